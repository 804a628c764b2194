"""Each RL recipe's real step (GRPO and PPO on the one loop) checked against a direct computation of the
quantities it uses and logs (issue 36): the tensors a step hands to its loss are captured with
monkeypatched spies, and every one is recomputed here by hand in float64 from the rollouts, the rewards
and snapshots of the weights (a forward per row, no padding, the formulas written out): log-probs,
group advantages, ratios and clipping, KL, per-token rewards, GAE, whitening, returns, losses, the
logged loss and KL, the adaptive KL coefficient, a reward-model ensemble's whitened and reduced scores.

The configurations that change the code path each take it here: several updates per batch (GRPO and
PPO), an ensemble with ``rl.reward_norm``, an adaptive ``rl.kl_target``, GRPO's ``rl.scale_rewards``
batch and none.

Planted bugs these catch: PPO's advantages whitened without subtracting their mean in
``make_experience``; GRPO ignoring its old log-probs with ``rl.updates_per_batch`` > 1 (ratio 1, no
clipping); the KL in the reward with the wrong sign or coefficient; GAE's lambda dropped; returns
from whitened advantages; the adaptive coefficient not applied; reward whitening refit every step or
applied after the reduce.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gptforge.config import RLConfig
from gptforge.data.chat import ChatTemplate, ChatTokenizer
from gptforge.eval.tasks.verifiable import Problem
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.parallel.distributed import DistInfo
from gptforge.training import grpo, ppo
from gptforge.training.grpo import GRPO, rl_config
from gptforge.training.loop import train
from gptforge.training.ppo import PPO
from gptforge.training.rm import RewardEnsemble, RewardModel

T_SAMPLE = 1.3  # a sampling temperature other than 1: the log-probs are those of softmax(logits / T)


def _small() -> tuple[GPTConfig, ChatTemplate]:
    # 64 tokens: GPT-2 ids 0..58 are single ASCII characters; chat ids 59..63
    t = ChatTemplate(bos=59, roles={"system": 60, "user": 61, "assistant": 62}, end=63, name="test")
    return GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=64, pad_vocab=False), t


def graded(problem, reply: str) -> float:
    """A reward with spread inside every group."""
    return (sum(map(ord, reply)) % 5) / 4 + 0.1 * len(reply)


def _run(tmp_path, tokenizer, algo: str, steps: int = 2, reward_model=None, reward_fn=graded, grad_clip=0.0,
         **rl) -> list[dict]:
    mcfg, t = _small()
    cfg = rl_config(mcfg, str(tmp_path / algo), "")
    cfg.rl = RLConfig(prompts=2, group=4, max_new_tokens=4, eval_n=0, temperature=T_SAMPLE, algo=algo,
                      **{"kl_coef": 0.1, "adv_eps": 1e-3, **rl})
    cfg.optim.lr, cfg.train.max_steps, cfg.train.ckpt_every, cfg.train.device = 3e-2, steps, 0, "cpu"
    cfg.train.micro_batch, cfg.optim.grad_clip = 4, grad_clip  # two micro-batches of 4 replies per update
    recipe_cls = PPO if algo == "ppo" else GRPO
    recipe = recipe_cls(cfg, t, tokenizer, reward_fn, problems_at=lambda step: [Problem("!", ""), Problem("?", "")],
                        held_out=[], reward_model=reward_model)
    recipe.words_unknown = True  # the 64-id toy speaks GPT-2's first 59 ids, not the whole tokenizer
    torch.manual_seed(0)
    train(cfg, recipe)
    return [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "rl"]


# ---------------------------------------------------------------- hand computations, float64
def hand_logp(model, prompt, reply, temperature, grad=False) -> torch.Tensor:
    """log softmax(logits / T) of each reply token given everything before it, one row, float64.
    ``grad``: ``model`` is already a float64 copy, and the result keeps its graph."""
    with torch.set_grad_enabled(grad):
        return _hand_logp(model if grad else copy.deepcopy(model).double().eval(), prompt, reply, temperature)


def _hand_logp(m, prompt, reply, temperature) -> torch.Tensor:
    seq = list(prompt) + list(reply)
    logits, _ = m(torch.tensor([seq[:-1]]))
    lp = torch.log_softmax(logits[0].double() / temperature, -1)
    return torch.stack([lp[len(prompt) - 1 + j, tok] for j, tok in enumerate(reply)])


@torch.no_grad()
def hand_values(value_model, prompt, reply) -> torch.Tensor:
    """V of the state before each reply token (the value head at the token that precedes it)."""
    m = copy.deepcopy(value_model).double().eval()
    h = m.body.hidden_states(torch.tensor([list(prompt) + list(reply)]))[0]  # (T, C)
    v = h @ m.score.weight[0]
    return v[len(prompt) - 1 : len(prompt) - 1 + len(reply)]


def rows_of(x: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """A right-padded (N, L) tensor -> each row's reply-token entries, in order."""
    return [x[k][mask[k].bool()].double() for k in range(x.size(0))]


