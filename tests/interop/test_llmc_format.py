"""llm.c's file formats byte by byte (issue 36: the `interop` mutation lane's fast tests). Files are built
here from llm.c's own description (train_gpt2.py ``write_model`` / ``write_tokenizer``: a 256-int32
header, then the parameters or the tokens), with numpy, not with gptforge's writer; gptforge's reader
must find every tensor where the spec puts it, and gptforge's writer must produce exactly the spec's
bytes. Every refusal is checked for its words and the file it names. Tiny shapes, no model runs."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptforge.interop import llmc
from gptforge.models.gpt2 import GPT, GPTConfig

L, NH, C, T = 2, 2, 8, 4  # layers, heads, width, maxT


def _spec_params(L, C, T, Vp):
    """llm.c's parameter count (train_gpt2.c fill_in_parameter_sizes), written out."""
    return Vp * C + T * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C


def _header(magic=20240326, version=3, T=T, V=100, L=L, NH=NH, C=C, Vp=128) -> np.ndarray:
    h = np.zeros(256, dtype="<i4")
    h[:8] = [magic, version, T, V, L, NH, C, Vp]
    return h


def _spec_file(path, V=100, Vp=128, version=3, seed=0) -> np.ndarray:
    """A model file per the spec with random float32 parameters; returns the flat parameters."""
    n = _spec_params(L, C, T, Vp)
    flat = np.random.default_rng(seed).standard_normal(n).astype("<f4")
    if version == 5:  # bfloat16: the top 16 bits of each float32 (values chosen exactly representable)
        flat = (flat.view("<u4") & 0xFFFF0000).view("<f4")
        body = (flat.view("<u4") >> 16).astype("<u2").tobytes()
    else:
        body = flat.tobytes()
    path.write_bytes(_header(version=version, V=V, Vp=Vp).tobytes() + body)
    return flat


