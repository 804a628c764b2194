"""Generative evaluation: greedy answers (KV cache) scored by exact match of the final number.

    gptforge eval --tasks arithmetic,gsm8k --ckpt runs/sft --limit 200

A task is a list of :class:`~gptforge.eval.tasks.verifiable.Problem` plus a format check. With a
chat template (a checkpoint from ``gptforge sft``) each question is rendered as a user turn and the
reply ends at ``<|end|>``; without one the prompt is ``Question: ...\\nAnswer:`` and the reply ends
at a blank line. Problems whose prompt does not fit the context count as wrong and are reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gptforge.data.chat import ChatTemplate, ChatTokenizer, plain_tokenizer
from gptforge.eval.tasks.base import EvalDataError
from gptforge.eval.tasks.verifiable import (
    Problem,
    arithmetic_problems,
    compare_problems,
    extract_answer,
    follows_arithmetic_format,
    follows_compare_format,
    gsm8k_problems,
    is_correct,
)
from gptforge.generation import SamplingParams, complete

RAW_STOPS = ("\n\n", "\nQuestion:")  # where a reply to a raw (template-less) prompt ends
HELD_OUT = 500  # a generated task's eval set: its first 500 distinct problems of ARITHMETIC_EVAL_SEED
ARITHMETIC_EVAL_SEED = 2024  # SFT files (rl.tasks) and RL problems leave these questions out


@dataclass(frozen=True)
class GenerativeTask:
    name: str
    problems: Callable[[int], list[Problem]]  # limit (0 = the task's default size) -> problems
    follows_format: Callable[[str], bool]
    max_new_tokens: int


def _distinct(problems: list[Problem], n: int) -> list[Problem]:
    out: dict[str, Problem] = {}
    for p in problems:
        out.setdefault(p.question, p)
    return list(out.values())[:n]


def arithmetic_eval_problems(n: int = 0) -> list[Problem]:
    """The arithmetic eval set: the first ``n`` (default 500) distinct problems of its own seed."""
    return _distinct(arithmetic_problems(2 * (n or HELD_OUT) + 100, seed=ARITHMETIC_EVAL_SEED), n or HELD_OUT)


def arithmetic3_problems(n: int, seed: int = 0) -> list[Problem]:
    """``n`` arithmetic problems with 3-digit operands ("What is 512 + 387?"): a harder task of the same form."""
    return arithmetic_problems(n, seed, digits=3)


def arithmetic3_eval_problems(n: int = 0) -> list[Problem]:
    """The 3-digit arithmetic eval set: the first ``n`` (default 500) distinct problems of its own seed."""
    return _distinct(arithmetic_problems(2 * (n or HELD_OUT) + 100, seed=ARITHMETIC_EVAL_SEED, digits=3), n or HELD_OUT)


def compare_eval_problems(n: int = 0) -> list[Problem]:
    """The compare eval set: the first ``n`` (default 500) distinct problems of its own seed."""
    return _distinct(compare_problems(2 * (n or HELD_OUT) + 100, seed=ARITHMETIC_EVAL_SEED), n or HELD_OUT)


# generated tasks: task -> (train-problem generator (n, seed), eval set); training data leaves the eval set out
GENERATED = {"arithmetic": (arithmetic_problems, arithmetic_eval_problems),
             "arithmetic3": (arithmetic3_problems, arithmetic3_eval_problems),
             "compare": (compare_problems, compare_eval_problems)}

GENERATIVE = {
    "arithmetic": GenerativeTask("arithmetic", arithmetic_eval_problems, follows_arithmetic_format, 24),
    # "964 - 494 = 470. The answer is 470.": 24 tokens with one token a digit (SmolLM2, Llama 3), 14 in GPT-2's
    "arithmetic3": GenerativeTask("arithmetic3", arithmetic3_eval_problems, follows_arithmetic_format, 32),
    "compare": GenerativeTask("compare", compare_eval_problems, follows_compare_format, 24),
    "gsm8k": GenerativeTask("gsm8k", gsm8k_problems, lambda t: extract_answer(t) is not None, 256),
}


@dataclass
class GenerativeResult:
    task: str
    n: int
    accuracy: float
    format_rate: float
    too_long: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)  # the first few (question, reply, answer)
    # every problem in order: question, answer, reply, correct (``eval --json`` keeps them, for paired comparisons)
    replies: list[dict[str, Any]] = field(default_factory=list)


def prompt_ids(problem: Problem, enc: Any, template: ChatTemplate | None, system: str | None = None) -> list[int]:
    if template is not None:
        return template.render_for_generation(problem.messages(with_solution=False, system=system), enc)
    return enc.encode_ordinary(f"Question: {problem.question}\nAnswer:")


def generate_replies(model: Any, enc: Any, prompts: Sequence[list[int]], template: ChatTemplate | None,
                     max_new_tokens: int, batch_size: int = 32, temperature: float = 0.0,
                     seed: int | None = 0, desc: str | None = None) -> list[str]:
    """Replies to token prompts, batched (left-padded, KV cache), greedy unless ``temperature``.
    ``desc``: a progress bar by that name over the prompts, on stderr."""
    from gptforge.progress import progress_bar

    if template is not None:
        enc = ChatTokenizer(plain_tokenizer(enc), template)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=None,
                                stop_token=template.end, seed=seed)
    else:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=None,
                                stop=RAW_STOPS, stop_token=enc.eot_token, seed=seed)
    out: list[str] = []
    with progress_bar(len(prompts), desc or "", "problem", show=desc is not None) as bar:
        for i in range(0, len(prompts), batch_size):
            out += [r["text"].strip() for r in complete(model, enc, prompts[i : i + batch_size], params)]
            bar.update(len(prompts[i : i + batch_size]))
    return out


def task_problems(name: str, limit: int = 0, offset: int = 0) -> list[Problem]:
    """Problems ``offset`` to ``offset + limit`` (to the end with ``limit`` 0) of a generative task's eval set;
    a limit past a generated task's held-out set is the whole set, as a scored task's limit past its data is.
    An offset stays inside the set as it is by default (a generated task's 500 problems, left out of every
    training draw), so the problems after it are a second held-out set, e.g. to choose a checkpoint on."""
    task = GENERATIVE[name]
    if name in GENERATED:  # the held-out set is the default 500: asking for more would score problems a
        limit = 0 if limit > HELD_OUT else limit  # training draw may have held (and generate 2 x limit to find them)
    if not offset:
        return task.problems(limit)[: limit or None]
    whole = task.problems(0)
    size = len(whole)
    if offset < 0 or offset + max(limit, 1) > size:
        raise EvalDataError(f"--offset {offset} with --limit {limit}: {name}'s held-out set has {size} problems "
                            f"(offset + limit at most {size}; with --limit 0, offset below {size})")
    return whole[offset: offset + limit if limit else None]


def evaluate_generative(model: Any, enc: Any, names: Sequence[str], template: ChatTemplate | None,
                        limit: int = 0, batch_size: int = 32, system: str | None = None,
                        offset: int = 0, bar: bool = False) -> list[GenerativeResult]:
    """Exact-match accuracy and format rate per task, on its problems ``offset`` to ``offset + limit``.
    ``bar``: a progress bar per task on stderr."""
    unknown = [n for n in names if n not in GENERATIVE]
    if unknown:
        raise EvalDataError(f"unknown generative task(s) {', '.join(unknown)}; known: {', '.join(GENERATIVE)}")
    results = []
    block = model.config.block_size
    for name in names:
        task = GENERATIVE[name]
        problems = task_problems(name, limit, offset)
        new = min(task.max_new_tokens, block - 1)
        prompts = [prompt_ids(p, enc, template, system) for p in problems]
        top, vocab = max((max(r, default=0) for r in prompts), default=0), getattr(model.config, "vocab_size", None)
        if vocab is not None and top >= vocab:  # before the context filter: such a prompt was scored wrong, unread
            raise EvalDataError(f"the model's vocab_size is {vocab}, but {name}'s prompts were "
                                f"tokenized to ids up to {top}: evaluate with the model's own tokenizer")
        fits = [i for i, ids in enumerate(prompts) if len(ids) + new <= block]
        replies = [""] * len(problems)
        desc = f"{name} ({len(fits)} problems)" if bar else None
        for i, r in zip(fits, generate_replies(model, enc, [prompts[i] for i in fits], template, new, batch_size,
                                               desc=desc), strict=True):
            replies[i] = r
        n = len(problems)
        rows = [{"question": p.question, "answer": p.answer, "reply": r, "correct": bool(is_correct(r, p.answer))}
                for p, r in zip(problems, replies, strict=True)]
        correct = sum(row["correct"] for row in rows)
        formatted = sum(task.follows_format(r) for r in replies)
        samples = [{"question": p.question, "reply": r, "answer": p.answer} for p, r in zip(problems[:3], replies,
                                                                                                  strict=False)]
        results.append(GenerativeResult(name, n, correct / n, formatted / n, n - len(fits), samples, rows))
    return results
