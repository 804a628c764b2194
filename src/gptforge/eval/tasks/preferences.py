"""Preference pairs with a known truth, made from the verifiable tasks: the chosen reply is the
task's worked answer (correct and in format), the rejected one is wrong in one recorded way.

Kinds of rejected reply (each row says which in ``"kind"``):

- ``wrong_number``: the task's format with a wrong final number (``37 + 48 = 86. The answer is 86.``);
- ``wrong_operand``: a right computation on a wrong operand (``37 + 49 = 86. ...``; for ``compare``,
  the smaller number named larger); tasks without operands (gsm8k) get a wrong number instead;
- ``broken_format``: the right number outside the format, so no answer can be read (``The sum is 85``).

Reward models and DPO learn from such sets and are scored against the truth; tests and CPU
benchmarks use them.

    >>> write_preferences(preference_set("compare", 5000, seed=1), "prefs.jsonl")   # for training
    >>> write_preferences(preference_set("compare", 500, held_out=True), "prefs_eval.jsonl")  # the eval problems
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptforge.eval.tasks.verifiable import Problem

KINDS = ("wrong_number", "wrong_operand", "broken_format")
_ARITH = re.compile(r"^What is (\d+) ([+-]) (\d+)\?$")
_COMPARE = re.compile(r"^Which is larger, (\d+) or (\d+)\?$")


def _off_by(rng: random.Random, x: int, avoid: set[int] | None = None) -> int:
    """A number near ``x`` (1..10 away), never negative, never ``x`` nor in ``avoid``."""
    avoid = (avoid or set()) | {x}
    while True:
        y = x + rng.choice([-1, 1]) * rng.randint(1, 10)
        if y >= 0 and y not in avoid:
            return y


def _arith(rng: random.Random, kind: str, a: int, op: str, b: int, c: int) -> str:
    if kind == "wrong_number":
        w = _off_by(rng, c)
        return f"{a} {op} {b} = {w}. The answer is {w}."
    if kind == "wrong_operand":  # misread one operand, then compute correctly from it
        while True:
            a2, b2 = (a, _off_by(rng, b)) if rng.random() < 0.5 else (_off_by(rng, a), b)
            w = a2 + b2 if op == "+" else a2 - b2
            if w != c and w >= 0:
                return f"{a2} {op} {b2} = {w}. The answer is {w}."
    return _broken(rng, str(c))


def _compare(rng: random.Random, kind: str, a: int, b: int) -> str:
    hi, lo = max(a, b), min(a, b)
    if kind == "wrong_operand":
        return f"{lo} is larger than {hi}. The answer is {lo}."
    if kind == "wrong_number":
        w = _off_by(rng, hi, {lo})
        return f"{w} is larger than {lo}. The answer is {w}."
    return _broken(rng, str(hi))


def _broken(rng: random.Random, answer: str) -> str:
    """The right number in a sentence that the answer extractor does not read."""
    return rng.choice([f"{answer}", f"The answer: {answer}", f"It is {answer}.", f"The answer is {answer} or so."])


def rejected_reply(problem: Problem, kind: str, rng: random.Random) -> str:
    """A wrong reply of ``kind`` (one of :data:`KINDS`) to ``problem``."""
    if kind not in KINDS:
        raise ValueError(f"rejected kind {kind!r}: expected one of {', '.join(KINDS)}")
    if m := _ARITH.match(problem.question):
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return _arith(rng, kind, a, op, b, int(problem.answer))
    if m := _COMPARE.match(problem.question):
        return _compare(rng, kind, int(m.group(1)), int(m.group(2)))
    # any other task (gsm8k): keep the worked text, change or unformat its final answer
    body = problem.solution.rsplit("The answer is", 1)[0].rstrip()
    if kind == "broken_format":
        return f"{body} So we get {problem.answer}".strip()
    w = _off_by(rng, int(problem.answer)) if problem.answer.lstrip("-").isdigit() else problem.answer + "1"
    return f"{body} The answer is {w}.".strip()


def preference_rows(problems: Sequence[Problem], seed: int = 0, kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    """One TRL-conversational preference row per problem: ``prompt`` (the user turn), ``chosen``
    (the worked solution), ``rejected`` (a wrong reply of a seeded kind from ``kinds``), plus the
    truth: ``kind`` and ``answer``. The same (problems, seed, kinds) give the same rows."""
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds {list(kinds)}: choose from {', '.join(KINDS)}")
    rng = random.Random(seed)
    rows = []
    for p in problems:
        kind = rng.choice(list(kinds))
        rows.append({"prompt": p.messages(with_solution=False),
                     "chosen": [{"role": "assistant", "content": p.solution}],
                     "rejected": [{"role": "assistant", "content": rejected_reply(p, kind, rng)}],
                     "kind": kind, "answer": p.answer})
    return rows


def preference_set(task: str, n: int, seed: int = 0, kinds: Sequence[str] = KINDS, held_out: bool = False,
                   exclude_eval: int = 500) -> list[dict[str, Any]]:
    """``n`` preference rows of a generated task (``arithmetic``, ``compare``). Training rows
    (``held_out`` False) come from seeded problems none of which is among the first ``exclude_eval``
    problems of the task's eval set, so that set stays held out (as SFT data does); ``held_out`` True
    makes the rows from that eval set itself (its first ``n`` problems): the held-out pairs."""
    from gptforge.eval.generative import GENERATED

    if task not in GENERATED:
        raise ValueError(f"preference task {task!r}: generated tasks are {', '.join(GENERATED)}")
    if n < 1:
        raise ValueError(f"preference set size {n}: must be >= 1")
    make, eval_set = GENERATED[task]
    if held_out:
        problems = eval_set(n)
        if len(problems) < n:
            raise ValueError(f"{task}: its eval set has {len(problems)} problems, fewer than {n}")
        return preference_rows(problems, seed, kinds)
    banned = {p.question for p in eval_set(exclude_eval)} if exclude_eval else set()
    problems: list[Problem] = []
    k = 0
    while len(problems) < n:
        problems += [p for p in make(n, seed + 1_000_003 * k) if p.question not in banned]
        k += 1
    return preference_rows(problems[:n], seed, kinds)


def write_preferences(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """One row per line: a preference JSONL file (``gptforge.data.preference.read_preferences`` reads it)."""
    from gptforge.storage import atomic_open

    path = Path(path)
    with atomic_open(path, "w", what="the preference file", sole=True, encoding="utf-8") as f:  # never half a
        # file, and never two writers at once (the second is refused, naming the first)
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
