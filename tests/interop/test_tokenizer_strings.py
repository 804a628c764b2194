"""gptforge's tokenizers against independent ones on thousands of varied strings (issue 57: "a tokenizer with
10,000 strings equal to the HF tokenizer"). The default suite runs 500 strings; the ``lane`` runs 10,000
(about 20 s here: transformers' encoding and gptforge's, three tokenizers).

The strings come from ``varied_strings``, deterministic: ASCII words and contractions, a dozen scripts
(Cyrillic, Greek, Arabic, Hebrew, Devanagari, CJK, kana, Hangul, Thai, combining marks, mathematical
letters), emoji (skin tones, ZWJ families, flags), digits in runs and other number systems, punctuation,
special-token-looking text (``<|im_start|>``, ``<s>``, ``<0x41>``, a typed '▁'), rare characters from
large blocks (CJK, Hangul, Ethiopic, Tibetan, emoji, supplementary ideographs), runs of spaces, tabs,
newlines, CRLF, no-break and ideographic spaces, leading and trailing whitespace, empty strings.

Three tokenizers, trained here on other strings of the same kind:

(a) a byte-level BPE with Qwen2's split regex and NFC normalizer, and Qwen3's ``<think>``/``</think>`` as
added tokens that are not special; (b) one with Llama 3's regex and ``ignore_merges`` (gptforge encodes it
with its tiktoken twin), and special tokens with the flags other families set: ``rstrip`` (Phi-3's turn
tokens), ``lstrip``, ``single_word``. Each is a ``tokenizers`` ``tokenizer.json`` in a Hugging Face folder,
read through gptforge's HF-folder door; the reference is transformers' ``AutoTokenizer`` of the same folder:
ids with special-token text as text, ids with the control tokens parsed, and the decoded text.

(c) a SentencePiece BPE (Llama 2's trainer settings: byte fallback, split digits, identity normalization,
whitespace kept; two user-defined and two control symbols), trained by the ``sentencepiece`` library.
Through the HF-folder door (transformers' own conversion, ``LlamaTokenizerFast(from_slow=True)``) the
reference is transformers. Through the GGUF door (the pieces, scores and types written as llama.cpp's
converter writes them, with the ``gguf`` package) gptforge reads it as llama.cpp does, which differs from
transformers' GGUF loader by design (a '▁' before text that begins with a space, and before each stretch
after a control or user-defined token; tests/interop/test_gguf_spm_tokenizer.py), so the reference there is
``sentencepiece`` itself, run on each stretch llama.cpp's tokenize cuts the text into (``llama_cpp_ids``):
with the dummy prefix (Llama 2, Mistral) and without it (Gemma's ``add_space_prefix`` false).
"""

from __future__ import annotations

import io
import json
import random
import re
import unicodedata
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")

from gptforge.data.tokenizer import hf_tokenizer_from_dir  # noqa: E402
from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from tests.interop.test_gguf_spm_tokenizer import llama_cpp_ids, write_spm_gguf  # noqa: E402

WORDS = ["the", "The", "THE", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "Hello", "a",
         "I", "don't", "it's", "we're", "they'll", "I'M", "you've", "she'd", "HTTP", "json", "x86_64", "foo_bar",
         "camelCase", "URL", "https://example.com/a?b=c&d=e", "user@mail.org", "C++", "f(x)", "#tag"]
SCRIPTS = ["naïve", "café", "résumé", "Straße", "Groß", "ÅÄÖ", "œuvre", "İstanbul", "ﬁne", "Привет", "мир", "Ёж",
           "Ελληνικά", "λόγος", "مرحبا", "بالعالم", "שלום", "עולם", "नमस्ते", "दुनिया", "中文", "你好世界", "漢字",
           "日本語の", "テキスト", "ひらがな", "한국어", "안녕하세요", "ภาษาไทย", "Tiếng Việt", "ქართული", "Հայերեն",
           "e\u0301", "a\u030a", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ℌ𝔢𝔩𝔩𝔬"]
EMOJI = ["🙂", "😀", "👍🏽", "👩\u200d👩\u200d👧", "🇫🇷", "❤️", "🤖", "🎉🎉", "✨", "🧑\u200d💻", "#️⃣", "☃"]
DIGITS = ["0", "7", "12", "123", "1234", "12345", "3.14159", "1,000,000", "2024-01-01", "0x1F", "1e-9", "٣٤٥", "１２３", "½"]
PUNCT = [".", ",", "!", "?", "...", ";", ":", "-", "--", "—", "(", ")", "[", "]", "{", "}", '"', "'", "`", "«", "»", "“",
         "”", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "<", ">", "~", "_", "!!!", "?!", "''"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<think>", "</think>", "[INST]",
           "[/INST]", "<|begin_of_text|>", "<|eot_id|>", "<|end|>", "<|user|>", "<|assistant|>", "<mask>", "<pad>", "<0x41>", "▁", "▁▁the",
           "<|", "|>", "<|im_start", "<<s>>"]
SPACES = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", "  \n  ",
          "\u00a0", "\u3000", "\u2028", "\u200b", "\f", "\v", " \t "]