def close(a, b, tol=2e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


# ---------------------------------------------------------------- GRPO
class GRPOSpy:
    """Records each grpo_step (the weights it starts from, its rollouts, rewards and coefficient) and each
    grpo_loss call in it (the weights at the call and the tensors it was given)."""

    def __init__(self, monkeypatch):
        self.steps: list[dict] = []
        real_step, real_loss = grpo.grpo_step, grpo.grpo_loss

        def step(wrapped, model, ref, optimizer, rollouts, rewards, cfg, pad, info=None, autocast=None, kl_coef=None):
            self.model = model
            self.steps.append({"init": copy.deepcopy(model), "ref": copy.deepcopy(ref), "rollouts": rollouts,
                               "rewards": rewards.clone(), "kl_coef": kl_coef, "info": info, "calls": []})
            return real_step(wrapped, model, ref, optimizer, rollouts, rewards, cfg, pad, info, autocast, kl_coef)

        def loss(logp, old_logp, ref_logp, adv, mask, clip_eps, kl_coef):
            out = real_loss(logp, old_logp, ref_logp, adv, mask, clip_eps, kl_coef)
            self.steps[-1]["calls"].append({"now": copy.deepcopy(self.model), "kl_coef": kl_coef,
                                            "logp": logp.detach().clone(),
                                            "old": old_logp.clone(), "adv": adv.clone(), "mask": mask.clone(),
                                            "loss": out[0].item(), "kl": out[1].item()})
            return out

        monkeypatch.setattr(grpo, "grpo_step", step)
        monkeypatch.setattr(grpo, "grpo_loss", loss)


def hand_grpo_loss(now, init, ref, prompts, replies, adv, clip_eps, kl_coef, T, clip=True, grad=False):
    losses, kls, ratios = [], [], []
    for p, r, a in zip(prompts, replies, adv, strict=True):
        lp, old = hand_logp(now, p, r, T, grad), hand_logp(init, p, r, T)
        lr = hand_logp(ref, p, r, T) if ref is not None else lp  # no reference: no KL term
        ratio = torch.exp(lp - old)
        clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) if clip else ratio
        surr = torch.minimum(ratio * a, clipped * a)
        d = lr - lp
        kl = torch.exp(d) - d - 1
        losses.append((-(surr - kl_coef * kl)).mean())
        kls.append(kl.mean())
        ratios.append(ratio)
    return torch.stack(losses).mean(), torch.stack(kls).mean(), torch.cat(ratios)


@pytest.mark.parametrize("updates,kl_coef,clip,scale", [(1, 0.1, 1e3, "group"), (2, 0.1, 1e3, "group"),
                                                         (2, 0.0, 0.0, "group"), (1, 0.1, 1e3, "batch"),
                                                         (2, 0.1, 1e3, "none")])
