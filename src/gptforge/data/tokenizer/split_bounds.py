"""A tokenizer read from a file splits text in time linear in a line's length, or is refused at load.

The regexes a tokenizer file brings (a ``Split`` pre-tokenizer's pattern, a ``Replace`` normalizer's or
decoder's, a tiktoken bundle's split pattern) run in backtracking engines: Oniguruma in the
``tokenizers`` library, fancy-regex in tiktoken. A pattern with nested quantifiers (``(a+)+b``,
``(\\w+\\s?)*$``) or one that retries a long run from every position (``a+b`` on a run of ``a``) takes
time exponential or quadratic in the length of a line: ``prepare`` ran for hours on a 1M-character
document, with no word. Two checks, both before the tokenizer is used:

1. :func:`nested_quantifier`, static, on every regex field of the file (normalizer, pre_tokenizer,
   decoder): a group that repeats (``*``, ``+``, ``{n,}``, ``{n,m}`` with m > 1) holding a repeat that
   can give back what it took (not possessive ``++``, not inside an atomic ``(?>...)``) is refused by
   name, with the fragment. No split pattern of a known model has
   one (GPT-2's, cl100k/Llama 3's, Qwen2's, SmolLM2's/StarCoder's, DeepSeek's); a nesting that cannot
   blow up can say so with ``++`` or ``(?>...)``, which keeps what it matches on real text.
2. :func:`probe`, by the clock, for what no static rule sees (``a+b``, ``(a|aa)+c``, ``\\s*\\s*\\s*x``): the
   tokenizer's own splitter (Oniguruma through ``tokenizers``; fancy-regex through tiktoken) runs on runs of
   one or two characters (letters in two scripts and cases, digits, spaces, tabs, newlines, punctuation, and
   the characters the pattern names) of 256, 1,024 and 4,096 characters, timed in this thread's CPU time (a
   loaded machine's other processes do not count). Refused: a run over PER_CHAR_S a character (25 us; a
   linear split takes 0.1-4 us here, the most on 4,096 one-character pieces), or a growth that makes a
   MILLION-character line take over MAX_LINE_S. The growth from 256 to 4,096 characters is only a screen
   (call overhead and caches make the libraries' own linear work grow as about the power 1.3 there); where
   it says over MAX_LINE_S, the verdict is the growth from 4,096 to 16,384 characters, each the best of two:
   GPT-2's, cl100k's, Llama 3's, Qwen2's and DeepSeek's patterns extrapolate to 1-10 s, ``a+b`` to ~30
   minutes (it takes 7.4 s on 65,536 characters). An engine that gives up (Oniguruma's retry limit,
   fancy-regex's backtrack limit: a Rust panic) is refused at once.

Bound on the probe itself: a run is only made 4x longer after the shorter one stayed under PER_CHAR_S a
character, so a quadratic pattern costs at most 16 x 25 us x 4,096 = 1.6 s at the confirming run and an
exponential one is cut by its engine's own limit (0.1-0.3 s). A good pattern costs 50-130 ms of CPU for
Oniguruma and ~15 ms for tiktoken, once per process and pattern (cached).

What the probe cannot promise: a pattern that is slow only after a prefix none of its runs hold
(``xq(a|aa)+c``) passes it; the engine's own limit then refuses the one text at encode time, naming the
tokenizer file (``base.library_failure``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from gptforge.data.tokenizer.base import TokenizerError

LEVELS = (256, 1024, 4096)  # characters per probe run, growing 4x
# the CPU time of a 1M-character line, extrapolated by the growth between two lengths (the screen: 256 to
# 4,096 characters; the verdict: 4,096 to 16,384). Known models' patterns come to 1-10 s (a 1M-character
# line of them takes ~2 s), a+b to ~30 minutes
MILLION = 1_000_000
MAX_LINE_S = 60.0
PER_CHAR_S = 25e-6  # a linear split takes 0.1-4 us of CPU a character here (measured on a loaded machine)
NOISE_FLOOR_S = 5e-4  # below this a growth is timer and cache noise
CONFIRM = 3  # repeats (best of) before a suspicion is a verdict
CONFIRM_LEVEL = 16384  # where the screen's estimate is over MAX_LINE_S, the growth is measured again up to here
# one- and two-character runs: the classes every split pattern names (letters in two scripts and both cases,
# digits, space, tab, newline, punctuation, apostrophe), then pairs of the commonest, then the pattern's own
# literal characters (a pattern retries from every position of a run it can start but not finish)
SINGLES = ("a", "A", "0", " ", "\n", "\t", "!", "'", "_", "é", "中")
PAIR_BASE = ("a", " ", "0", "\n")
END = "\x01"  # ends every run: in no class a pattern would repeat over, so an anchored or lookahead tail fails
MAX_LITERALS = 12


# --- 1. the static check ----------------------------------------------------------------------------------

def nested_quantifier(pattern: str) -> str | None:
    """The first fragment of ``pattern`` in which a repeated group holds a repeat that can backtrack
    (``(a+)+``, ``(\\w+\\s?)*``, ``(?:x*y){2,}``), or None. Escapes, character classes (nested too),
    ``\\p{..}``, comments and look-arounds are read as Oniguruma reads them; possessive repeats and
    atomic groups do not count as inner repeats (they never give back what they took)."""
    # each open group: [start index, holds a repeat that can backtrack, atomic]
    stack: list[list[Any]] = [[0, False, False]]
    i, n = 0, len(pattern)
    # the atom just read: (start, holds a repeat that can backtrack, the enclosing group's flag before it)
    last: tuple[int, bool, bool] | None = None
    while i < n:
        c = pattern[i]
        if c == "\\":
            start = i
            i += 2
            if pattern[i - 1:i] in ("p", "P", "x", "u", "k") and pattern[i:i + 1] == "{":
                i = _skip_to(pattern, i, "}") + 1
            last = (start, False, stack[-1][1])
        elif c == "[":
            last = (i, False, stack[-1][1])
            i = _skip_class(pattern, i)
        elif c == "(":
            if pattern.startswith("(?#", i):  # a comment
                i = _skip_to(pattern, i, ")") + 1
                continue
            if pattern.startswith("(?", i) and not pattern.startswith(("(?<", "(?P"), i):
                k = i + 2
                while k < n and (pattern[k].isalpha() or pattern[k] == "-"):
                    k += 1
                if k < n and pattern[k] == ")":  # (?i) and the like: flags for the rest, no group
                    i = k + 1
                    continue
            stack.append([i, False, pattern.startswith("(?>", i)])
            i += 1
            last = None
        elif c == ")":
            if len(stack) == 1:  # unbalanced: the engine's own compile refuses it
                i += 1
                continue
            start, holds, atomic = stack.pop()
            inner = holds and not atomic
            last = (start, inner, stack[-1][1])
            stack[-1][1] = stack[-1][1] or inner  # undone below if a possessive repeat makes the group atomic
            i += 1
        elif c in "*+?{":
            end, most, mod = _quantifier(pattern, i)
            if end == i:  # a literal '{'
                last = (i, False, stack[-1][1])
                i += 1
                continue
            if last is not None:
                start, inner, before = last
                if mod == "+":  # possessive: the repeat and what it holds never give back
                    stack[-1][1] = before
                elif most > 1:
                    if inner:
                        return pattern[start:end]
                    stack[-1][1] = True
            i = end
            last = None
        else:
            last = None if c == "|" else (i, False, stack[-1][1])
            i += 1
    return None


def _skip_to(p: str, i: int, close: str) -> int:
    j = p.find(close, i)
    return len(p) - 1 if j < 0 else j


def _skip_class(p: str, i: int) -> int:
    """The index after the ``]`` closing the class opened at ``p[i]`` (nested classes, escapes, a
    leading ``]`` or ``^]`` taken literally)."""
    depth, j = 0, i
    while j < len(p):
        c = p[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            j += 1
            if j < len(p) and p[j] == "^":
                j += 1
            if j < len(p) and p[j] == "]":
                j += 1
            continue
        if c == "]":
            depth -= 1
            j += 1
            if depth == 0:
                return j
            continue
        j += 1
    return j


def _quantifier(p: str, i: int) -> tuple[int, float, str]:
    """(end index, most repeats, '?' lazy / '+' possessive / '') of the quantifier at ``p[i]``; end ==
    i where ``{`` is a literal brace."""
    c = p[i]
    if c == "{":
        j = p.find("}", i)
        body = p[i + 1:j] if j > 0 else ""
        parts = body.split(",")
        if j < 0 or len(parts) > 2 or not all(x.strip().isdigit() or x.strip() == "" for x in parts) or not body.strip(","):
            return i, 1, ""
        most = math.inf if len(parts) == 2 and not parts[1].strip() else int(parts[-1])
        end = j + 1
    else:
        most = 1 if c == "?" else math.inf
        end = i + 1
    nxt = p[end:end + 1]
    # '?' after any repeat is lazy (it still backtracks); '+' after * + ? is possessive. Oniguruma's Ruby
    # syntax reads '{n,m}+' as a repeat of a repeat: no modifier here, the '+' is read as a quantifier next
    mod = nxt if nxt == "?" or (nxt == "+" and c != "{") else ""
    return end + len(mod), most, mod


# --- 2. the probe, by the clock ---------------------------------------------------------------------------

def pumps(patterns: list[str]) -> Iterator[str]:
    """The runs a probe tries: SINGLES, ordered pairs of PAIR_BASE, the patterns' literal characters."""
    seen: set[str] = set()
    literals = []
    for pat in patterns:
        esc = False
        for ch in pat:
            if esc:
                esc = False
                continue
            if ch == "\\":
                esc = True
                continue
            if ch not in "()[]{}|*+?^$.-:,!=<>#" and not ch.isspace() and ch not in literals:
                literals.append(ch)
    for p in (*SINGLES, *(a + b for a in PAIR_BASE for b in PAIR_BASE if a != b), *literals[:MAX_LITERALS]):
        if p not in seen:
            seen.add(p)
            yield p


def _clock(run: Callable[[str], Any], text: str, repeats: int = 1) -> float:
    """The best of ``repeats`` CPU times of this thread for ``run(text)``: both libraries split one string
    on the calling thread, and CPU time leaves out what other processes take from a loaded machine (wall
    time there made GPT-2's own pattern look quadratic)."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.thread_time()
        run(text)
        best = min(best, time.thread_time() - t0)
    return best


def _text(pump: str, n: int) -> str:
    return pump * (n // len(pump)) + END


def probe(run: Callable[[str], Any], patterns: tuple[str, ...] = ()) -> str | None:
    """Why ``run`` (a splitter: text -> anything) is not linear in a line's length, in words; or None.
    ``patterns``: the regexes it runs, whose literal characters are probed too."""
    with _held_stderr() as keep:
        for pump in pumps(list(patterns)):
            try:
                why = _probe_pump(run, pump)
            except BaseException as e:  # noqa: BLE001 - a Rust panic (retry or backtrack limit) is a BaseException
                if isinstance(e, (KeyboardInterrupt, SystemExit, MemoryError)):
                    raise
                keep[0] = False  # the panic's own lines: the refusal says it in one
                said = str(e).splitlines()[0][:100] if str(e) else ""
                return (f"its regex engine gives up on a run of {pump!r} ({type(e).__name__}: {said}): it "
                        "backtracks without end")
            if why is not None:
                return why
    return None


@contextlib.contextmanager
def _held_stderr() -> Iterator[list[bool]]:
    """File descriptor 2 held in a temporary file while the probe runs, and written back after unless the
    caller clears the flag: Rust's panic hook writes its message (and a backtrace where RUST_BACKTRACE is
    set) straight to fd 2, which would put lines before the one-line refusal."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no fd 2 to hold
        yield [True]
        return
    keep = [True]
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield keep
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if keep[0]:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)