# single characters drawn from large blocks (CJK, Hangul syllables, Ethiopic, Tibetan, emoji, supplementary
# ideographs), never in the training text: outside the trained vocabularies (SentencePiece's byte fallback)
RARE = [(0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1200, 0x137F), (0x0F00, 0x0FD4), (0x1F300, 0x1F5FF), (0x20000, 0x2A6DF)]
POOLS = [WORDS] * 30 + [SCRIPTS] * 14 + [EMOJI] * 5 + [DIGITS] * 8 + [PUNCT] * 10 + [SPECIAL] * 5 + [RARE] * 6


# the flags' cases, first in every list: whitespace for lstrip/rstrip to take (also taken twice), a word to refuse
FIXED = ["x<mask>y", "x <mask> y", "<mask>", "a<mask> b", "hi <|end|>\n\n next", "hi  \t<|user|> x", "<|end|> <|user|>",
         "<|user|>\nhello<|end|>\n<|assistant|>", " <|user|> ", "<think>x</think>  y", "Groß café", "", " ", "▁x", " ▁ x",
         "a\u030a<mask>", "½<mask>²", "Ⅻ<mask>", "x_<mask>", "<mask>\u0301"]  # a mark, a number, a letter number: words?


def varied_strings(n: int, seed: int = 0, rare: bool = True) -> list[str]:
    """``n`` strings of 1-12 pieces from the pools above, joined by a space, nothing, or any whitespace run;
    some with whitespace in front, some with the trailing spaces cut, a few whitespace or a special text alone.
    ``rare`` false: no characters from the rare blocks (the training text)."""
    rng = random.Random(seed)
    pools = POOLS if rare else [p for p in POOLS if p is not RARE]
    out = FIXED[:n] if rare else []
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choice(pools)
            parts.append(chr(rng.randint(*rng.choice(RARE))) if pool is RARE else rng.choice(pool))
            parts.append(rng.choice(SPACES) if rng.random() < 0.25 else " " if rng.random() < 0.8 else "")
        s = "".join(parts)
        r = rng.random()
        s = rng.choice(SPACES) + s if r < 0.15 else s.rstrip(" ") if r < 0.25 else s
        if rng.random() < 0.03:
            s = rng.choice(["", " ", "\n", "  ", rng.choice(SPECIAL)])
        out.append(s)
    return out


def _corpus() -> list[str]:
    return varied_strings(4000, seed=123, rare=False)  # other strings than the ones compared (seed 0)


QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
BPE_KINDS = {  # name -> (split regex, NFC normalizer, ignore_merges, special tokens, bos, tokenizer_class)
    "qwen2": (QWEN2, True, False, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "Qwen2Tokenizer"),
    "llama3": (LLAMA3, False, True, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|begin_of_text|>",
               "PreTrainedTokenizerFast"),
}
# added after training, as Qwen3 and Phi-3 have them: (text, special, lstrip, rstrip, single_word)
ADDED = {
    "qwen2": [("<think>", False, False, False, False), ("</think>", False, False, False, False)],  # Qwen3's: not special
    # Phi-3's turn tokens take the whitespace after them (rstrip); lstrip and single_word as other models use them
    "llama3": [("<|end|>", True, False, True, False), ("<|user|>", True, True, False, False),
               ("<|assistant|>", True, False, True, False), ("<mask>", True, False, False, True)],
}


