"""A GGUF's ``tokenizer.ggml.*`` keys, one at a time (issue 36, lane ``gguf``): what each key must hold
(llama.cpp's ``llama_vocab::load``: token ids inside the vocabulary, merges of two tokens, one type per
token) and the one-line refusal of anything else, naming the file, the key and the value. The header walk
hands ``tokenizer_from_gguf`` plain dicts (items as bytes, each array's item type and count), so these run
on dicts in milliseconds; test_gguf_tokenizer_edges.py and test_gguf_spm_tokenizer.py check whole files'
ids against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptforge.interop.gguf_tokenizer import PRE_TOKENIZERS, GGUFReadError, tokenizer_from_gguf
from tests.interop.test_gguf_read import _alphabet

PATH = Path("/models/tok.gguf")
STRING, UINT32, INT32, FLOAT32, BOOL = 8, 4, 5, 6, 7
EOT, START = "<|endoftext|>", "<|im_start|>"
TOKENS = [EOT, START, *_alphabet(), "ab", "abc"]
MERGES = ["a b", "ab c"]
TYPES = [3, 3] + [1] * 258


def bpe(**over):
    """(items, scalars, arrays) of a byte-level BPE vocabulary; ``key=None`` leaves a key out."""
    items = {"tokenizer.ggml.tokens": [t.encode() for t in TOKENS], "tokenizer.ggml.merges": [m.encode() for m in MERGES],
             "tokenizer.ggml.token_type": list(TYPES)}
    scalars = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.bos_token_id": 0,
               "tokenizer.ggml.eos_token_id": 0}
    for k, v in over.items():
        key = f"tokenizer.ggml.{k}" if k != "chat_template" else "tokenizer.chat_template"
        if key in items:
            items[key] = v
        else:
            scalars[key] = v
    items = {k: v for k, v in items.items() if v is not None}
    scalars = {k: v for k, v in scalars.items() if v is not None}
    arrays = {k: (INT32 if k.endswith("token_type") else STRING, len(v)) for k, v in items.items()}
    return items, scalars, arrays


def read(items, scalars, arrays):
    return tokenizer_from_gguf(items, scalars, arrays, PATH)


def refused(items, scalars, arrays) -> str:
    with pytest.raises(GGUFReadError) as e:
        read(items, scalars, arrays)
    msg = str(e.value)
    assert msg.startswith(f"{PATH}: ") and "\n" not in msg, msg
    return msg


def test_a_byte_level_vocabulary_reads_with_its_ends_and_template():
    tok, template, n = read(*bpe(bos_token_id=1, eos_token_id=0, chat_template="{{ messages }}"))
    assert n == len(TOKENS) and template == "{{ messages }}" and tok.chat_template == "{{ messages }}"
    assert (tok.bos_token_id, tok.eos_token_id, tok.eot_token) == (1, 0, 1)
    assert tok.encode_ordinary("abc ab") == [TOKENS.index("abc"), TOKENS.index("Ġ"), TOKENS.index("ab")]
    tok, template, _ = read(*bpe(bos_token_id=None, eos_token_id=1))
    assert (tok.bos_token_id, tok.eos_token_id, tok.eot_token, template) == (None, 1, 1, None)


@pytest.mark.parametrize("value", ["", None, 3, b"{{ x }}"])
def test_an_empty_or_non_string_chat_template_is_none(value):
    tok, template, _ = read(*bpe(chat_template=value))
    assert template is None and tok.chat_template is None


@pytest.mark.parametrize("model", [None, "bert", "GPT2", "t5", "rwkv", ""])
def test_other_tokenizer_models_are_refused(model):
    msg = refused(*bpe(model=model))
    assert msg == (f"{PATH}: tokenizer.ggml.model={model!r}: gptforge reads the byte-level BPE ('gpt2') and "
                   "SentencePiece ('llama') vocabularies only"), msg


@pytest.mark.parametrize("key", ["tokens", "merges"])
def test_tokens_and_merges_must_be_lists_of_strings(key):
    items, scalars, arrays = bpe()
    name = f"tokenizer.ggml.{key}"
    del items[name], arrays[name]
    assert refused(items, scalars, arrays) == f"{PATH}: {name} is missing or not a list of strings"
    items, scalars, arrays = bpe()
    arrays[name] = (UINT32, arrays[name][1])
    assert refused(items, scalars, arrays) == f"{PATH}: {name} is missing or not a list of strings"
    items, scalars, arrays = bpe()  # a scalar string under the key is not a list
    del items[name], arrays[name]
    scalars[name] = "a b"
    assert refused(items, scalars, arrays) == f"{PATH}: {name} is missing or not a list of strings"


def test_a_sentencepiece_vocabulary_checks_merges_only_when_it_has_them():
    """SentencePiece files may carry merges (llama.cpp ignores them; gptforge checks they are strings)."""
    items, scalars, arrays = bpe(model="llama")
    arrays["tokenizer.ggml.merges"] = (UINT32, 2)
    del items["tokenizer.ggml.merges"]
    assert refused(items, scalars, arrays) == f"{PATH}: tokenizer.ggml.merges is missing or not a list of strings"
    items, scalars, arrays = bpe(model="llama")
    del arrays["tokenizer.ggml.merges"], items["tokenizer.ggml.merges"]
    scalars["tokenizer.ggml.merges"] = 7
    assert refused(items, scalars, arrays) == f"{PATH}: tokenizer.ggml.merges is missing or not a list of strings"
    # no merges at all: on to the scores, which a SentencePiece vocabulary needs
    items, scalars, arrays = bpe(model="llama", merges=None)
    assert "tokenizer.ggml.scores is missing" in refused(items, scalars, arrays)


def test_no_tokens_and_a_token_that_is_not_utf8_are_refused():
    assert refused(*bpe(tokens=[])) == f"{PATH}: tokenizer.ggml.tokens is empty"
    bad = [t.encode() for t in TOKENS]
    bad[5] = b"\xff\xfe"
    assert refused(*bpe(tokens=bad)) == f"{PATH}: tokenizer.ggml.tokens holds a string that is not UTF-8"
    assert refused(*bpe(merges=[b"a b", b"\xc3 b"])) == f"{PATH}: tokenizer.ggml.merges holds a string that is not UTF-8"


@pytest.mark.parametrize("bad", ["ab", "a b c", "a  b", "a\tb", "x" * 100])
def test_a_merge_that_is_not_two_tokens_and_one_space_is_refused_naming_the_first(bad):
    msg = refused(*bpe(merges=[b"a b", bad.encode(), b"also bad here"]))
    assert msg == f"{PATH}: tokenizer.ggml.merges holds {bad!r:.60}, not two tokens joined by one space", msg
    assert len(msg) <= len(f"{PATH}: tokenizer.ggml.merges holds , not two tokens joined by one space") + 60  # cut


def test_token_types_must_be_integers_one_per_token():
    items, scalars, arrays = bpe()
    arrays["tokenizer.ggml.token_type"] = (FLOAT32, len(TYPES))
    assert refused(items, scalars, arrays) == f"{PATH}: tokenizer.ggml.token_type is not a list of integers"
    for n in (len(TYPES) - 1, len(TYPES) + 1):
        msg = refused(*bpe(token_type=[1] * n))
        assert msg == f"{PATH}: tokenizer.ggml.token_type has {n} entries for {len(TOKENS)} tokens", msg
    for itype in (0, 1, 2, 3, 4, 5, 10, 11):  # every GGUF integer type, uint8 to int64
        items, scalars, arrays = bpe()
        arrays["tokenizer.ggml.token_type"] = (itype, len(TYPES))
        assert read(items, scalars, arrays)[2] == len(TOKENS)
    items, scalars, arrays = bpe(token_type=None)  # no types: llama.cpp takes every token as normal
    assert read(items, scalars, arrays)[0].special_tokens == {EOT: 0}  # the ends named by id only


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "unknown_token_id"])
def test_a_special_token_id_must_be_inside_the_vocabulary(key):
    last = len(TOKENS) - 1
    for v in (-1, len(TOKENS), 1 << 40, True, False, "0", 0.0, [0]):
        msg = refused(*bpe(**{key: v}))
        assert msg == f"{PATH}: tokenizer.ggml.{key}={v!r} is not a token id (0 to {last})", msg
    assert read(*bpe(**{key: 1}))  # an id inside the vocabulary reads
    if key == "unknown_token_id":
        assert read(*bpe(**{key: last}))


def test_the_ends_are_named_by_id_and_a_vocabulary_without_one_is_refused():
    tok = read(*bpe(bos_token_id=1, eos_token_id=None))[0]
    assert (tok.bos_token_id, tok.eot_token) == (1, 1)
    assert read(*bpe(bos_token_id=None, eos_token_id=None))[0].eot_token == 0  # <|endoftext|>, a control token
    with pytest.raises(GGUFReadError) as e:  # no special token at all: the tokenizer's own refusal, one line
        read(*bpe(bos_token_id=None, eos_token_id=None, token_type=[1] * len(TYPES)))
    assert str(e.value).startswith(f"{PATH} (tokenizer.ggml.*): no bos or eos special token") and "\n" not in str(e.value)


def test_a_byte_level_vocabulary_needs_a_known_pre_tokenizer():
    known = ", ".join(sorted(PRE_TOKENIZERS))
    for pre in (None, 3):
        msg = refused(*bpe(pre=pre))
        assert msg == (f"{PATH}: tokenizer.ggml.pre is missing; gptforge reproduces llama.cpp's split for {known} "
                       "only, not its 'default' one"), msg
    assert "tokenizer.ggml.pre='deepseek-llm'" in refused(*bpe(pre="deepseek-llm"))


SPM = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], "▁", "a", "b", "▁a"]


def _spm_dicts(extra: list[tuple[str, float]], merges: list[str] | None = None, types: bool = True, **flags):
    """(items, scalars, arrays) of a SentencePiece vocabulary: SPM's head (unk, bos, eos, the 256 byte
    tokens), then ``extra`` (piece, score); ``flags`` are ``tokenizer.ggml.*`` keys (llama.cpp's defaults
    where absent)."""
    tokens = SPM[:259] + [t for t, _ in extra]
    items = {"tokenizer.ggml.tokens": [t.encode() for t in tokens],
             "tokenizer.ggml.scores": [0.0] * 259 + [s for _, s in extra]}
    arrays = {"tokenizer.ggml.tokens": (STRING, len(tokens)), "tokenizer.ggml.scores": (FLOAT32, len(tokens))}
    if types:
        items["tokenizer.ggml.token_type"] = [2, 3, 3] + [6] * 256 + [1] * len(extra)
        arrays["tokenizer.ggml.token_type"] = (INT32, len(tokens))
    if merges is not None:
        items["tokenizer.ggml.merges"] = [m.encode() for m in merges]
        arrays["tokenizer.ggml.merges"] = (STRING, len(merges))
    scalars = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
               "tokenizer.ggml.unknown_token_id": 0, **{f"tokenizer.ggml.{k}": v for k, v in flags.items()}}
    return items, scalars, arrays


def spm(**flags):
    """SPM itself (its last four pieces scored 0), with ``flags``."""
    return _spm_dicts([(t, 0.0) for t in SPM[259:]], **flags)


@pytest.mark.parametrize("key", ["add_space_prefix", "add_bos_token", "add_eos_token"])
def test_sentencepiece_flags_must_be_booleans(key):
    for v in (1, 0, "true", None.__class__):
        msg = refused(*spm(**{key: v}))
        assert msg == f"{PATH}: tokenizer.ggml.{key}={v!r} is not a boolean", msg


def test_sentencepiece_flags_default_as_llama_cpp_and_reach_the_tokenizer():
    """llama.cpp's defaults: a space prefix and bos added, no eos. Each flag set the other way changes the ids."""
    enc = lambda **kw: read(*spm(**kw))[0]._tok.encode("a").ids  # noqa: E731  (the flags' own effect)
    a, sp_a = SPM.index("a"), SPM.index("▁a")
    assert enc() == [1, sp_a]
    assert enc(add_space_prefix=False) == [1, a]
    assert enc(add_bos_token=False) == [sp_a]
    assert enc(add_eos_token=True) == [1, sp_a, 2]
    assert enc(add_space_prefix=True, add_bos_token=True, add_eos_token=False) == [1, sp_a]


