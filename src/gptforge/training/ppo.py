"""PPO for language models (Schulman et al. 2017, as in Ziegler et al. 2019 / InstructGPT and TRL's
PPOTrainer): a value head, GAE, clipped policy and value losses, and the KL penalty folded into the
per-token reward.

    >>> exp = make_experience(policy, ref, value_model, prompts, replies, scores, pad=50256, kl_coef=0.05)
    >>> loss, stats = ppo_batch_loss(policy, value_model, exp, rows=minibatch)   # per minibatch, per epoch

The math, per reply token t (mask m_t = 1 on the reply's tokens; everything is 0 after the reply):

    d_t       = log π_ref(y_t) − log π_old(y_t)
    KL_t      = −d_t   (k1),   or   e^{d_t} − 1 − d_t   (k3, >= 0)      π_old: the policy that sampled
    r_t       = −kl_coef · KL_t  (+ score on the reply's last token)   the reward the value head learns
    δ_t       = r_t + γ V(t+1) − V(t)                                  V = 0 past the end
    A_t       = δ_t + γ λ A_{t+1}                                      GAE (Schulman et al. 2016)
    R_t       = A_t + V(t)                                             the value head's target (returns)
    Â_t       = (A_t − mean A) / sqrt(var A + 1e-8)                    whitened over the batch's reply tokens
    ρ_t       = exp(log π(y_t) − log π_old(y_t))
    policy    = mean_t max(−Â_t ρ_t, −Â_t clip(ρ_t, 1 − ε, 1 + ε))
    value     = ½ mean_t max((V_t − R_t)², (clip(V_t, V_old,t − ε_v, V_old,t + ε_v) − R_t)²)
    loss      = policy + vf_coef · value

Means are over the masked tokens of the whole batch (TRL's ``masked_mean``); the variance in the
whitening is the unbiased one (Bessel), as TRL's ``masked_var``. Under data parallelism the whitening's
mean and variance are the whole step's, over every rank's rollouts (TRL whitens each process's share),
so a run on N processes equals one process with the same rollouts.

Two settings from Ziegler et al. (2019), shared with GRPO (:class:`gptforge.training.rl_state.RLState`):
``rl.reward_norm`` whitens a reward model's score (each ensemble member's) by the mean and std it
gave step 1's replies, so ``kl_coef`` weighs the KL against a reward of unit spread whatever the
reward model's scale; ``rl.kl_target`` makes ``kl_coef`` adaptive,
``kl_coef ← kl_coef · (1 + clip(KL / target − 1, ±0.2) · replies / rl.kl_horizon)`` after each step,
KL being the step's mean per-reply sum of KL_t (the logged ``kl``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gptforge.parallel.distributed import all_reduce_mean, all_reduce_sum, gathered, grad_sync, local_tensor
from gptforge.training.grpo import GRPO, token_logprobs
from gptforge.training.rl_state import RLError
from gptforge.training.rm import last_index

# --- the math ---------------------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is set (all of them together, not per row)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum()


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) over the masked entries (unbiased variance); ``shift_mean`` False
    keeps the mean (scales only, for whitening rewards). Entries outside the mask are set to 0.
    ``reduce`` sums a tensor over every rank (data parallel): the statistics are then the whole
    batch's, as on one process, instead of each rank's share's."""
    m = mask.to(x.dtype)
    total = (lambda t: t) if reduce is None else reduce
    s, n = total(torch.stack([(x * m).sum(), m.sum()])).unbind()
    if n < 2:
        raise ValueError("whitening needs at least two masked entries (a larger batch or longer replies)")
    mean = s / n
    var = total((((x - mean) ** 2) * m).sum().reshape(1))[0] / n * (n / (n - 1))
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def kl_penalized_rewards(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         mask: torch.Tensor, kl_coef: float, kl_estimator: str = "k1",
                         end: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards (N, L): −kl_coef · KL_t on the reply's tokens, plus each reply's score (N,)
    at position ``end`` (N,) (default: the last reply token). Returns (rewards, KL per token)."""
    if kl_estimator not in ("k1", "k3"):
        raise ValueError(f"kl_estimator {kl_estimator!r}: expected k1 or k3")
    m = mask.to(logprobs.dtype)
    d = (ref_logprobs - logprobs) * m  # log(π_ref / π_old)
    kl = -d if kl_estimator == "k1" else torch.expm1(d) - d
    rewards = -kl_coef * kl
    if end is None:
        end = last_index(mask)
    rewards = rewards.clone()
    rewards[torch.arange(rewards.size(0), device=rewards.device), end] += scores.to(rewards.dtype)
    return rewards, kl


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (N, L) rewards and values (0 after each reply) ->
    (advantages, returns = advantages + values), both (N, L); see the module docstring."""
    L = rewards.size(1)
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(L)):
        next_v = values[:, t + 1] if t + 1 < L else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate, as a loss (N, L inputs) -> (mean over masked tokens, stats)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = masked_mean(torch.max(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {"policy_loss": loss.item(), "clipfrac": masked_mean((clipped > unclipped).float(), mask).item(),
                 "approx_kl": (0.5 * masked_mean((logprobs - old_logprobs) ** 2, mask)).item()}
    return loss, stats


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   clip_value: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped value loss ½ mean max((V − R)², (clip(V, V_old ± ε_v) − R)²) over masked tokens."""
    clipped = torch.clamp(values, old_values - clip_value, old_values + clip_value)
    l1, l2 = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(l1, l2), mask)
    with torch.no_grad():
        stats = {"value_loss": loss.item(), "value_clipfrac": masked_mean((l2 > l1).float(), mask).item()}
    return loss, stats


def ppo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, values: torch.Tensor,
             old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip_eps: float = 0.2,
             clip_value: float = 0.2, vf_coef: float = 0.1, value_mask: torch.Tensor | None = None,
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """policy + vf_coef · value (TRL's defaults: clip 0.2, value clip 0.2, vf_coef 0.1). ``value_mask``
    (default ``mask``) is where the value loss is taken."""
    pl, ps = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps)
    vl, vs = ppo_value_loss(values, old_values, returns, mask if value_mask is None else value_mask, clip_value)
    loss = pl + vf_coef * vl
    return loss, {"loss": loss.item(), **ps, **vs}


# --- the value head ------------------------------------------------------------------------------------


class ValueModel(nn.Module):
    """A family model (with ``hidden_states``) plus a linear ``score`` head read at every position:
    ``forward(ids)`` -> (N, T) values, V(t) = the value of the state after token t. TRL starts it from
    the reward model; :meth:`from_reward_model` does the same."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body
        self.config = body.config
        self.score = nn.Linear(body.config.n_embd, 1, bias=False)
        nn.init.zeros_(self.score.weight)

    @classmethod
    def from_reward_model(cls, rm: nn.Module) -> ValueModel:
        import copy

        v = cls(copy.deepcopy(rm.body))
        v.score.weight.data.copy_(rm.score.weight.data)
        return v

    @torch.no_grad()
    def start_from_reward_model(self, rm: nn.Module) -> None:
        """Take ``rm``'s weights (body and score head) in place (``rl.value_init reward_model``): the
        value of a finished reply then starts at the reward model's score of it. RLError when the
        reward model's shape differs from the value model's (the policy's)."""
        try:
            self.body.load_state_dict(rm.body.state_dict(), strict=True)
        except RuntimeError as e:
            raise RLError("rl.value_init reward_model: the reward model's shape differs from the policy's "
                          f"({str(e).splitlines()[0]}); use rl.value_init policy, or a reward model trained "
                          "from the same SFT model") from None
        self.score.weight.copy_(rm.score.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.score(self.body.hidden_states(ids)).squeeze(-1).float()  # (N, T)


# --- experience: one batch of rollouts turned into PPO's tensors ------------------------------------------


@dataclass
class Experience:
    """Rollouts as right-padded tensors. Per-token tensors are (N, L) over the target positions from
    the batch's first reply token on: column j scores token ``ids[:, start + 1 + j]``."""

    ids: torch.Tensor  # long (N, T): prompt + reply, right-padded
    start: int  # first target position holding a reply token (in any row)
    mask: torch.Tensor  # bool (N, L): reply tokens
    logprobs: torch.Tensor  # under the policy that sampled them (π_old)
    ref_logprobs: torch.Tensor
    values: torch.Tensor  # V_old, 0 off the reply
    rewards: torch.Tensor  # −kl_coef · KL plus the score on the last reply token
    advantages: torch.Tensor  # whitened over the batch's reply tokens
    returns: torch.Tensor


def pad_rollouts(prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad: int
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids (N, T) right-padded prompt + reply, reply mask over targets (N, L), start)."""
    if any(len(r) == 0 for r in replies) or any(len(p) == 0 for p in prompts):
        raise ValueError("every rollout needs a prompt token and a reply token")
    seqs = [list(p) + list(r) for p, r in zip(prompts, replies, strict=True)]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), T - 1, dtype=torch.bool)
    for k, (s, p, r) in enumerate(zip(seqs, prompts, replies, strict=True)):
        ids[k, : len(s)] = torch.as_tensor(s)
        mask[k, len(p) - 1 : len(p) - 1 + len(r)] = True  # target t is token t + 1
    start = min(len(p) for p in prompts) - 1
    return ids, mask[:, start:], start


@torch.no_grad()
def make_experience(policy: nn.Module, ref: nn.Module, value_model: nn.Module, prompts: Sequence[Sequence[int]],
                    replies: Sequence[Sequence[int]], scores: torch.Tensor, pad: int, kl_coef: float = 0.05,
                    gamma: float = 1.0, lam: float = 0.95, temperature: float = 1.0, kl_estimator: str = "k1",
                    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Experience:
    """Score-carrying rollouts -> :class:`Experience`: log-probs under the policy and the reference,
    the value head's values, the KL-penalised per-token rewards, GAE and whitened advantages (over
    every rank's rollouts with ``reduce``, a sum over ranks: see :func:`masked_whiten`)."""
    device = next(policy.parameters()).device
    ids, mask, start = pad_rollouts(prompts, replies, pad)
    ids, mask = ids.to(device), mask.to(device)
    logp = token_logprobs(policy, ids, temperature, start)
    ref_logp = token_logprobs(ref, ids, temperature, start)
    values = value_model(ids)[:, start:-1] * mask  # V(t): the state whose next token is target t
    rewards, _ = kl_penalized_rewards(scores.to(device), logp, ref_logp, mask, kl_coef, kl_estimator)
    adv, returns = gae(rewards, values, gamma, lam)
    return Experience(ids, start, mask, logp, ref_logp, values, rewards, masked_whiten(adv, mask, reduce=reduce),
                      returns * mask)


def ppo_batch_loss(policy: nn.Module, value_model: nn.Module, exp: Experience, rows: torch.Tensor | None = None,
                   clip_eps: float = 0.2, clip_value: float = 0.2, vf_coef: float = 0.1, temperature: float = 1.0,
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO step function on the ``rows`` of an experience batch (all by default): fresh log-probs
    and values, then :func:`ppo_loss`."""
    r = slice(None) if rows is None else rows
    ids, mask = exp.ids[r], exp.mask[r]
    logp = token_logprobs(policy, ids, temperature, exp.start)
    values = value_model(ids)[:, exp.start : -1]
    return ppo_loss(logp, exp.logprobs[r], exp.advantages[r], values, exp.values[r], exp.returns[r], mask,
                    clip_eps, clip_value, vf_coef)


# --- the recipe: `gptforge rl --algo ppo` on the one loop ----------------------------------------------------

class PolicyValue(nn.Module):
    """PPO's run model: the policy (a family model) and the value model (its own body, started from the
    policy's weights, plus a zero ``score`` head: TRL's separate value model). One optimizer trains
    both; checkpoints hold both (``policy.*``, ``value.*``, ``recipe: "ppo"``) and every command that
    loads a model (``chat``, ``eval``, ``export``) reads the policy (:func:`gptforge.load.load_model`).
    ``forward(ids, start, temperature)`` -> (the policy's token log-probs, the values), both (N, L)
    over the targets from ``start`` on: one differentiable call, so DDP sees both models. With LoRA
    (``lora.rank``) only the policy takes adapters; the value model trains in full (``trains_whole``), as
    TRL's ``PPOTrainer`` with a ``peft_config``, and checkpoints hold the adapters and the value model."""

    trains_whole = ("value",)  # read by training/lora.py

    def __init__(self, policy: nn.Module, value: ValueModel):
        super().__init__()
        self.policy, self.value = policy, value
        self.config = policy.config

    @property
    def blocks(self) -> nn.ModuleList:  # FSDP shards and recomputes per block
        return nn.ModuleList([*self.policy.blocks, *self.value.body.blocks])

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return (self.policy.num_parameters(exclude_embeddings) + self.value.body.num_parameters(exclude_embeddings)
                + self.value.score.weight.numel())

    def forward(self, ids: torch.Tensor, start: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(self.policy, ids, temperature, start), self.value(ids)[:, start:-1]


class PPO(GRPO):
    """PPO on the one loop, built on GRPO's problems, sampling, rewards and held-out eval: each step samples ``rl.prompts`` x ``rl.group`` replies with the policy,
    scores them (reward function or ``rl.reward_model``), builds the experience (KL-penalised
    per-token rewards, GAE, whitened advantages) and makes ``rl.updates_per_batch`` optimizer steps on
    it, each over micro-batches of ``train.micro_batch`` replies (the clipped losses' token means
    per micro-batch, weighted by its replies)."""

    name, kind = "ppo", "rl"

    def build_model(self, model_cfg: Any) -> PolicyValue:
        from gptforge.models.registry import build_model
        from gptforge.training.rm import freeze_unused_head

        return PolicyValue(build_model(model_cfg), ValueModel(freeze_unused_head(build_model(model_cfg))))

    def policy(self, run: Any) -> nn.Module:
        return run.model.policy

    def step(self, run: Any, step: int) -> dict[str, float]:
        cfg, info, rl = run.cfg, run.info, run.cfg.rl
        policy = run.model.policy
        # FSDP: sampling (replies of unequal lengths) and the experience (the policy and value called apart
        # from the root) run on the weights gathered once
        with gathered(run.model):
            rollouts, r, local, sample_ms, bad = self.sample_and_score(run, step, policy)
            if bad:  # every rank stops here, before the update
                return {"loss": float("nan"), "reward": float(all_reduce_mean(local, info)[0])}
            with run.autocast():
                exp = make_experience(policy, self.ref if self.ref is not None else policy, run.model.value,
                                      rollouts.prompts, rollouts.replies, r, self.pad, self.kl_coef(run), rl.gamma,
                                      rl.lam, rl.temperature, reduce=lambda t: all_reduce_sum(t, info))
        kl = ((exp.logprobs - exp.ref_logprobs) * exp.mask).sum(dim=1).mean().item()
        N, mb = exp.ids.size(0), cfg.train.micro_batch
        chunks = [torch.arange(i, min(i + mb, N), device=exp.ids.device) for i in range(0, N, mb)]
        run.model.train()
        norm, sums = torch.zeros(()), {}
        for _ in range(rl.updates_per_batch):
            sums = {}
            for k, rows in enumerate(chunks):
                with grad_sync(run.wrapped, info, sync=k == len(chunks) - 1), run.autocast():
                    logp, values = run.wrapped(exp.ids[rows], exp.start, rl.temperature)
                    loss, st = ppo_loss(logp, exp.logprobs[rows], exp.advantages[rows], values, exp.values[rows],
                                        exp.returns[rows], exp.mask[rows], rl.clip_eps, rl.clip_value, rl.vf_coef)
                    (loss * len(rows) / N).backward()
                for key, v in st.items():
                    sums[key] = sums.get(key, 0.0) + v * len(rows) / N
            params_ = list(run.model.parameters())
            norm = (torch.nn.utils.clip_grad_norm_(params_, cfg.optim.grad_clip) if cfg.optim.grad_clip > 0 else
                    torch.nn.utils.get_total_norm([p.grad for p in params_ if p.grad is not None]))
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        run.model.eval()
        reward, acc, reply_len = all_reduce_mean(local, info).tolist()
        keys = ["loss", "policy_loss", "value_loss", "clipfrac", "approx_kl"]
        vals = all_reduce_mean(torch.tensor([sums[k] for k in keys] + [kl], device=run.device), info).tolist()
        return self.after_step(run, {**dict(zip(keys, vals[:-1], strict=True)), "reward": reward, "accuracy": acc,
                                     "kl": vals[-1], "grad_norm": float(local_tensor(norm)), "reply_len": reply_len,
                                     "sample_ms": sample_ms})