def byte_level_dir(out: Path, kind: str) -> Path:
    """A byte-level BPE trained by ``tokenizers`` in Qwen2's or Llama 3's shape, saved as a Hugging Face folder."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    regex, nfc, ignore_merges, specials, bos, klass = BPE_KINDS[kind]
    t = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=1200, show_progress=False, special_tokens=specials,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        t.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                         special_tokens=[(bos, t.token_to_id(bos))])
    for text, special, lstrip, rstrip, single_word in ADDED[kind]:
        t.add_tokens([AddedToken(text, special=special, lstrip=lstrip, rstrip=rstrip, single_word=single_word,
                                 normalized=False)])
    out.mkdir(parents=True)
    t.save(str(out / "tokenizer.json"))
    added = json.loads(t.to_str())["added_tokens"]  # the flags in the config too, as a Hub folder has them
    config = {"tokenizer_class": klass, "bos_token": bos, "eos_token": specials[-1], "model_max_length": 4096,
              "clean_up_tokenization_spaces": False,
              "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


USER_DEFINED = ["<think>", "</think>"]
CONTROL = ["<|im_start|>", "<|im_end|>"]


def train_sentencepiece(dummy_prefix: bool = True) -> bytes:
    """A SentencePiece BPE model (its serialized proto) with Llama 2's trainer settings."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=buf, vocab_size=1200, model_type="bpe", byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=dummy_prefix,
        split_digits=True, allow_whitespace_only_pieces=True, user_defined_symbols=USER_DEFINED,
        control_symbols=CONTROL, character_coverage=0.999, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2, num_threads=1)
    return buf.getvalue()


def gguf_vocab(sp) -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and llama.cpp's token types (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte) of a
    SentencePiece model, as llama.cpp's converter writes them (user-defined: the ones a model's added tokens name)."""
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]

    def kind(i: int) -> int:
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else \
            4 if tokens[i] in USER_DEFINED else 1

    return tokens, [sp.get_score(i) for i in range(n)], [kind(i) for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tok")
    out = {kind: byte_level_dir(root / kind, kind) for kind in BPE_KINDS}
    proto = train_sentencepiece()
    (root / "spm").mkdir()
    (root / "spm" / "tokenizer.model").write_bytes(proto)
    hf = transformers.LlamaTokenizerFast.from_pretrained(str(root / "spm"), from_slow=True)
    hf.save_pretrained(str(root / "spm"))
    out["spm"] = root / "spm"
    out["spm_proto"] = proto
    out["root"] = root
    return out


SIZES = [500, pytest.param(10_000, marks=pytest.mark.lane)]


def _transformers_ids(hf, strs: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """(special-token text as text, control tokens parsed), no bos."""
    return (hf(strs, add_special_tokens=False, split_special_tokens=True).input_ids,
            hf(strs, add_special_tokens=False).input_ids)


def _first_diff(strs, ours, theirs) -> str:
    bad = [(s, a, b) for s, a, b in zip(strs, ours, theirs, strict=True) if a != b]
    return f"{len(bad)} of {len(strs)} differ; first {bad[0][0]!r}: gptforge {bad[0][1]} != {bad[0][2]}" if bad else ""


def _equal_to_transformers(ours, hf, strs: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Assert gptforge's ids equal transformers' for every string, special text plain and parsed; returns
    transformers' (plain, parsed) ids for the caller's further checks."""
    plain, parsed = _transformers_ids(hf, strs)
    got = [ours.encode_ordinary(s) for s in strs]
    assert got == plain, _first_diff(strs, got, plain)
    got = [ours.encode(s, allowed_special="all") for s in strs]
    assert got == parsed, _first_diff(strs, got, parsed)
    return plain, parsed


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", sorted(BPE_KINDS))
def test_byte_level_bpe_equals_transformers(built, kind, n):
    ours, hf = hf_tokenizer_from_dir(built[kind]), transformers.AutoTokenizer.from_pretrained(str(built[kind]))
    assert (ours._fast is not None) == (kind == "llama3")  # Llama 3's shape goes through the tiktoken twin
    strs = varied_strings(n)
    plain, parsed = _equal_to_transformers(ours, hf, strs)
    assert sum(len(set(p) & set(ours.special_tokens.values())) > 0 for p in parsed) > n // 50  # specials were parsed
    for text, special, *_flags in ADDED[kind]:  # each added token met, whole, in the ids
        tid = hf.convert_tokens_to_ids(text)
        assert sum(tid in p for p in (parsed if special else plain)) > n // 200, text
    if kind == "llama3":  # the flags had whitespace to take and a word to refuse
        assert any(re.search(r"<\|end\|>\s", s) for s in strs) and any(re.search(r"\s<\|user\|>", s) for s in strs)
        assert any(re.search(r"\w<mask>|<mask>\w", s) for s in strs)
    norm = (lambda s: unicodedata.normalize("NFC", s)) if BPE_KINDS[kind][1] else (lambda s: s)
    for s, ids in zip(strs, plain, strict=True):
        assert ours.decode(ids) == norm(s) == hf.decode(ids, clean_up_tokenization_spaces=False), s