def test_grpo_step_against_a_hand_computation(tmp_path, tokenizer, monkeypatch, updates, kl_coef, clip, scale):
    spy = GRPOSpy(monkeypatch)
    logged = _run(tmp_path, tokenizer, "grpo", steps=2, updates_per_batch=updates, clip_eps=0.05, kl_coef=kl_coef,
                  grad_clip=clip, scale_rewards=scale)
    assert len(spy.steps) == 2
    for s, rec in zip(spy.steps, logged, strict=True):
        ro = rec_r = s["rollouts"]
        rewards = torch.tensor([graded(pb, x) for pb, x in zip(ro.problems, ro.texts, strict=True)], dtype=torch.float64)
        close(s["rewards"].flatten(), rewards, 1e-6)
        g = rewards.view(2, 4)
        # rl.scale_rewards, as TRL: the group's sample std, the step's sample std over all 8 rewards, or none
        std = {"group": g.std(1, keepdim=True) + 1e-3, "batch": g.std() + 1e-3, "none": 1.0}[scale]
        adv = ((g - g.mean(1, keepdim=True)) / std).flatten()
        assert s["kl_coef"] == kl_coef and (s["ref"] is None) == (kl_coef == 0)
        # the run's DistInfo (grad_sync and batch scaling read it; without it a rank would act alone)
        assert isinstance(s["info"], DistInfo) and s["info"].world == 1
        assert len(s["calls"]) == 2 * updates  # two micro-batches per update
        clip_acted = []
        for i, call in enumerate(s["calls"]):
            u, rows = i // 2, range((i % 2) * 4, (i % 2) * 4 + 4)
            P, R = [rec_r.prompts[k] for k in rows], [rec_r.replies[k] for k in rows]
            close(call["adv"], adv[list(rows)])
            # old log-probs: the sampling policy's (the weights before this batch's first update)
            for k, (p, r) in enumerate(zip(P, R, strict=True)):
                close(rows_of(call["old"], call["mask"])[k], hand_logp(s["init"], p, r, T_SAMPLE))
                close(rows_of(call["logp"], call["mask"])[k], hand_logp(call["now"], p, r, T_SAMPLE))
            want, kl, ratio = hand_grpo_loss(call["now"], s["init"], s["ref"], P, R, adv[list(rows)], 0.05, kl_coef,
                                             T_SAMPLE)
            close(call["loss"], want)
            close(call["kl"], kl)
            if u == 0:
                close(ratio, torch.ones_like(ratio), 1e-6)
            else:  # the second update: the policy moved, the ratio is not 1 and the clip acts
                assert (ratio - 1).abs().max() > 0.05
                unclipped, _, _ = hand_grpo_loss(call["now"], s["init"], s["ref"], P, R, adv[list(rows)], 0.05,
                                                 kl_coef, T_SAMPLE, clip=False)
                clip_acted.append(abs(unclipped.item() - want.item()))
        if updates > 1:  # somewhere in the second update the clipped surrogate differs from the plain one
            assert max(clip_acted) > 1e-4
        # the logged loss and KL: the last update's, averaged over the micro-batches by their replies
        last = s["calls"][-2:]
        close(rec["loss"], sum(c["loss"] for c in last) / 2, 1e-6)
        close(rec["kl"], sum(c["kl"] for c in last) / 2, 1e-6)
        close(rec["reward"], rewards.mean(), 1e-6)
        # the logged gradient norm: of the last update's loss, the replies' mean over both micro-batches
        now = copy.deepcopy(last[0]["now"]).double().train()
        total = sum(hand_grpo_loss(now, s["init"], s["ref"], [ro.prompts[k] for k in rows],
                                   [ro.replies[k] for k in rows], adv[list(rows)], 0.05, kl_coef, T_SAMPLE,
                                   grad=True)[0] * 0.5 for rows in (range(0, 4), range(4, 8)))
        total.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in now.parameters() if p.grad is not None))
        close(rec["grad_norm"], norm, 1e-4)


