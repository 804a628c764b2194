"""The one parser of numbers written on the command line: every numeric flag (argparse's ``type=int`` and
``type=float`` included, through ``argparsing.OneLineParser``'s type registry) and every ``--section.key`` override.

    >>> parse_int("1e4"), parse_int("32_768"), parse_float("3e-4")
    (10000, 32768, 0.0003)
    >>> parse_int("１０")
    Traceback (most recent call last):
    ValueError: '１０' holds '１' (FULLWIDTH DIGIT ONE), not an ASCII character; write it in ASCII digits: 10

A number is refused (ValueError with the reason, which the callers put after the flag's name) when it is
not written in ASCII (``１０``, ``١٠``: full-width or Arabic-Indic digits, a non-breaking space, which Python's
int() and float() read as 10 without a word: a pasted or mistyped value, not one anybody types on purpose; the
refusal says the ASCII number it would have been), when an underscore is anything but a thousands separator
(``32_768`` and ``100_000_000`` group digits by three and are taken; ``1_0``, ``10_`` or ``1__000`` are typos that
int() read as 10 and 1000), when it is not a number, not finite (``nan``, ``inf``, ``1e400``, which float() reads as inf), not whole where a whole
number is wanted, or an integer past 64 bits (no count, size or seed is that large; torch and numpy would
overflow on it later, far from the flag).
"""

from __future__ import annotations

import math
import re
import unicodedata

# the widest dimension any model config may give (a width, a head count, a vocabulary, a context): no real
# model comes near it, and past it a config is damaged, not big (meta.json's n_embd 2^40 overflowed torch's
# size arithmetic in a traceback before anything compared it with the weights). Every config reader's bound:
# gptforge's own (models/gpt2.py, models/llama.py) and Hugging Face's (interop/hf.py, interop/hf_llama.py)
MAX_DIM = 1 << 24

# the most CPU threads a process may ask torch for (train.threads, bench-generate --threads): past every machine's
# cores; torch.set_num_threads(10**6) spawned threads until it failed in a traceback (an 8 MiB stack each)
MAX_THREADS = 1024

INT_LIMIT = 2**63 - 1  # the largest int64: torch's and numpy's integers


# an underscore is a thousands separator only: between digits, in groups of three, in the integer part
_GROUPED = re.compile(r"[+-]?[0-9]{1,3}(_[0-9]{3})+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


def _plain(raw: str) -> str:
    """``raw`` stripped and without its thousands separators, once it is known to be written as a person types a
    number: ASCII only (see the module's docstring) and any underscore a separator of three digits."""
    s = str(raw).strip(" \t\n\r\f\v")  # ASCII white space only: a no-break space is refused below
    odd = next((c for c in s if not c.isascii()), None)
    if odd is not None:
        try:  # what int()/float() would have read it as, so the user sees the number they meant (or did not)
            ascii_form = "".join(str(unicodedata.decimal(c)) if not c.isascii() else c for c in s)
            said = f"; write it in ASCII digits: {ascii_form}"
        except ValueError:
            said = "; write it in ASCII digits, signs and dots"
        name = unicodedata.name(odd, f"U+{ord(odd):04X}")
        raise ValueError(f"{raw!r} holds {odd!r} ({name}), not an ASCII character{said}")
    if "_" in s and not _GROUPED.fullmatch(s):
        raise ValueError(f"{raw!r}: '_' may only separate thousands (32_768, 100_000_000); a typo? write the "
                         "number without it")
    return s.replace("_", "")


def parse_int(raw: str) -> int:
    """A whole number, also written 1e9, 5.0 or 32_768, within 64 bits."""
    s = _plain(raw)
    try:
        v = int(s)
    except ValueError:
        v = None
    if v is None:
        f = parse_float(raw)
        if not f.is_integer():
            raise ValueError(f"{raw!r} is not a whole number")
        v = int(f)
    if abs(v) > INT_LIMIT:
        raise ValueError(f"{raw!r} is out of range (an integer of at most {INT_LIMIT:,} in size)")
    return v


def parse_float(raw: str) -> float:
    """A finite number."""
    s = _plain(raw)  # its refusal is its own (not "not a number": '１０' reads as a number to the eye)
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"{raw!r} is not a finite number")
    return v
