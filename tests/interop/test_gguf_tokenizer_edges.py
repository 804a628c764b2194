"""The tokenizer inside a GGUF file against transformers' own GGUF loader, on the edges the common tests
do not reach (issues 32 and 36): a token stored twice, merges whose order decides the split, bos/eos
named by id but typed normal, and SentencePiece's flags. Each file is written small with the ``gguf``
package's ``GGUFWriter``; transformers reads the same file (``AutoTokenizer.from_pretrained(gguf_file=)``)
and must give the ids gptforge gives."""

from __future__ import annotations

from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from tests.interop.test_gguf_read import _alphabet, add_llama_hparams, tiny_llama, write_f32_tensors, write_gguf  # noqa: E402

EOT = "<|endoftext|>"  # a control token: gptforge's tokenizer needs a document separator


def _bpe_file(path: Path, tokens: list[str], merges: list[str], types: list[int] | None = None,
              pre: str = "gpt-2", bos: int | None = None, eos: int | None = None) -> Path:
    """A vocabulary-only llama GGUF (byte-level BPE): the keys a reader needs and a one-layer model."""


    model = tiny_llama(vocab=len(tokens), n_layer=1, n_embd=32, n_head=2, n_kv_head=2)
    w = gguf.GGUFWriter(str(path), "llama")
    cfg = model.config
    add_llama_hparams(w, cfg)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types != []:  # [] leaves tokenizer.ggml.token_type out
        w.add_token_types(types or [3 if t == EOT else 1 for t in tokens])
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    write_f32_tensors(w, model)
    return path


