"""No two of an RL run's random draws share a stream. Every draw is seeded by ``rollouts.mix_seed(seed, step,
TAG, ...)``: the task's problems for a step and for each of its redraws (round 0, 1, ...), the probe of how
many problems are free to train on, and the replies GRPO (and PPO) sample at each step and round, which ranks
split by rows of one batch. A tag changed or dropped so that two of these draw the same numbers (numpy's
SeedSequence pads its entropy to four words with zeros: (seed, step, 2) is (seed, step, 2, 0)) failed no test: the seeds are
recorded here where the recipes draw them and checked to belong to one purpose each, and the ranks' rows to
cover one batch once. tests/training/test_problem_stream.py pins the problem seeds' values.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gptforge.eval import generative
from gptforge.eval.generative import GenerativeTask
from gptforge.eval.tasks.verifiable import Problem
from gptforge.training import grpo as grpo_mod
from gptforge.training import rollouts
from gptforge.training.grpo import GRPO

STEPS, ROUNDS, PROMPTS, GROUP = range(12), range(4), 4, 2


@pytest.fixture
def recorded(monkeypatch):
    """mix_seed where the recipes call it, each seed it returns logged."""
    log: list[int] = []
    real = rollouts.mix_seed

    def spy(*xs: int) -> int:
        log.append(real(*xs))
        return log[-1]

    monkeypatch.setattr(rollouts, "mix_seed", spy)
    monkeypatch.setattr(grpo_mod, "mix_seed", spy)
    items = [Problem(f"fixed {i}", str(i)) for i in range(40)]  # gsm8k's is a download: a fixed list in its place
    monkeypatch.setitem(generative.GENERATIVE, "gsm8k",
                        GenerativeTask("gsm8k", lambda n=0: list(items) if not n else items[:n], lambda t: True, 8))
    return log


def _taken(log: list[int], draw) -> list[int]:
    log.clear()
    draw()
    return list(log)


def _problem_draws(log, task: str, seed: int) -> dict[tuple, list[int]]:
    """purpose -> the seeds it drew: the probe (generated tasks), each (step, round)'s problems."""
    at = []
    probe = _taken(log, lambda: at.append(rollouts.problem_stream(SimpleNamespace(task=task, prompts=PROMPTS, eval_n=8),
                                                                  seed)[0]))
    out = {("probe", task): probe} if probe else {}  # a fixed list has no probe
    for step in STEPS:
        for rnd in ROUNDS:
            out[("problems", task, step, rnd)] = _taken(log, lambda s=step, r=rnd: at[0](s, r) if r else at[0](s))
    return out


def _reply_draws(log, monkeypatch, seed: int, world: int) -> dict[tuple, list]:
    """(step, round) -> per rank, (seeds drawn, SamplingParams) of GRPO's sampling (sample_and_score, the one
    place GRPO and PPO sample a step's replies)."""
    params = []

    def sample(model, enc, template, mine, group, p):
        params.append(p)
        n = len(mine) * group
        return rollouts.Rollouts([q for q in mine for _ in range(group)], [[1]] * n, [[1]] * n, [""] * n)

    monkeypatch.setattr(grpo_mod, "sample_replies", sample)
    recipe = object.__new__(GRPO)
    recipe.enc = recipe.template = None
    recipe.problems_at = lambda step, round=0: [Problem(f"q{i}", "1") for i in range(PROMPTS)]
    recipe.rewards = lambda ro, run: torch.zeros(len(ro.replies))
    cfg = SimpleNamespace(train=SimpleNamespace(seed=seed),
                          rl=SimpleNamespace(max_new_tokens=2, temperature=1.0, top_k=0, group=GROUP))
    out = {}
    for step in STEPS:
        for rnd in ROUNDS:
            for rank in range(world):
                run = SimpleNamespace(cfg=cfg, info=SimpleNamespace(rank=rank, world=world, enabled=False),
                                      device="cpu")
                seeds = _taken(log, lambda r=run, s=step, k=rnd: recipe.sample_and_score(r, s, None, k))
                out.setdefault((step, rnd), []).append((seeds, params[-1]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 1337])
def test_every_draw_of_an_rl_run_has_a_stream_of_its_own(recorded, monkeypatch, seed):
    purposes = {**_problem_draws(recorded, "arithmetic", seed), **_problem_draws(recorded, "gsm8k", seed)}
    for (step, rnd), ranks in _reply_draws(recorded, monkeypatch, seed, 1).items():
        [(seeds, p)] = ranks
        assert seeds == [p.seed]  # the replies' one seed is the one mix_seed gave
        purposes[("replies", step, rnd)] = seeds
    owner: dict[int, tuple] = {}
    for purpose, seeds in purposes.items():
        assert seeds and len(set(seeds)) == len(seeds), purpose  # a draw's refills (k) are new numbers too
        for s in seeds:
            assert owner.setdefault(s, purpose) == purpose, f"{purpose} draws the stream of {owner[s]}"


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_draw_rows_of_one_batch_each_once_as_one_process_would(recorded, monkeypatch, world):
    """Ranks share the step's reply seed and each takes its own rows of the whole batch: rank r drawing rank 0's
    rows (an offset dropped) would sample the same replies on every rank."""
    one = _reply_draws(recorded, monkeypatch, 5, 1)
    for key, ranks in _reply_draws(recorded, monkeypatch, 5, world).items():
        [(_, whole)] = one[key]
        assert {p.seed for _, p in ranks} == {whole.seed}
        rows = [row for _, p in ranks for row in range(p.rows[0], p.rows[0] + PROMPTS // world * GROUP)]
        assert sorted(rows) == list(range(whole.rows[1])) and all(p.rows[1] == whole.rows[1] for _, p in ranks)