@pytest.mark.parametrize("n", SIZES)
def test_sentencepiece_hf_folder_equals_transformers(built, n):
    """transformers' conversion of the SentencePiece model (Metaspace, prepend_scheme 'first') through the
    HF-folder door; and, where that conversion agrees with SentencePiece by design (text that does not begin
    with a space or a typed '▁', no user-defined token), equal to ``sentencepiece`` too."""
    ours, hf = hf_tokenizer_from_dir(built["spm"]), transformers.AutoTokenizer.from_pretrained(str(built["spm"]))
    sp = spm.SentencePieceProcessor(model_proto=built["spm_proto"])
    strs = varied_strings(n)
    plain, parsed = _equal_to_transformers(ours, hf, strs)
    alike = [s for s in strs if not s.startswith((" ", "▁")) and not any(u in s for u in USER_DEFINED)]
    assert len(alike) > n * 3 // 4
    got, want = [ours.encode_ordinary(s) for s in alike], [sp.encode(s) for s in alike]
    assert got == want, _first_diff(alike, got, want)


def _spm_gguf(built, dummy_prefix: bool):
    proto = built["spm_proto"] if dummy_prefix else train_sentencepiece(dummy_prefix=False)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    tokens, scores, types = gguf_vocab(sp)
    path = write_spm_gguf(built["root"] / f"spm-{dummy_prefix}.gguf", tokens, scores, types,
                          kv={"tokenizer.ggml.add_space_prefix": dummy_prefix})
    return sp, tokens, types, read_gguf(path, weights=False).tokenizer, path


def _cut(tokens: list[str], types: list[int], which: tuple[int, ...]) -> dict[str, int]:
    return {t: i for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k in which}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dummy_prefix", [True, False], ids=["llama2", "gemma"])
def test_sentencepiece_gguf_equals_sentencepiece_as_llama_cpp_splits(built, dummy_prefix, n):
    """The GGUF door: ``sentencepiece`` on each stretch of text llama.cpp's tokenize leaves between user-defined
    tokens (and control ones, where special text is parsed); its own dummy prefix is llama.cpp's
    ``add_space_prefix``. Byte fallback, user-defined and control tokens are all exercised; gptforge's decode
    gives back each stretch with the space the prefix put before it (llama.cpp's detokenize drops the first)."""
    sp, tokens, types, ours, _ = _spm_gguf(built, dummy_prefix)
    user, control = _cut(tokens, types, (4,)), _cut(tokens, types, (2, 3))
    assert set(user) == set(USER_DEFINED) and set(control) == {"<unk>", "<s>", "</s>", *CONTROL}
    strs = varied_strings(n)
    plain = [ours.encode_ordinary(s) for s in strs]
    want = [llama_cpp_ids(sp.encode, user, s, prefix=False) for s in strs]
    assert plain == want, _first_diff(strs, plain, want)
    parsed = [llama_cpp_ids(sp.encode, user | control, s, prefix=False) for s in strs]
    got = [ours.encode(s, allowed_special="all") for s in strs]
    assert got == parsed, _first_diff(strs, got, parsed)
    byte = [i for i, k in enumerate(types) if k == 6]
    assert sum(any(byte[0] <= i <= byte[-1] for i in ids) for ids in want) > n // 5  # byte fallback
    assert sum(any(i in user.values() for i in ids) for ids in want) > n // 50  # user-defined, whole
    assert sum(any(i in control.values() for i in ids) for ids in parsed) > n // 50  # control, parsed
    pattern = "(" + "|".join(re.escape(t) for t in sorted(user, key=len, reverse=True)) + ")"
    for s, ids in zip(strs, plain, strict=True):
        stretches = [p for p in re.split(pattern, s) if p]
        space = " " if dummy_prefix else ""
        want = "".join(p if p in user else space + p.replace("▁", " ") for p in stretches)  # a typed '▁' is a space
        assert ours.decode(ids) == want, s