def _spm_vocab(extra: list[tuple[str, float]], merges: list[str] | None = None, types: bool = True, **flags):
    """(tokens, the tokenizer) of :func:`_spm_dicts`' vocabulary, no bos added unless ``flags`` say so."""
    items, scalars, arrays = _spm_dicts(extra, merges, types, **{"add_bos_token": False, **flags})
    return [b.decode() for b in items["tokenizer.ggml.tokens"]], read(items, scalars, arrays)[0]


def test_sentencepiece_merges_a_file_carries_are_not_used():
    """The scores prefer "bc" (-1) over "ab" (-5), so llama.cpp's SentencePiece tokenizer (the best-scoring
    merged piece first) splits "abc" as a|bc. llama.cpp reads no ``tokenizer.ggml.merges`` for this model, so a
    file whose merges rank "a b" first splits the same way (transformers' GGUF loader would take them: ab|c)."""
    extra = [("a", 0.0), ("b", 0.0), ("c", 0.0), ("ab", -5.0), ("bc", -1.0)]
    tokens, by_scores = _spm_vocab(extra, add_space_prefix=False)
    assert [tokens[i] for i in by_scores.encode_ordinary("abc")] == ["a", "bc"]
    tokens, with_merges = _spm_vocab(extra, merges=["a b", "b c"], add_space_prefix=False)
    assert [tokens[i] for i in with_merges.encode_ordinary("abc")] == ["a", "bc"]


