"""training/ppo.py's and grpo.py's math and steps where the `training` mutation lane found its tests blind
(issue 36; the lane's score: docs/benchmarks.md, "Mutation testing"; each survivor's verdict in the record git
keeps, `git show 73bfdcc:docs/benchmarks.md`, "Lane `training`").

The losses themselves were pinned (TRL's tensors, the recipes' hand computations), but these were not:
- the defaults that callers rely on: TRL's PPO clip 0.2, value clip 0.2 and vf_coef 0.1; GRPO's group
  scaling with eps 1e-4; log-probs at temperature 1 from position 0;
- that ``ppo_batch_loss``'s ``rows`` and its hyper-parameters reach the loss (every caller passed the
  defaults, so dropping or swapping them changed nothing);
- the batch-scaled advantages of a step with one or two rewards (the sample std's edge);
- ``pad_rollouts``' refusals: a one-token prompt is valid, an empty one and unequal counts are not;
- ``grpo_step``'s plumbing that only the torchrun tests exercised (mutmut, in one process, cannot see them):
  DDP's ``no_sync`` on all but an update's last micro-batch, the step's DistInfo reaching batch scaling, and
  the forwards it may skip; its gradient clip below 1;
- what ``GRPO.sample_and_score`` hands the sampler (a rank's share, temperature, top-k, seed, rows) and the
  score it reports; ``GRPO.check`` and ``check_context`` at their edges, with their whole messages.

Each is compared with a direct computation written out here (float64 where it is numeric).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from gptforge.models.gpt2 import GPTConfig
from gptforge.parallel.distributed import DistInfo
from gptforge.training import grpo
from gptforge.training.grpo import group_advantages, token_logprobs
from gptforge.training.ppo import ValueModel, make_experience, pad_rollouts, ppo_batch_loss, ppo_loss
from tests.training.test_ppo_experience import PROMPTS, REPLIES, _gpt  # the tiny model and rollouts


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
    with pytest.raises(ValueError, match="^every rollout needs a prompt token and a reply token$"):
        pad_rollouts([[]], [[1]], pad=0)
    for prompts, replies in [([[1], [2]], [[3]]), ([[1]], [[3], [4]])]:
        with pytest.raises(ValueError):
            pad_rollouts(prompts, replies, pad=0)


# ---------------------------------------------------------------- grpo_loss and grpo_step's plumbing
def test_grpo_loss_has_no_kl_term_without_a_reference_or_a_coefficient():
    """The KL term needs both a reference and a positive coefficient; without either the loss is the clipped
    surrogate alone and the reported KL is 0 (grpo_step passes no reference when the coefficient is 0)."""
    from gptforge.training.grpo import grpo_loss

    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]])
    old = torch.tensor([[-0.6, -1.0], [-1.5, -0.1]])
    ref = torch.tensor([[-0.1, -3.0], [-0.2, -0.3]])
    adv, mask = torch.tensor([1.0, -0.5]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ratio = torch.exp(logp - old).double()
    surr = torch.minimum(ratio * adv.double()[:, None], ratio.clamp(0.8, 1.2) * adv.double()[:, None])
    want = -((surr[0, 0] + surr[0, 1]) / 2 + surr[1, 0]) / 2
    for r, kl_coef in [(None, 0.1), (ref, 0.0), (None, 0.0)]:
        loss, kl = grpo_loss(logp, old, r, adv, mask, 0.2, kl_coef)
        assert loss.item() == pytest.approx(want.item(), rel=1e-6) and kl.item() == 0.0
    # with both, the KL is there: k3 = e^d − d − 1, d = log π_ref − log π, each reply's mean over its tokens
    d = (ref - logp).double()
    k3 = torch.exp(d) - d - 1
    loss, kl = grpo_loss(logp, old, ref, adv, mask, 0.2, 0.1)
    assert kl.item() == pytest.approx(((k3[0, 0] + k3[0, 1]) / 2 + k3[1, 0]).item() / 2, rel=1e-6)
    assert loss.item() == pytest.approx(want.item() + 0.1 * kl.item(), rel=1e-6)


class _DDPStandIn(torch.nn.Module):
    """What grpo_step sees of DDP: a forward and ``no_sync``. Records, for each differentiable forward, whether
    it ran inside ``no_sync`` (DDP then keeps the gradients local: they are all-reduced by the first backward
    outside it)."""

    def __init__(self, module):
        super().__init__()
        self.module, self.local, self.seen = module, False, []

    def forward(self, *a, **kw):
        self.seen.append(self.local)
        return self.module(*a, **kw)

    def no_sync(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.local = True
            try:
                yield
            finally:
                self.local = False
        return ctx()


def _grpo_inputs(updates: int, kl_coef: float, micro_batch: int = 2):
    """A 6-reply GRPO batch (2 problems x 3) on a tiny model, its config, rewards with spread in each group."""
    from gptforge.eval.tasks.verifiable import Problem
    from gptforge.training.grpo import rl_config
    from gptforge.training.rollouts import Rollouts

    mcfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=40, pad_vocab=False)
    cfg = rl_config(mcfg, "unused", "")
    cfg.rl.updates_per_batch, cfg.rl.kl_coef, cfg.train.micro_batch, cfg.optim.grad_clip = updates, kl_coef, micro_batch, 0
    prompts = [[1, 2, 3]] * 3 + [[4, 5]] * 3
    replies = [[10, 11], [12], [13, 14, 15], [16], [17, 18], [19, 20, 21]]
    ro = Rollouts([Problem("a", "1")] * 3 + [Problem("b", "2")] * 3, prompts, replies, [""] * 6)
    return cfg, ro, torch.tensor([[1.0, 0.0, 0.5], [0.0, 2.0, 1.0]])


@pytest.mark.parametrize("updates", [1, 2])
def test_grpo_step_all_reduces_gradients_on_each_updates_last_micro_batch_only(updates):
    from gptforge.training.grpo import grpo_step

    cfg, ro, rewards = _grpo_inputs(updates, 0.0)
    model = _gpt(4)
    wrapped = _DDPStandIn(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grpo_step(wrapped, model, None, opt, ro, rewards, cfg, pad=0, info=DistInfo(rank=0, world=2))
    assert wrapped.seen == [True, True, False] * updates  # 3 micro-batches of 2 replies an update


@pytest.mark.parametrize("updates,kl_coef", [(1, 0.0), (1, 0.1), (2, 0.0), (2, 0.1)])
def test_grpo_step_runs_the_reference_and_the_old_policy_only_when_their_numbers_are_used(updates, kl_coef):
    """The reference's forwards only with a KL coefficient; the sampling policy's (old log-probs, no gradient)
    only with several updates a batch: with one, the first update's own log-probs are the old ones."""
    from gptforge.training.grpo import grpo_step

    cfg, ro, rewards = _grpo_inputs(updates, kl_coef)
    model, ref = _gpt(4), _gpt(5)
    calls = {"ref": 0, "no_grad": 0, "grad": 0}
    ref.register_forward_hook(lambda *_: calls.__setitem__("ref", calls["ref"] + 1))
    model.register_forward_hook(
        lambda *_: calls.__setitem__(k := "grad" if torch.is_grad_enabled() else "no_grad", calls[k] + 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grpo_step(model, model, ref, opt, ro, rewards, cfg, pad=0, kl_coef=kl_coef)
    assert calls == {"ref": 3 if kl_coef > 0 else 0, "no_grad": 3 if updates > 1 else 0, "grad": 3 * updates}


def test_grpo_step_scales_batch_advantages_over_every_rank(monkeypatch):
    """rl.scale_rewards batch inside a step: the std's moments go to the all-reduce with the step's own
    DistInfo (a rank that passed none would divide by its own share's std); the stand-in collective adds
    another rank's rewards, and the advantages the loss gets are divided by the std of all of them."""
    from gptforge.training.grpo import grpo_step

    cfg, ro, rewards = _grpo_inputs(1, 0.0)
    cfg.rl.scale_rewards = "batch"
    other = torch.tensor([5.0, -3.0], dtype=torch.float64)
    seen, advs = [], []

    def reduce(t, info):
        seen.append(info.world)
        return t + torch.stack([torch.tensor(2.0, dtype=torch.float64), other.sum(), (other * other).sum()])

    real_loss = grpo.grpo_loss
    monkeypatch.setattr(grpo, "all_reduce_sum", reduce)
    monkeypatch.setattr(grpo, "grpo_loss", lambda *a: advs.append(a[3]) or real_loss(*a))
    model = _gpt(4)
    grpo_step(_DDPStandIn(model), model, None, torch.optim.SGD(model.parameters(), lr=0.1), ro, rewards, cfg, pad=0,
              info=DistInfo(rank=0, world=2))
    assert seen == [2]
    std = torch.cat([rewards.double().flatten(), other]).std().item()
    want = (rewards - rewards.mean(1, keepdim=True)).flatten() / (std + cfg.rl.adv_eps)
    torch.testing.assert_close(torch.cat(advs), want.float())


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_grpo_step_clips_the_gradient_norm_when_asked(clip):
    """optim.grad_clip > 0 clips the update's gradient to that norm (any positive value, below 1 too); 0 leaves
    it whole. Seen in the parameters' move under SGD at lr 1: its norm is the clipped gradient's."""
    from gptforge.training.grpo import grpo_step

    cfg, ro, rewards = _grpo_inputs(1, 0.0)
    cfg.optim.grad_clip = clip
    model = _gpt(4)
    before = [p.detach().clone() for p in model.parameters()]
    out = grpo_step(model, model, None, torch.optim.SGD(model.parameters(), lr=1.0), ro, rewards, cfg, pad=0)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True)))
    assert out["grad_norm"] > 0.01  # the logged norm is the gradient's before clipping
    assert moved.item() == pytest.approx(clip if clip else out["grad_norm"], rel=1e-4)


