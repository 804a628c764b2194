"""HellaSwag (validation, 10,042 examples), scored exactly as llm.c and build-nanogpt do.

Completion style: the context ``ctx`` is followed by each of the four endings with a leading space;
acc takes the ending with the lowest total token loss, acc_norm the lowest mean token loss (over
the ending's tokens only). No preprocessing of the text (lm-eval's harness strips "[title]" etc.
and normalises by bytes, which is why its numbers differ).

Reference numbers (10,042 validation examples):

| model | acc | acc_norm | source |
|---|---|---|---|
| GPT-2 124M | 0.2859 | 0.2955 | build-nanogpt ``hellaswag.py``, this scoring |
| GPT-2 1558M | 0.3842 | 0.4893 | build-nanogpt ``hellaswag.py``, this scoring |
| GPT-3 125M | | 0.337 | GPT-3 paper (Brown et al. 2020), the line llm.c plots |

Reproduce online: ``gptforge assets evals --online && gptforge eval --tasks hellaswag --hf gpt2``.
"""

from __future__ import annotations

from typing import Any

from gptforge.eval.tasks.base import Example, Task, shared_context

GPT2_124M = {"acc": 0.2859, "acc_norm": 0.2955}
GPT3_125M = {"acc_norm": 0.337}


def render(row: dict[str, Any]) -> Example:
    endings = row["endings"]
    if not isinstance(endings, list) or len(endings) != 4 or not all(isinstance(e, str) for e in endings):
        raise ValueError(f"endings must be a list of 4 strings, got {endings!r}")
    return shared_context(row["ctx"], [" " + e for e in endings], int(row["label"]))


TASK = Task("hellaswag", "choice", render, "commonsense sentence completion, 4 endings")
