"""``rl.resample_flat``: DAPO's dynamic sampling, position by position.

A group whose replies all got the same reward has advantages 0 and teaches nothing; with
``rl.resample_flat`` R the problem at that position of the step is replaced by the one at the same
position of the step's redraw (round 1, 2, ... R) until its group differs. Checked on a toy model
whose reward is flat by construction for some problems: which problem each position trains on, the
rewards the update gets (recomputed from the replies' texts), how many rounds are sampled, and
that the logged reward and accuracy stay the first draw's. 2 ranks against 1 with resampling is in
tests/training/test_distributed.py (``rl_resample``).
"""

from __future__ import annotations

import pytest

from gptforge.config import RLConfig
from gptforge.eval.tasks.verifiable import Problem
from gptforge.run.metrics import read_metrics
from gptforge.training import grpo as grpo_mod
from gptforge.training.grpo import GRPO, rl_config
from gptforge.training.loop import train

from .test_grpo import _small_vocab_model

# each round's problems by position (single characters: the toy speaks GPT-2's first 59 ids); the reward
# of a reply to a problem in FLAT is 0 whatever it says, so its group is flat
ROUNDS = {0: "AVBW", 1: "XVDY", 2: "EFZG", 3: "HIJK"}  # V at position 1 in rounds 0 and 1
FLAT = set("ABCDEFGHIJK")


def reward(problem: Problem, reply: str) -> float:
    return 0.0 if problem.question in FLAT else (sum(map(ord, reply)) % 7 + 1) / 7  # differs between replies


def _run(tmp_path, name, tokenizer, monkeypatch, resample: int, steps: int = 1):
    model, t = _small_vocab_model()
    sd = model.state_dict()
    asked: list[tuple[int, int]] = []

    def problems_at(step: int, round: int = 0) -> list[Problem]:
        asked.append((step, round))
        return [Problem(q, "A") for q in ROUNDS[round]]

    trained, drawn = [], []
    real, real_sample = grpo_mod.grpo_step, grpo_mod.sample_replies

    def sample_spy(*a, **kw):
        drawn.append(real_sample(*a, **kw))
        return drawn[-1]

    monkeypatch.setattr(grpo_mod, "sample_replies", sample_spy)

    def spy(wrapped, model, ref, optimizer, rollouts, rewards, cfg, *rest, **kw):
        trained.append((rollouts, rewards.clone()))
        return real(wrapped, model, ref, optimizer, rollouts, rewards, cfg, *rest, **kw)

    monkeypatch.setattr(grpo_mod, "grpo_step", spy)
    cfg = rl_config(model.config, str(tmp_path / name), "")
    cfg.rl = RLConfig(prompts=4, group=4, max_new_tokens=3, kl_coef=0.0, eval_n=0, resample_flat=resample)
    cfg.optim.lr, cfg.train.max_steps, cfg.train.ckpt_every, cfg.train.device = 1e-3, steps, 0, "cpu"
    recipe = GRPO(cfg, t, tokenizer, reward, problems_at=problems_at, held_out=[])
    recipe.words_unknown = True  # the 64-id toy (see test_grpo): no tokenizer claimed
    train(cfg, recipe, init_weights=lambda m: m.load_state_dict(sd))
    rl = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["kind"] == "rl"]
    _run.drawn = drawn  # every round's rollouts, in order
    return trained, rl, sorted({r for s, r in asked if s == 0})  # the rounds drawn for the first step


def _groups(rollouts, rewards, G=4):
    return [(rollouts.problems[i].question, rollouts.texts[i : i + G], rewards.view(-1).tolist()[i : i + G])
            for i in range(0, len(rollouts.problems), G)]


def test_each_flat_position_takes_the_first_redraw_that_is_not_flat(tmp_path, tokenizer, monkeypatch):
    [base], base_rl, asked0 = _run(tmp_path, "off", tokenizer, monkeypatch, 0)
    [(ro, r)], rl, asked = _run(tmp_path, "on", tokenizer, monkeypatch, 5)
    got = _groups(ro, r)
    # positions 0 and 2 are flat in round 0 (A, B); round 1 fills 0 (X), not 2 (D is flat); round 2 fills 2 (Z).
    # Positions 1 and 3 keep round 0's groups; the rounds stop when nothing is flat: 0, 1, 2 and not 3..5
    assert [q for q, _, _ in got] == ["X", "V", "Z", "W"]
    assert asked == [0, 1, 2] and asked0 == [0]
    assert rl[0]["resample_rounds"] == 2 and rl[0]["flat_groups"] == 0 and rl[0]["flat_groups_drawn"] == 2
    # the update's rewards are the reward of the texts it trains on (not a round's rewards beside another's texts)
    for q, texts, rewards in got:
        assert rewards == pytest.approx([reward(Problem(q, "A"), x) for x in texts]) and len(set(rewards)) > 1
    # the positions that were not flat keep the very replies a run without resampling trained on
    off = _groups(*base)
    assert got[1] == off[1] and got[3] == off[3]
    # a redraw samples afresh: the same problem at the same position in round 1 gets other replies
    assert _run.drawn[1].texts[4:8] != _run.drawn[0].texts[4:8] and _run.drawn[1].problems[4].question == "V"
    # the logged reward and accuracy are the first draw's (the policy's own), as without resampling
    assert (rl[0]["reward"], rl[0]["accuracy"]) == (base_rl[0]["reward"], base_rl[0]["accuracy"])
    assert "resample_rounds" not in base_rl[0] and base_rl[0]["flat_groups"] == 2


