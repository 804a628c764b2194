"""OpenBookQA (validation, 500): elementary science questions with 4 choices.

Rendered as lm-eval does: the ``question_stem`` then ``" " + choice``; the label is the position of
``answerKey`` among the choice labels.

Reference: GPT-3 125M 0.356 (GPT-3 paper, zero-shot, acc_norm-style, test split). Measure GPT-2 124M with
``gptforge assets evals --online && gptforge eval --tasks openbookqa --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task, labelled_choices, shared_context

GPT3_125M = {"acc_norm": 0.356}


def render(row: dict[str, Any]) -> Example:
    texts, answer = labelled_choices(row)
    return shared_context(row["question_stem"], [" " + t for t in texts], answer)


TASK = Task("openbookqa", "choice", render, "open-book science questions, 4 choices")