def _probe_pump(run: Callable[[str], Any], pump: str) -> str | None:
    times: dict[int, float] = {}
    for n in (*LEVELS, CONFIRM_LEVEL):
        if n == CONFIRM_LEVEL and _million(times[LEVELS[0]], LEVELS[0], times[LEVELS[-1]], LEVELS[-1]) <= MAX_LINE_S:
            return None  # the common case: linear by the screen, no long run
        t = _clock(run, _text(pump, n))
        # again (best of CONFIRM) where over its budget but not by far, so one cold run is no verdict; and at the
        # first level, the base of the growth, always (a cold first call into the engine made a+b look linear)
        if PER_CHAR_S * n < t < 10 * PER_CHAR_S * n or (n == LEVELS[0] and t <= PER_CHAR_S * n):
            t = min(t, _clock(run, _text(pump, n), CONFIRM - 1))
        if t > PER_CHAR_S * n:
            return (f"splitting {n:,} characters of {pump!r} repeated takes {t * 1e3:,.0f} ms ({t / n * 1e6:,.0f} us "
                    "a character, where a linear split takes about 1)")
        times[n] = t
    # the screen's extrapolation from 256 characters is coarse (call overhead, caches): the verdict is the growth
    # from 4,096 to 16,384 characters, each the best of two
    n0, n1 = LEVELS[-1], CONFIRM_LEVEL
    t0 = min(times[n0], _clock(run, _text(pump, n0)))
    t1 = min(times[n1], _clock(run, _text(pump, n1)))
    est = _million(t0, n0, t1, n1)
    if est <= MAX_LINE_S:
        return None
    return (f"splitting {n1:,} characters of {pump!r} repeated takes {t1 * 1e3:,.0f} ms, {t1 / t0:,.1f}x the time of "
            f"{n0:,} (a linear split takes {n1 // n0}x): at that growth a {MILLION:,}-character line takes about "
            f"{_duration(est)}")


