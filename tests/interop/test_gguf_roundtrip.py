"""A model read from a GGUF file exports back to GGUF with its own tokenizer (issue 32).

``gptforge export gguf --gguf FILE`` (and so any checkpoint trained ``--init-from FILE.gguf``) must name
the file's pre-tokenizer again: the tokenizer read from a GGUF holds llama.cpp's regexes for its
``tokenizer.ggml.pre`` (SmolLM2's ``smollm`` splits every digit first), and the exporter used to know
only tiktoken's GPT-2 and GPT-4 patterns, so a SmolLM2 fine-tune could not go back to llama.cpp. The
reference is the ``gguf`` package's own reader of the original file and of the export: the same
pre-tokenizer name, tokens, token types (a user-defined token such as ``<think>`` stays user-defined,
so it is still matched whole) and merges; gptforge's read-back encodes as the original does.
"""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from tests.interop.test_gguf_read import IDS, _logits, strings, tiny_llama, write_gguf  # noqa: E402


def _fields(path) -> dict:
    r = gguf.GGUFReader(str(path))
    out = {}
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"):
        f = r.fields[key]
        parts = [bytes(f.parts[i]).decode() for i in f.data]
        out[key] = parts if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") else parts[0]
    f = r.fields["tokenizer.ggml.token_type"]
    out["tokenizer.ggml.token_type"] = [int(f.parts[i][0]) for i in f.data]  # control, user-defined, normal
    return out


@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "llama-bpe", "qwen2"])
def test_a_gguf_model_exports_back_to_gguf_with_its_pre_tokenizer(tmp_path, capsys, pre):
    src = write_gguf(tmp_path / "in.gguf", tiny_llama(), pre=pre)
    assert main(["export", "gguf", "--gguf", str(src), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    out = tmp_path / "out" / "model-f32.gguf"
    want, got = _fields(src), _fields(out)
    assert got == want
    a, b = read_gguf(src), read_gguf(out)
    for s in strings(400, seed=7) + ["<think>hmm</think>", "a <think> b"]:  # a user-defined token stays whole
        assert b.tokenizer.encode_ordinary(s) == a.tokenizer.encode_ordinary(s), s
    torch.testing.assert_close(_logits(b.model, IDS), _logits(a.model, IDS), atol=1e-5, rtol=0)
