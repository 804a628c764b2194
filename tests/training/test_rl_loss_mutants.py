"""training/ppo.py's and grpo.py's math where the `training` mutation lane found its tests blind (issue 36).

The losses themselves were pinned (TRL's tensors, the recipes' hand computations), but four things were not:
- the defaults that callers rely on: TRL's PPO clip 0.2, value clip 0.2 and vf_coef 0.1; GRPO's group
  scaling with eps 1e-4; log-probs at temperature 1 from position 0;
- that ``ppo_batch_loss``'s ``rows`` and its hyper-parameters reach the loss (every caller passed the
  defaults, so dropping or swapping them changed nothing);
- the batch-scaled advantages of a step with one or two rewards (the sample std's edge);
- ``pad_rollouts``' refusals: a one-token prompt is valid, an empty one and unequal counts are not.

Each is compared with a direct computation in float64 written out here.
"""

from __future__ import annotations

import copy

import pytest
import torch

from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.parallel.distributed import DistInfo
from gptforge.training import grpo
from gptforge.training.grpo import group_advantages, token_logprobs
from gptforge.training.ppo import ValueModel, make_experience, pad_rollouts, ppo_batch_loss, ppo_loss


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=40, pad_vocab=False))


def hand_ppo_loss(lp, old, adv, v, old_v, ret, mask, clip_eps, clip_value, vf_coef) -> float:
    """TRL's PPO loss written out in float64: the clipped surrogate's masked mean plus vf_coef times half the
    masked mean of the larger squared error of the value and of the value clipped to old ± clip_value."""
    lp, old, adv, v, old_v, ret = (t.double() for t in (lp, old, adv, v, old_v, ret))
    m = mask.double()
    ratio = torch.exp(lp - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_eps, 1 + clip_eps))
    vc = torch.minimum(torch.maximum(v, old_v - clip_value), old_v + clip_value)
    vl = 0.5 * torch.maximum((v - ret) ** 2, (vc - ret) ** 2)
    return ((pg * m).sum() / m.sum() + vf_coef * (vl * m).sum() / m.sum()).item()


PROMPTS = [[1, 2, 3], [1, 2], [4, 5, 6, 7], [8, 9]]
REPLIES = [[10, 11, 0], [12], [13, 14], [15, 16, 17, 0]]


@pytest.fixture(scope="module")
def moved():
    """An experience batch, then a policy and a value model moved away from it, far enough that ratios leave
    1 ± 0.2 on some tokens (not all) and values leave old ± 0.2 on some (not all)."""
    policy, ref, value = _gpt(0), _gpt(1), ValueModel(_gpt(2))
    torch.nn.init.normal_(value.score.weight, std=0.5)
    exp = make_experience(policy, ref, value, PROMPTS, REPLIES, torch.tensor([1.0, -1.0, 0.5, 2.0]), pad=39,
                          kl_coef=0.1, gamma=0.9, lam=0.8)
    policy2, value2 = copy.deepcopy(policy), copy.deepcopy(value)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in policy2.parameters():
            p.add_(0.08 * torch.randn(p.shape, generator=g))
        value2.score.weight.add_(0.05 * torch.randn(value2.score.weight.shape, generator=g))
    with torch.no_grad():
        lp = token_logprobs(policy2, exp.ids, 1.0, exp.start)
        v = value2(exp.ids)[:, exp.start : -1]
    ratio = torch.exp(lp - exp.logprobs)[exp.mask]
    assert ((ratio - 1).abs() > 0.2).any() and ((ratio - 1).abs() < 0.2).any(), ratio
    dv = (v - exp.values)[exp.mask]
    assert (dv.abs() > 0.2).any() and (dv.abs() < 0.2).any(), dv
    return exp, policy2, value2, lp, v


