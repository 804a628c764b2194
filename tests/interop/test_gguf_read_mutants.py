"""``read_gguf`` against independent references, for the bugs a person makes in a GGUF reader (issues 32
and 36's hand-planted audit): the model through transformers' own GGUF loader (q/k row order, tied
head, rope theta, rms epsilon, qwen2's unpermuted rows, a custom alignment), every supported tensor
type through the ``gguf`` package's ``dequantize`` of the same bytes (the K-quants included), and the
header's bounds. Files are written small with ``gguf.GGUFWriter``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf import llama_tensors  # noqa: E402
from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from tests.interop.test_gguf_read import (  # noqa: E402
    IDS,
    MERGES,
    TOKENS,
    TYPES,
    _logits,
    add_llama_hparams,
    rewrite_gguf,
    tiny_llama,
    write_gguf,
)

Q = gguf.GGMLQuantizationType


def test_a_llama_without_its_rms_epsilon_is_refused(tmp_path, capsys):
    """llama.cpp requires ``llama.attention.layer_norm_rms_epsilon`` (``get_key`` with required true in
    its llama hparams) and transformers' loader, finding none, keeps LlamaConfig's 1e-6; a reader that
    guesses (1e-5 here before) loads a model neither of them would. So a file without it is refused in
    one line naming the file and the key, by the reader and by ``gptforge import gguf`` (exit 2)."""
    from gptforge.cli import main

    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    assert read_gguf(good, weights=False).model is None
    key = "llama.attention.layer_norm_rms_epsilon"
    bad = rewrite_gguf(good, tmp_path / "noeps.gguf", key)
    with pytest.raises(GGUFReadError, match=rf"{key} is missing") as e:
        read_gguf(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    assert main(["import", "gguf", "--model", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err and key in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def _write(path: Path, model, arch: str = "llama", alignment: int | None = None, raw: dict | None = None,
           kv: dict | None = None) -> Path:
    """``model`` as llama.cpp's converter lays it out (``llama_tensors``), F32, with the common tests'
    byte-level vocabulary; ``alignment``: a custom ``general.alignment``; ``raw``: tensor name ->
    (bytes as uint8 rows, GGML type) written in place of that tensor."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    add_llama_hparams(w, cfg)
    for k, v in (kv or {}).items():
        w.add_uint32(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in llama_tensors(model).items():
        if raw and name in raw:
            w.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        else:
            w.add_tensor(name, np.ascontiguousarray(t.detach().float().numpy(), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _hf_logits(path: Path, ids: torch.Tensor = IDS) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        return m(ids).logits


@pytest.mark.parametrize(("arch", "tied", "alignment"), [("llama", False, None), ("llama", True, 64),
                                                         ("qwen2", False, 128)])
def test_logits_equal_transformers_gguf_load(tmp_path, arch, tied, alignment):
    """The same file through transformers' GGUF loader (which undoes llama.cpp's q/k permutation for
    llama and leaves qwen2's rows alone) and through ``read_gguf``: the same logits. The model has
    grouped heads (k rows un-permuted per kv head), rope theta 500 and rms epsilon 1e-6 (neither a
    default), a tied or untied head, and a custom ``general.alignment`` (the data section and every
    offset aligned to it)."""
    model = tiny_llama(tie_embeddings=tied, norm_eps=1e-6, qkv_bias=arch == "qwen2")
    with torch.no_grad():  # the head far from the embeddings, so a head that is not tied shows
        if not tied:
            model.lm_head.weight.mul_(-3.0)
        if arch == "qwen2":
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.copy_(torch.randn_like(p))
    path = _write(tmp_path / "m.gguf", model, arch=arch, alignment=alignment)
    g = read_gguf(path)
    cfg = g.model.config
    assert (cfg.rope_theta, cfg.tie_embeddings, cfg.qkv_bias) == (500.0, tied, arch == "qwen2")
    assert cfg.norm_eps == pytest.approx(1e-6, rel=1e-6)
    V = len(TOKENS)
    ours, theirs = _logits(g.model)[..., :V], _hf_logits(path)[..., :V]
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    torch.testing.assert_close(ours, _logits(model)[..., :V], atol=2e-5, rtol=0)
    if tied:
        assert g.model.lm_head.weight is g.model.model.embed_tokens.weight


def _random_blocks(rng, rows: int, cols: int, qtype) -> np.ndarray:
    """Valid bytes of a ``qtype`` (rows, cols) tensor: random, every byte below 0x3C so each float16
    scale (and F32/F16/BF16 value) is finite and below 1."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 0x3C, size=(rows, cols // block * size), dtype=np.uint8)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                                   "Q4_K", "Q5_K", "Q6_K"])
def test_every_supported_type_is_the_gguf_packages_dequantize(tmp_path, qtype):
    """Each type gptforge lists as supported, written as raw blocks into a (512, 256) and a (256, 512)
    matrix: the weights read back are exactly ``gguf.quants.dequantize`` of those bytes (llama.cpp's own
    block layouts and scales, in numpy), row for row; the logits are a model holding them."""
    from gptforge.interop.gguf_read import SUPPORTED_TYPES

    assert qtype in SUPPORTED_TYPES
    model = tiny_llama(n_embd=256, n_head=4, n_kv_head=2, intermediate_size=512)
    rng = np.random.default_rng(len(qtype) * 7 + ord(qtype[-1]))
    raw = {"blk.0.ffn_up.weight": _random_blocks(rng, 512, 256, Q[qtype]),
           "blk.1.ffn_down.weight": _random_blocks(rng, 256, 512, Q[qtype])}
    g = read_gguf(_write(tmp_path / "m.gguf", model, raw={k: (v, Q[qtype]) for k, v in raw.items()}))
    sd = g.model.state_dict()
    for name, key, shape in (("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", (512, 256)),
                             ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", (256, 512))):
        want = np.asarray(gguf.quants.dequantize(raw[name], Q[qtype]), dtype=np.float32).reshape(shape)
        assert np.isfinite(want).all() and np.abs(want).max() > 0
        assert torch.equal(sd[key], torch.from_numpy(want)), (qtype, name)


def test_header_bounds(tmp_path):
    """Refused in one line naming the file: a GGUF version gptforge does not know (4), a token longer
    than the per-item bound, and a ``llama.vocab_size`` other than the token count."""
    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    data = bytearray(good.read_bytes())
    struct.pack_into("<I", data, 4, 4)
    v4 = tmp_path / "v4.gguf"
    v4.write_bytes(bytes(data))
    with pytest.raises(GGUFReadError, match="GGUF.version=4") as e:
        read_gguf(v4)
    assert str(v4) in str(e.value)

    from gptforge.interop.gguf_read import MAX_ITEM_STRING

    long_tok = "a" * (MAX_ITEM_STRING + 1)
    path = tmp_path / "long.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([*TOKENS, long_tok])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFReadError, match=rf"an item of tokenizer\.ggml\.tokens is {MAX_ITEM_STRING + 1} bytes"):
        read_gguf(path)

    model = tiny_llama()
    bad = _write(tmp_path / "vocab.gguf", model, kv={"llama.vocab_size": len(TOKENS) + 1})
    with pytest.raises(GGUFReadError, match=rf"llama\.vocab_size={len(TOKENS) + 1} but tokenizer\.ggml\.tokens "
                                            rf"holds {len(TOKENS)}") as e:
        read_gguf(bad)
    assert str(bad) in str(e.value)


def test_a_folder_or_device_given_as_the_gguf_is_named_as_such(tmp_path, capsys):
    """`import gguf --model DIR` (or /dev/zero) said "no such file" of something that exists."""
    from gptforge.cli import main
    from gptforge.interop.gguf_read import GGUFReadError, read_gguf

    for p in (tmp_path, Path("/dev/zero")):
        with pytest.raises(GGUFReadError, match=r"not a file \(a folder or device\)"):
            read_gguf(p)
    with pytest.raises(GGUFReadError, match=r": no such file$"):
        read_gguf(tmp_path / "missing.gguf")
    assert main(["import", "gguf", "--model", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: not a file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_the_model_owns_its_weights_not_the_files_pages(tmp_path, qtype):
    """An F32 tensor comes back from the gguf package as a view of the mapped file: the reader copies it, so
    the model's weights are its own, writable, and the model does not change when the file is overwritten
    afterwards (an export over the same path, a download replacing it). Checked by zeroing every byte after
    the header in place and comparing logits; and by writing into a weight (training does)."""
    path = write_gguf(tmp_path / "m.gguf", tiny_llama(), qtype=qtype)
    g = read_gguf(path)
    before = _logits(g.model).clone()
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the same inode: a mapping of it would see this
        f.seek(size // 2)
        f.write(bytes(size - size // 2))
    assert torch.equal(_logits(g.model), before)
    for p in g.model.parameters():
        with torch.no_grad():
            p.add_(0.0)  # a read-only view of the file would refuse this (or crash)