def test_a_sentencepiece_token_no_merge_reaches_is_spelled_out():
    """llama.cpp's SentencePiece tokenizer merges adjacent pieces whose join is a token: "abc" with no "ab" or
    "bc" is never reached from a, b, c, so a whole-word match (``ignore_merges``) must not take it."""
    tokens, tok = _spm_vocab([("a", 0.0), ("b", 0.0), ("c", 0.0), ("abc", 5.0)], add_space_prefix=False)
    assert [tokens[i] for i in tok.encode_ordinary("abc")] == ["a", "b", "c"]


@pytest.mark.parametrize("prefix", [True, False])
def test_the_saved_sentencepiece_tokenizer_json_decodes_back_to_the_text(prefix, tmp_path):
    """The tokenizer.json a checkpoint keeps (and ``export hf`` hands on) is read by the tokenizers library on
    its own: its decoder gives back the text ('▁' as a space, bytes from their <0xXX> tokens, the one space
    the normalizer prepended with ``add_space_prefix`` dropped, no other). gptforge's own decode joins the
    pieces' bytes and never runs that decoder, so only a reader of the saved file sees it."""
    from tokenizers import Tokenizer as RustTokenizer

    from gptforge.data.tokenizer.bundle import save_tokenizer

    extra = [("▁", 0.0), ("a", 0.0), ("b", 0.0), ("▁a", -1.0)]
    _, tok = _spm_vocab(extra, add_space_prefix=prefix)
    save_tokenizer(tok, tmp_path)
    theirs = RustTokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    # (text that begins with a space gets its '▁' too, as in llama.cpp: the decoder drops exactly that one)
    for text in ("a a", "a  b", "a ", "ab\nb é", "a  ", "  a", " a"):
        ids = tok.encode_ordinary(text)
        assert theirs.encode(text, add_special_tokens=False).ids == ids
        assert theirs.decode(ids) == text, (text, ids)
    assert len(tok.encode_ordinary(" a")) == (2 if prefix else 1)  # "▁" "▁a", or "▁a"