def test_ppo_loss_and_batch_loss_default_to_trls_clips_and_value_coefficient(moved):
    exp, policy, value, lp, v = moved
    want = hand_ppo_loss(lp, exp.logprobs, exp.advantages, v, exp.values, exp.returns, exp.mask, 0.2, 0.2, 0.1)
    loss, stats = ppo_loss(lp, exp.logprobs, exp.advantages, v, exp.values, exp.returns, exp.mask)
    assert loss.item() == pytest.approx(want, rel=1e-5) and stats["loss"] == pytest.approx(want, rel=1e-5)
    loss, _ = ppo_batch_loss(policy, value, exp)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    # and the defaults matter here: other clips or coefficient give another loss
    other = hand_ppo_loss(lp, exp.logprobs, exp.advantages, v, exp.values, exp.returns, exp.mask, 1.2, 1.2, 1.1)
    assert abs(other - want) > 1e-3


def test_ppo_batch_loss_passes_its_rows_and_hyper_parameters_to_the_loss(moved):
    exp, policy, value, lp, v = moved
    args = (exp.logprobs, exp.advantages, v, exp.values, exp.returns, exp.mask)
    # each hyper-parameter on its own, so that none can stand in for another
    for clip_eps, clip_value, vf_coef in [(0.05, 0.2, 0.1), (0.2, 0.03, 0.1), (0.2, 0.2, 0.7), (0.05, 0.03, 0.7)]:
        want = hand_ppo_loss(lp, *args, clip_eps, clip_value, vf_coef)
        loss, stats = ppo_batch_loss(policy, value, exp, clip_eps=clip_eps, clip_value=clip_value, vf_coef=vf_coef)
        assert loss.item() == pytest.approx(want, rel=1e-5), (clip_eps, clip_value, vf_coef)
    rows = torch.tensor([2, 0])
    want = hand_ppo_loss(lp[rows], *(t[rows] for t in args), 0.1, 0.05, 0.5)
    loss, _ = ppo_batch_loss(policy, value, exp, rows=rows, clip_eps=0.1, clip_value=0.05, vf_coef=0.5)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert abs(want - hand_ppo_loss(lp, *args, 0.1, 0.05, 0.5)) > 1e-3  # the rows matter