def test_grpo_adaptive_kl_moves_the_coefficient_by_the_controller(tmp_path, tokenizer, monkeypatch):
    spy = GRPOSpy(monkeypatch)
    logged = _run(tmp_path, tokenizer, "grpo", steps=3, kl_target=1e-4, kl_horizon=16)
    coef = 0.1
    for s, rec in zip(spy.steps, logged, strict=True):
        assert s["kl_coef"] == pytest.approx(coef, rel=1e-12) and rec["kl_coef"] == pytest.approx(coef, rel=1e-12)
        assert all(c["kl_coef"] == s["kl_coef"] for c in s["calls"])  # the loss is given this step's coefficient
        # Ziegler et al.: coef * (1 + clip(KL / target - 1, ±0.2) * replies / horizon)
        err = min(max(rec["kl"] / 1e-4 - 1, -0.2), 0.2)
        coef = coef * (1 + err * 8 / 16)
    assert spy.steps[-1]["kl_coef"] != 0.1


@pytest.mark.parametrize("reduce", ["min", "mean"])
def test_grpo_reward_model_ensemble_whitened_then_reduced(tmp_path, tokenizer, monkeypatch, reduce):
    """rl.reward_model A,B with rl.reward_norm and min or mean: each member's score whitened by the mean and
    population std it gave step 1's replies (kept for step 2), then the members' minimum or mean."""
    mcfg, _ = _small()
    torch.manual_seed(5)
    members = [RewardModel(GPT(mcfg), init_std=1.0), RewardModel(GPT(mcfg), init_std=3.0)]
    ens = RewardEnsemble(members, reduce=reduce)
    frozen = copy.deepcopy(ens)
    spy = GRPOSpy(monkeypatch)
    from gptforge.run.session import RunSession

    said, real_log = [], RunSession.log  # the run's log (rank 0's lines), not every rank's print
    monkeypatch.setattr(RunSession, "log", lambda self, msg: said.append(msg) or real_log(self, msg))
    _run(tmp_path, tokenizer, "grpo", steps=2, reward_model=ens, reward_norm=True)
    assert sum(m.startswith("rl.reward_norm: the reward model's score on the starting policy's replies") for m in said) == 1

    def member_scores(s):
        ro = s["rollouts"]
        out = []
        for m in frozen.members:
            md = copy.deepcopy(m).double().eval()
            row = []
            for p, r in zip(ro.prompts, ro.replies, strict=True):
                h = md.body.hidden_states(torch.tensor([p + r]))[0, -1]
                row.append(h @ md.score.weight[0])
            out.append(torch.stack(row))
        return torch.stack(out)  # (members, N)

    first = member_scores(spy.steps[0])
    shift, scale = first.mean(1, keepdim=True), first.std(1, unbiased=False, keepdim=True)
    for s in spy.steps:
        white = (member_scores(s) - shift) / scale
        want = white.min(0).values if reduce == "min" else white.mean(0)
        close(s["rewards"].flatten(), want, 1e-4)
    assert not torch.allclose(((first - shift) / scale).mean(0), ((first - shift) / scale).min(0).values)


# ---------------------------------------------------------------- PPO
class PPOSpy:
    def __init__(self, monkeypatch):
        self.steps: list[dict] = []
        real_exp, real_loss = ppo.make_experience, ppo.ppo_loss

        def make_experience(policy, ref, value_model, prompts, replies, scores, pad, kl_coef=0.05, gamma=1.0,
                            lam=0.95, temperature=1.0, kl_estimator="k1", reduce=None):
            self.policy, self.value = policy, value_model
            exp = real_exp(policy, ref, value_model, prompts, replies, scores, pad, kl_coef, gamma, lam, temperature,
                           kl_estimator, reduce)
            self.steps.append({"policy": copy.deepcopy(policy), "ref": copy.deepcopy(ref),
                               "value": copy.deepcopy(value_model), "prompts": prompts, "replies": replies,
                               "scores": scores.clone(), "kl_coef": kl_coef, "gamma": gamma, "lam": lam,
                               "exp": exp, "calls": []})
            return exp

        def loss(logprobs, old_logprobs, advantages, values, old_values, returns, mask, clip_eps=0.2,
                 clip_value=0.2, vf_coef=0.1, value_mask=None):
            out = real_loss(logprobs, old_logprobs, advantages, values, old_values, returns, mask, clip_eps,
                            clip_value, vf_coef, value_mask)
            self.steps[-1]["calls"].append({"policy": copy.deepcopy(self.policy), "value": copy.deepcopy(self.value),
                                            "loss": out[0].item(), "stats": out[1]})
            return out

        monkeypatch.setattr(ppo, "make_experience", make_experience)
        monkeypatch.setattr(ppo, "ppo_loss", loss)


