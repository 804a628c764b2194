"""Issue 56 class 7: on-policy pairs at their edges, over many groups.

``prepare preferences --chosen solution``: a reply the verifier marks correct is never the rejected one,
also when its text is not the worked solution's (``48 + 37`` for ``37 + 48``: the dedup by text does not
cover it, which is how a test lost that check); with a reward model the rejected replies are the
lowest-scored wrong ones. With ``--chosen sample`` a reward model's pairs are its best against its worst.

The sampler is replaced by replies built from templates whose truth is computed here from the numbers
they state (the equation holds, about the question's own numbers and operator, and the stated answer is
the true one): an independent computation, not the task's verifier. The reward model is replaced by a
table of known scores (each reply's last id indexes it), so which reply is lowest is known by hand.

Plants tried (each fails here): ``truth[i] or`` dropped from ``solution_rejects``; its reward-model order
reversed (``-scores[i]``); ``judged_by_rm`` ignored (the sampled order); ``ranked[-1 - j]`` ->
``ranked[j + 1]`` in ``pairs_from_scores`` (rejected not the worst). ``scores[i] < threshold`` ->
``<=`` there survives and is equivalent: a correct reply then in ``bad`` only meets chosen replies of
its own score, which the ``scores[c] <= scores[r]`` guard skips.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from gptforge.eval.tasks.synthetic import training_problems
from gptforge.training import rollouts
from gptforge.training.policy_pairs import PairSettings, policy_pairs

K = 6  # replies per problem


def _truth(text: str, question: str) -> bool:
    """Correct, computed from the reply's own numbers: 'x op y = c. The answer is d.' with {x, y} the
    question's numbers, op its operator, x op y == c, and c == d == the true value."""
    q = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", question)
    m = re.fullmatch(r"(\d+) ([+-]) (\d+) = (-?\d+)\. The answer is (-?\d+)\.", text.strip())
    if q is None or m is None:
        return False
    a, op, b = int(q[1]), q[2], int(q[3])
    true = a + b if op == "+" else a - b
    x, op2, y, c, d = int(m[1]), m[2], int(m[3]), int(m[4]), int(m[5])
    held = x + y if op2 == "+" else x - y
    return sorted([x, y]) == sorted([a, b]) and op2 == op and held == c == d == true


def _replies(p, rng: random.Random) -> list[str]:
    """K replies to ``p``: the solution, right ones in other words, wrong ones, lucky ones, repeats."""
    a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", p.question).groups()
    true = int(p.answer)
    forms = [p.solution, f" {p.solution}  ",  # the solution (the second only in spacing)
             f"{b} {op} {a} = {true}. The answer is {true}.",  # right when op is +, wrong (false equation) for -
             f"{a} {op} {b} = {true + 1}. The answer is {true + 1}.", f"{a} {op} {b} = {true - 1}. The answer is {true}.",
             f"The answer is {true}.", f"{a} {op} {b} = {true}. The answer is {true + 10}.", "I do not know."]
    return [rng.choice(forms) for _ in range(K)]


@pytest.fixture(scope="module")
def world():
    problems = list({p.question: p for p in training_problems(70, 3, task="arithmetic")}.values())[:60]  # distinct
    assert len(problems) == 60
    rng = random.Random(7)
    texts = [t for p in problems for t in _replies(p, rng)]
    # distinct with probability 1 (no ties to argue about); float32 values, as score_sequences returns
    scores = [torch.tensor(rng.uniform(-5, 5), dtype=torch.float32).item() for _ in texts]
    return problems, texts, scores


