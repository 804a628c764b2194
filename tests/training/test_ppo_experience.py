"""PPO's experience and step on real models: rollouts padded with reply masks, log-probs that sum to
DPO's sequence log-probs, values and rewards only on the reply, a first update with ratio 1, and a
few updates that move the policy toward the higher-scored reply (TRL equality of the math itself:
test_trl_ppo.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.training.dpo import sequence_logps
from gptforge.training.grpo import token_logprobs
from gptforge.training.ppo import ValueModel, make_experience, pad_rollouts, ppo_batch_loss


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=40, pad_vocab=False))


PROMPTS = [[1, 2, 3], [1, 2], [4, 5, 6, 7], [8, 9]]
REPLIES = [[10, 11, 0], [12], [13, 14], [15, 16, 17, 0]]


def test_pad_rollouts_masks_the_replies():
    ids, mask, start = pad_rollouts(PROMPTS, REPLIES, pad=39)
    assert start == 1 and ids.shape == (4, 6) and mask.shape == (4, 4)
    for k, (p, r) in enumerate(zip(PROMPTS, REPLIES, strict=True)):
        targets = ids[k, 1 + start :]
        assert targets[mask[k]].tolist() == r
        assert ids[k, : len(p) + len(r)].tolist() == p + r and (ids[k, len(p) + len(r) :] == 39).all()
    with pytest.raises(ValueError, match="a reply token"):
        pad_rollouts([[1]], [[]], pad=0)


def test_experience_holds_kl_penalised_rewards_advantages_and_returns():
    policy, ref = _gpt(0), _gpt(1)
    value = ValueModel(_gpt(2))
    torch.nn.init.normal_(value.score.weight, std=0.5)
    scores = torch.tensor([1.0, -1.0, 0.5, 2.0])
    exp = make_experience(policy, ref, value, PROMPTS, REPLIES, scores, pad=39, kl_coef=0.1, gamma=0.9, lam=0.8)
    full = torch.zeros_like(exp.ids, dtype=torch.bool)
    full[:, 1 + exp.start :] = exp.mask
    with torch.no_grad():
        want, n = sequence_logps(policy, exp.ids, full)
    torch.testing.assert_close((exp.logprobs * exp.mask).sum(1), want, atol=1e-5, rtol=0)
    assert n.tolist() == [len(r) for r in REPLIES]
    off = ~exp.mask
    assert (exp.values[off] == 0).all() and (exp.rewards[off] == 0).all() and (exp.advantages[off] == 0).all()
    last = torch.tensor([m.nonzero()[-1].item() for m in exp.mask])
    kl = (exp.logprobs - exp.ref_logprobs)[torch.arange(4), last]
    torch.testing.assert_close(exp.rewards[torch.arange(4), last], scores - 0.1 * kl)
    # the first update sees ratio 1: no clipping, and the value loss is half the mean squared error
    loss, stats = ppo_batch_loss(policy, value, exp, vf_coef=0.1)
    assert stats["clipfrac"] == 0 and stats["approx_kl"] == pytest.approx(0, abs=1e-10)
    mse = ((exp.values - exp.returns) ** 2)[exp.mask].mean().item()
    assert stats["value_loss"] == pytest.approx(0.5 * mse, rel=1e-5)


def test_a_few_updates_prefer_the_higher_scored_reply():
    policy = _gpt(0)
    ref, value = copy.deepcopy(policy).eval(), ValueModel(_gpt(3))
    prompts, replies = [[1, 2]] * 8, [[20, 30]] * 4 + [[21, 30]] * 4
    scores = torch.tensor([1.0] * 4 + [0.0] * 4)
    ids = torch.tensor([[1, 2, 20]])

    def p20_over_p21() -> float:
        with torch.no_grad():
            lp = torch.log_softmax(policy(ids)[0][0, 1], -1)
        return (lp[20] - lp[21]).item()

    before = p20_over_p21()
    opt = torch.optim.AdamW([*policy.parameters(), *value.parameters()], lr=1e-2)
    for _ in range(5):
        exp = make_experience(policy, ref, value, prompts, replies, scores, pad=0, kl_coef=0.01)
        for rows in (torch.arange(0, 8, 2), torch.arange(1, 8, 2)):  # two minibatches: the second one's ratio moves
            loss, stats = ppo_batch_loss(policy, value, exp, rows, clip_eps=0.2)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert p20_over_p21() > before + 1.0, (before, p20_over_p21())
    assert token_logprobs(policy, ids, 1.0, 1).shape == (1, 1)


def test_value_model_starts_from_the_reward_model():
    """rl.value_init reward_model (TRL's start): the value at each reply's last token equals the reward
    model's score of the same sequence; a reward model of another shape is refused, naming the key."""
    from gptforge.training.rl_state import RLError
    from gptforge.training.rm import RewardModel, freeze_unused_head

    rm = RewardModel(_gpt(1))
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    value = ValueModel(freeze_unused_head(_gpt(2)))
    value.start_from_reward_model(rm)
    ids, mask, start = pad_rollouts(PROMPTS, REPLIES, pad=39)
    last = torch.tensor([len(p) + len(r) - 1 for p, r in zip(PROMPTS, REPLIES, strict=True)])
    with torch.no_grad():
        assert torch.allclose(value(ids)[torch.arange(4), last], rm(ids, last), atol=1e-6)
    other = RewardModel(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=40, pad_vocab=False)))
    with pytest.raises(RLError, match="rl.value_init"):
        value.start_from_reward_model(other)
