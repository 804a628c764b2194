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


@pytest.mark.parametrize("prefix_space", [False, True])
def test_a_gpt2_style_tokenizer_json_exports_as_llama_cpps_gpt2_split(tmp_path, capsys, prefix_space):
    """A Hugging Face folder whose tokenizer.json splits with a ByteLevel pre-tokenizer alone (GPT-2's own
    file, every ``ByteLevelBPETokenizer``'s: GPT-2's regex inside ByteLevel, no Split step) goes out as
    llama.cpp's ``gpt-2`` pre-tokenizer, and the file's tokenizer encodes as the ``tokenizers`` library does
    on the folder's own file (the independent reference). With ``add_prefix_space`` (a space before the text,
    which llama.cpp's gpt-2 never adds) it is refused by name, nothing written."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.ByteLevelBPETokenizer(add_prefix_space=prefix_space)
    bpe.train_from_iterator(strings(2000, seed=3), vocab_size=400, special_tokens=["<|endoftext|>"])
    d = tmp_path / "hf"
    d.mkdir()
    bpe.save(str(d / "tokenizer.json"))
    n = bpe.get_vocab_size()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=n, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    code = main(["export", "gguf", "--hf", str(d), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    if prefix_space:
        assert code == 2 and "llama.cpp has no name for" in err and not (tmp_path / "out").exists(), err
        return
    assert code == 0, err
    out = next((tmp_path / "out").glob("*.gguf"))
    f = gguf.GGUFReader(str(out)).fields["tokenizer.ggml.pre"]
    assert bytes(f.parts[f.data[0]]).decode() == "gpt-2"
    back = read_gguf(out).tokenizer
    ref = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    ref.encode_special_tokens = True  # special-token text typed in ordinary text stays text, as encode_ordinary
    for s in strings(400, seed=11) + ["Hello world", " two  spaces ", "don't I'll 2024"]:
        assert back.encode_ordinary(s) == ref.encode(s, add_special_tokens=False).ids, s
