"""GGUF metadata and the byte-level tokenizer against what llama.cpp documents, for mutmut's survivors in
``gguf_config._key``, ``_check_extras_and_vocab`` and ``gguf_tokenizer.tokenizer_json_from_gguf`` (issue 36,
lane ``gguf``): a key of the wrong GGUF type is refused as llama.cpp's ``get_key`` refuses it ("key has
wrong type"), experts and sliding windows are refused, the vocabulary's bounds, and Llama 3's split
(``ignore_merges``; its regex alone decides the pieces). Files are written small with ``gguf.GGUFWriter``."""

from __future__ import annotations

from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf_config import _check_extras_and_vocab  # noqa: E402
from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from tests.interop.test_gguf_read import _alphabet, rewrite_gguf, tiny_llama, write_gguf  # noqa: E402
from tests.interop.test_gguf_tokenizer_edges import EOT, _bpe_file  # noqa: E402

VT = gguf.GGUFValueType


def _refused(path: Path, match: str) -> str:
    with pytest.raises(GGUFReadError, match=match) as e:
        read_gguf(path, weights=False)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    return msg


def test_a_key_of_the_wrong_gguf_type_is_refused_as_llama_cpp_refuses_it(tmp_path):
    """llama.cpp's ``get_key`` checks the stored GGUF type against the one it expects and throws "key
    has wrong type": a block count stored as a string, a float or a bool is not a count (a bool is an
    int to Python, so it needs its own check). A missing required key names what it builds."""
    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    assert read_gguf(good, weights=False).metadata["llama.block_count"] == 2
    key = "llama.block_count"
    for i, (value, vtype) in enumerate([("2", VT.STRING), (2.0, VT.FLOAT32), (True, VT.BOOL)]):
        bad = rewrite_gguf(good, tmp_path / f"t{i}.gguf", key, value, vtype)
        _refused(bad, rf"metadata key {key}={value!r} has the wrong type$")
    missing = rewrite_gguf(good, tmp_path / "missing.gguf", key)
    _refused(missing, rf"metadata key {key} is missing; gptforge needs it to build the Llama$")
    gpt = write_gguf(tmp_path / "gpt.gguf", tiny_llama(), arch="gpt2")
    gpt = rewrite_gguf(gpt, tmp_path / "gptmissing.gguf", "gpt2.block_count")
    _refused(gpt, r"metadata key gpt2\.block_count is missing; gptforge needs it to build the GPT$")


@pytest.mark.parametrize(("key", "what"), [("llama.expert_count", "Llama"),
                                           ("qwen2.attention.sliding_window", "Llama"),
                                           ("gpt2.expert_count", "GPT")])
def test_experts_and_sliding_windows_are_refused(tmp_path, key, what):
    """A mixture of experts (llama.cpp's ``expert_count`` > 0: Mixtral under architecture llama) or a
    sliding window where gptforge does not read one (qwen2; llama's is Mistral's, test_gguf_families.py)
    is a model gptforge's Llama and GPT do not implement: refused naming key and value.
    ``expert_count`` 0 (what converters write for a dense model) reads."""
    arch = key.split(".")[0]
    model = tiny_llama(n_kv_head=4) if arch == "gpt2" else tiny_llama()
    dense = write_gguf(tmp_path / "dense.gguf", model, arch=arch, kv={f"{arch}.expert_count": 0})
    if arch == "llama":
        assert read_gguf(dense, weights=False).metadata[f"{arch}.expert_count"] == 0
    bad = write_gguf(tmp_path / "bad.gguf", model, arch=arch, kv={key: 8})
    if arch == "gpt2":  # tiny_llama's keys under gpt2 are refused earlier (its MLP); the check itself:
        with pytest.raises(GGUFReadError) as e:
            _check_extras_and_vocab({key: 8}, bad, "gpt2", 10, "GPT")
        msg = str(e.value)
    else:
        msg = _refused(bad, "experts")
    assert msg == (f"{bad}: {key}=8: experts and sliding windows; gptforge's {what} does not implement it and "
                   "will not load the model wrong"), msg


def test_the_vocabulary_size_bounds(tmp_path):
    """1 to 2**20 tokens: a one-token vocabulary is a vocabulary; 2**20 + 1 (beyond any released
    model's, Gemma 3 has 262,144) is refused naming the bound. The header admits arrays of up to 2**22
    items, so this check is what bounds the embedding allocated later."""
    path = tmp_path / "m.gguf"
    for n in (1, 2, 1 << 20):
        _check_extras_and_vocab({"llama.vocab_size": n}, path, "llama", n, "Llama")
    for n in (0, (1 << 20) + 1):
        with pytest.raises(GGUFReadError) as e:
            _check_extras_and_vocab({}, path, "llama", n, "Llama")
        assert str(e.value) == f"{path}: tokenizer.ggml.tokens holds {n} tokens (1 to 1048576)"
    with pytest.raises(GGUFReadError) as e:
        _check_extras_and_vocab({"qwen2.vocab_size": 7}, path, "qwen2", 6, "Llama")
    assert str(e.value) == f"{path}: qwen2.vocab_size=7 but tokenizer.ggml.tokens holds 6"


def _ids(path: Path, text: str) -> list[int]:
    return read_gguf(path, weights=False).tokenizer.encode(text)


def test_llama3_takes_a_word_that_is_a_token_whole(tmp_path):
    """llama.cpp sets ``ignore_merges`` for Llama 3's vocabulary (llama-vocab.cpp: a piece that is itself
    a token is output whole, before any merge); GPT-2's does not. "abc" is a token no merge reaches."""
    tokens = [EOT] + _alphabet() + ["ab", "abc"]
    ab, abc, c = tokens.index("ab"), tokens.index("abc"), tokens.index("c")
    llama3 = _bpe_file(tmp_path / "l3.gguf", tokens, ["a b"], pre="llama-bpe")
    assert _ids(llama3, "abc") == [abc]
    gpt2 = _bpe_file(tmp_path / "g2.gguf", tokens, ["a b"], pre="gpt-2")
    assert _ids(gpt2, "abc") == [ab, c]


def test_llama3_regex_alone_splits_punctuation_and_its_newline(tmp_path):
    """Llama 3's regex keeps a punctuation run and the newlines after it as one piece
    (`` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*``), so the merge ". Ċ" applies (Llama 3's vocabulary has ".Ċ");
    a byte-level step that split again with GPT-2's regex would part them."""
    tokens = [EOT] + _alphabet() + [".Ċ"]
    path = _bpe_file(tmp_path / "l3.gguf", tokens, [". Ċ"], pre="llama-bpe")
    assert _ids(path, "a.\n") == [tokens.index("a"), tokens.index(".Ċ")]