@pytest.mark.parametrize("n", SIZES)
def test_a_gguf_sentencepiece_tokenizer_exported_to_hf_reads_alike_in_transformers(built, tmp_path, n):
    """``export hf``'s tokenizer files of a model that came from a SentencePiece GGUF: transformers reading the
    folder encodes as gptforge does (llama.cpp's split travels in the tokenizer.json as a normalizer), parses
    the control tokens alike, and decodes the ids back to the text (one leading '▁' dropped) where no
    user-defined token sits inside it."""
    from gptforge.interop.hf_tokenizer import write_model_tokenizer

    _, tokens, types, ours, _ = _spm_gguf(built, True)
    write_model_tokenizer(tmp_path, ours, None, 4096)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    strs = varied_strings(n)
    plain, parsed = _equal_to_transformers(ours, hf, strs)
    assert hf("the").input_ids == [1, *ours.encode_ordinary("the")]  # bos, as the GGUF's add_bos_token says
    whole = [(s, ids) for s, ids in zip(strs, plain, strict=True) if not any(u in s for u in USER_DEFINED)]
    assert len(whole) > n * 3 // 4
    for s, ids in whole:
        assert hf.decode(ids, clean_up_tokenization_spaces=False) == s.replace("▁", " "), s


def test_special_token_flags_survive_the_hf_export(built, tmp_path):
    """A Phi-3-like chat tokenizer whose end-of-turn token (eos, ``rstrip``) takes the whitespace after it: in
    the folder ``export hf`` writes (tokenizer.json as it is, ``PreTrainedTokenizerFast``, eos named by its
    text) transformers parses control tokens as gptforge does, strip included."""
    import shutil

    from gptforge.interop.hf_tokenizer import write_model_tokenizer

    src = tmp_path / "src"
    shutil.copytree(built["llama3"], src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["eos_token"] = {"__type": "AddedToken", "content": "<|end|>", "lstrip": False, "rstrip": True,
                        "single_word": False, "normalized": False, "special": True}
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = hf_tokenizer_from_dir(src)
    assert ours.eos_token_id == ours.special_tokens["<|end|>"]
    (tmp_path / "out").mkdir()
    write_model_tokenizer(tmp_path / "out", ours, None, 4096)
    strs = varied_strings(300)
    for folder in (src, tmp_path / "out"):
        hf = transformers.AutoTokenizer.from_pretrained(str(folder))
        got, want = [ours.encode(s, allowed_special="all") for s in strs], _transformers_ids(hf, strs)[1]
        assert got == want, (folder.name, _first_diff(strs, got, want))
    assert ours.encode("a<|end|> \n b", allowed_special="all")[1:] == ours.encode("a<|end|>b", allowed_special="all")[1:]


PHI3 = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}" \
       "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"


def test_a_chat_template_renders_with_the_flags_as_transformers(built, tmp_path):
    """Phi-3's chat format: its turn tokens take the newline after them (``rstrip``), in transformers'
    ``apply_chat_template`` and in gptforge's render, which cuts the control tokens out itself."""
    import shutil

    from gptforge.data.chat_jinja import JinjaChatTemplate

    shutil.copytree(built["llama3"], tmp_path / "phi")
    cfg = json.loads((tmp_path / "phi" / "tokenizer_config.json").read_text())
    (tmp_path / "phi" / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": PHI3}))
    tok = hf_tokenizer_from_dir(tmp_path / "phi")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "phi"))
    chat = JinjaChatTemplate(PHI3, tok, end="<|end|>")  # (special text typed in a message stays text in gptforge,
    # where transformers parses it: the messages hold none)
    conv = [{"role": "user", "content": " hello  there\n"}, {"role": "assistant", "content": "\n Groß 12 !"},
            {"role": "user", "content": "and\tthen"}, {"role": "assistant", "content": "done "}]
    ids, mask = chat.render(conv)
    assert ids == list(hf.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
    assert tok.special_tokens["<|user|>"] in ids and 0 < sum(mask) < len(ids)
    want = hf.apply_chat_template(conv[:1], tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"]
    assert chat.render_for_generation(conv[:1]) == list(want)