def test_ppo_policy_and_value_stats_by_hand():
    """approx_kl = ½ · masked mean of (log π − log π_old)²; clipfrac = the share of masked tokens whose clipped
    term is the larger; value_clipfrac likewise for the value loss, where a value inside old ± clip is not
    clipped (its two squared errors are equal: not counted)."""
    from gptforge.training.ppo import ppo_policy_loss, ppo_value_loss

    lp = torch.tensor([[0.0, -0.5, -1.0], [-0.2, -0.3, 9.0]])
    old = torch.tensor([[-0.5, -0.5, -0.7], [-0.2, -0.1, 0.0]])
    adv = torch.tensor([[1.0, -1.0, -2.0], [0.5, 1.0, 3.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    _, s = ppo_policy_loss(lp, old, adv, mask, 0.2)
    d = [0.5, 0.0, -0.3, 0.0, -0.2]  # the masked differences (the unmasked 9.0 must not count)
    assert s["approx_kl"] == pytest.approx(0.5 * sum(x * x for x in d) / 5, rel=1e-6)
    # ratio e^0.5 = 1.65 > 1.2 with A > 0: clipped term larger (-1.2 > -1.65): counted; ratio 1: no;
    # e^-0.3 = 0.74 < 0.8 with A < 0: the clipped -(-2)(0.8) = 1.6 > 1.48: counted; 1: no; e^-0.2 = 0.82: no
    assert s["clipfrac"] == pytest.approx(2 / 5)
    v = torch.tensor([[1.0, 0.5, 2.0], [0.0, -1.0, 5.0]])
    old_v = torch.tensor([[0.0, 0.45, 2.0], [0.3, -1.0, 0.0]])
    ret = torch.tensor([[2.0, 0.0, 1.0], [-1.0, -2.0, 0.0]])
    _, vs = ppo_value_loss(v, old_v, ret, mask, 0.2)
    # 1 -> 0.2 (further from 2): counted; 0.5 inside 0.45 ± 0.2: equal errors, not counted; 2 = old: not;
    # 0 -> 0.1 (further from -1): counted; -1 = old: not
    assert vs["value_clipfrac"] == pytest.approx(2 / 5)
    l1 = [1.0, 0.25, 1.0, 1.0, 1.0]
    l2 = [(0.2 - 2) ** 2, 0.25, 1.0, 1.1 ** 2, 1.0]
    assert vs["value_loss"] == pytest.approx(0.5 * sum(map(max, l1, l2)) / 5, rel=1e-6)


def test_group_advantages_defaults_are_group_scaling_with_eps_1e_4():
    r = torch.tensor([[0.0, 1e-3, 2e-3], [1.0, 3.0, 8.0]], dtype=torch.float64)
    c = r - r.mean(1, keepdim=True)
    torch.testing.assert_close(group_advantages(r), c / (r.std(1, keepdim=True) + 1e-4))
    with pytest.raises(ValueError, match="scale_rewards 'groups'"):  # the refusal names what was given
        group_advantages(r, 1e-4, "groups")


@pytest.mark.parametrize("rewards", [[[0.7]], [[0.0, 1.0]], [[0.0], [1.0]], [[2.0, 0.0, 1.0]]])
def test_batch_scaled_advantages_of_one_two_or_three_rewards(rewards):
    """The step's sample std over n rewards: a single reward has none (0, and the advantage is 0, not nan);
    two or more divide by n − 1."""
    r = torch.tensor(rewards, dtype=torch.float64)
    got = group_advantages(r, 1e-4, "batch")
    c = r - r.mean(1, keepdim=True)
    std = r.flatten().std().item() if r.numel() > 1 else 0.0
    torch.testing.assert_close(got, c / (std + 1e-4))
    assert torch.isfinite(got).all()


def test_batch_scaling_all_reduces_on_the_ranks_device(monkeypatch):
    """The count, sum and sum of squares go into the all-reduce on the rank's device (NCCL refuses CPU tensors);
    checked on the meta device, the one device besides the CPU here. The stand-in collective answers with the
    moments of this rank's rewards and one other rank's reward."""
    seen = []
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])

    def reduce(t, info):
        seen.append((t.device, t.dtype, info.world))
        both = torch.cat([r.flatten(), torch.tensor([3.0])]).double()
        return torch.stack([torch.tensor(5.0, dtype=torch.float64), both.sum(), (both * both).sum()])

    monkeypatch.setattr(grpo, "all_reduce_sum", reduce)
    got = group_advantages(r, 1e-4, "batch", DistInfo(rank=0, world=2, device=torch.device("meta")))
    assert seen == [(torch.device("meta"), torch.float64, 2)]
    std = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0], dtype=torch.float64).std().item()
    torch.testing.assert_close(got, (r - 0.5) / (std + 1e-4))


def test_token_logprobs_default_to_temperature_1_from_the_first_position():
    model = _gpt(3).eval()
    seq = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = token_logprobs(model, seq)
        logits = copy.deepcopy(model).double()(seq[:, :-1])[0]
    want = torch.log_softmax(logits, -1).gather(2, seq[:, 1:, None])[..., 0]
    assert got.shape == (2, 6)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_pad_rollouts_takes_one_token_prompts_and_refuses_empty_ones_and_unequal_counts():
    ids, mask, start = pad_rollouts([[5], [6, 7]], [[1, 2], [3]], pad=0)
    assert start == 0 and ids.tolist() == [[5, 1, 2], [6, 7, 3]]
    assert mask.tolist() == [[True, True], [False, True]]
    with pytest.raises(ValueError, match="every rollout needs a prompt token and a reply token"):
        pad_rollouts([[]], [[1]], pad=0)
    for prompts, replies in [([[1], [2]], [[3]]), ([[1]], [[3], [4]])]:
        with pytest.raises(ValueError):
            pad_rollouts(prompts, replies, pad=0)
