"""Reward functions for RL on verifiable tasks, and loading one named on the command line.

A reward function takes the problem and the reply text and returns a float::

    def my_reward(problem: Problem, reply: str) -> float: ...

    gptforge rl --init-from runs/sft --out runs/rl --task arithmetic --reward mypkg.rewards:my_reward

A reward that raises stops the step with an error naming the prompt: it never counts as a silent 0.
A reward that is not finite in float32 (nan, inf, 1e308) stops the run with exit 3 before any update.
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
from collections.abc import Callable, Sequence

import numpy

from gptforge.eval.tasks.verifiable import Problem, extract_answer, is_correct

RewardFn = Callable[[Problem, str], float]


class RewardError(RuntimeError):
    """A reward function that could not be loaded, raised, or returned a non-number."""


def exact_match(problem: Problem, reply: str) -> float:
    """1 when the final 'The answer is N.' matches the problem's answer, else 0."""
    return 1.0 if is_correct(reply, problem.answer) else 0.0


def exact_match_with_format(problem: Problem, reply: str) -> float:
    """exact_match, plus 0.1 for a parsable answer line (a denser signal for weak models)."""
    return exact_match(problem, reply) + (0.1 if extract_answer(reply) is not None else 0.0)


def numeric_closeness(problem: Problem, reply: str) -> float:
    """exact_match, else up to 0.5 for a numeric answer close to the right one (0.5 * exp(-|error| / 5)):
    a dense signal while exact hits are rare (still verifiable: it only reads the final answer)."""
    if exact_match(problem, reply):
        return 1.0
    got = extract_answer(reply)
    try:
        return 0.5 * math.exp(-abs(float(got) - float(problem.answer)) / 5) if got is not None else 0.0
    except ValueError:  # a non-numeric reference answer: no partial credit
        return 0.0


def digit_match(problem: Problem, reply: str) -> float:
    """exact_match, else up to 0.5 for the digits of an integer answer that are right in their places:
    0.5 * (digits equal to the answer's, aligned from the ones) / (digits of the longer of the two), 0 when
    the signs differ or either is not an integer. Unlike numeric_closeness it rewards a right ones digit
    under a wrong hundreds digit (899 for 999 scores 1/3, 990 for 999 scores 2/3 and is closer in value):
    multi-digit arithmetic is learned digit by digit, and a model that guesses (every reply in a group
    wrong) still gets replies that score differently, where exact_match gives GRPO nothing to learn from."""
    if exact_match(problem, reply):
        return 1.0
    got, want = extract_answer(reply), problem.answer.strip()
    if got is None or not _INT.fullmatch(got) or not _INT.fullmatch(want) or got.startswith("-") != want.startswith("-"):
        return 0.0
    a, b = got.lstrip("-")[::-1], want.lstrip("-")[::-1]
    return 0.5 * sum(x == y for x, y in zip(a, b, strict=False)) / max(len(a), len(b))


_INT = re.compile(r"-?\d+")

BUILTIN: dict[str, RewardFn] = {"exact_match": exact_match, "exact_match_with_format": exact_match_with_format,
                                "numeric_closeness": numeric_closeness, "digit_match": digit_match}


def load_reward(spec: str) -> RewardFn:
    """A built-in name or ``module:function`` (importable from the current environment)."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise RewardError(f"--reward {spec!r}: give a built-in ({', '.join(BUILTIN)}) or module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise RewardError(f"--reward {spec!r}: cannot import it ({type(e).__name__}: {e})") from e
    if not callable(fn):
        raise RewardError(f"--reward {spec!r}: {name} is not callable")
    return fn


def score(fn: RewardFn, problems: Sequence[Problem], replies: Sequence[str]) -> list[float]:
    """Rewards per reply, as floats (any real number: int, float, numpy scalar); a raise or a non-number
    names the prompt. A non-finite reward (or one beyond float32, like 1e308) is returned as it is: the
    GRPO step refuses to train on it and the loop stops the run with exit 3, saving nothing."""
    out = []
    for p, r in zip(problems, replies, strict=True):
        try:
            v = fn(p, r)
        except Exception as e:
            raise RewardError(f"reward function {getattr(fn, '__name__', fn)!r} raised on prompt {p.question!r:.120}: "
                              f"{type(e).__name__}: {e}") from e
        if isinstance(v, (bool, numpy.bool_)) or not isinstance(v, numbers.Real):
            raise RewardError(f"reward function {getattr(fn, '__name__', fn)!r} returned {v!r} on prompt "
                              f"{p.question!r:.120}; expected a number")
        out.append(float(v))  # numpy scalars too; inf and nan stay what they are: the run stops (exit 3)
    return out
