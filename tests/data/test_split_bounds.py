"""A tokenizer read from a file splits text in time linear in a line's length, or is refused when it is read
(issue 56, class 3; ``gptforge.data.tokenizer.split_bounds``). The doors (a checkpoint's bundle, ``prepare
--tokenizer`` of a Hugging Face folder and of a tiktoken bundle) are walked in tests/cli/test_tokenizer_hostile.py;
here the two checks against hand-made expectations, the known models' patterns through both engines and the
GGUF door, and the time a refusal takes against the bound the module's constants give."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from gptforge.data.tokenizer import GPT4_PAT, R50K_PAT, HFTokenizer, TokenizerError, bytes_to_unicode
from gptforge.data.tokenizer import split_bounds as sb
from gptforge.interop.gguf_tokenizer import PRE_TOKENIZERS, spm_tokenizer_json_from_gguf, tokenizer_json_from_gguf

# DeepSeek-V3's split (its tokenizer.json's Split patterns joined): digits in threes, CJK runs, letters after one
# punctuation mark; written by hand from the published file, as the other models' are in the package
DEEPSEEK = (r"\p{N}{1,3}|[一-龥\u3040-ゟ゠-ヿ]+|[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
            r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN = {"gpt2-tiktoken": R50K_PAT, "cl100k": GPT4_PAT, "deepseek-v3": DEEPSEEK,
         **{f"gguf-{name}-{k}": r for name, (rs, _) in PRE_TOKENIZERS.items() for k, r in enumerate(rs)}}


def tokenizer_json(pattern: str, normalizer: dict | None = None, decoder: dict | None = None) -> str:
    """A byte-level BPE with no merges whose split is ``pattern`` (the shape of GPT-2's and Llama 3's files)."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "post_processor": None, "normalizer": normalizer,
        "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False}],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "decoder": decoder or {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": []}})


# --- the static check ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "fragment"), [
    (r"(a+)+b", "(a+)+"),
    (r"(\w+\s?)*$", r"(\w+\s?)*"),
    (r"x((a+))+y", "((a+))+"),  # the inner repeat two groups down
    (r"(?:x*y){2,}", "(?:x*y){2,}"),  # a bounded outer repeat above 1 is a repeat
    (r"(?:[a-z]+\d?){3}", r"(?:[a-z]+\d?){3}"),
    (r"(a+)+?b", "(a+)+?"),  # lazy backtracks all the same
    (r"(?i)(\p{L}+ ?)+$", r"(\p{L}+ ?)+"),  # after a flag group, through \p{..}
    (r"[(]+(a*)*", "(a*)*"),  # a '(' inside a class opens no group
    (r"(?>(a+)+)b", "(a+)+"),  # atomic outside does not stop the nesting inside from backtracking
    # none: no nesting, or nesting that never gives back (possessive, atomic inside), or no repeat outside
    (r"(a+)++b", None), (r"(?:\s*+\w)+", None), (r"(?:(?>a+)b)+", None), (r"(a+)?b", None), (r"(a+){1}", None),
    (r"a{2,3}b{,4}", None), (r"x{|y}", None), (r"(?i:'s|'t)+", None), (r"(?#(a+)+)b", None), (r"[(a+)+]", None),
])
def test_nested_quantifiers_are_found_by_hand(pattern, fragment):
    assert sb.nested_quantifier(pattern) == fragment


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_split_patterns_pass_both_engines_quickly(name):
    """GPT-2's (tiktoken's and llama.cpp's spelling), cl100k's, Llama 3's, Qwen2's, SmolLM2's, DeepSeek-V3's: no
    nesting, and linear by the clock in Oniguruma and in tiktoken. "Quickly": each engine's probe in under
    5 us a character probed (the most a linear split took here was 4 us, on 4,096 one-character pieces)."""
    pattern = KNOWN[name]
    assert sb.nested_quantifier(pattern) is None
    from tokenizers import Tokenizer

    library = Tokenizer.from_str(tokenizer_json(pattern))
    chars = len(list(sb.pumps([pattern]))) * sum(sb.LEVELS) * sb.CONFIRM
    engines = {"oniguruma": lambda: sb.probe(library.pre_tokenizer.pre_tokenize_str, (pattern,)),
               "tiktoken": lambda: sb.tiktoken_probe.__wrapped__(pattern)}  # uncached
    for engine, check in engines.items():
        t0 = time.thread_time()
        why = check()
        spent = time.thread_time() - t0
        assert why is None, f"{engine}: {why}"
        assert spent < 5e-6 * chars, f"{engine}: {spent:.2f} s CPU for {chars:,} characters"


def test_gguf_tokenizers_pass(tmp_path):
    """The GGUF door: a GGUF names its split (tokenizer.ggml.pre) from llama.cpp's fixed table and carries no
    regex of its own, so every entry of the table, and a SentencePiece (Metaspace, no regex) vocabulary,
    must load through the check."""
    alphabet = list(bytes_to_unicode().values())
    for pre in PRE_TOKENIZERS:
        text = tokenizer_json_from_gguf(alphabet + ["<|endoftext|>"], None, [], pre, tmp_path / "m.gguf", eos_id=256)
        assert HFTokenizer(text, where=f"gguf {pre}").encode_ordinary("It's 2024!  ok") != []
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581a", "a"]
    text = spm_tokenizer_json_from_gguf(tokens, None, [0.0] * len(tokens), tmp_path / "s.gguf", bos_id=1, eos_id=2,
                                        unk_id=0)
    assert HFTokenizer(text, where="gguf spm").encode_ordinary("a a") != []


# --- refusals -------------------------------------------------------------------------------------------------

