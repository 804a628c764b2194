"""How much an accuracy says: the chance level of a task and a 95% Wilson score interval.

    gptforge eval --tasks piqa --hf gpt2 --limit 40     # acc 0.625, chance 0.500, 95% CI 0.470-0.758

At ``--limit 40`` an accuracy of 0.625 on a two-choice task is within noise of chance; the interval
says so. Wilson's interval (not the normal approximation) stays inside [0, 1] and is sound at small n
and at accuracies near 0 or 1 (Newcombe 1998, method 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson(correct: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``correct`` successes out of ``n`` (``(0, 1)`` when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if correct <= 0 else max(0.0, centre - half)  # exact at the ends (no 1e-17 from rounding)
    hi = 1.0 if correct >= n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value of paired right/wrong outcomes: ``b`` problems only the first model
    gets right, ``c`` only the second; under no difference each discordant pair is a fair coin."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def chance_level(examples: Sequence[Any]) -> float | None:
    """The accuracy of guessing uniformly: the mean of 1 / candidates over the examples; None for
    open-ended tasks (one continuation scored against the whole vocabulary, such as LAMBADA)."""
    counts = [len(ex.continuations) for ex in examples]
    if not counts or min(counts) < 2:
        return None
    return sum(1 / c for c in counts) / len(counts)


# generative tasks whose answer is one of a few options named in the prompt: a guesser's accuracy. The
# others (arithmetic, gsm8k) have an open numeric answer: no meaningful chance level.
GENERATIVE_CHANCE = {"compare": 0.5}  # "Which is larger, 37 or 48?": one of the two numbers


def with_context(result: dict[str, Any], chance: float | None) -> dict[str, Any]:
    """``result`` ({"n", "acc", ["acc_norm"]}) with ``chance`` and a 95% interval per accuracy."""
    n = int(result["n"])
    out = dict(result, chance=chance)
    for key in ("acc", "acc_norm"):
        if key in result:
            out[f"{key}_ci95"] = list(wilson(result[key] * n, n))
    return out


def fmt_ci(lo_hi: Sequence[float]) -> str:
    return f"{lo_hi[0]:.3f}-{lo_hi[1]:.3f}"


# --- one formatter for every printed rate and score -------------------------------------------------

RM_SCORE_SCALE = "reward-model score (logit, higher is better; untrained ≈ 0)"
LOSS_UNIT = "nats/token"


def rate_context(rate: float, n: int, chance: float | None = None) -> dict[str, Any]:
    """A rate's numbers for JSON: ``{"rate", "n", "ci95", "chance"}`` (the 95% Wilson interval)."""
    return {"rate": rate, "n": n, "ci95": list(wilson(rate * n, n)), "chance": chance}


def fmt_rate(name: str, rate: float, n: int, chance: float | None = None, *, chance_name: str = "chance",
             hint: str = "") -> str:
    """Every printed accuracy or rate, one way: its name, the value, the 95% interval and n, the chance
    level where it applies (``chance_name``: "chance", or "parity" for a win rate), and a note when it is
    below that level: within noise, or a WARNING (with ``hint``) when the whole interval is below.

        held-out pair accuracy 0.280 (95% CI 0.201-0.375, n 100, chance 0.500)  WARNING: below chance ...
    """
    lo, hi = wilson(rate * n, n)
    out = f"{name} {rate:.3f} (95% CI {lo:.3f}-{hi:.3f}, n {n}"
    out += ")" if chance is None else f", {chance_name} {chance:.3f})"
    if chance is not None and hi < chance:
        out += f"  WARNING: below {chance_name} beyond noise" + (f"; {hint}" if hint else "")
    elif chance is not None and rate < chance:
        out += f"  (below {chance_name}, within noise)"
    return out


def fmt_score(name: str, value: float, scale: str) -> str:
    """A score that is not a rate: its name, value and what its scale means (``scale``)."""
    return f"{name} {value:.3f} ({scale})"


def fmt_loss(name: str, value: float, unit: str = LOSS_UNIT) -> str:
    return f"{name} {value:.4f} ({unit})"