def hand_experience(s, T):
    """Per row: log-probs, reference log-probs, values, per-token rewards, GAE advantages and returns;
    then the advantages whitened over every reply token of the batch (mean subtracted, unbiased var)."""
    out = []
    for p, r, score in zip(s["prompts"], s["replies"], s["scores"].double(), strict=True):
        lp, ref = hand_logp(s["policy"], p, r, T), hand_logp(s["ref"], p, r, T)
        v = hand_values(s["value"], p, r)
        rew = -s["kl_coef"] * (lp - ref)  # k1: KL_t = log π_old − log π_ref
        rew[-1] += score
        adv, nxt_a, nxt_v = torch.zeros_like(v), 0.0, 0.0
        for t in reversed(range(len(r))):
            delta = rew[t] + s["gamma"] * nxt_v - v[t]
            nxt_a = delta + s["gamma"] * s["lam"] * nxt_a
            adv[t], nxt_v = nxt_a, v[t]
        out.append({"lp": lp, "ref": ref, "v": v, "rew": rew, "adv": adv, "ret": adv + v})
    flat = torch.cat([o["adv"] for o in out])
    mean, var = flat.mean(), flat.var(unbiased=True)
    for o in out:
        o["white"] = (o["adv"] - mean) / torch.sqrt(var + 1e-8)
    return out


def hand_ppo_loss(s, H, call, rows, *, clip_eps: float, clip_value: float, vf_coef: float):
    """PPO's loss at one of step ``s``'s loss calls (``call``: its policy and value model), over replies ``rows``
    against the experience ``H = hand_experience(s, ...)``, by hand: the clipped policy term and the clipped value
    term, meaned over the reply tokens; and the policy ratios."""
    pg, vl, ratios = [], [], []
    for k in rows:
        p, r, h = s["prompts"][k], s["replies"][k], H[k]
        ratio = torch.exp(hand_logp(call["policy"], p, r, T_SAMPLE) - h["lp"])
        pg.append(torch.maximum(-h["white"] * ratio, -h["white"] * ratio.clamp(1 - clip_eps, 1 + clip_eps)))
        v = hand_values(call["value"], p, r)
        vc = torch.clamp(v, h["v"] - clip_value, h["v"] + clip_value)
        vl.append(torch.maximum((v - h["ret"]) ** 2, (vc - h["ret"]) ** 2))
        ratios.append(ratio)
    return torch.cat(pg).mean() + vf_coef * 0.5 * torch.cat(vl).mean(), torch.cat(ratios)


