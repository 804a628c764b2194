"""LAMBADA (OpenAI's detokenised test set, 5,153 passages): predict the last word of a passage.

The context is the passage without its last word, the continuation ``" " + last word``. A passage
counts as correct when greedy decoding reproduces every token of the word (acc); perplexity is
``exp`` of the mean per-passage total loss of the word, as lm-eval reports it.

Reference: GPT-2 124M acc 0.4599, ppl 35.13 (GPT-2 paper, Table 3; OpenAI's own preprocessing);
GPT-3 125M acc 0.427, ppl 18.6 (GPT-3 paper, zero-shot). Measure with our scoring:
``gptforge assets evals --online && gptforge eval --tasks lambada --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task

GPT2_124M = {"acc": 0.4599, "ppl": 35.13}
GPT3_125M = {"acc": 0.427, "ppl": 18.6}


def render(row: dict[str, Any]) -> Example:
    context, word = row["text"].rsplit(" ", 1)  # ValueError (malformed) for a one-word text
    if not word:
        raise ValueError("the passage ends in a space: no last word")
    return Example((context,), (" " + word,), 0)


TASK = Task("lambada", "last_word", render, "last-word prediction: greedy accuracy and perplexity")