def test_sentencepiece_without_token_types_has_only_its_named_ends_special():
    tokens, tok = _spm_vocab([("a", 0.0)], types=False)
    assert tok.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2} and len(tokens) == 260


def test_sentencepiece_eos_alone_goes_after_the_text():
    enc = lambda **kw: read(*spm(**kw))[0]._tok.encode("a").ids  # noqa: E731
    assert enc(add_bos_token=False, add_eos_token=True) == [SPM.index("▁a"), 2]
    assert enc(add_bos_token=True, add_eos_token=True) == [1, SPM.index("▁a"), 2]


def test_a_sentencepiece_vocabulary_without_every_byte_token_is_refused():
    items, scalars, arrays = spm()
    items["tokenizer.ggml.tokens"] = [t.encode() if t != "<0x41>" else b"A" for t in SPM]
    msg = refused(items, scalars, arrays)
    assert msg == (f"{PATH}: tokenizer.ggml.tokens lacks the byte token <0x41> (1 of the 256 missing); gptforge "
                   "converts SentencePiece vocabularies with byte fallback only"), msg


def test_the_tokenizer_is_named_after_the_file():
    assert read(*bpe())[0].name == "tok" and read(*spm())[0].name == "tok"


def test_a_file_merge_splits_at_its_one_space_only():
    """A merge is two tokens joined by one space; a token may hold other whitespace (a newline here), which
    is part of the token, not a separator: such a file is read (its merges checked, the scores used)."""
    extra = [("a", 0.0), ("b", 0.0), ("\n", 0.0), ("a\n", -1.0), ("a\nb", -2.0)]
    tokens, tok = _spm_vocab(extra, merges=["a \n", "a\n b"], add_space_prefix=False)
    assert [tokens[i] for i in tok.encode_ordinary("a\nb")] == ["a\nb"]


def test_the_saved_sentencepiece_tokenizer_json_gives_type_ids_as_transformers(tmp_path):
    """One text: type id 0 throughout; a pair: 0 for the first, 1 for the second (TemplateProcessing's $A:0,
    $B:1, which transformers' Llama tokenizer writes)."""
    from tokenizers import Tokenizer as RustTokenizer

    from gptforge.data.tokenizer.bundle import save_tokenizer

    _, tok = _spm_vocab([("▁", 0.0), ("a", 0.0), ("b", 0.0), ("▁a", -1.0)], add_bos_token=True)
    save_tokenizer(tok, tmp_path)
    theirs = RustTokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    one = theirs.encode("a a")
    assert one.ids[0] == 1 and one.type_ids == [0] * len(one.ids)
    pair = theirs.encode("a", "b")
    first = len(theirs.encode("a").ids)
    assert pair.type_ids == [0] * first + [1] * (len(pair.ids) - first) and len(pair.ids) > first