def test_a_position_flat_in_every_round_keeps_its_first_group(tmp_path, tokenizer, monkeypatch):
    """rl.resample_flat 1: position 2 is flat in rounds 0 and 1, so it trains on its first group (B's), and
    one flat group is logged; round 2 is never drawn."""
    [(ro, r)], rl, asked = _run(tmp_path, "one", tokenizer, monkeypatch, 1)
    got = _groups(ro, r)
    assert [q for q, _, _ in got] == ["X", "V", "B", "W"] and set(got[2][2]) == {0.0}
    assert asked == [0, 1] and rl[0]["resample_rounds"] == 1 and rl[0]["flat_groups"] == 1
    assert rl[0]["flat_groups_drawn"] == 2


def test_resample_flat_is_bounded_and_grpo_only():
    for bad in (-1, 33, 10**9):
        with pytest.raises(ValueError, match="rl.resample_flat"):
            RLConfig(resample_flat=bad)
    with pytest.raises(ValueError, match="rl.resample_flat.*ppo"):
        RLConfig(algo="ppo", group=1, resample_flat=2)
    assert RLConfig(resample_flat=32).resample_flat == 32


def test_a_redraw_is_new_problems_never_held_out_and_the_same_on_every_call():
    from gptforge.training.rollouts import problem_stream

    at, held_out = problem_stream(RLConfig(task="arithmetic", prompts=8, eval_n=50), seed=3)
    banned = {p.question for p in held_out}
    draws = {r: at(5, r) for r in (0, 1, 2)}
    assert draws[0] == at(5) and draws[1] == at(5, 1)  # round 0 is the step's usual draw; each is a function
    assert len({tuple(p.question for p in d) for d in draws.values()}) == 3  # of (seed, step, round)
    assert not banned & {p.question for d in draws.values() for p in d}


def test_sample_ms_is_every_rounds_sampling_time(tmp_path, tokenizer, monkeypatch):
    """The logged sample_ms adds each round's sampling to the first draw's: with a clock that moves 1 s per
    sampling call (grpo's clock only), 1 + 2 rounds log 3000 ms, and a run without resampling 1000."""
    import types

    now = [0.0]
    monkeypatch.setattr(grpo_mod, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    real = grpo_mod.sample_replies

    def slow(*a, **kw):
        now[0] += 1.0
        return real(*a, **kw)

    monkeypatch.setattr(grpo_mod, "sample_replies", slow)
    _, rl, _ = _run(tmp_path, "on", tokenizer, monkeypatch, 5)
    assert rl[0]["resample_rounds"] == 2 and rl[0]["sample_ms"] == pytest.approx(3000.0)
    _, rl, _ = _run(tmp_path, "off", tokenizer, monkeypatch, 0)
    assert rl[0]["sample_ms"] == pytest.approx(1000.0)


def test_a_step_with_every_group_flat_says_so_once_with_its_step_and_what_to_do(tmp_path, tokenizer, monkeypatch,
                                                                                 capsys):
    """Every problem flat (here: in every round too, so resampling cannot help): the run says it once, at the
    first such step, whole; later flat steps say nothing more."""
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROUNDS", {r: "ABCD" for r in range(4)})
    _, rl, _ = _run(tmp_path, "flat", tokenizer, monkeypatch, 1, steps=2)
    out = capsys.readouterr().out
    said = ("step 1: every group's 4 replies got the same reward (0.000 on average), so every advantage is 0 and "
            "only the KL term moves the model: nothing is learned from the reward until some replies in a group "
            "score differently. If the reward stays flat, start from a longer SFT run (one that gets some answers "
            "right: see `gptforge eval --tasks arithmetic` on it), raise rl.group or rl.temperature, or use a "
            "graded reward")
    assert out.count(said) == 1 and out.count("every group's") == 1, out
    assert [r["flat_groups"] for r in rl] == [4, 4]


def test_a_non_finite_reward_in_a_redraw_stops_the_step_before_any_update(tmp_path, tokenizer, monkeypatch):
    """A redraw's rewards are guarded as the first draw's: a nan in round 1 (problem X) stops the run at that
    step with nothing trained, and its row logs a null loss."""
    import sys

    here = sys.modules[__name__]
    monkeypatch.setattr(here, "reward", lambda p, r, real=here.reward: float("nan") if p.question == "X" else real(p, r))
    trained, rl, asked = _run(tmp_path, "bad", tokenizer, monkeypatch, 5, steps=2)
    assert trained == [] and asked == [0, 1]  # round 1 drawn, then the step stopped
    assert [r["step"] for r in rl] == [1] and rl[0]["loss"] is None