def _spec_tensors(flat: np.ndarray, Vp: int) -> dict[str, np.ndarray]:
    """The spec's order: wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb lnfw lnfb."""
    shapes = [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
              ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    out, off = {}, 0
    for name, shape in shapes:
        k = math.prod(shape)
        out[name] = flat[off : off + k].reshape(shape)
        off += k
    assert off == flat.size
    return out


HF = {"ln1w": "ln_1.weight", "ln1b": "ln_1.bias", "qkvw": "attn.c_attn.weight", "qkvb": "attn.c_attn.bias",
      "attprojw": "attn.c_proj.weight", "attprojb": "attn.c_proj.bias", "ln2w": "ln_2.weight", "ln2b": "ln_2.bias",
      "fcw": "mlp.c_fc.weight", "fcb": "mlp.c_fc.bias", "fcprojw": "mlp.c_proj.weight", "fcprojb": "mlp.c_proj.bias"}


@pytest.mark.parametrize("version", [3, 5])
def test_reader_finds_every_tensor_where_the_spec_puts_it(tmp_path, version):
    flat = _spec_file(tmp_path / "m.bin", version=version)
    h = llmc.read_model_header(tmp_path / "m.bin")
    assert h == {"version": version, "maxT": T, "V": 100, "L": L, "NH": NH, "C": C, "Vp": 128,
                 "num_params": _spec_params(L, C, T, 128)}
    m = llmc.read_llmc_model(tmp_path / "m.bin", flash=False)
    assert (m.config.n_layer, m.config.n_head, m.config.n_embd, m.config.block_size, m.config.vocab_size,
            m.config.pad_vocab, m.config.flash) == (L, NH, C, T, 100, True, False)
    assert not m.training
    sd = {k: v.double().numpy() for k, v in m.state_dict().items()}
    t = _spec_tensors(flat, 128)
    np.testing.assert_array_equal(sd["transformer.wte.weight"], t["wte"])
    np.testing.assert_array_equal(sd["transformer.wpe.weight"], t["wpe"])
    np.testing.assert_array_equal(sd["transformer.ln_f.weight"], t["lnfw"])
    np.testing.assert_array_equal(sd["transformer.ln_f.bias"], t["lnfb"])
    for i in range(L):
        for name, key in HF.items():
            np.testing.assert_array_equal(sd[f"transformer.h.{i}.{key}"], t[name][i], err_msg=f"{name}[{i}]")


@pytest.mark.parametrize("V,Vp,rows", [(128, 128, 128), (100, 101, 128), (100, 256, 128)])
def test_a_vocabulary_padded_to_another_multiple_keeps_the_real_rows(tmp_path, V, Vp, rows):
    flat = _spec_file(tmp_path / "m.bin", V=V, Vp=Vp)
    m = llmc.read_llmc_model(tmp_path / "m.bin")
    assert m.config.pad_vocab == (Vp != V)
    wte = m.transformer.wte.weight.detach().double().numpy()
    assert wte.shape == (rows, C)
    np.testing.assert_array_equal(wte[:V], _spec_tensors(flat, Vp)["wte"][:V])
    assert not wte[V:].any()  # rows past the vocabulary: zeros, never the file's padding


@pytest.mark.parametrize("dtype,version", [("float32", 3), ("bfloat16", 5)])
def test_writer_produces_the_spec_bytes(tmp_path, dtype, version):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=L, n_head=NH, n_embd=C, block_size=T, vocab_size=100, pad_vocab=False))
    assert llmc.write_llmc_model(model, tmp_path / "w.bin", dtype) == tmp_path / "w.bin"
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    wte = torch.zeros(128, C)
    wte[:100] = sd["transformer.wte.weight"]
    parts = [wte, sd["transformer.wpe.weight"]]
    for name in ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
                 "fcprojb"):
        parts += [sd[f"transformer.h.{i}.{HF[name]}"] for i in range(L)]
    parts += [sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    flat = np.concatenate([p.flatten().numpy() for p in parts]).astype("<f4")
    if version == 5:  # round to nearest even, as torch's bfloat16 conversion
        body = torch.from_numpy(flat).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    else:
        body = flat.tobytes()
    assert (tmp_path / "w.bin").read_bytes() == _header(version=version, V=100, Vp=128).tobytes() + body
    # a model padded to 128 rows already: its padding rows (random at init) are written as zeros, as llm.c's
    padded = GPT(GPTConfig(n_layer=L, n_head=NH, n_embd=C, block_size=T, vocab_size=100))
    padded.load_state_dict({**{k: v for k, v in model.state_dict().items() if k != "lm_head.weight"},
                            "transformer.wte.weight": torch.cat([
        model.transformer.wte.weight.detach(), torch.randn(28, C)])}, strict=False)  # (lm_head is wte, tied)
    assert padded.transformer.wte.weight[100:].abs().sum() > 0
    assert llmc.write_llmc_model(padded, tmp_path / "p.bin", dtype).read_bytes() == (tmp_path / "w.bin").read_bytes()
    with pytest.raises(ValueError, match=r"^dtype='float16'; llm.c files hold float32 or bfloat16$"):
        llmc.write_llmc_model(model, tmp_path / "x.bin", "float16")
    assert not (tmp_path / "x.bin").exists()


def test_models_an_llmc_file_cannot_hold_are_refused():
    with pytest.raises(ValueError, match=r"^model.arch='llama': llm.c model files hold GPT-2 only; export this model "
                                         r"with `gptforge export hf` instead$"):
        llmc.check_llmc_model(SimpleNamespace(config=SimpleNamespace(arch="llama", bias=True)))
    with pytest.raises(ValueError, match=r"^llm.c's GPT-2 has biases everywhere; a model.bias=false model cannot be "
                                         r"written$"):
        llmc.check_llmc_model(SimpleNamespace(config=SimpleNamespace(arch="gpt2", bias=False)))
    llmc.check_llmc_model(SimpleNamespace(config=SimpleNamespace(arch="gpt2", bias=True)))


def test_header_refusals_name_the_file_and_the_field(tmp_path):
    good = _header().tobytes() + b"\0" * (_spec_params(L, C, T, 128) * 4)

    def refused(data: bytes, words: str, name="m.bin"):
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(llmc.LlmcFormatError) as e:
            llmc.read_model_header(p)
        assert str(e.value) == f"{p}: {words}", str(e.value)

    (tmp_path / "ok.bin").write_bytes(good)
    assert llmc.read_model_header(tmp_path / "ok.bin")["num_params"] == _spec_params(L, C, T, 128)
    refused(good[:1023], "1023 bytes is shorter than the 1024-byte llm.c header")
    refused(_header(magic=7).tobytes(), "magic 7 is not llm.c's model magic 20240326")
    refused(_header(magic=20240328).tobytes(), "magic 20240328 is not llm.c's model magic 20240326 (that is a "
                                               "tokenizer file)")
    refused(_header(version=4).tobytes(), "version 4 unsupported; gptforge reads 3 (float32) and 5 (bfloat16), "
                                          "re-export with llm.c's train_gpt2.py")
    for field, bad in (("T", 0), ("V", 0), ("L", 0), ("NH", 0), ("C", 0), ("Vp", 99), ("NH", 3)):
        kw = {"T": T, "V": 100, "L": L, "NH": NH, "C": C, "Vp": 128, field: bad}
        f = {"version": 3, "maxT": kw["T"], "V": kw["V"], "L": kw["L"], "NH": kw["NH"], "C": kw["C"], "Vp": kw["Vp"]}
        refused(_header(**kw).tobytes() + good[1024:], f"inconsistent header {f} (need positive sizes, Vp >= V, C "
                                                       "divisible by NH)")
    n = _spec_params(L, C, T, 128)
    refused(good[:-4], f"{len(good) - 4} bytes, but the header {{'version': 3, 'maxT': {T}, 'V': 100, 'L': {L}, "
                       f"'NH': {NH}, 'C': {C}, 'Vp': 128}} implies {n:,} parameters = {1024 + 4 * n} bytes; the file is "
                       "truncated or not an llm.c model")
    refused(_header(version=5).tobytes() + good[1024:], f"{len(good)} bytes, but the header {{'version': 5, "
            f"'maxT': {T}, 'V': 100, 'L': {L}, 'NH': {NH}, 'C': {C}, 'Vp': 128}} implies {n:,} parameters = "
            f"{1024 + 2 * n} bytes; the file is truncated or not an llm.c model")
    # Vp == V is a valid (unpadded) file
    (tmp_path / "eq.bin").write_bytes(_header(V=128).tobytes() + good[1024:])
    assert llmc.read_model_header(tmp_path / "eq.bin")["V"] == 128


@pytest.mark.parametrize("reader,what", [(llmc.read_model_header, "model"), (llmc.read_llmc_tokenizer, "tokenizer")])
def test_a_path_that_is_not_a_file_says_what_it_is(tmp_path, reader, what):
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(FileNotFoundError, match=f"^llm.c {what} file {d} is a directory, not a file$"):
        reader(d)
    for name in ("d.bin", "a.bin", "c.bin", "b.bin", "z.txt"):
        (d / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError) as e:
        reader(d)
    assert str(e.value) == f"llm.c {what} file {d} is a directory, not a file (it holds a.bin, b.bin, c.bin)"
    os.symlink(tmp_path / "gone.bin", tmp_path / "link.bin")
    with pytest.raises(FileNotFoundError) as e:
        reader(tmp_path / "link.bin")
    assert str(e.value) == f"llm.c {what} file {tmp_path / 'link.bin'} is a symlink to a missing file"
    with pytest.raises(FileNotFoundError) as e:
        reader(tmp_path / "gone.bin")
    assert str(e.value) == f"llm.c {what} file {tmp_path / 'gone.bin'} does not exist"


class _Enc:
    """A tiktoken-like encoding of the given token bytes."""

    def __init__(self, toks, eot):
        self.toks, self.n_vocab, self.eot_token = toks, len(toks), eot

    def decode_single_token_bytes(self, i):
        return self.toks[i]


def _tok_file(toks, version=2, eot=1, n=None, magic=20240328) -> bytes:
    h = np.zeros(256, dtype="<i4")
    h[:4] = [magic, version, len(toks) if n is None else n, eot]
    return h.tobytes() + b"".join(bytes([len(t)]) + t for t in toks)


def test_tokenizer_file_bytes_both_ways(tmp_path):
    toks = [b"a", b"\xff" * 255, b" the", b"<|endoftext|>"]
    assert llmc.write_llmc_tokenizer(_Enc(toks, 3), tmp_path / "t.bin") == tmp_path / "t.bin"
    assert (tmp_path / "t.bin").read_bytes() == _tok_file(toks, eot=3)
    assert llmc.read_llmc_tokenizer(tmp_path / "t.bin") == (toks, 3)
    (tmp_path / "v1.bin").write_bytes(_tok_file(toks, version=1, eot=0))
    assert llmc.read_llmc_tokenizer(tmp_path / "v1.bin") == (toks, None)  # version 1 has no eot
    for bad in (b"", b"x" * 256):
        with pytest.raises(ValueError) as e:
            llmc.write_llmc_tokenizer(_Enc([b"a", bad], 0), tmp_path / "bad.bin")
        assert str(e.value) == f"token 1 is {len(bad)} bytes; llm.c stores lengths as one byte (1..255)"
        assert not (tmp_path / "bad.bin").exists()


def test_tokenizer_refusals_name_the_file(tmp_path):
    def refused(data: bytes, words: str):
        p = tmp_path / "t.bin"
        p.write_bytes(data)
        with pytest.raises(llmc.LlmcFormatError) as e:
            llmc.read_llmc_tokenizer(p)
        assert str(e.value) == f"{p}: {words}", str(e.value)

    refused(_tok_file([])[:1023], "1023 bytes is shorter than the 1024-byte llm.c header")
    refused(_tok_file([b"a"], magic=20240326), "magic 20240326 is not llm.c's tokenizer magic 20240328")
    refused(_tok_file([b"a"], version=3), "tokenizer version 3 unsupported (1 or 2)")
    refused(_tok_file([b"a"], version=0), "tokenizer version 0 unsupported (1 or 2)")
    refused(_tok_file([b"a", b"b"], n=3), "ends after 2 of 3 tokens")
    refused(_tok_file([b"a", b"bc"])[:-1], "token 1 is truncated or empty")
    refused(_tok_file([b"a"]) + b"\x00", "1 trailing bytes after 1 tokens")
    refused(_tok_file([b"a"], n=2) + b"\x00", "token 1 is truncated or empty")
    assert llmc.read_llmc_tokenizer(_write(tmp_path / "e.bin", _tok_file([]))) == ([], 1)


def _write(p, data):
    p.write_bytes(data)
    return p


def test_a_full_disk_names_the_llmc_file_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    class Full(_Enc):
        def decode_single_token_bytes(self, i):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(Exception) as e:
        llmc.write_llmc_tokenizer(Full([b"a"], 0), tmp_path / "t.bin")
    assert f"while writing the llm.c tokenizer file ({tmp_path / 't.bin'})" in str(e.value)

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(llmc, "_param_shapes", full)  # the first tensor's write
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    with pytest.raises(Exception) as e:
        llmc.write_llmc_model(model, tmp_path / "m.bin")
    assert f"while writing the llm.c model file ({tmp_path / 'm.bin'})" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_bfloat16_file_with_an_odd_parameter_count_reads_every_value(tmp_path):
    """C = 3, maxT = 2, one layer: 128*3 + 2*3 + (12*9 + 13*3) + 2*3 = 543 parameters, 1,086 bytes of
    bfloat16 (not a whole number of float32s)."""
    n = 128 * 3 + 2 * 3 + (12 * 9 + 13 * 3) + 2 * 3
    assert n % 2 == 1
    vals = (np.arange(n) % 251 - 125).astype("<f4")  # small integers: exact in bfloat16
    h = np.zeros(256, dtype="<i4")
    h[:8] = [20240326, 5, 2, 100, 1, 1, 3, 128]
    (tmp_path / "odd.bin").write_bytes(h.tobytes() + (vals.view("<u4") >> 16).astype("<u2").tobytes())
    m = llmc.read_llmc_model(tmp_path / "odd.bin")
    assert m.config.flash  # the default: the fused attention kernel
    assert m.transformer.ln_f.bias.tolist() == vals[-3:].tolist()
    assert m.transformer.wte.weight[:100].flatten().tolist() == vals[: 100 * 3].tolist()
