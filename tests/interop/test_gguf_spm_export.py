"""``export gguf`` of a model whose tokenizer is a SentencePiece vocabulary (Llama 2, Mistral, TinyLlama; read
from a GGUF "llama" vocabulary or a Hugging Face tokenizer.json of that shape): llama.cpp's SentencePiece keys
(tokens, scores, token types, the flags), so a GGUF model goes out as it came in (issue 32).

The reference is transformers' own GGUF loader, on the file gptforge wrote and on the original one: the same
ids for ~300 strings (spaces, newlines, digits, byte fallback, control and user-defined tokens), and
gptforge's reader of the written file agrees with llama.cpp's split of them (``llama_cpp_ids``). The files are tiny Llamas written in
tests/interop/test_gguf_spm_tokenizer.py's way (a hand vocabulary with tied scores, a trained one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from tests.interop.test_gguf_spm_tokenizer import VOCABS, _hf, cuts, llama_cpp_ids, texts, write_spm_gguf  # noqa: E402


def _src(tmp_path: Path, which: str, **flags) -> Path:
    tokens, scores, types = VOCABS[which]()
    (tmp_path / "in").mkdir()
    return write_spm_gguf(tmp_path / "in" / "m.gguf", tokens, scores, types,
                          kv={f"tokenizer.ggml.{k}": v for k, v in flags.items()})


def _export(src: Path, out: Path, capsys) -> Path:
    assert main(["export", "gguf", "--gguf", str(src), "--out", str(out), "--dtype", "f32"]) == 0, \
        capsys.readouterr().err
    files = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["files"]
    return Path(files[0])


@pytest.mark.parametrize("which", sorted(VOCABS))
def test_a_sentencepiece_model_goes_back_out_to_gguf(tmp_path, capsys, which):
    tokens = VOCABS[which]()[0]
    src = _src(tmp_path, which, add_space_prefix=True, add_bos_token=True)
    out = _export(src, tmp_path / "out", capsys)
    strs = texts()
    want = _hf(src)(strs, split_special_tokens=True).input_ids  # bos added, as the original file says
    assert _hf(out)(strs, split_special_tokens=True).input_ids == want
    assert _hf(out)(strs, add_special_tokens=False).input_ids == _hf(src)(strs, add_special_tokens=False).input_ids
    ours = read_gguf(out, weights=False).tokenizer
    hf = _hf(src)
    user, _ = cuts(tokens)  # split as llama.cpp splits it: a '▁' before each stretch of text
    assert [ours.encode_ordinary(s) for s in strs] == \
        [llama_cpp_ids(lambda t: hf(t, add_special_tokens=False, split_special_tokens=True).input_ids, user, s)
         for s in strs]
    # the keys themselves: llama.cpp's SentencePiece model, each token at its id with its type, bos/eos/unk
    r = gguf.GGUFReader(str(out))

    def field(key):
        f = r.fields[key]
        return [f.parts[i].tolist() for i in f.data]

    assert bytes(field("tokenizer.ggml.model")[0]).decode() == "llama"
    got = [bytes(t).decode() for t in field("tokenizer.ggml.tokens")]
    last = {t: i for i, t in enumerate(tokens)}  # a token listed twice ("is") keeps its last id, as every reader
    assert [got[i] for i in last.values()] == list(last)
    got_types = [t[0] for t in field("tokenizer.ggml.token_type")]
    assert [got_types[i] for i in range(3, 259)] == [6] * 256  # <0x00> ... <0xFF>: byte tokens
    assert got_types[0] == 2 and got_types[1] == got_types[2] == 3  # <unk>, <s>, </s>
    assert got_types[tokens.index("<think>")] == 4 and got_types[tokens.index("<|im_end|>")] == 3
    assert [field(f"tokenizer.ggml.{k}")[0][0] for k in ("bos_token_id", "unknown_token_id")] == [1, 0]
    assert field("tokenizer.ggml.add_bos_token")[0][0] is True
    assert field("tokenizer.ggml.add_space_prefix")[0][0] is True


def test_without_a_space_prefix_and_without_bos(tmp_path, capsys):
    src = _src(tmp_path, "hand", add_space_prefix=False, add_bos_token=False)
    out = _export(src, tmp_path / "out", capsys)
    a, b = read_gguf(src, weights=False).tokenizer, read_gguf(out, weights=False).tokenizer
    strs = texts(100, seed=3)
    assert [b.encode_ordinary(s) for s in strs] == [a.encode_ordinary(s) for s in strs]
    from tokenizers import Tokenizer

    assert Tokenizer.from_str(b._text).encode("the").ids == Tokenizer.from_str(a._text).encode("the").ids  # no bos


def _spm_json_tokenizer(tmp_path: Path, **change):
    """A trained Metaspace BPE with byte fallback, as transformers' Llama tokenizer.json holds one, changed."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from gptforge.data.tokenizer.hf_kind import HFTokenizer

    t = Tokenizer(models.BPE(byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    t.train_from_iterator(["the quick brown fox jumps over the lazy dog, then the cat"] * 20,
                          trainers.BpeTrainer(vocab_size=120, show_progress=False, special_tokens=["<unk>", "<s>", "</s>"],
                                              initial_alphabet=[f"<0x{b:02X}>" for b in range(256)]))
    doc = json.loads(t.to_str())
    for piece in change.pop("extra", []):
        doc["model"]["vocab"][piece] = len(doc["model"]["vocab"]) + 3
    for k, v in change.items():
        doc[k] = {**doc[k], **v} if isinstance(v, dict) and isinstance(doc.get(k), dict) else v
    return HFTokenizer(json.dumps(doc), name="spm", bos="<s>", eos="</s>")


@pytest.mark.parametrize("change,words", [
    ({"pre_tokenizer": {"prepend_scheme": "always"}}, "prepend_scheme 'always'"),
    ({"pre_tokenizer": {"split": True}}, "split True"),
    ({"normalizer": {"type": "Lowercase"}}, "normalizer"),
    # "abc" is "ab"+"c" or "a"+"bc": a SentencePiece vocabulary's scores make both merges, this BPE lists one
    ({"model": {"merges": ["a b", "b c", "ab c"]}, "extra": ["ab", "bc", "abc"]}, "merges are not in the order"),
])
def test_shapes_llama_cpp_cannot_express_are_refused_by_name(tmp_path, change, words):
    from gptforge.interop.gguf import spm_vocab

    tok = _spm_json_tokenizer(tmp_path, **change)
    with pytest.raises(ValueError, match="export hf instead") as e:
        spm_vocab(tok, 512)
    assert words in str(e.value) and "Metaspace" in str(e.value)


def test_a_byte_level_bpe_is_not_taken_for_sentencepiece(tmp_path):
    from gptforge.data.tokenizer import gpt2_tokenizer
    from gptforge.interop.gguf import spm_vocab

    assert spm_vocab(gpt2_tokenizer(), 50304) is None


def test_a_merge_whose_piece_is_not_in_the_vocabulary_is_refused():
    """(``tokenizers`` refuses such a file itself; a tokenizer object built another way meets this check.)"""
    from types import SimpleNamespace

    from gptforge.interop.gguf import spm_vocab

    doc = {"model": {"type": "BPE", "byte_fallback": True, "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
           "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
           "normalizer": None}
    tok = SimpleNamespace(kind="hf", _json=doc, describe=lambda: "tokenizer 'x'")
    with pytest.raises(ValueError, match="merge 'a' \\+ 'b' does not make a token of its vocabulary"):
        spm_vocab(tok, 8)
    doc["model"]["vocab"]["ab"] = 2
    assert spm_vocab(tok, 8)["scores"][:3] == [0.0, 0.0, -1.0]
    doc["model"]["vocab"]["ab"] = 9
    with pytest.raises(ValueError, match="token 'ab' has id 9, outside the model's 8 rows"):
        spm_vocab(tok, 8)


def test_pieces_of_one_score_whose_merges_interleave_keep_one_score():
    """Two pieces of equal score sort their merges by the pieces' lengths: "ab"+"c", "xy"+"z", then "a"+"bc".
    One score per merged piece would put "a"+"bc" before "xy"+"z"; the exporter keeps them at one score."""
    from types import SimpleNamespace

    from gptforge.interop.gguf import spm_vocab
    from gptforge.interop.gguf_tokenizer import spm_merges

    tokens = ["a", "b", "c", "x", "y", "z", "ab", "bc", "xy", "abc", "xyz"]
    scores = [0.0] * 6 + [-1.0, -2.0, -3.0, -4.0, -4.0]
    merges = spm_merges(tokens, scores)
    assert merges[-3:] == [["ab", "c"], ["xy", "z"], ["a", "bc"]]
    doc = {"model": {"type": "BPE", "byte_fallback": True, "vocab": {t: i for i, t in enumerate(tokens)},
                     "merges": [" ".join(m) for m in merges]},
           "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
           "normalizer": None}
    got = spm_vocab(SimpleNamespace(kind="hf", _json=doc, describe=lambda: "tokenizer 'x'"), len(tokens))
    assert spm_merges(tokens, got["scores"]) == merges
    assert got["scores"][9] == got["scores"][10] < min(got["scores"][6:9]) <= max(got["scores"][6:9]) < 0