def _million(t0: float, n0: int, t1: float, n1: int) -> float:
    """Seconds for a MILLION-character line, extrapolated from ``t1`` by the growth from (n0, t0) to (n1, t1)
    (at least linear)."""
    power = max(1.0, math.log(max(t1, 1e-9) / max(t0, 1e-9), n1 / n0)) if t1 >= NOISE_FLOOR_S else 1.0
    return t1 * (MILLION / n1) ** power


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:,.0f} s"
    if s < 7200:
        return f"{s / 60:,.0f} minutes"
    if s < 2 * 86400:
        return f"{s / 3600:,.0f} hours"
    return f"{s / 86400:,.0f} days"


FIX = ("Fix: rewrite the pattern so no part of a line is tried again from every position (no repeat inside a "
       "repeat; possessive '++' or atomic '(?>...)' where a repeat must not give back), or use a known "
       "model's split pattern (GPT-2's, Llama 3's)")


# --- the two kinds' checks --------------------------------------------------------------------------------

def regex_fields(node: Any, field: str) -> Iterator[tuple[str, str]]:
    """(field path, regex) of every ``"pattern": {"Regex": ...}`` under ``node`` (a tokenizer.json part)."""
    if isinstance(node, dict):
        pat = node.get("pattern")
        if isinstance(pat, dict) and isinstance(pat.get("Regex"), str):
            yield f"{field}.pattern.Regex", pat["Regex"]
        for k, v in node.items():
            if k != "pattern":
                yield from regex_fields(v, f"{field}.{k}")
    elif isinstance(node, list):
        for k, v in enumerate(node):
            yield from regex_fields(v, f"{field}[{k}]")