def _theirs(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def test_a_token_stored_twice_keeps_its_last_id_as_transformers(tmp_path):
    """A byte-level vocabulary holding "Ġthe" at two ids: llama.cpp (``token_to_id[word] = i``) and
    transformers (a dict built in file order) both keep the LAST id; text containing " the" must encode
    to that id."""
    tokens = [EOT, *_alphabet(), "Ġt", "he", "Ġthe", "ab", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he", "a b"]
    path = _bpe_file(tmp_path / "dup.gguf", tokens, merges, eos=0)
    ours, theirs = read_gguf(path, weights=False).tokenizer, _theirs(path)
    last = len(tokens) - 1
    for text in (" the", "ab the the", "x the"):
        want = _ids(theirs, text)
        assert last in want and tokens.index("Ġthe") not in want, (text, want)  # the fixture's own claim: transformers keeps the last
        assert ours.encode_ordinary(text) == want, text
    assert ours.decode([last]) == " the"


def test_merge_order_decides_the_split_as_transformers(tmp_path):
    """"a b" before "b c": "abc" is "ab"+"c"; the other order gives "a"+"bc". Both files against
    transformers, so a reader that reverses or re-sorts the merges fails one of them."""
    for merges, want in ((["a b", "b c"], ["ab", "c"]), (["b c", "a b"], ["a", "bc"])):
        tokens = [EOT, *_alphabet(), "ab", "bc"]
        path = _bpe_file(tmp_path / f"{merges[0][0]}.gguf", tokens, merges, eos=0)
        ours, theirs = read_gguf(path, weights=False).tokenizer, _theirs(path)
        ids = ours.encode_ordinary("abc")
        assert ids == _ids(theirs, "abc")
        assert [tokens[i] for i in ids] == want


def test_bos_and_eos_named_by_id_are_special_even_typed_normal(tmp_path):
    """A file whose bos/eos ids point at tokens typed NORMAL (1): llama.cpp still treats them as its
    bos/eos, so gptforge matches their text whole as special tokens and never splits them."""
    tokens = [*_alphabet(), "<s>", "</s>", "ab"]
    path = _bpe_file(tmp_path / "be.gguf", tokens, ["a b"], bos=256, eos=257)
    tok = read_gguf(path, weights=False).tokenizer
    assert tok.bos_token_id == 256 and tok.eos_token_id == 257
    assert {"<s>", "</s>"} <= set(tok.special_tokens)
    assert tok.encode("x</s>", allowed_special="all") == [tokens.index("x"), 257]
    assert 257 not in tok.encode_ordinary("x</s>")


def test_spm_merges_are_transformers_generate_merges():
    """``spm_merges`` (the merges a SentencePiece vocabulary implies) is transformers' own
    ``generate_merges`` over the same vocabulary: ties of score, a token stored twice (its last id and
    score), and an empty token (no split has an empty side). Lengths that disagree are an error."""
    from transformers.tokenization_utils_base import generate_merges

    from gptforge.interop.gguf_tokenizer import spm_merges

    tokens = ["", "a", "b", "c", "ab", "bc", "abc", "ca", "cab", "b", "abca", "bca"]
    scores = [0.0, -1.0, -1.0, -1.0, -2.0, -2.0, -3.0, -2.0, -3.0, -5.0, -4.0, -3.0]
    vocab = {t: i for i, t in enumerate(tokens)}
    want = [list(m) for m in generate_merges(vocab, dict(zip(tokens, scores, strict=True)))]
    got = spm_merges(tokens, scores)
    assert got == want and len(got) > 8
    assert all(left and right for left, right in got)
    with pytest.raises(ValueError):
        spm_merges(tokens, scores[:-1])


def test_spm_score_refusals_name_the_key_and_type(tmp_path):
    """The scores' refusals say what is wrong: missing (a SentencePiece vocabulary needs one score per
    token), or stored as another GGUF item type (named by its number: 5 is int32)."""
    from tests.interop.test_gguf_spm_tokenizer import hand_vocab, write_spm_gguf

    tokens, scores, types = hand_vocab()
    path = write_spm_gguf(tmp_path / "noscores.gguf", tokens, None, types)
    with pytest.raises(GGUFReadError, match=r"tokenizer\.ggml\.scores is missing: a SentencePiece vocabulary "
                                            r"\(tokenizer\.ggml\.model='llama'\) needs one score per token$"):
        read_gguf(path, weights=False)
    path = write_spm_gguf(tmp_path / "int.gguf", tokens, [int(s) for s in scores], types,
                          scores_type=gguf.GGUFValueType.INT32)
    with pytest.raises(GGUFReadError, match=r"tokenizer\.ggml\.scores is not a list of floats \(GGUF item type 5\)$"):
        read_gguf(path, weights=False)


def test_an_unknown_pre_tokenizer_is_refused_naming_the_known_ones(tmp_path):
    """``tokenizer.ggml.pre`` that gptforge has no llama.cpp split for: one line naming the file, the value
    and every name it does know, sorted, so the user sees what would load."""
    path = _bpe_file(tmp_path / "pre.gguf", [EOT, *_alphabet(), "ab"], ["a b"], pre="deepseek-llm", eos=0)
    with pytest.raises(GGUFReadError) as e:
        read_gguf(path, weights=False)
    assert str(e.value) == (f"{path}: tokenizer.ggml.pre='deepseek-llm': gptforge knows how llama.cpp splits text "
                            "for gpt-2, llama-bpe, llama-v3, llama3, qwen2, smollm, starcoder only")



UD_TOKENS = [EOT, *_alphabet(), "ab", "a b"]  # "a b": user-defined, stored as its text (a real space)
UD_TYPES = [3] + [1] * 257 + [4]


def test_a_user_defined_token_stored_as_text_reads_and_a_file_without_types_reads(tmp_path):
    """llama.cpp stores a user-defined token as its text ("a b", a real space), outside the byte
    alphabet: gptforge spells it from its UTF-8 bytes for the BPE model and adds it as a plain added
    token, so the file reads and the id decodes to the text. A file with no ``tokenizer.ggml.token_type``
    at all reads as all-normal tokens, bos/eos special by their ids."""
    path = _bpe_file(tmp_path / "ud.gguf", UD_TOKENS, ["a b"], types=UD_TYPES, eos=0)
    tok = read_gguf(path, weights=False).tokenizer
    assert tok.decode([len(UD_TOKENS) - 1]) == "a b" and tok.encode_ordinary("ab") == [UD_TOKENS.index("ab")]
    notypes = read_gguf(_bpe_file(tmp_path / "nt.gguf", UD_TOKENS[:-1], ["a b"], types=[], eos=0), weights=False)
    tok = notypes.tokenizer
    assert tok.eos_token_id == 0 and set(tok.special_tokens) == {EOT}
    assert tok.encode_ordinary("abx") == [UD_TOKENS.index("ab"), UD_TOKENS.index("x")]


def test_a_user_defined_token_stored_as_text_encodes_to_its_own_id(tmp_path):
    """tokenizers gives an added token whose content is not a key of the BPE model's vocab a new id past the
    vocabulary (tokenizer.json's "id" is not used), so "a b" (a real space, outside the byte alphabet) encoded
    to len(tokens): its text is now the vocab key, and it encodes to its own id, as in llama.cpp."""
    path = _bpe_file(tmp_path / "ud.gguf", UD_TOKENS, ["a b"], types=UD_TYPES, eos=0)
    tok = read_gguf(path, weights=False).tokenizer
    assert tok.encode_ordinary("xa b") == [UD_TOKENS.index("x"), len(UD_TOKENS) - 1]


def test_added_tokens_match_where_transformers_matches_them(tmp_path):
    """Control and user-defined tokens are matched inside words and keep the spaces around them (no
    single_word, lstrip or rstrip), as transformers' GGUF loader adds them: the same ids on text that
    puts them against letters and between spaces."""
    path = write_gguf(tmp_path / "m.gguf", tiny_llama(), pre="gpt-2")
    ours, theirs = read_gguf(path, weights=False).tokenizer, _theirs(path)
    for text in ("x<think>y", "a <think> b", "x <|im_end|> y", "<|im_start|>user\n the<|im_end|>", " <think>"):
        assert ours.encode(text, allowed_special="all") == _ids(theirs, text), text


def test_a_user_defined_token_that_a_merge_makes_keeps_its_spelled_piece(tmp_path):
    """When a merge makes the user-defined token's spelled piece ("a" + "Ġb" = "aĠb", the bytes of "a b"), the
    BPE model needs that piece in its vocab, so it stays the key: the file reads, "a b" in text still
    encodes by the merges to the token's id, and the id decodes to the text."""
    tokens = [EOT, *_alphabet(), "Ġb", "a b"]
    path = _bpe_file(tmp_path / "m.gguf", tokens, ["Ġ b", "a Ġb"], types=UD_TYPES, eos=0)
    tok = read_gguf(path, weights=False).tokenizer
    assert tok.decode([len(tokens) - 1]) == "a b" and tok.encode_ordinary("x b") == [tokens.index("x"), len(tokens) - 2]