# ---------------------------------------------------------------- GRPO.sample_and_score
@pytest.mark.parametrize("rnd,top_k", [(0, 5), (2, 0)])
def test_sample_and_score_hands_the_sampler_its_share_and_the_steps_parameters(monkeypatch, rnd, top_k):
    """Rank 1 of 4 samples problems 2 and 3 of the step's 8, with the run's temperature and top-k (0: none), the
    seed SeedSequence(train.seed, step, 1) (a redraw: (train.seed, step, 8, round)) and its rows' place in the
    whole batch (so that 4 ranks draw what 1 process would); then scores them: mean reward, accuracy against
    each problem's answer, mean reply length, and whether any reward was not finite."""
    import numpy as np

    from gptforge.eval.tasks.verifiable import Problem
    from gptforge.generation import SamplingParams
    from gptforge.training.grpo import GRPO
    from gptforge.training.rollouts import Rollouts

    cfg, _, _ = _grpo_inputs(1, 0.0)
    cfg.rl.group, cfg.rl.temperature, cfg.rl.top_k, cfg.rl.max_new_tokens, cfg.train.seed = 3, 1.3, top_k, 6, 9
    asked = []

    def problems_at(step, round=0):
        asked.append((step, round))
        return [Problem(f"{step}.{round}.{i}", str(i)) for i in range(8)]

    recipe = GRPO(cfg, None, SimpleTok(), lambda p, reply: float(len(reply)), problems_at=problems_at, held_out=[])
    seen = []

    def sampler(model, enc, template, problems, group, params):
        seen.append((list(problems), group, params))
        probs = [p for p in problems for _ in range(group)]
        a, b = (f"The answer is {k}." for k in (2, 3))
        texts = [a, "x", a, b, "The answer is 2.", b]  # right, wrong, right; right, wrong, right
        return Rollouts(probs, [[1]] * 6, [[5] * (k + 1) for k in range(6)], texts)

    monkeypatch.setattr(grpo, "sample_replies", sampler)
    monkeypatch.setattr(grpo, "any_rank", lambda flag, info: flag)  # one process stands in for the 4
    run = SimpleNamespace(cfg=cfg, info=DistInfo(rank=1, world=4), device=torch.device("cpu"))
    ro, r, local, _, bad = recipe.sample_and_score(run, 3, None, rnd)
    assert asked == [(3, rnd)]
    [(mine, group, params)] = seen
    assert [p.question for p in mine] == [f"3.{rnd}.2", f"3.{rnd}.3"] and group == 3
    seed = int(np.random.SeedSequence([9, 3, 1] if rnd == 0 else [9, 3, 8, rnd]).generate_state(1)[0])
    assert params == SamplingParams(max_new_tokens=6, temperature=1.3, top_k=top_k or None, seed=seed, rows=(6, 24))
    assert r.tolist() == [16.0, 1.0, 16.0, 16.0, 16.0, 16.0] and not bad  # the reward: the text's length
    assert local.tolist() == pytest.approx([81 / 6, 4 / 6, 3.5])


