"""What keeps ``gptforge import gguf`` (and every ``--gguf`` command) fast, and the refusals of the GGUF
reader's own parse of the tokenizer arrays.

The 98 MB SmolLM2 file imported in 11.3 s of CPU before, 4.4 s after (docs/benchmarks.md): the
``gguf`` package's reader (a numpy view per string: 2.4 s per parse of a 49,152-token vocabulary, and
the command parsed the file twice) is replaced by gptforge's bounded header walk, which keeps the arrays'
items; the tokenizer built with the model is the one the command asks for next; and a model built on the
meta device skips its random init, whose meta ``normal_`` imported ``torch._dynamo`` (1.4 s).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from tests.interop.test_gguf_read import TOKENS, tiny_llama, write_gguf  # noqa: E402


def _patched(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    data = src.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    dst.write_bytes(data.replace(old, new))
    return dst


def test_a_token_that_is_not_utf8_is_refused(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    assert "abc" in TOKENS
    item = struct.pack("<Q", 3) + b"abc"
    bad = _patched(good, tmp_path / "bad.gguf", item, struct.pack("<Q", 3) + b"\xffbc")
    with pytest.raises(GGUFReadError, match=r"tokenizer\.ggml\.tokens holds a string that is not UTF-8") as e:
        read_gguf(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_token_types_that_are_not_integers_are_refused(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    key = b"tokenizer.ggml.token_type"
    head = struct.pack("<Q", len(key)) + key + struct.pack("<II", 9, 5)  # an array of int32
    bad = _patched(good, tmp_path / "bad.gguf", head, head[:-4] + struct.pack("<I", 6))  # of float32
    with pytest.raises(GGUFReadError, match=r"tokenizer\.ggml\.token_type is not a list of integers") as e:
        read_gguf(bad)
    assert str(bad) in str(e.value)
    assert read_gguf(good).tokenizer.n_vocab == len(TOKENS)


def test_the_tokenizer_read_with_the_model_is_not_read_again(tmp_path, monkeypatch):
    """``load_model`` then the tokenizer and chat template (what every ``--gguf`` command asks for):
    one read of the file; a changed file is read again."""
    import os

    from gptforge.interop import gguf_read
    from gptforge.load import ModelSource, load_chat_template_of, load_model, load_tokenizer_of

    path = write_gguf(tmp_path / "m.gguf", tiny_llama())
    calls = []
    real = gguf_read.read_gguf
    monkeypatch.setattr(gguf_read, "read_gguf", lambda p, weights=True: calls.append(weights) or real(p, weights))
    source = ModelSource(gguf=str(path))
    load_model(source)
    tok = load_tokenizer_of(source)
    assert load_chat_template_of(source, tok) is not None
    assert calls == [True]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_tokenizer_of(source).n_vocab == tok.n_vocab
    assert calls == [True, False]


def test_a_model_built_on_meta_skips_its_init_and_a_real_one_does_not():
    """In a fresh process: building SmolLM2's shape on meta (every command's first step in loading a
    model) leaves ``torch._dynamo`` unimported; built on the CPU, the weights are still drawn N(0, 0.02)."""
    code = """
import sys, torch
from gptforge.models.llama import LlamaConfig
from gptforge.models.registry import build_model
cfg = LlamaConfig(n_layer=30, n_head=9, n_kv_head=3, n_embd=576, intermediate_size=1536, vocab_size=49152)
with torch.device("meta"):
    m = build_model(cfg)
assert m.lm_head.weight.is_meta and m.lm_head.weight.shape == (49152, 576)
print("torch._dynamo" in sys.modules)
small = build_model(LlamaConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=256))
print(round(small.model.embed_tokens.weight.std().item(), 2))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "0.02"]
