"""SentencePiece GGUF vocabularies (``tokenizer.ggml.model`` "llama": Llama 2, Mistral, TinyLlama) read as
tokenizers (issue 32: any GGUF model in every command), split as llama.cpp splits them (issue 57).

The files are written here with ``gguf.GGUFWriter`` (a tiny Llama, a vocabulary of tokens, scores and
token types as llama.cpp's converter stores them: ``<unk>``/``<s>``/``</s>``, the 256 ``<0xXX>`` byte
tokens, pieces spelled with '▁'). The reference for the merges is transformers' own GGUF loader of the same
file (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``): ids on plain words, runs of spaces, newlines,
digits, unicode and characters missing from the vocabulary (byte fallback), a chat template rendered
with control tokens, and bos from the post-processor. Where the space goes is llama.cpp's rule
(``llama_vocab::impl::tokenize``, SPM): control and user-defined tokens are cut out of the text, and each
stretch left gets one space before it, even one that begins with a space; transformers' loader prepends
'▁' only at the start of the whole text and only where it does not begin with a space, so it is asked for
each stretch with that space already in front (``llama_cpp_ids``). Two vocabularies: one by hand (pieces of
equal score, a piece reachable by two splits), one trained (``tokenizers`` BPE, Metaspace, byte fallback;
scores -id as SentencePiece's BPE writes them). tests/interop/test_tokenizer_strings.py compares a
SentencePiece-trained vocabulary with the ``sentencepiece`` library itself.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from gptforge.load import ModelSource, load_chat_template_of, load_tokenizer_of  # noqa: E402
from tests.interop.test_gguf_read import add_llama_hparams, tiny_llama, write_f32_tensors  # noqa: E402

HEAD = [("<unk>", 2), ("<s>", 3), ("</s>", 3)] + [(f"<0x{b:02X}>", 6) for b in range(256)]
TAIL = [("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4)]  # control, control, user-defined
CHARS = ["▁"] + list("abcdefghijklmnopqrstuvwxyzTHI0123456789.,!?'[]/") + ["é", "中"]
# (piece, score): "ab" and "bc" tie, and "abc" is made from either; "xy" and "yz" tie with no "xyz": "xyz" is
# "xy"+"z" (the earlier token's merge first, as transformers orders them; llama.cpp: the leftmost pair);
# "rs" and "pqr" tie: "pqrs" is "pqr"+"s" (the longer left piece first; llama.cpp: the leftmost pair);
# "▁the" from "▁t"+"he" or "▁th"+"e"; runs of '▁' merge as their own pieces; "is" twice (its last id and
# score count, in transformers as in llama.cpp)
PIECES = [("▁t", -1), ("he", -2), ("▁the", -3), ("▁th", -4), ("in", -5), ("▁a", -6), ("▁▁", -7), ("▁▁▁▁", -8),
          ("ab", -9), ("bc", -9), ("abc", -10), ("▁is", -11), ("is", -12), ("12", -13), ("▁1", -14), ("INST", -15),
          ("▁[", -16), ("ST", -17), ("IN", -18), ("▁this", -19), ("th", -20), ("xy", -21), ("yz", -21),
          ("pq", -22), ("rs", -23), ("pqr", -23), ("is", -24)]

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
LLAMA2 = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]" \
         "{% else %} {{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
CONV = [{"role": "user", "content": "is this the abc?"}, {"role": "assistant", "content": " 12 in\nthe  hat é中ü"},
        {"role": "user", "content": "  the 1234 <think> [x]"}, {"role": "assistant", "content": "the end"}]

WORDS = ["the", "this", "is", "abc", "bc", "xyz", "wxyz", "pqrs", "in", "12", "1234", "[INST]", "THIS", "é", "中", "ü", "🙂", "Ж", "a",
         "<think>", "<s>", "</s>", "<|im_start|>", "<unk>", "<0x41>", "▁", "x"]
GAPS = [" ", "  ", "   ", "    ", "\n", "\n\n", "\t", " \n ", "", "", "."]
FIXED = ["the this", "  two  spaces", "trailing   ", "   ", " ", "", "a\nb", "\n\nthe", "1234 12 3", "xé中ü🙂",
         "naïve café 東京", "abc abcbc bcabc", "xyz", "pqrs", "the<think>the", "[INST] hi [/INST]", "<s>the</s>", "▁the"]


def texts(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return FIXED + ["".join(rng.choice(WORDS) + rng.choice(GAPS) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def hand_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = [t for t, _ in HEAD] + CHARS + [p for p, _ in PIECES] + [t for t, _ in TAIL]
    scores = [0.0] * len(HEAD) + [-1000.0 - i for i in range(len(CHARS))] + [float(s) for _, s in PIECES] + \
             [0.0] * len(TAIL)
    types = [k for _, k in HEAD] + [1] * (len(CHARS) + len(PIECES)) + [k for _, k in TAIL]
    return tokens, scores, types


def trained_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style BPE trained here: Metaspace, byte fallback; the trainer's tokens by id, after
    the control and byte tokens, each scored -id (SentencePiece's BPE: the earlier merge scores higher)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = ["the quick brown fox jumps over the lazy dog 12 times.", "In 2024 there were 1,234 dogs; then 56.",
              "  indented text\nwith newlines\n\nand tabs\tthere", "naïve café résumé — Привет мир 中文 テキスト",
              "Is this the real life? Is this just fantasy?", "[INST] what is 2+2? [/INST] four"] * 30
    t = Tokenizer(models.BPE(byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    t.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    pieces = [p for p, _ in sorted(t.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = [t for t, _ in HEAD] + pieces + [t for t, _ in TAIL]
    scores = [0.0] * len(HEAD) + [-float(i) for i in range(len(pieces))] + [0.0] * len(TAIL)
    types = [k for _, k in HEAD] + [1] * len(pieces) + [k for _, k in TAIL]
    return tokens, scores, types


VOCABS = {"hand": hand_vocab, "trained": trained_vocab}


def write_spm_gguf(path: Path, tokens: list[str], scores, types: list[int] | None, template: str = CHATML,
                   kv: dict | None = None, scores_type=gguf.GGUFValueType.FLOAT32, model: str = "llama",
                   special_ids: bool = True) -> Path:
    """A tiny Llama GGUF carrying a SentencePiece vocabulary under llama.cpp's keys; ``kv``: extra keys
    (bool, int (uint32) or str values), ``None`` for scores or types leaves that key out; ``special_ids``
    false leaves out the unk, bos and eos ids."""
    m = tiny_llama(vocab=len(tokens), n_layer=1)
    cfg = m.config
    w = gguf.GGUFWriter(str(path), "llama")
    add_llama_hparams(w, cfg)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    if scores is not None:
        w.add_key_value("tokenizer.ggml.scores", list(scores), gguf.GGUFValueType.ARRAY, sub_type=scores_type)
    if types is not None:
        w.add_token_types(types)
    if special_ids:
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    for k, v in (kv or {}).items():
        (w.add_bool if isinstance(v, bool) else w.add_uint32 if isinstance(v, int) else w.add_string)(k, v)
    w.add_chat_template(template)
    write_f32_tensors(w, m)
    return path


def llama_cpp_ids(encode_text, cut: dict[str, int], s: str, prefix: bool = True) -> list[int]:
    """``s`` as llama.cpp's SentencePiece tokenize gives it: the tokens in ``cut`` (text -> id: the user-defined
    ones, and the control ones where special text is parsed) taken out of the text, longest first; each stretch
    of text left, with one space in front where ``prefix`` (add_space_prefix), through ``encode_text``, an
    engine that must prepend nothing to text that begins with a space."""
    import re

    if not cut:
        return encode_text((" " if prefix else "") + s) if s else []
    out: list[int] = []
    pattern = "(" + "|".join(re.escape(t) for t in sorted(cut, key=len, reverse=True)) + ")"
    for i, part in enumerate(re.split(pattern, s)):
        if i % 2:
            out.append(cut[part])
        elif part:
            out += encode_text((" " if prefix else "") + part)
    return out


def _hf_engine(hf):
    return lambda t: hf(t, add_special_tokens=False, split_special_tokens=True).input_ids


def _hf(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def cuts(tokens: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """(the user-defined tokens, the control ones) of either vocabulary, text -> id, as llama.cpp cuts them."""
    return {"<think>": tokens.index("<think>")}, {t: tokens.index(t) for t in ("<unk>", "<s>", "</s>", *CHAT)}


CHAT = ("<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("which", sorted(VOCABS))
def test_spm_ids_equal_transformers(tmp_path, which):
    tokens, scores, types = VOCABS[which]()
    path = write_spm_gguf(tmp_path / "m.gguf", tokens, scores, types)
    ours, hf = read_gguf(path, weights=False).tokenizer, _hf(path)
    cut, control = cuts(tokens)
    strs = texts() + [" " + s for s in texts(60, seed=5)]
    for s in strs:
        got = ours.encode_ordinary(s)  # control-token text stays text; <think> (user-defined) is whole
        assert got == llama_cpp_ids(_hf_engine(hf), cut, s), s
        # every piece's bytes ('▁' a space, <0xXX> its byte): the text, with the space llama.cpp puts before
        # each stretch of it (gptforge's decode keeps it; llama.cpp's detokenize drops the first); a '▁' typed
        # is a space
        t = s.replace("▁", " ")
        assert ours.decode(got) == "".join(p if p in cut else " " + p for p in _parts(t, cut)), s
    assert sum(s.startswith(" ") for s in strs) > 20  # where transformers' loader alone would differ
    byte = [s for s in strs if any(0x03 <= i < 0x03 + 256 for i in ours.encode_ordinary(s))]
    assert len(byte) > 50  # byte fallback is exercised (ü, 🙂, Ж, \n, \t are in neither vocabulary)
    assert tokens.index("<think>") in ours.encode_ordinary("x<think>x")  # user-defined, whole
    cut_all = cut | control
    assert [ours.encode(s, allowed_special="all") for s in strs] == \
        [llama_cpp_ids(_hf_engine(hf), cut_all, s) for s in strs]  # control tokens, then the rest
    from tokenizers import Tokenizer

    # the file's tokenizer.json as saved with a gptforge model: transformers adds bos as it does
    assert Tokenizer.from_str(ours._text).encode(strs[0]).ids == hf(strs[0]).input_ids == \
        [1, *ours.encode_ordinary(strs[0])]
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)
    assert set(ours.special_tokens) == {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"}


def _parts(s: str, cut: dict[str, int]) -> list[str]:
    import re

    pattern = "(" + "|".join(re.escape(t) for t in sorted(cut, key=len, reverse=True)) + ")"
    return [p for p in re.split(pattern, s) if p]


@pytest.mark.parametrize("template", ["chatml", "llama2"])
def test_spm_chat_template_ids_as_llama_cpp(tmp_path, template):
    """A chat template through the model source every command loads (``ModelSource(gguf=...)``): the text
    transformers renders, split as llama.cpp splits it (each stretch after a control token with its '▁')."""
    src = {"chatml": CHATML, "llama2": LLAMA2}[template]
    vocab = trained_vocab()
    path = write_spm_gguf(tmp_path / "m.gguf", *vocab, template=src)
    source = ModelSource(gguf=str(path))
    tok = load_tokenizer_of(source)
    chat, hf = load_chat_template_of(source, tok), _hf(path)
    ids, mask = chat.render(CONV)
    user, control = cuts(vocab[0])
    cut = user | control
    text = hf.apply_chat_template(CONV, tokenize=False)
    assert ids == llama_cpp_ids(_hf_engine(hf), cut, text)
    assert len(mask) == len(ids) and 0 < sum(mask) < len(ids)
    if template == "chatml":
        want = hf.apply_chat_template(CONV[:-1], tokenize=False, add_generation_prompt=True)
        assert chat.render_for_generation(CONV[:-1]) == llama_cpp_ids(_hf_engine(hf), cut, want)
        assert ids[1] == tok.encode_ordinary("user")[0]  # "▁user", where transformers has "user"
    else:
        assert ids[0] == 1 and ids.count(1) == 1  # the template's own bos, once


def test_spm_flags(tmp_path):
    """``add_bos_token`` false: no bos from the post-processor (transformers reads the key too).
    ``add_space_prefix`` false: no '▁' before the text, as llama.cpp reads it; transformers' loader
    ignores the key, so the reference is its encoding of the text without the space we add here."""
    tokens, scores, types = hand_vocab()
    from tokenizers import Tokenizer

    nobos = write_spm_gguf(tmp_path / "nobos.gguf", tokens, scores, types, kv={"tokenizer.ggml.add_bos_token": False})
    ours, hf = read_gguf(nobos, weights=False).tokenizer, _hf(nobos)
    assert Tokenizer.from_str(ours._text).encode("the this").ids == hf("the this").input_ids == \
        ours.encode_ordinary("the this")
    eos = write_spm_gguf(tmp_path / "eos.gguf", tokens, scores, types, kv={"tokenizer.ggml.add_eos_token": True})
    ours = read_gguf(eos, weights=False).tokenizer
    assert Tokenizer.from_str(ours._text).encode("the").ids == [1, *ours.encode_ordinary("the"), 2]
    plain = write_spm_gguf(tmp_path / "plain.gguf", tokens, scores, types,
                           kv={"tokenizer.ggml.add_space_prefix": False})
    ours, hf = read_gguf(plain, weights=False).tokenizer, _hf(plain)
    for s in texts(100, seed=3):
        if s and not s.startswith(("<s>", "</s>", "<|im", "<think>", " ", "▁")):  # (no '▁' before a space: above)
            assert ours.encode_ordinary(" " + s) == hf(s, add_special_tokens=False, split_special_tokens=True).input_ids
    assert ours.encode_ordinary("the") == [tokens.index("t"), tokens.index("he")]  # no '▁' prepended
    assert ours.decode(ours.encode_ordinary("the this")) == "the this"


def test_spm_special_ids_default_as_llama_cpp(tmp_path):
    """A SentencePiece GGUF without unk/bos/eos ids: llama.cpp takes 0, 1 and 2 (its SPM defaults), so the file
    reads as the same file with those ids written; a file naming other ids keeps them (the defaults fill gaps
    only)."""
    tokens, scores, types = hand_vocab()
    bare = read_gguf(write_spm_gguf(tmp_path / "bare.gguf", tokens, scores, types, special_ids=False),
                     weights=False).tokenizer
    full = read_gguf(write_spm_gguf(tmp_path / "full.gguf", tokens, scores, types), weights=False).tokenizer
    assert (bare.bos_token_id, bare.eos_token_id) == (full.bos_token_id, full.eos_token_id) == (1, 2)
    for s in texts(50, seed=5):
        assert bare.encode(s, allowed_special="all") == full.encode(s, allowed_special="all")
    from tokenizers import Tokenizer

    assert Tokenizer.from_str(bare._text).encode("the").ids == Tokenizer.from_str(full._text).encode("the").ids
    assert Tokenizer.from_str(bare._text).encode("the").ids[0] == 1  # the post-processor's bos is <s>
    assert bare._text == full._text  # unk included: the same tokenizer.json
    im_end = tokens.index("<|im_end|>")
    other = read_gguf(write_spm_gguf(tmp_path / "other.gguf", tokens, scores, types, special_ids=False,
                                     kv={"tokenizer.ggml.eos_token_id": im_end}), weights=False).tokenizer
    assert (other.bos_token_id, other.eos_token_id) == (1, im_end)


def test_spm_refusals(tmp_path):
    tokens, scores, types = hand_vocab()
    cases = [
        (dict(scores=scores[:-1]), rf"tokenizer\.ggml\.scores has {len(tokens) - 1} entries for {len(tokens)} tokens"),
        (dict(scores=[int(s) for s in scores], scores_type=gguf.GGUFValueType.INT32),
         r"tokenizer\.ggml\.scores is not a list of floats"),
        (dict(scores=None), r"tokenizer\.ggml\.scores is missing"),
        (dict(scores=[float("nan")] + scores[1:]), r"tokenizer\.ggml\.scores holds NaN"),
        (dict(model="bert"), r"tokenizer\.ggml\.model='bert'"),
        (dict(tokens=[t for t in tokens if t != "<0x7F>"], scores=scores[:-1], types=types[:-1]),
         r"tokenizer\.ggml\.tokens lacks the byte token <0x7F>"),
        (dict(kv={"tokenizer.ggml.add_space_prefix": 1}), r"tokenizer\.ggml\.add_space_prefix=1 is not a boolean"),
        (dict(kv={"tokenizer.ggml.merges": "a b"}), r"tokenizer\.ggml\.merges is missing or not a list of strings"),
    ]
    for i, (kw, match) in enumerate(cases):
        args = dict(tokens=tokens, scores=scores, types=types) | kw
        path = write_spm_gguf(tmp_path / f"bad{i}.gguf", **args)
        with pytest.raises(GGUFReadError, match=match) as e:
            read_gguf(path, weights=False)
        assert "\n" not in str(e.value) and str(path) in str(e.value)
    # no tokens at all: refused as missing, naming the key
    w = gguf.GGUFWriter(str(tmp_path / "notok.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(GGUFReadError, match=r"notok\.gguf: tokenizer\.ggml\.tokens is missing"):
        read_gguf(tmp_path / "notok.gguf", weights=False)


def test_spm_text_starting_with_space_as_llama_cpp(tmp_path):
    tokens, scores, types = hand_vocab()
    tok = read_gguf(write_spm_gguf(tmp_path / "m.gguf", tokens, scores, types), weights=False).tokenizer
    # llama.cpp: " " + " the", spaces as '▁': "▁▁the"; merged best score first: "▁t" (-1), "he" (-2), "▁the" (-3)
    assert tok.encode_ordinary(" the") == [tokens.index("▁"), tokens.index("▁the")]
    # after a user-defined token too (llama.cpp's prefix goes before every stretch of text), and none where
    # there is no text; with add_space_prefix false, none at all
    think = tokens.index("<think>")
    assert tok.encode_ordinary(" the<think>the") == [tokens.index("▁"), tokens.index("▁the"), think, tokens.index("▁the")]
    assert tok.encode_ordinary("<think>") == [think] and tok.encode_ordinary("") == []
    assert tok.encode("<s>the", allowed_special="all") == [1, tokens.index("▁the")]
    plain = read_gguf(write_spm_gguf(tmp_path / "p.gguf", tokens, scores, types,
                                     kv={"tokenizer.ggml.add_space_prefix": False}), weights=False).tokenizer
    assert plain.encode_ordinary(" the") == [tokens.index("▁the")]
    assert plain.encode_ordinary("a<think>the") == [tokens.index("a"), think, tokens.index("t"), tokens.index("he")]


def test_spm_unused_and_control_pieces_as_llama_cpp(tmp_path):
    """An unused token (type 5) merges and comes out like a normal one: llama.cpp's SPM session looks pieces up
    by text whatever their type (SentencePiece itself would resegment it), and transformers' loader agrees; it
    is no special token. A control token's text stays text in ``encode_ordinary`` and is one id in ``encode``."""
    tokens, scores, types = hand_vocab()
    types = list(types)
    types[tokens.index("▁the")] = 5
    path = write_spm_gguf(tmp_path / "m.gguf", tokens, scores, types)
    tok, hf = read_gguf(path, weights=False).tokenizer, _hf(path)
    for s in ("the this", "x the", "<s>the"):
        assert tok.encode_ordinary(s) == hf(s, add_special_tokens=False, split_special_tokens=True).input_ids, s
    assert tokens.index("▁the") in tok.encode_ordinary("the") and "▁the" not in tok.special_tokens
    assert 1 not in tok.encode_ordinary("<s>the") and tok.encode("<s>the", allowed_special="all")[0] == 1


