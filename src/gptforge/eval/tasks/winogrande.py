"""WinoGrande (winogrande_xl validation, 1,267): pronoun resolution with two options, partial scoring.

Partial scoring (lm-eval's approach): the sentence is cut at ``_``; each candidate's context is the
part before ``_`` with that option substituted, and the scored continuation is the shared remainder
after ``_`` (with a leading space). So both candidates score the same tokens under different
contexts, and acc and acc_norm agree.

Reference: GPT-3 125M 0.520 (GPT-3 paper, zero-shot, partial scoring, dev set). Measure GPT-2 124M with
``gptforge assets evals --online && gptforge eval --tasks winogrande --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task

GPT3_125M = {"acc": 0.520}


def render(row: dict[str, Any]) -> Example:
    sentence = row["sentence"]
    cut = sentence.index("_")  # ValueError (malformed) when there is no blank
    remainder = " " + sentence[cut + 1 :].strip()
    options = [row["option1"], row["option2"]]
    answer = {"1": 0, "2": 1}[str(row["answer"])]
    return Example(tuple(sentence[:cut] + o for o in options), (remainder, remainder), answer)


TASK = Task("winogrande", "choice", render, "pronoun resolution, 2 options (partial scoring)")
