"""Preference pairs from a policy's own samples: the on-policy data DPO and reward models learn best from.

    gptforge prepare preferences compare --policy runs/sft --samples 8 --n 3000 --out prefs_onpolicy.jsonl
    gptforge prepare preferences compare --policy runs/sft --judge runs/rm --n 3000 --out prefs_rm.jsonl

For each problem the policy samples ``samples`` replies (the RL sampler: chat template, KV cache,
``temperature``/``top_k``); a judge scores them and the problem gives a pair when the scores differ:

- ``judge="task"`` (the verifier, standing in for a human labeller): chosen = a correct reply, rejected
  = a wrong one (:func:`~gptforge.eval.tasks.verifiable.is_verified`: the right final answer, in the
  task's form and consistent with the question, so "60 is larger than 59. The answer is 63." is not
  chosen); a problem whose replies are all right or all wrong gives no pair;
- a reward model (a ``gptforge rm`` run): chosen = its highest-scored reply, rejected = its lowest
  (best-of-n against worst-of-n, as in RSO and Llama 2's rejection sampling); ties give no pair.

``chosen="solution"`` keeps the rejected side on-policy but takes the task's worked solution as the
chosen reply (SPIN, Chen et al. 2024: the data's answer against the model's own): a sampled reply can
be right by luck ("86 is larger than 30. The answer is 89."), and DPO would then raise its wrong copy
of the numbers along with the right answer.

The generator's pairs (:mod:`gptforge.eval.tasks.preferences`) are off-policy: their rejected replies
are wrong in three scripted ways, which are not how the policy is wrong. These pairs are the policy's
own mistakes, so DPO moves probability where the policy actually puts it. Every row records the truth
(``answer``; ``kind`` ``"policy"``), both replies' judge scores and exact-match truth, and the sampling
seed: the same arguments give the same file.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptforge.eval.tasks.verifiable import Problem, is_verified


@dataclass(frozen=True)
class PairSettings:
    samples: int = 8  # replies sampled per problem
    temperature: float = 0.7
    top_k: int = 50  # 0 = off
    max_new_tokens: int = 24
    pairs_per_problem: int = 1  # distinct (chosen, rejected) pairs taken from one problem's replies, at most
    chosen: str = "sample"  # sample: a reply the judge prefers; solution: the task's worked solution (SPIN)
    batch: int = 16  # problems sampled together (x samples replies in one batch)
    seed: int = 0

    def check(self) -> None:
        for name, lo in (("samples", 2), ("max_new_tokens", 1), ("pairs_per_problem", 1), ("batch", 1)):
            if getattr(self, name) < lo:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= {lo}")
        if not 0 < self.temperature <= 10:
            raise ValueError(f"--temperature {self.temperature}: must be in (0, 10] (pairs need distinct samples)")
        if self.top_k < 0:
            raise ValueError(f"--top-k {self.top_k}: must be >= 0 (0 = off)")
        if self.chosen not in ("sample", "solution"):
            raise ValueError(f"--chosen {self.chosen!r}: sample or solution")


def pairs_from_scores(texts: Sequence[str], scores: Sequence[float], k: int, rng: random.Random,
                      threshold: float | None = None) -> list[tuple[int, int]]:
    """Up to ``k`` (chosen, rejected) index pairs among one problem's replies. With ``threshold`` (the
    verifier: 1 = correct) chosen comes from the replies scoring >= it and rejected from those below,
    drawn at random; without, the best against the worst, then the next best against the next worst.
    Replies with the same text never pair with each other."""
    order = list(range(len(texts)))
    if threshold is not None:
        good = [i for i in order if scores[i] >= threshold]
        bad = [i for i in order if scores[i] < threshold]
        rng.shuffle(good)
        rng.shuffle(bad)
        cand = [(g, b) for g in good for b in bad]
    else:
        ranked = sorted(order, key=lambda i: (-scores[i], i))
        cand = [(ranked[j], ranked[-1 - j]) for j in range(len(ranked) // 2)]
    out: list[tuple[int, int]] = []
    used: set[int] = set()
    for c, r in cand:
        if len(out) == k:
            break
        if c in used or r in used or texts[c] == texts[r] or scores[c] <= scores[r]:
            continue
        out.append((c, r))
        used |= {c, r}
    return out


def solution_rejects(texts: Sequence[str], scores: Sequence[float], truth: Sequence[float], solution: str, k: int,
                     judged_by_rm: bool) -> list[int]:
    """Up to ``k`` distinct replies to pair under the worked ``solution`` (``chosen="solution"``, as
    SPIN pairs the data's answer with the model's own): the wrong ones by the verifier, or the reward
    model's lowest-scored ones; never a reply equal to the solution, nor a correct one."""
    seen = {solution.strip()}
    order = sorted(range(len(texts)), key=lambda i: (scores[i], i)) if judged_by_rm else range(len(texts))
    out = []
    for i in order:
        if len(out) == k:
            break
        if truth[i] or texts[i].strip() in seen:
            continue
        seen.add(texts[i].strip())
        out.append(i)
    return out