class SimpleTok:
    """The least a GRPO recipe needs of a tokenizer without a chat template (--raw): an end token."""

    eot_token = 0


# ---------------------------------------------------------------- GRPO.check, check_context
def _recipe(tokenizer, problems_at):
    from gptforge.training.grpo import GRPO

    cfg, _, _ = _grpo_inputs(1, 0.0)
    return cfg, GRPO(cfg, None, tokenizer, lambda p, r: 0.0, problems_at=problems_at, held_out=[])


def test_check_refuses_model_parallel_layouts_and_uneven_prompts_and_asks_for_no_accumulation(tokenizer):
    from gptforge.eval.tasks.verifiable import Problem
    from gptforge.training.rl_state import RLError

    cfg, recipe = _recipe(tokenizer, lambda step, round=0: [Problem("1 + 1", "2")])
    cfg.rl.prompts, cfg.rl.max_new_tokens = 4, 4
    assert recipe.check(cfg, 1) == 0 and recipe.check(cfg, 4) == 0  # a step is replies, not token batches
    for tp, pp in [(2, 1), (1, 2), (2, 2)]:
        cfg.dist.tp, cfg.dist.pp = tp, pp
        with pytest.raises(RLError) as e:
            recipe.check(cfg, 1)
        assert str(e.value) == (f"dist.tp={tp}, dist.pp={pp}: GRPO samples with the whole model on every rank, so "
                                "it runs data-parallel only (dist.tp 1, dist.pp 1)")
    cfg.dist.tp = cfg.dist.pp = 1
    with pytest.raises(RLError) as e:
        recipe.check(cfg, 3)
    assert str(e.value) == "rl.prompts=4 must divide over 3 ranks (each rank samples whole groups)"