@pytest.mark.parametrize("updates,kl_coef", [(1, 0.1), (2, 0.1), (1, 0.0)])
def test_ppo_step_against_a_hand_computation(tmp_path, tokenizer, monkeypatch, updates, kl_coef):
    spy = PPOSpy(monkeypatch)
    # what only the torchrun tests see the effect of (2 ranks against 1 process; mutmut cannot map them): the
    # step's gradient all-reduce on each update's last micro-batch, of the model the run wrapped, and the
    # whitening's statistics through the all-reduce (its sum and count, then its variance)
    syncs, reduced = [], []
    real_sync, real_sum = ppo.grad_sync, ppo.all_reduce_sum
    monkeypatch.setattr(ppo, "grad_sync", lambda w, info, sync: syncs.append((w, sync)) or real_sync(w, info, sync))
    monkeypatch.setattr(ppo, "all_reduce_sum", lambda t, info: reduced.append(t.numel()) or real_sum(t, info))
    logged = _run(tmp_path, tokenizer, "ppo", steps=2, updates_per_batch=updates, gamma=0.9, lam=0.8, clip_eps=0.05,
                  clip_value=0.05, vf_coef=0.3, kl_coef=kl_coef)
    assert len(spy.steps) == 2
    assert [sync for _, sync in syncs] == [False, True] * updates * 2
    assert all(isinstance(w, ppo.PolicyValue) for w, _ in syncs)
    assert reduced == [2, 1] * 2
    for i_step, (s, rec) in enumerate(zip(spy.steps, logged, strict=True)):
        exp, H = s["exp"], hand_experience(s, T_SAMPLE)
        assert (s["kl_coef"], s["gamma"], s["lam"]) == (kl_coef, 0.9, 0.8)
        enc = ChatTokenizer(tokenizer, _small()[1])  # the rollouts' text, as the recipe reads it
        texts = [enc.decode([t for t in r if t != 63]).strip() for r in s["replies"]]
        close(s["scores"], [graded(None, x) for x in texts], 1e-6)
        for name, key in (("logprobs", "lp"), ("ref_logprobs", "ref"), ("values", "v"), ("rewards", "rew"),
                          ("advantages", "white"), ("returns", "ret")):
            for k, row in enumerate(rows_of(getattr(exp, name), exp.mask)):
                close(row, H[k][key], 5e-5)
        white = torch.cat([h["white"] for h in H])
        assert abs(white.mean().item()) < 1e-6 and white.std().item() == pytest.approx(1, abs=1e-6)
        kl = torch.cat([h["lp"] - h["ref"] for h in H]).abs().max()
        if kl_coef == 0:  # no reference: the policy stands in (no KL penalty, no copy of the weights)
            assert kl == 0
        if i_step == 1:  # the policy has moved from the reference: the KL and the values are not 0
            assert kl_coef == 0 or kl > 1e-3
            assert torch.cat([h["v"] for h in H]).abs().max() > 1e-3
        # the logged KL: the batch's mean per-reply sum of log π_old − log π_ref
        close(rec["kl"], torch.stack([(h["lp"] - h["ref"]).sum() for h in H]).mean(), 1e-5)
        # every loss call: fresh log-probs and values against the experience's, clipped, by hand
        assert len(s["calls"]) == 2 * updates
        for i, call in enumerate(s["calls"]):
            rows = range((i % 2) * 4, (i % 2) * 4 + 4)
            want, ratio = hand_ppo_loss(s, H, call, rows, clip_eps=0.05, clip_value=0.05, vf_coef=0.3)
            close(call["loss"], want, 5e-5)
            if i // 2 == 1:
                assert (ratio - 1).abs().max() > 0.05  # the clip acts on the second update
        last = s["calls"][-2:]
        close(rec["loss"], sum(c["loss"] for c in last) / 2, 1e-6)
        # the logged gradient norm: of the last update's loss, the replies' mean over both micro-batches, over
        # the policy's and the value model's trainable weights
        pol, val = copy.deepcopy(last[0]["policy"]).double().train(), copy.deepcopy(last[0]["value"]).double().train()
        total = 0.0
        for rows in (range(0, 4), range(4, 8)):
            pg, vl = [], []
            for k in rows:
                p, r, h = s["prompts"][k], s["replies"][k], H[k]
                ratio = torch.exp(hand_logp(pol, p, r, T_SAMPLE, grad=True) - h["lp"])
                pg.append(torch.maximum(-h["white"] * ratio, -h["white"] * ratio.clamp(0.95, 1.05)))
                hs = val.body.hidden_states(torch.tensor([list(p) + list(r)]))[0]
                v = (hs @ val.score.weight[0])[len(p) - 1 : len(p) - 1 + len(r)]
                vc = torch.clamp(v, h["v"] - 0.05, h["v"] + 0.05)
                vl.append(torch.maximum((v - h["ret"]) ** 2, (vc - h["ret"]) ** 2))
            total = total + 0.5 * (torch.cat(pg).mean() + 0.3 * 0.5 * torch.cat(vl).mean())
        total.backward()
        grads = [q.grad for m in (pol, val) for q in m.parameters() if q.grad is not None]
        close(rec["grad_norm"], torch.sqrt(sum((g.double() ** 2).sum() for g in grads)), 1e-4)
        assert set(rec) >= {"loss", "policy_loss", "value_loss", "clipfrac", "approx_kl", "reward", "accuracy", "kl",
                            "grad_norm", "reply_len", "sample_ms", "kl_coef"}, sorted(rec)
        assert rec["sample_ms"] > 0 and rec["kl_coef"] == kl_coef
        close(rec["reply_len"], sum(map(len, s["replies"])) / len(s["replies"]), 1e-9)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rl_steps_clip_the_whole_models_gradient_to_optim_grad_clip(tmp_path, tokenizer, monkeypatch, algo):
    """optim.grad_clip > 0 (below 1 too) clips each update's gradient over every trainable weight (PPO's value
    model included) to that norm; the step logs the norm before clipping. The optimizer is AdamW, whose first
    update hardly depends on the gradient's scale, so the clip is seen at the call: its arguments and the
    gradient's norm after it."""
    seen = []
    real = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **kw):
        params = list(params)
        before = real(params, float("inf"))  # the norm, unclipped
        out = real(params, max_norm, *a, **kw)
        after = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in params if q.grad is not None))
        seen.append((len(params), max_norm, before.item(), after.item()))
        return out

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    model_params = []
    real_train = torch.nn.Module.train
    monkeypatch.setattr(torch.nn.Module, "train", lambda m, mode=True: model_params.append(
        len(list(m.parameters()))) or real_train(m, mode))
    logged = _run(tmp_path, tokenizer, algo, steps=2, grad_clip=0.5)
    assert len(seen) == 2 and all(mx == 0.5 for _, mx, _, _ in seen)
    assert all(n == max(model_params) for n, _, _, _ in seen)  # every weight of the run's model
    for (_, _, before, after), rec in zip(seen, logged, strict=True):
        assert before > 0.5 and after == pytest.approx(0.5, rel=1e-5)
        close(rec["grad_norm"], before, 1e-5)


