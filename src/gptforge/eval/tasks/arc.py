"""ARC-Easy (validation, 570) and ARC-Challenge (validation, 299): grade-school science questions.

Rendered as lm-eval does: ``"Question: {question}\\nAnswer:"`` then ``" " + choice`` for each choice
(3 to 5 of them); the label is the position of ``answerKey`` among the choice labels.

Reference: GPT-3 125M ARC-Easy 0.436, ARC-Challenge 0.266 (GPT-3 paper, zero-shot, test split; these
are validation splits). Measure GPT-2 124M with
``gptforge assets evals --online && gptforge eval --tasks arc_easy,arc_challenge --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task, labelled_choices, shared_context

GPT3_125M = {"arc_easy": {"acc": 0.436}, "arc_challenge": {"acc": 0.266}}


def render(row: dict[str, Any]) -> Example:
    texts, answer = labelled_choices(row)
    return shared_context(f"Question: {row['question']}\nAnswer:", [" " + t for t in texts], answer)


EASY = Task("arc_easy", "choice", render, "science questions (easy set)")
CHALLENGE = Task("arc_challenge", "choice", render, "science questions (challenge set)")
