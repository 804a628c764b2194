"""Training data made from the verifiable tasks of :mod:`gptforge.eval.tasks.verifiable`: problems
that leave the eval set out, and SFT conversation files.

    gptforge prepare conversations arithmetic --n 5000 --out conv.jsonl   # SFT conversations
"""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.eval.tasks.verifiable import (
    GENERATIVE_TASKS,
    Problem,
    arithmetic_problems,
    extract_answer,
    follows_arithmetic_format,
    gsm8k_problems,
    is_correct,
)

__all__ = ["GENERATIVE_TASKS", "Problem", "arithmetic_problems", "extract_answer", "follows_arithmetic_format",
           "gsm8k_problems", "is_correct", "training_problems", "write_conversations"]


def write_conversations(problems: list[Problem], path: str | Path) -> Path:
    """One ``{"messages": [...]}`` per line: an SFT data file."""
    from gptforge.storage import atomic_open

    path = Path(path)
    with atomic_open(path, "w", what="the conversations file", sole=True, encoding="utf-8") as f:  # never half a
        # file, and never two writers at once (the second is refused, naming the first)
        for p in problems:
            f.write(json.dumps({"messages": p.messages()}) + "\n")
    return path


def training_problems(n: int, seed: int, digits: int = 2, exclude_eval: int = 500,
                      task: str = "arithmetic") -> list[Problem]:
    """``n`` problems of a generated task for SFT data, none of them among the first
    ``exclude_eval`` problems of its eval set (so that eval stays held out)."""
    from gptforge.eval.generative import GENERATED

    if task == "arithmetic" and digits == 3:  # the problems of task arithmetic3, whose eval set is left out
        task = "arithmetic3"
    make, eval_set = GENERATED[task]
    # arithmetic with other digit counts has no eval set of its own (2 digits is arithmetic's)
    held = exclude_eval and (task != "arithmetic" or digits == 2)
    banned = {p.question for p in eval_set(exclude_eval)} if held else set()
    out: list[Problem] = []
    k = 0
    while len(out) < n:
        seed_k = seed + 1_000_003 * k
        batch = arithmetic_problems(n, seed_k, digits) if task == "arithmetic" else make(n, seed_k)
        out += [p for p in batch if p.question not in banned]
        k += 1
    return out[:n]