def test_ppo_adaptive_kl_feeds_the_experience(tmp_path, tokenizer, monkeypatch):
    spy = PPOSpy(monkeypatch)
    logged = _run(tmp_path, tokenizer, "ppo", steps=3, kl_target=1e-4, kl_horizon=16)
    coef = 0.1
    for s, rec in zip(spy.steps, logged, strict=True):
        assert s["kl_coef"] == pytest.approx(coef, rel=1e-12)
        err = min(max(rec["kl"] / 1e-4 - 1, -0.2), 0.2)
        coef = coef * (1 + err * 8 / 16)
    assert spy.steps[-1]["kl_coef"] != 0.1


def test_whitening_needs_two_entries_and_says_so():
    """The size guard at its edge: two masked entries whiten (to ±1/sqrt(2), the unbiased variance), one is
    refused with the reason; an unknown KL estimator is refused by name."""
    x, mask = torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[True, True, False]])
    w = ppo.masked_whiten(x, mask)
    close(w, [[-(2**-0.5), 2**-0.5, 0.0]], 1e-6)
    with pytest.raises(ValueError, match="whitening needs at least two masked entries"):
        ppo.masked_whiten(x, torch.tensor([[True, False, False]]))
    with pytest.raises(ValueError, match="kl_estimator 'k2': expected k1 or k3"):
        ppo.kl_penalized_rewards(torch.zeros(1), x, x, mask, 0.1, "k2")
