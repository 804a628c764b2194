"""PIQA (physical commonsense, validation, 1,838 examples): which of two solutions achieves the goal.

Rendered as lm-eval does: ``"Question: {goal}\\nAnswer:"`` then ``" " + sol1`` / ``" " + sol2``.

Reference: GPT-3 125M 0.646 (GPT-3 paper, zero-shot, its own length normalisation). Our acc_norm
divides by tokens, lm-eval's by bytes, so compare like with like by measuring:
``gptforge assets evals --online && gptforge eval --tasks piqa --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task, shared_context

GPT3_125M = {"acc": 0.646}


def render(row: dict[str, Any]) -> Example:
    return shared_context(f"Question: {row['goal']}\nAnswer:", [" " + row["sol1"], " " + row["sol2"]],
                          int(row["label"]))


TASK = Task("piqa", "choice", render, "physical commonsense, 2 solutions")