def check_static(patterns: list[tuple[str, str]], where: str) -> None:
    for field, pat in patterns:
        frag = nested_quantifier(pat)
        if frag is not None:
            raise TokenizerError(f"{where}: {field} = {pat[:120]!r}: {frag[:60]!r} repeats a part that itself repeats "
                                 "(nested quantifiers): a backtracking regex engine takes time exponential in a line's "
                                 f"length on it. {FIX}")


def check_hf(doc: dict, library: Any, where: str) -> None:
    """A tokenizer.json's regexes (normalizer, pre_tokenizer, decoder) statically, then its normalizer and
    pre-tokenizer through ``library`` (the ``tokenizers`` Tokenizer) by the clock."""
    fields = [f for part in ("normalizer", "pre_tokenizer", "decoder") for f in regex_fields(doc.get(part), part)]
    check_static(fields, where)
    key = json.dumps([doc.get("normalizer"), doc.get("pre_tokenizer")], sort_keys=True)
    why = _hf_probe_cached(key, library, tuple(p for f, p in fields if not f.startswith("decoder")))
    if why is not None:
        named = "; ".join(f"{f} = {p[:80]!r}" for f, p in fields if not f.startswith("decoder")) or "pre_tokenizer"
        raise TokenizerError(f"{where}: its split is not linear in a line's length ({named}): {why}. {FIX}")


_HF_CACHE: dict[str, str | None] = {}


def _hf_probe_cached(key: str, library: Any, patterns: tuple[str, ...]) -> str | None:
    """One probe per process and (normalizer, pre_tokenizer): prepare's workers, tests and a server load the
    same tokenizer many times. (The library object is not hashable, so a dict keyed by the JSON.)"""
    if key in _HF_CACHE:
        return _HF_CACHE[key]
    norm, pre = library.normalizer, library.pre_tokenizer
    if norm is None and pre is None:
        why = None
    else:
        def run(text: str) -> Any:
            t = norm.normalize_str(text) if norm is not None else text
            return pre.pre_tokenize_str(t) if pre is not None else t

        why = probe(run, patterns)
    if len(_HF_CACHE) > 64:
        _HF_CACHE.clear()
    _HF_CACHE[key] = why
    return why


@functools.lru_cache(maxsize=64)
def tiktoken_probe(pattern: str) -> str | None:
    """Why tiktoken's engine (fancy-regex) does not split linearly with ``pattern``; or None. The encoder
    has the 256 single bytes only, so the clock times the split, not merges."""
    import tiktoken

    enc = tiktoken.Encoding(name="split-probe", pat_str=pattern, mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={})
    return probe(enc.encode_ordinary, (pattern,))


def check_tiktoken_pattern(pattern: str, where: str, field: str = "pattern") -> None:
    """A tiktoken split pattern read from a file: statically, then tiktoken's engine by the clock."""
    check_static([(field, pattern)], where)
    why = tiktoken_probe(pattern)
    if why is not None:
        raise TokenizerError(f"{where}: {field} = {pattern[:120]!r}: its split is not linear in a line's length: "
                             f"{why}. {FIX}")
