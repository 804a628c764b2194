"""SciQ (validation, 1,000): science exam questions with a supporting paragraph and 4 answers.

Rendered as lm-eval does: ``"{support.lstrip()}\\nQuestion: {question}\\nAnswer:"`` then the
candidates ``distractor1, distractor2, distractor3, correct_answer`` (label 3), each with a leading space.

Reference: no GPT-2 124M / GPT-3 125M number from the original papers (SciQ is not in them); small
models score far above chance here because the support paragraph usually contains the answer.
Measure with ``gptforge assets evals --online && gptforge eval --tasks sciq --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task, shared_context


def render(row: dict[str, Any]) -> Example:
    answers = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    if not all(isinstance(a, str) for a in answers):
        raise ValueError(f"answers must be strings, got {answers!r}")
    context = f"{row['support'].lstrip()}\nQuestion: {row['question']}\nAnswer:"
    return shared_context(context, [" " + a for a in answers], 3)


TASK = Task("sciq", "choice", render, "science questions with a support paragraph, 4 answers")