# llama.cpp's own record of its SentencePiece tokenizer (its test-tokenizer-0 on models/ggml-vocab-tinyllama.gguf,
# TinyLlama's = Llama 2's vocabulary; parse_special on, no bos): the text, and the ids it wrote
LLAMA_CPP_TINYLLAMA = [
    ("abc</s> def ghi", [25638, 2, 29871, 822, 330, 2918]), ("</s> XML", [2, 29871, 6560]),
    ("X</s> Y", [1060, 2, 29871, 612]), ("a</s>b", [263, 2, 289]), ("a</s> b", [263, 2, 29871, 289]),
    ("a</s>  b", [263, 2, 259, 289]), ("a</s>\nb", [263, 2, 29871, 13, 29890]), ("def ghi", [822, 330, 2918]),
    (" def ghi", [29871, 822, 330, 2918]), ("ghi", [330, 2918]), (" ghi", [29871, 330, 2918]),
]


def test_spm_ids_as_llama_cpp_recorded_them(tmp_path):
    """Llama 2's ids for the pieces those strings need, each at its id (the other ids filled with pieces no text
    makes), scored as SentencePiece's BPE scores them (-id; the whitespace piece '▁▁' -1e9, as Llama 2's
    tokenizer.model has it: llama.cpp's " ghi" -> '▁' '▁g' needs it below '▁g'), the prefixes each piece is
    merged through, and the single characters. gptforge gives llama.cpp's recorded ids, '▁' after '</s>' and
    before a text that begins with a space included."""
    pieces = {259: "▁▁", 263: "▁a", 289: "▁b", 330: "▁g", 612: "▁Y", 822: "▁def", 1060: "▁X", 2918: "hi",
              6560: "▁XML", 25638: "▁abc", 29871: "▁", 29890: "b",
              20000: "▁ab", 20001: "▁d", 20002: "▁de", 20003: "▁XM"}
    pieces |= {29900 + i: c for i, c in enumerate("acdefghiXMLY")}
    n = max(pieces) + 1
    tokens = [pieces.get(i, f"<filler{i}>") for i in range(n)]
    tokens[:259] = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0] * 259 + [-1e9 if t == "▁▁" else -float(i) for i, t in enumerate(tokens) if i >= 259]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    tok = read_gguf(write_spm_gguf(tmp_path / "m.gguf", tokens, scores, types), weights=False).tokenizer
    for text, ids in LLAMA_CPP_TINYLLAMA:
        assert tok.encode(text, allowed_special="all") == ids, (text, [tokens[i] for i in ids])