def test_check_context_fits_the_first_steps_longest_prompt_and_its_reply_in_the_context(tokenizer):
    """Step 0's longest prompt (later steps' are not asked: here they are longer) plus rl.max_new_tokens must fit
    block_size (32): exactly filling it is allowed, one more is refused naming the flag and the room left."""
    from gptforge.eval.tasks.verifiable import Problem
    from gptforge.training.rl_state import RLError

    short, long = "1 + 1", "1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1"
    cfg, recipe = _recipe(tokenizer, lambda step, round=0: [Problem(short, "2"), Problem(short + " + 1", "3")]
                          if step == 0 else [Problem(long, "16")])
    longest = len(tokenizer.encode_ordinary(f"Question: {short} + 1\nAnswer:"))
    room = 32 - longest
    assert room > 0 and len(tokenizer.encode_ordinary(f"Question: {long}\nAnswer:")) > longest
    cfg.rl.max_new_tokens = room
    recipe.check_context(cfg)
    cfg.rl.max_new_tokens = room + 1
    with pytest.raises(RLError) as e:
        recipe.check_context(cfg)
    assert str(e.value) == (f"--max-new-tokens {room + 1} (rl.max_new_tokens): prompts of task arithmetic take up to "
                            f"{longest} tokens and the model's context is 32; give at most {room}")
    cfg.model.block_size, cfg.rl.max_new_tokens = longest + 1, 2  # room for one token: short, not too short
    with pytest.raises(RLError) as e:
        recipe.check_context(cfg)
    assert str(e.value).endswith(f"context is {longest + 1}; give at most 1")
    cfg.model.block_size = longest  # no room at all
    with pytest.raises(RLError) as e:
        recipe.check_context(cfg)
    assert str(e.value).endswith("give at most 0 (this model's context is too short)")
    cfg.model.block_size = longest - 3  # less than none: still "at most 0"
    with pytest.raises(RLError) as e:
        recipe.check_context(cfg)
    assert str(e.value).endswith("give at most 0 (this model's context is too short)")


def test_check_context_without_problems_counts_a_prompt_of_one_token(tokenizer):
    from gptforge.training.rl_state import RLError

    cfg, recipe = _recipe(tokenizer, lambda step, round=0: [])
    cfg.rl.max_new_tokens = 31
    recipe.check_context(cfg)
    cfg.rl.max_new_tokens = 32
    with pytest.raises(RLError, match="take up to 1 tokens .* give at most 31$"):
        recipe.check_context(cfg)
