"""A GGUF file of llama.cpp's ``llama`` or ``phi3`` architecture with ``attention.sliding_window`` shorter than its
context (a Mistral 7B's 4096 of 32k, Phi-3-mini-4k's 2047 of 4096) is read as llama.cpp and transformers' GGUF
loader run it: every layer attends over the whole context.

llama.cpp's llama never reads the key and its phi3 turns the window off ("Phi SWA is currently disabled", PR
13676); transformers' GGUF loader maps the key for neither architecture (a ``LlamaConfig``/``Phi3Config`` without a
window). gptforge's reader applied the window, so past 8 tokens it computed a model neither of them computes. The
reference here is transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``) of the same file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from tests.interop.test_gguf_families import IDX, WINDOW, _hf_model, write_converter_gguf  # noqa: E402
from tests.interop.test_gguf_read import rewrite_gguf  # noqa: E402

# sums of <= 96 float32 terms over 3 layers and the head, |logits| < 10: 96 * 4 * 1.2e-7 * 10 ~ 5e-4 bounds
# any reordering of them (measured: 0)
ATOL = 96 * 4 * 1.2e-7 * 10


def _with_pad_id(src, dst):
    """``src`` with tokenizer.ggml.padding_token_id 0: transformers' Phi3Config otherwise pads with id 32000,
    outside this 268-token vocabulary, and fails to build."""
    return rewrite_gguf(src, dst, "tokenizer.ggml.padding_token_id", 0, gguf.GGUFValueType.UINT32)


@pytest.mark.parametrize("name, arch", [("mistral", "llama"), ("phi3", "phi3")])
def test_a_llama_or_phi3_gguf_window_is_run_as_llamacpp_and_transformers_run_it(name, arch, tmp_path):
    hf = _hf_model(name)  # sliding_window 8, context 128: the HF model itself slides
    assert hf.config.sliding_window == WINDOW
    path = _with_pad_id(write_converter_gguf(tmp_path / "c.gguf", hf, arch), tmp_path / "m.gguf")
    assert gguf.GGUFReader(str(path)).fields[f"{arch}.attention.sliding_window"].contents() == WINDOW
    tf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf",
                                                           dtype=torch.float32).eval()
    assert not getattr(tf.config, "sliding_window", None)  # transformers' reading: no window
    g = read_gguf(path).model
    assert g.config.sliding_window == 0 and g.config.family == ("" if arch == "llama" else "phi3")
    with torch.no_grad():
        want, got, windowed = tf(IDX).logits, g(IDX)[0], hf(IDX).logits
    assert (got - want).abs().max().item() <= ATOL
    assert (windowed - want).abs().max().item() > 100 * ATOL  # the window would have decided the logits


# ----------------------------------------------------------------------------- every {arch}.* key accounted for

from gptforge.interop.gguf_read import GGUFReadError  # noqa: E402
from tests.interop.test_gguf_read import tiny_llama, write_gguf  # noqa: E402

VT = gguf.GGUFValueType
# keys llama.cpp reads for every architecture (or some) that change what it computes, at a value that would;
# gptforge read none of them and loaded such a file as if they were absent
CHANGE = [("attention.causal", False, VT.BOOL), ("rope.scaling.attn_factor", 2.0, VT.FLOAT32),
          ("attention.key_length_swa", 8, VT.UINT32), ("rope.scaling.alpha", 1000.0, VT.FLOAT32),
          ("pooling_type", 1, VT.UINT32), ("logit_scale", 0.5, VT.FLOAT32), ("attention.scale", 0.5, VT.FLOAT32),
          ("residual_scale", 0.2, VT.FLOAT32), ("embedding_scale", 12.0, VT.FLOAT32)]
# the same keys where they change nothing, and the converter's notes: they load to the same logits
NO_CHANGE = [("attention.causal", True, VT.BOOL), ("rope.scaling.attn_factor", 1.0, VT.FLOAT32),
             ("rope.scaling.finetuned", False, VT.BOOL), ("expert_used_count", 0, VT.UINT32),
             ("tensor_data_layout", "Meta AI original pth", VT.STRING)]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("keys") / "llama.gguf", tiny_llama())


GPT2 = {"gpt2.context_length": 32, "gpt2.embedding_length": 32, "gpt2.block_count": 1, "gpt2.feed_forward_length": 128,
        "gpt2.attention.head_count": 2, "gpt2.attention.layer_norm_epsilon": 1e-5}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("key, value, vtype", CHANGE, ids=[k for k, _, _ in CHANGE])
def test_a_metadata_key_gptforge_does_not_read_is_refused_by_name(plain, arch, key, value, vtype, tmp_path):
    match = f"{arch}.{key}={value!r}: a key gptforge does not read for architecture {arch}"
    if arch == "gpt2":  # its metadata alone, as the reader hands it over (a GPT-2 file carries a 50k vocabulary)
        from gptforge.interop.gguf_config import gpt2_config_from_gguf

        assert gpt2_config_from_gguf(GPT2, {}, Path("m.gguf"), 268).n_layer == 1
        with pytest.raises(GGUFReadError, match=match) as e:
            gpt2_config_from_gguf({**GPT2, f"gpt2.{key}": value}, {}, Path("m.gguf"), 268)
    else:
        bad = rewrite_gguf(plain, tmp_path / "bad.gguf", f"{arch}.{key}", value, vtype)
        with pytest.raises(GGUFReadError, match=match) as e:
            read_gguf(bad, weights=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key, value, vtype", NO_CHANGE, ids=[k for k, _, _ in NO_CHANGE])
def test_a_key_that_changes_nothing_loads_to_the_same_logits(plain, key, value, vtype, tmp_path):
    ok = rewrite_gguf(plain, tmp_path / "ok.gguf", f"llama.{key}", value, vtype)
    idx = IDX[:, :32] % 268
    with torch.no_grad():
        assert torch.equal(read_gguf(ok).model(idx)[0], read_gguf(plain).model(idx)[0])


def test_a_llama_with_a_head_size_apart_exports_to_gguf_as_transformers_reads_it(tmp_path):
    """A Llama whose heads are not n_embd/n_head wide (a Llama head_dim, Mistral Nemo's 128 of 5120/32 under
    architecture llama) was refused at GGUF export ("model.head_size: llama.cpp's llama architecture has no such
    option"), though llama.cpp reads attention.key_length for every architecture. The file now carries it; the
    export's tensors and keys, with the small tokenizer, load in transformers' GGUF loader to the model's logits.
    With q/k/v biases (qwen2) it stays refused by name: the reader sizes their biases by n_embd."""
    from gptforge.interop.gguf import export_gguf

    model = tiny_llama(head_size=32).eval()  # 4 heads of 32 over n_embd 64
    r = gguf.GGUFReader(str(export_gguf(model, tmp_path / "out", tokenizer=False)))
    assert r.fields["llama.attention.key_length"].contents() == 32
    kv = {k: f.contents() for k, f in r.fields.items() if k.split(".", 1)[-1] in
          ("attention.key_length", "attention.value_length", "rope.dimension_count")}
    tensors = {t.name: torch.from_numpy(t.data.copy()).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    path = _with_pad_id(write_gguf(tmp_path / "w.gguf", model, kv=kv, tensors=tensors), tmp_path / "m.gguf")
    tf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf",
                                                           dtype=torch.float32).eval()
    idx = IDX[:, :32] % 268
    with torch.no_grad():
        want = model(idx)[0]
        assert (tf(idx).logits - want).abs().max().item() <= ATOL
        assert (read_gguf(path).model(idx)[0] - want).abs().max().item() <= ATOL
    # named as the architecture the file would be: q/k/v biases are llama.cpp's qwen2, not its llama
    with pytest.raises(ValueError, match="model.head_size: llama.cpp's qwen2 architecture has no such option"):
        export_gguf(tiny_llama(head_size=32, qkv_bias=True), tmp_path / "qwen2", tokenizer=False)