def test_the_estimate_for_a_million_characters_is_the_growth_extrapolated():
    """By hand: 1 ms at 4,096 and 16 ms at 16,384 characters is the power 2 (16x for 4x), so 1,000,000
    characters take 0.016 x (1e6 / 16384)^2 = 59.6 s; a linear growth (4x) 0.976 s; a growth below linear
    counts as linear (never an estimate under what the longest run says)."""
    assert sb._million(1e-3, 4096, 16e-3, 16384) == pytest.approx(0.016 * (1e6 / 16384) ** 2, rel=1e-12)
    assert sb._million(1e-3, 4096, 4e-3, 16384) == pytest.approx(0.004 * 1e6 / 16384, rel=1e-12)
    assert sb._million(1e-3, 4096, 2e-3, 16384) == pytest.approx(0.002 * 1e6 / 16384, rel=1e-12)


# each: a split pattern, what the refusal says of it (which check caught it), and the field it names
SLOW = {
    "nested": (r"(a+)+b|.", "nested quantifiers"),
    "nested-anchored": (r"(\w+\s?)*$|\s+|.", "nested quantifiers"),
    "alternation": (r"(a|aa)+c|\s+|.", "gives up"),  # Oniguruma's retry limit on a run of 'a'
    "quadratic": (r"a+b|.", "characters of 'a' repeated takes"),  # 7.4 s on 65,536 characters, ~30 min on 1M
    "cubic": (r"\s*\s*\s*x|.", "us a character"),  # 256 spaces already take ~1 s
}


@pytest.mark.parametrize("case", sorted(SLOW))
def test_a_slow_split_is_refused_within_the_probes_bound(case):
    """Refused in one line naming the file, the field, the pattern and what to do, in bounded CPU time: at
    most every run the probe makes up to its budget (PER_CHAR_S a character) before the one that fails,
    plus the confirming runs at 4,096 and 16,384 characters at their budget (module docstring)."""
    pattern, needle = SLOW[case]
    pumps = len(list(sb.pumps([pattern])))
    bound = sb.PER_CHAR_S * (pumps * sum(sb.LEVELS) * sb.CONFIRM + 2 * (sb.LEVELS[-1] + sb.CONFIRM_LEVEL))
    t0 = time.thread_time()
    with pytest.raises(TokenizerError) as e:
        HFTokenizer(tokenizer_json(pattern), where="hostile/tokenizer.json")
    spent = time.thread_time() - t0
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("hostile/tokenizer.json", "pre_tokenizer.pretokenizers[0].pattern.Regex", repr(pattern), needle,
                 "Fix:"):
        assert part in msg, msg
    assert spent < bound, f"{spent:.1f} s CPU, bound {bound:.1f} s"


BLOCK = bytes(1 << 16)


def burn(n_bytes: int) -> None:
    """CPU work proportional to ``n_bytes`` (hashing them, 64 KiB at a time, so nothing large is allocated)."""
    h = hashlib.sha256()
    for _ in range(max(1, n_bytes >> 16)):
        h.update(BLOCK)


# splitters whose cost is known by construction. The probe's limits are times, so each case sits far from
# the limit it must not cross on any x86 (SHA-256 at 0.3-2 GB/s): the quadratic one hashes 128 MiB at 16,384
# characters, 70-450 ms (the budget there is 410 ms a run, and a million-character line > 60 s needs > 16 ms);
# the slow linear one hashes 200 KiB a character, 100-700 us (the budget is 25)
@pytest.mark.parametrize(("work", "needles"), [
    (lambda n: n * 64, None),  # linear: 1 MiB at 16,384 characters, a few ms
    (lambda n: n * n // 2, ("1,000,000-character line", "us a character")),  # quadratic: 16x for 4x the text
    (lambda n: n * 200_000, ("us a character",)),  # linear, but a slow split: 200 s for 1M characters
])
def test_the_probe_judges_a_splitter_by_its_work(work, needles):
    """The probe against splitters whose work grows with the text as chosen, an expectation set apart from any
    regex engine: the linear one passes; the quadratic one is refused (by its growth on a fast machine, by the
    budget a character on one 6x slower); the slow linear one by the budget a character."""
    why = sb.probe(lambda text: burn(work(len(text))))
    if needles is None:
        assert why is None, why
    else:
        assert why is not None and any(n in why for n in needles), why


@pytest.mark.parametrize(("part", "node", "field"), [
    ("normalizer", {"type": "Replace", "pattern": {"Regex": "(x+)+y"}, "content": "z"}, "normalizer.pattern.Regex"),
    ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace",
                    "pattern": {"Regex": "(x*)*"}, "content": "z"}]}, "normalizer.normalizers[1].pattern.Regex"),
    ("decoder", {"type": "Replace", "pattern": {"Regex": "(x+)+y"}, "content": "z"}, "decoder.pattern.Regex"),
])
def test_every_regex_field_is_checked(part, node, field):
    """A Replace normalizer runs its regex on every text before the split, a Replace decoder on every reply."""
    kw = {part: node}
    with pytest.raises(TokenizerError, match="nested quantifiers") as e:
        HFTokenizer(tokenizer_json(r"\s+|\S+", **kw), where="t.json")
    assert field in str(e.value)


def test_the_panic_of_a_refused_pattern_is_not_printed(capfd):
    """Rust's panic hook writes to fd 2 straight: the probe holds it, so the refusal is the only line."""
    with pytest.raises(TokenizerError, match="gives up"):
        HFTokenizer(tokenizer_json(r"(a|aa)+c|\s+|\S"), where="t.json")
    assert "panicked" not in capfd.readouterr().err