@torch.no_grad()
def policy_pairs(policy: torch.nn.Module, enc: Any, template: Any, problems: Sequence[Problem], settings: PairSettings,
                 reward_model: torch.nn.Module | None = None,
                 progress: Callable[[int, dict[str, float]], None] | None = None) -> tuple[list[dict], dict[str, float]]:
    """(preference rows, stats) from ``policy``'s samples on ``problems``; judged by the task's verifier,
    or by ``reward_model`` when given. ``progress(problems_done, stats)`` is called after every batch."""
    from gptforge.data.chat import ChatTokenizer
    from gptforge.generation import SamplingParams
    from gptforge.training.rm import score_sequences
    from gptforge.training.rollouts import sample_replies

    settings.check()
    if template is not None and not isinstance(enc, ChatTokenizer):
        enc = ChatTokenizer(enc, template)
    pad = template.bos if template is not None else enc.eot_token  # as GRPO's scoring
    rng = random.Random(settings.seed)
    rows: list[dict] = []
    n_correct = n_replies = n_pairs_problems = 0
    stats: dict[str, float] = {}
    K = settings.samples
    for start in range(0, len(problems), settings.batch):
        batch = list(problems[start : start + settings.batch])
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                top_k=settings.top_k or None, seed=settings.seed * 1_000_003 + start)
        ro = sample_replies(policy, enc, template, batch, K, params)
        # the task's judge: the right answer in the task's form, consistent with the question (is_verified)
        truth = [1.0 if is_verified(t, p) else 0.0 for p, t in zip(ro.problems, ro.texts, strict=True)]
        if reward_model is not None:
            seqs = [p + r for p, r in zip(ro.prompts, ro.replies, strict=True)]
            judged = score_sequences(reward_model, seqs, pad).tolist()  # right-padded: pad never seen
        else:
            judged = truth
        n_correct += int(sum(truth))
        n_replies += len(truth)
        for j, p in enumerate(batch):
            sl = slice(j * K, (j + 1) * K)
            texts, sc, tr = ro.texts[sl], judged[sl], truth[sl]
            if settings.chosen == "solution":  # the worked solution against the policy's wrong / worst replies
                got = [(None, r) for r in solution_rejects(texts, sc, tr, p.solution, settings.pairs_per_problem,
                                                           judged_by_rm=reward_model is not None)]
            else:
                got = pairs_from_scores(texts, sc, settings.pairs_per_problem, rng,
                                        threshold=1.0 if reward_model is None else None)
            n_pairs_problems += bool(got)
            for c, r in got:
                rows.append({"prompt": p.messages(with_solution=False),
                             "chosen": [{"role": "assistant", "content": p.solution if c is None else texts[c]}],
                             "rejected": [{"role": "assistant", "content": texts[r]}],
                             "kind": "policy", "answer": p.answer,
                             "chosen_score": None if c is None else sc[c], "rejected_score": sc[r],
                             "chosen_correct": True if c is None else bool(tr[c]), "rejected_correct": bool(tr[r])})
        done = min(start + settings.batch, len(problems))
        stats = {"problems": done, "replies": n_replies, "sample_accuracy": n_correct / max(n_replies, 1),
                 "pairs": len(rows), "problems_with_pairs": n_pairs_problems}
        if reward_model is not None and rows:
            stats["pairs_true_order"] = sum(r["chosen_correct"] and not r["rejected_correct"] for r in rows) / len(rows)
        if progress is not None:
            progress(done, stats)
    return rows, stats


def problems_for(task: str, n: int, seed: int, held_out: bool = False) -> list[Problem]:
    """The problems to sample on: ``n`` training problems of a generated task (its first 500 eval
    problems left out, as SFT data and the generator's pairs), or with ``held_out`` the eval set's
    first ``n`` (a held-out on-policy file: a reward model's accuracy on the policy's own replies)."""
    from gptforge.eval.generative import GENERATED
    from gptforge.eval.tasks.synthetic import training_problems

    if task not in GENERATED:
        raise ValueError(f"task {task!r}: generated tasks are {', '.join(GENERATED)}")
    if n < 1:
        raise ValueError(f"--n {n}: must be >= 1")
    if not held_out:
        return training_problems(n, seed, task=task)
    problems = GENERATED[task][1](n)
    if len(problems) < n:
        raise ValueError(f"--n {n}: the {task} eval set has {len(problems)} problems")
    return problems