@pytest.fixture
def patched(world, monkeypatch):
    """The sampler gives the world's replies (each reply's one id is its index) and the reward model
    scores a sequence by that index."""
    problems, texts, scores = world

    def sample(model, enc, template, probs, group, params):
        assert group == K
        idx = [problems.index(p) * K + k for p in probs for k in range(K)]
        return rollouts.Rollouts([problems[i // K] for i in idx], [[0]] * len(idx), [[i] for i in idx], [texts[i] for i in idx])

    def score(rm, seqs, pad, **kw):
        return torch.tensor([scores[s[-1]] for s in seqs])

    monkeypatch.setattr(rollouts, "sample_replies", sample)
    import gptforge.training.rm as rm

    monkeypatch.setattr(rm, "score_sequences", score)
    return world


def _groups(world):
    problems, texts, scores = world
    for j, p in enumerate(problems):
        yield p, texts[j * K:(j + 1) * K], scores[j * K:(j + 1) * K]


@pytest.mark.parametrize("judge", ["task", "rm"])
@pytest.mark.parametrize("k", [1, 3])
def test_chosen_solution_never_rejects_a_correct_reply_and_an_rm_rejects_its_lowest(patched, tokenizer, judge, k):
    problems, texts, scores = patched
    assert sum(_truth(t, p.question) and t.strip() != p.solution for p, g, _ in _groups(patched) for t in g) > 20, \
        "the world must hold correct replies that are not the solution's text"
    rows, _ = policy_pairs(None, tokenizer, None, problems,
                           PairSettings(samples=K, pairs_per_problem=k, chosen="solution", batch=16),
                           reward_model=object() if judge == "rm" else None)
    by_answer: dict[str, list[dict]] = {}
    for r in rows:
        by_answer.setdefault(r["prompt"][-1]["content"], []).append(r)
    for p, group, sc in _groups(patched):
        got = by_answer.get(p.question, [])
        assert all(r["chosen"][0]["content"] == p.solution for r in got)
        rejected = [r["rejected"][0]["content"] for r in got]
        for t in rejected:
            assert not _truth(t, p.question), (p.question, t)  # never a correct reply
        # the wrong replies, each text once (with its lowest score), the solution's text excluded
        wrong: dict[str, float] = {}
        for t, s in zip(group, sc, strict=True):
            if not _truth(t, p.question) and t.strip() != p.solution.strip():
                wrong[t.strip()] = min(s, wrong.get(t.strip(), float("inf")))
        assert len(rejected) == min(k, len(wrong)) and len({t.strip() for t in rejected}) == len(rejected)
        if judge == "rm":  # the k lowest-scored wrong texts, and each row records its score
            assert {t.strip() for t in rejected} == set(sorted(wrong, key=wrong.get)[:k]), p.question
            assert [r["rejected_score"] for r in got] == [wrong[t.strip()] for t in rejected], (got, wrong)
        else:
            assert {t.strip() for t in rejected} <= set(wrong)


def test_chosen_sample_with_an_rm_pairs_its_best_against_its_worst(patched, tokenizer):
    problems, texts, scores = patched
    rows, _ = policy_pairs(None, tokenizer, None, problems, PairSettings(samples=K, pairs_per_problem=1, batch=16),
                           reward_model=object())
    by_q = {r["prompt"][-1]["content"]: r for r in rows}
    for p, group, sc in _groups(patched):
        lo, hi = min(range(K), key=sc.__getitem__), max(range(K), key=sc.__getitem__)
        r = by_q.get(p.question)
        if group[lo] == group[hi]:  # the same text at both ends: that pair is skipped
            continue
        assert r is not None, p.question
        assert (r["chosen"][0]["content"], r["rejected"][0]["content"]) == (group[hi], group[lo])
        assert (r["chosen_score"], r["rejected_score"]) == (sc[hi], sc[lo])


def test_chosen_sample_with_the_verifier_never_rejects_a_correct_reply(patched, tokenizer):
    problems, texts, scores = patched
    rows, _ = policy_pairs(None, tokenizer, None, problems, PairSettings(samples=K, pairs_per_problem=3, batch=16))
    assert rows
    questions = {p.question: p for p in problems}
    for r in rows:
        q = questions[r["prompt"][-1]["content"]].question
        assert _truth(r["chosen"][0]["content"], q) and not _truth(r["rejected"][0]["content"], q)
