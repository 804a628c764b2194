"""What an RL step trains on, shared by the recipes that sample: the task's problems for each step (seeded by
step, the held-out ones left out), the replies a policy samples to them, and its held-out accuracy.

    gptforge rl --init-from runs/sft --task arithmetic --out runs/rl --steps 100

GRPO and PPO (:mod:`gptforge.training.grpo`, :mod:`gptforge.training.ppo`) draw each step's problems from
:func:`problem_stream` and sample with :func:`sample_replies`; on-policy preference pairs
(:mod:`gptforge.training.policy_pairs`) sample with it too, and DPO's task eval scores with
:func:`held_out_correct`. A step's problems and every reply's random draws are functions of (seed, step)
(:func:`mix_seed`), so a resume is exact and 2 ranks draw what 1 would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptforge.data.chat import ChatTemplate
from gptforge.eval.tasks.verifiable import Problem, is_correct
from gptforge.generation import SamplingParams, stream_tokens
from gptforge.training.rl_state import RLError


@dataclass
class Rollouts:
    problems: list[Problem]  # one per reply (each problem repeated group times)
    prompts: list[list[int]]
    replies: list[list[int]]  # reply tokens, including the end token when the model produced it
    texts: list[str]


@torch.no_grad()
def sample_replies(model: Any, enc: Any, template: ChatTemplate | None, problems: Sequence[Problem], group: int,
                   params: SamplingParams) -> Rollouts:
    """``group`` sampled replies to each problem, in one left-padded batch with the KV cache. With a
    template a reply ends at ``<|end|>``; without (``--raw``) the prompt is ``Question: ...\nAnswer:``
    and a reply ends at <|endoftext|> or a blank line, as ``gptforge eval --raw`` reads them."""
    from gptforge.eval.generative import RAW_STOPS, prompt_ids

    probs = [p for p in problems for _ in range(group)]
    prompts = [prompt_ids(p, enc, template) for p in probs]
    end = template.end if template is not None else enc.eot_token
    replies: list[list[int]] = [[] for _ in probs]
    done = [False] * len(probs)
    for nxt in stream_tokens(model, prompts, params):
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                replies[i].append(t)
                done[i] = t == end or (template is None and any(s in enc.decode(replies[i]) for s in RAW_STOPS))
        if all(done):
            break
    texts = [enc.decode([t for t in r if t != end]) for r in replies]
    if template is None:
        texts = [min((x.split(s)[0] for s in RAW_STOPS), key=len) for x in texts]
    return Rollouts(probs, prompts, replies, [x.strip() for x in texts])


def mix_seed(*xs: int) -> int:
    """A seed from several integers, the same in every process (Python's str hash is not). The RL recipes'
    one seed scheme: this module's problem draws and GRPO's (and so PPO's) reply sampling each pass their own
    constant tag after (seed, step), so no two draws share a stream. numpy pads the entropy to four words with
    zeros, so (a, b, c) and (a, b, c, 0) are one stream: tests/training/test_grpo_streams.py checks the draws."""
    import numpy as np

    return int(np.random.SeedSequence(list(xs)).generate_state(1)[0])


def problem_stream(cfg: Any, seed: int) -> tuple[Callable[..., list[Problem]], list[Problem]]:
    """``cfg``: the ``rl`` section. ((step, round=0) -> that step's training problems, the held-out problems).
    Held-out problems are never trained on; a step's problems depend only on (seed, step, round), so a
    resumed run sees the same ones. Round r > 0 is the step's r-th redraw (``rl.resample_flat``)."""
    import random

    from gptforge.eval.generative import GENERATED, GENERATIVE

    if cfg.task not in GENERATIVE:
        raise RLError(f"--task {cfg.task!r}: built-in tasks are {', '.join(GENERATIVE)}")
    if cfg.task in GENERATED:
        make, eval_set = GENERATED[cfg.task]
        held_out = eval_set(cfg.eval_n or 1)[: cfg.eval_n]
        banned = {p.question for p in eval_set(0)} | {p.question for p in held_out}
        probe = make(1000, seed=mix_seed(seed, 4))  # a generated task has a few thousand distinct problems: a large
        free = sum(p.question not in banned for p in probe) / len(probe)  # held-out set leaves none to train on
        if free < 0.05:  # (and drawing a step's problems would loop for ever)
            raise RLError(f"--eval-n {cfg.eval_n} (rl.eval_n): {len(banned)} held-out {cfg.task} problems leave almost "
                          f"none to train on (of 1000 new draws, {free:.1%} are not held out); lower --eval-n")

        def at(step: int, round: int = 0) -> list[Problem]:
            out: list[Problem] = []
            k = 0
            while len(out) < cfg.prompts:
                cand = make(cfg.prompts, seed=mix_seed(seed, step, 2, k) if round == 0 else mix_seed(seed, step, 6, round, k))
                out += [p for p in cand if p.question not in banned][: cfg.prompts - len(out)]
                k += 1
            return out

        return at, held_out
    allp = GENERATIVE[cfg.task].problems(0)
    held_out, pool = allp[: cfg.eval_n], allp[cfg.eval_n :]
    if len(pool) < cfg.prompts:
        raise RLError(f"--eval-n {cfg.eval_n} leaves {len(pool)} {cfg.task} problems to train on; lower it")
    return (lambda step, round=0: random.Random(mix_seed(seed, step, 3) if round == 0 else mix_seed(seed, step, 7, round))
            .sample(pool, cfg.prompts)), held_out


def held_out_correct(model: Any, enc: Any, template: ChatTemplate | None, problems: Sequence[Problem],
                     max_new: int, desc: str | None = None) -> int:
    """How many of ``problems`` the model answers correctly, greedily; ``desc``: a progress bar by that name."""
    from gptforge.eval.generative import generate_replies, prompt_ids

    if not problems:
        return 0
    prompts = [prompt_ids(p, enc, template) for p in problems]
    replies = generate_replies(model, enc, prompts, template, max_new, desc=desc)
    return sum(is_correct(r, p.answer) for r, p in zip(replies, problems, strict=True))
