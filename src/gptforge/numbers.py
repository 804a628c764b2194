"""The one parser of numbers written on the command line: every numeric flag (argparse's ``type=int`` and
``type=float`` included, through ``argparsing.OneLineParser``'s type registry) and every ``--section.key`` override.

    >>> parse_int("1e4"), parse_int("32_768"), parse_float("3e-4")
    (10000, 32768, 0.0003)

A number is refused (ValueError with the reason, which the callers put after the flag's name) when it is
not a number, not finite (``nan``, ``inf``, ``1e400``, which float() reads as inf), not whole where a whole
number is wanted, or an integer past 64 bits (no count, size or seed is that large; torch and numpy would
overflow on it later, far from the flag).
"""

from __future__ import annotations

import math

# the widest dimension any model config may give (a width, a head count, a vocabulary, a context): no real
# model comes near it, and past it a config is damaged, not big (meta.json's n_embd 2^40 overflowed torch's
# size arithmetic in a traceback before anything compared it with the weights). Every config reader's bound:
# gptforge's own (models/gpt2.py, models/llama.py) and Hugging Face's (interop/hf.py, interop/hf_llama.py)
MAX_DIM = 1 << 24

# the most CPU threads a process may ask torch for (train.threads, bench-generate --threads): past every machine's
# cores; torch.set_num_threads(10**6) spawned threads until it failed in a traceback (an 8 MiB stack each)
MAX_THREADS = 1024

INT_LIMIT = 2**63 - 1  # the largest int64: torch's and numpy's integers


def parse_int(raw: str) -> int:
    """A whole number, also written 1e9, 5.0 or 32_768, within 64 bits."""
    s = str(raw).strip().replace("_", "")
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
    try:
        v = float(str(raw).strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"{raw!r} is not a finite number")
    return v
