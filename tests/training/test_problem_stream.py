"""rollouts.problem_stream, an RL run's problems, against a derivation by hand (issue 36: the `training` mutation
lane found it pinned only by properties, so a changed seed, a dropped redraw counter or a broken fixed-list
branch passed).

Its contract: the held-out problems are the task's eval set's first ``rl.eval_n``; step ``s``'s problems are
drawn with the seed SeedSequence(seed, s, 2, k) (round 0) or (seed, s, 6, round, k) (a redraw), k = 0, 1, ...
until ``rl.prompts`` problems outside the task's whole eval set and the held-out set are found; a fixed-list
task (gsm8k) holds out its first ``eval_n`` problems and samples each step's from the rest with
random.Random(SeedSequence(seed, s, 3)) or (seed, s, 7, round). A resumed run depends on these staying fixed:
it must see the problems the interrupted one would have. The seeds are derived here with numpy directly, not
through rollouts' ``mix_seed``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from gptforge.eval import generative
from gptforge.eval.generative import GENERATED, GenerativeTask
from gptforge.eval.tasks.verifiable import Problem
from gptforge.training.rl_state import RLError
from gptforge.training.rollouts import problem_stream


def seed_of(*xs: int) -> int:
    return int(np.random.SeedSequence(list(xs)).generate_state(1)[0])


def _cfg(task: str, prompts: int, eval_n: int) -> SimpleNamespace:
    return SimpleNamespace(task=task, prompts=prompts, eval_n=eval_n)


def test_an_unknown_task_is_refused_naming_the_built_in_ones():
    with pytest.raises(RLError) as e:
        problem_stream(_cfg("poetry", 2, 4), 0)
    assert str(e.value) == "--task 'poetry': built-in tasks are arithmetic, arithmetic3, compare, gsm8k"


@pytest.mark.parametrize("task,eval_n", [*((t, 300) for t in sorted(GENERATED)), ("compare", 6000)])
def test_a_generated_tasks_draws_by_hand(task, eval_n):
    make, eval_set = GENERATED[task]
    at, held = problem_stream(_cfg(task, 16, eval_n), 7)
    assert held == eval_set(eval_n)[:eval_n]
    banned = {p.question for p in eval_set(0)} | {p.question for p in held}
    redraws, most = 0, 0
    for step, rnd in [(0, 0), (3, 0), (3, 1), (3, 2), (4, 1)]:
        want, k = [], 0
        while len(want) < 16:
            s = seed_of(7, step, 2, k) if rnd == 0 else seed_of(7, step, 6, rnd, k)
            want += [p for p in make(16, seed=s) if p.question not in banned][: 16 - len(want)]
            k += 1
        redraws, most = redraws + k - 1, max(most, k)
        got = at(step, rnd) if rnd else at(step)
        assert got == want, (step, rnd)
        assert not {p.question for p in got} & banned
    # the arithmetic tasks hold out a few hundred of their thousands, so a batch is refilled now and then; the
    # counter k must then move on (a refill with k = 1 or k += 2 gives other problems)
    assert redraws > 0 or task == "arithmetic3"
    # with 6,000 of compare's 8,010 held out, a quarter of each batch is usable: a step takes several batches
    assert most >= 3 or eval_n < 6000


def test_a_generated_task_whose_held_out_set_leaves_almost_nothing_is_refused_with_the_estimate():
    make, eval_set = GENERATED["compare"]  # 90 x 89 = 8,010 distinct problems
    at, _ = problem_stream(_cfg("compare", 4, 6000), 3)  # 25% of new draws are free: accepted
    assert len(at(0)) == 4
    # 15,000 asked: the eval set's 30,100 draws hold about 7,800 of the 8,010 (it stops at what it finds)
    held = eval_set(15000)[:15000]
    banned = {p.question for p in eval_set(0)} | {p.question for p in held}
    probe = make(1000, seed=seed_of(3, 4))
    free = sum(p.question not in banned for p in probe) / 1000
    assert 0 < free < 0.05, free  # some left, too few: refused with the estimate
    with pytest.raises(RLError) as e:
        problem_stream(_cfg("compare", 4, 15000), 3)
    assert str(e.value) == (f"--eval-n 15000 (rl.eval_n): {len(banned)} held-out compare problems leave almost none to "
                            f"train on (of 1000 new draws, {free:.1%} are not held out); lower --eval-n")


@pytest.fixture
def fixed(monkeypatch):
    """A fixed-list task standing in for gsm8k (its data is a download): 20 problems."""
    items = [Problem(f"q{i}", str(i)) for i in range(20)]
    task = GenerativeTask("gsm8k", lambda n=0: list(items) if not n else items[:n], lambda t: True, 8)
    monkeypatch.setitem(generative.GENERATIVE, "gsm8k", task)
    return items


def test_a_fixed_list_task_holds_out_its_first_problems_and_samples_the_rest(fixed):
    at, held = problem_stream(_cfg("gsm8k", 4, 5), 11)
    assert held == fixed[:5]
    for step, rnd in [(0, 0), (2, 0), (2, 1), (2, 3)]:
        rng = random.Random(seed_of(11, step, 3) if rnd == 0 else seed_of(11, step, 7, rnd))
        got = at(step, rnd) if rnd else at(step)
        assert got == rng.sample(fixed[5:], 4), (step, rnd)
    # exactly as many left as a step takes is enough; one fewer is refused, by name
    at, _ = problem_stream(_cfg("gsm8k", 4, 16), 0)
    assert sorted(p.question for p in at(0)) == sorted(p.question for p in fixed[16:])
    with pytest.raises(RLError) as e:
        problem_stream(_cfg("gsm8k", 4, 17), 0)
    assert str(e.value) == "--eval-n 17 leaves 3 gsm8k problems to train on; lower it"
