"""GRPO on verifiable rewards (DeepSeekMath's Group Relative Policy Optimization), readable top to bottom.

    gptforge rl --init-from runs/sft --task arithmetic --out runs/rl --steps 100
    gptforge rl --out runs/rl --resume
    torchrun --nproc_per_node 2 -m gptforge rl --init-from runs/sft --out runs/rl   # rollouts split by rank

Each step: take ``prompts`` problems, sample ``group`` replies to each with the KV cache
(``gptforge.generation``), score them with the reward function, turn rewards into group-relative
advantages ``(r - mean_group) / (std_group + eps)`` (``rl.scale_rewards``: or over the step's std, or
not divided), and minimise, per reply token,

    -[ min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A) - kl_coef * KL ]
    ratio = exp(logp - logp_old),  KL = exp(ref - logp) - (ref - logp) - 1   (k3, >= 0)

averaged over each reply's tokens, then over replies (TRL's ``loss_type="grpo"`` normalisation). With
``rl.kl_target`` the coefficient adapts after each step (:func:`adapt_kl_coef`, on the logged mean token
KL); it is kept in :class:`RLState`, the run's only state besides the weights. ``ref``
is the frozen starting model; with one update per batch (``rl.updates_per_batch`` 1) ``logp_old`` is
the sampling policy, so ratio = 1 and the gradient is the plain policy gradient plus the KL term.
With ``rl.resample_flat`` R, a group whose replies all scored the same (no advantage, no signal) is
replaced by a redrawn problem's group, up to R rounds (:meth:`GRPO.resample_flat`, DAPO's dynamic
sampling); the logged reward and accuracy stay those of the step's first draw, the policy's own.

This file is only the algorithm (the problems and the sampling it trains on are
:mod:`gptforge.training.rollouts`): :class:`GRPO` is a recipe on the one loop
(:func:`gptforge.training.loop.train`), which supplies the optimizer and schedule (``optim.*``),
precision, DDP, checkpoints, signals, exit codes and metrics. Across ranks each rank samples and
scores ``rl.prompts / world`` problems' groups (a group never spans ranks, so advantages need no
communication) and DDP averages the gradients of equal shares: 2 ranks equal 1 rank. A step's
problems and every reply's random draws are functions of (seed, step), so a resume is exact.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from gptforge.data.chat import ChatTemplate, ChatTokenizer, plain_tokenizer
from gptforge.eval.tasks.verifiable import Problem, is_correct
from gptforge.generation import SamplingParams
from gptforge.parallel.distributed import (
    DistInfo,
    all_reduce_mean,
    all_reduce_sum,
    any_rank,
    frozen_copy,
    gathered,
    grad_sync,
    local_tensor,
)
from gptforge.training.packing import pack_replies, packed_logprobs
from gptforge.training.recipe import Recipe, RunCtx
from gptforge.training.rewards import RewardFn, score
from gptforge.training.rl_state import RLError, RLState, adapt_kl_coef
from gptforge.training.rollouts import Rollouts, held_out_correct, mix_seed, problem_stream, sample_replies

# --- the math: advantages and the loss (tested against hand-computed numbers) ----------------------

def group_advantages(rewards: torch.Tensor, eps: float = 1e-4, scale: str = "group",
                     info: DistInfo | None = None) -> torch.Tensor:
    """rewards (P, G) -> (P, G): each reward minus its group's mean, divided by (std + eps), TRL's
    ``scale_rewards``: ``group`` the group's sample std (DeepSeekMath's GRPO); ``batch`` the sample std
    of every reward of the step, over all ranks; ``none`` not divided (Dr. GRPO, Liu et al. 2025: a
    group whose rewards barely differ then gives small advantages instead of unit ones)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (rewards.std(dim=1, keepdim=True) + eps)
    if scale != "batch":
        raise ValueError(f"scale_rewards {scale!r}: group, batch or none")
    info = info or DistInfo()
    r = rewards.detach().double().flatten().cpu()
    moments = torch.stack([torch.tensor(float(r.numel()), dtype=torch.float64), r.sum(), (r * r).sum()])
    n, s1, s2 = all_reduce_sum(moments.to(info.device), info).cpu()  # every rank's count, sum, sum of squares
    var = (s2 - s1 * s1 / n) / (n - 1) if n > 1 else torch.zeros((), dtype=torch.float64)
    return centred / (float(var.clamp(min=0).sqrt()) + eps)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, adv: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (N, L) of the replies under the policy, the sampling policy and the
    reference; advantages (N,); mask (N, L) 1 on reply tokens. Returns (loss: mean over replies of
    the mean over their tokens, the same mean of the KL term, detached)."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
    else:
        kl = torch.zeros_like(logp)
    per_token = -(surrogate - kl_coef * kl)
    n_tok = mask.sum(dim=1).clamp(min=1)
    loss = ((per_token * mask).sum(dim=1) / n_tok).mean()
    kl_mean = ((kl * mask).sum(dim=1) / n_tok).mean().detach()
    return loss, kl_mean


def token_logprobs(model: torch.nn.Module, seqs: torch.Tensor, temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """seqs (N, T) -> log p(seqs[:, t+1] | seqs[:, :t+1]) for t >= ``start``, as (N, T-1-start), float32,
    under the policy that sampled them: softmax(logits / temperature) (as TRL's GRPO), so the ratio
    and the KL are those of the sampling distribution and not of the T=1 one. ``start``: the first
    reply position; the output head (most of a small model's compute: one row per vocabulary entry)
    then runs on the replies only, not on the prompts."""
    logits, _ = model(seqs[:, :-1], logits_to_keep=seqs.size(1) - 1 - start)
    return torch.gather(F.log_softmax(logits.float() / temperature, dim=-1), 2, seqs[:, 1 + start :, None]).squeeze(2)


# --- one GRPO step ------------------------------------------------------------------------------------

def grpo_step(wrapped: torch.nn.Module, model: torch.nn.Module, ref: torch.nn.Module | None,
              optimizer: torch.optim.Optimizer, rollouts: Rollouts, rewards: torch.Tensor, cfg: Any, pad: int,
              info: DistInfo | None = None, autocast: Callable = contextlib.nullcontext,
              kl_coef: float | None = None) -> dict[str, float]:
    """Update on one batch of rollouts (this rank's share); rewards (P, G). ``wrapped`` (DDP or the
    model itself) runs the differentiable forward, ``model`` the no-grad ones. ``cfg``: the run Config
    (``rl.*``, ``train.micro_batch`` replies per forward, ``optim.grad_clip``); ``kl_coef``: this step's
    (the adaptive controller's), ``rl.kl_coef`` when None. Returns loss, KL, grad norm. A micro-batch's
    replies to one prompt share rows that hold the prompt once (:mod:`gptforge.training.packing`): the
    reference, old and policy log-probs each encode a group's prompt once, not once per reply."""
    info = info or DistInfo()
    rl, device = cfg.rl, next(model.parameters()).device
    kl_coef = rl.kl_coef if kl_coef is None else kl_coef
    adv = group_advantages(rewards, rl.adv_eps, rl.scale_rewards, info).flatten().to(device)
    N, mb = adv.numel(), cfg.train.micro_batch
    chunks = [list(range(i, min(i + mb, N))) for i in range(0, N, mb)]
    packs = [pack_replies([rollouts.prompts[i] for i in rows], [rollouts.replies[i] for i in rows],
                          model.config.block_size, pad, device) for rows in chunks]  # each prompt once a row
    T = rl.temperature
    with torch.no_grad(), autocast():
        refs = [packed_logprobs(ref, p, T) if ref is not None and kl_coef > 0 else None for p in packs]
        olds = [packed_logprobs(model, p, T) for p in packs] if rl.updates_per_batch > 1 else None
    model.train()
    loss_sum, kl_sum, norm = 0.0, 0.0, torch.zeros(())
    for _ in range(rl.updates_per_batch):
        loss_sum, kl_sum = 0.0, 0.0
        for k, (pack, rows) in enumerate(zip(packs, chunks, strict=True)):
            with grad_sync(wrapped, info, sync=k == len(chunks) - 1), autocast():
                logp = packed_logprobs(wrapped, pack, T)
                old = olds[k] if olds is not None else logp.detach()
                loss, kl = grpo_loss(logp, old, refs[k], adv[rows[0] : rows[-1] + 1], pack.mask, rl.clip_eps, kl_coef)
                (loss * len(rows) / N).backward()  # mean over this rank's N replies; DDP averages equal shares
            loss_sum += loss.item() * len(rows) / N
            kl_sum += kl.item() * len(rows) / N
        if cfg.optim.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return {"loss": loss_sum, "kl": kl_sum, "grad_norm": float(local_tensor(norm))}


def flat_rows(rewards: torch.Tensor) -> list[bool]:
    """Per group (row of ``rewards``, (P, G)): whether its replies all got the same reward. Such a group's
    advantages are all 0, so it gives the policy no signal (GRPO learns only from differences within a group)."""
    return (rewards.max(dim=1).values == rewards.min(dim=1).values).tolist()


def flat_groups(rewards: torch.Tensor) -> int:
    """How many groups of ``rewards`` (P, G) are flat (:func:`flat_rows`)."""
    return sum(flat_rows(rewards))


# --- the preset ----------------------------------------------------------------------------------------

def rl_config(model: Any, out_dir: str, init_from: str) -> Any:
    """RL defaults (the preset of ``gptforge rl``) for a model of shape ``model``: AdamW at a constant
    1e-5 after an optional warmup (``optim.schedule wsd`` with no cooldown), no weight decay, 16 replies
    per forward, 100 steps, checkpoints every 50. Any key can be overridden as --section.key."""
    from gptforge.config import Config, OptimConfig, RLConfig, TrainConfig

    cfg = Config(optim=OptimConfig(lr=1e-5, warmup_steps=0, weight_decay=0.0, grad_clip=1.0, schedule="wsd",
                                   cooldown_frac=0.0, min_lr_frac=1.0),
                 train=TrainConfig(micro_batch=16, seq_len=1, total_batch_tokens=16, max_steps=100, val_every=0,
                                   sample_every=0, ckpt_every=50, keep_ckpts=2, seed=0, compile=False,
                                   out_dir=out_dir),
                 rl=RLConfig(init_from=init_from))
    if model is not None:
        cfg.model = model
    return cfg


# --- the recipe ------------------------------------------------------------------------------------------

class GRPO(Recipe):
    """GRPO on the one loop. ``template`` None: ``rl.raw`` plain-text prompts. ``reward_fn`` comes from
    the command line (:func:`gptforge.training.rewards.load_reward`), never from a checkpoint."""

    name, kind = "grpo", "rl"

    def __init__(self, cfg: Any, template: ChatTemplate | None, enc: Any, reward_fn: RewardFn,
                 problems_at: Callable[[int], list[Problem]] | None = None, held_out: Sequence[Problem] | None = None,
                 reward_model: torch.nn.Module | None = None):
        self.template, self.reward_fn, self.reward_model = template, reward_fn, reward_model
        self.tokenizer = plain_tokenizer(enc)  # the run's tokenizer (checkpoints carry it)
        if template is not None:
            template.check_model(cfg.model)
            if cfg.model.vocab_size < template.vocab_size:
                raise RLError("the model's logits do not cover the chat tokens; RL needs a chat (SFT) checkpoint")
            enc = enc if isinstance(enc, ChatTokenizer) else ChatTokenizer(enc, template)
        self.enc = enc
        if problems_at is None:
            problems_at, held_out = problem_stream(cfg.rl, cfg.train.seed)
        self.problems_at, self.held_out = problems_at, list(held_out or [])
        self.pad = template.bos if template is not None else enc.eot_token

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "chat_template": self.template.to_dict() if self.template else None}

    def check(self, cfg: Any, world: int) -> int:
        from gptforge.config import check_finite_floats

        check_finite_floats(cfg)
        if cfg.dist.tp > 1 or cfg.dist.pp > 1:
            raise RLError(f"dist.tp={cfg.dist.tp}, dist.pp={cfg.dist.pp}: GRPO samples with the whole model on every "
                          "rank, so it runs data-parallel only (dist.tp 1, dist.pp 1)")
        if cfg.rl.prompts % world:
            raise RLError(f"rl.prompts={cfg.rl.prompts} must divide over {world} ranks (each rank samples whole groups)")
        self.check_context(cfg)
        return 0  # no token batches to accumulate: a step is rl.prompts x rl.group replies

    def check_context(self, cfg: Any) -> None:
        """A training prompt and its reply must fit the model's context: checked on the first step's problems,
        before any compute, naming the flag (held-out prompts that do not fit count as wrong, reported)."""
        from gptforge.eval.generative import prompt_ids

        longest = max((len(prompt_ids(p, self.enc, self.template)) for p in self.problems_at(0)), default=1)
        room = cfg.model.block_size - longest
        if cfg.rl.max_new_tokens > room:
            raise RLError(f"--max-new-tokens {cfg.rl.max_new_tokens} (rl.max_new_tokens): prompts of task "
                          f"{cfg.rl.task} take up to {longest} tokens and the model's context is {cfg.model.block_size}; "
                          f"give at most {max(room, 0)}" + ("" if room > 0 else " (this model's context is too short)"))

    def loaders(self, cfg: Any, info: DistInfo) -> tuple[Any, Any, int]:
        self._prompts, self._adaptive = cfg.rl.prompts, cfg.rl.kl_target > 0
        self.state = RLState(cfg.rl.kl_coef, self._adaptive)
        return self.state, None, 1

    def kl_coef(self, run: RunCtx) -> float:
        """This step's KL coefficient: rl.kl_coef, or where the adaptive controller has moved it."""
        return self.state.kl_coef if self.state.kl_coef is not None else run.cfg.rl.kl_coef

    def after_step(self, run: RunCtx, out: dict[str, float]) -> dict[str, float]:
        """The step's stats, plus the KL coefficient it used; with ``rl.kl_target`` the controller moves it."""
        rl, coef = run.cfg.rl, self.kl_coef(run)
        if rl.kl_target and math.isfinite(out["kl"]):  # every step that reaches here logs its KL
            self.state.kl_coef = adapt_kl_coef(coef, out["kl"], rl.kl_target, rl.prompts * rl.group, rl.kl_horizon)
        return {**out, "kl_coef": coef}

    def prepare_model(self, run: RunCtx) -> None:
        """The reference is the starting model, frozen: a copy of the init weights on a fresh run, the
        ``rl.init_from`` checkpoint's weights on a resume. A LoRA run's reference is its base, the policy
        with the adapters off (no copy: TRL's reference with peft), on a fresh run and a resume alike."""
        self.ref = None
        if self.reward_model is not None:
            self.reward_model.to(run.device).eval().requires_grad_(False)
        norm = self.state.reward_norm
        if run.cfg.rl.reward_norm:
            if self.reward_model is None:
                raise RLError("rl.reward_norm whitens a reward model's score: give --reward-model RUN[,RUN...]")
            members = len(getattr(self.reward_model, "members", [None]))
            if run.state.step > 0 and norm is None:
                raise RLError("rl.reward_norm: the checkpoint holds no whitening (meta.json loader.reward_norm), set "
                              "on the run's first step; resume from a checkpoint of this run")
            if norm is not None and len(norm["shift"]) != members:
                raise RLError(f"rl.reward_norm: the checkpoint whitens {len(norm['shift'])} reward model(s), "
                              f"rl.reward_model has {members}; the checkpoint is not this run's")
        if run.cfg.rl.kl_coef > 0 and run.cfg.lora.rank:
            from gptforge.models.lora import BaseOf

            self.ref = BaseOf(self.policy(run))  # the base: the starting weights, checked by fingerprint on resume
        elif run.cfg.rl.kl_coef > 0:
            if run.state.step == 0:
                from gptforge.models.registry import build_model

                self.ref = frozen_copy(self.policy(run), lambda: build_model(run.cfg.model))
            else:
                from gptforge.load import ModelSource, load_model

                self.ref = load_model(ModelSource.from_path(run.cfg.rl.init_from)).to(run.device)
            self.ref.eval().requires_grad_(False)
        run.model.eval()

    def begin(self, run: RunCtx, start_step: int) -> None:
        if start_step == 0:
            self.evaluate(run, 0, last=False, force=True)

    def sample_and_score(self, run: RunCtx, step: int, model: torch.nn.Module, round: int = 0) -> tuple[
            Rollouts, torch.Tensor, torch.Tensor, float, bool]:
        """This rank's share of step ``step``'s problems (``round`` > 0: the step's redraw of that number,
        ``rl.resample_flat``), ``rl.group`` replies each from ``model``, scored: (rollouts, rewards (n,),
        this rank's [mean reward, accuracy, reply length], sampling ms, whether any rank got a non-finite
        reward: then every rank must stop before the update). Called inside ``gathered(run.model)``: under
        FSDP the ranks' replies end at different lengths, so their forward counts differ."""
        cfg, info, rl = run.cfg, run.info, run.cfg.rl
        problems = self.problems_at(step, round) if round else self.problems_at(step)
        share = len(problems) // info.world
        mine = problems[info.rank * share : (info.rank + 1) * share]
        t0 = time.perf_counter()
        params = SamplingParams(max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_k=rl.top_k or None,
                                seed=mix_seed(cfg.train.seed, step, 1) if round == 0 else mix_seed(cfg.train.seed, step, 8, round),
                                rows=(info.rank * share * rl.group, len(problems) * rl.group))
        rollouts = sample_replies(model, self.enc, self.template, mine, rl.group, params)
        sample_ms = (time.perf_counter() - t0) * 1000
        r = self.rewards(rollouts, run)
        correct = [is_correct(t, p.answer) for t, p in zip(rollouts.texts, rollouts.problems, strict=True)]
        local = torch.tensor([r.mean().item(), sum(correct) / len(correct),
                              sum(len(x) for x in rollouts.replies) / len(rollouts.replies)], device=run.device)
        bad = any_rank(not bool(torch.isfinite(r).all()), info)  # 1e308: finite in Python, inf in float32
        return rollouts, r, local, sample_ms, bad

    def step(self, run: RunCtx, step: int) -> dict[str, float]:
        cfg, info, rl = run.cfg, run.info, run.cfg.rl
        with gathered(run.model):  # the whole sampling phase, first draw and redraws: one all-gather under FSDP
            rollouts, r, local, sample_ms, bad = self.sample_and_score(run, step, run.model)
            n = len(rollouts.problems) // rl.group  # this rank's problems
            rounds, first_flat = 0, flat_groups(r.view(n, rl.group))  # the first draw's, before any is replaced
            if rl.resample_flat and not bad:
                rollouts, r, rounds, more_ms, bad = self.resample_flat(run, step, rollouts, r)
                sample_ms += more_ms
        if bad:  # every rank stops here, before the update
            return {"loss": float("nan"), "reward": float(all_reduce_mean(local, info)[0])}
        out = grpo_step(run.wrapped, run.model, self.ref, run.optimizer, rollouts, r.view(n, rl.group), cfg,
                        self.pad, info, run.autocast, kl_coef=self.kl_coef(run))
        reward, acc, reply_len = all_reduce_mean(local, info).tolist()
        loss, kl = all_reduce_mean(torch.tensor([out["loss"], out["kl"]], device=run.device), info).tolist()
        flat, first_flat = (int(x) for x in all_reduce_sum(torch.tensor(
            [float(flat_groups(r.view(n, rl.group))), float(first_flat)], device=run.device), info).tolist())
        if flat == rl.prompts and not run.extras.get("flat_said"):  # every problem of every rank
            run.extras["flat_said"] = True
            run.log(f"step {step + 1}: every group's {rl.group} replies got the same reward ({reward:.3f} on average), so "
                    "every advantage is 0 and only the KL term moves the model: nothing is learned from the reward "
                    "until some replies in a group score differently. If the reward stays flat, start from a longer "
                    "SFT run (one that gets some answers right: see `gptforge eval --tasks "
                    f"{rl.task}` on it), raise rl.group or rl.temperature, or use a graded reward")
        return self.after_step(run, {"loss": loss, "reward": reward, "accuracy": acc, "kl": kl,
                                     "grad_norm": out["grad_norm"], "reply_len": reply_len, "sample_ms": sample_ms,
                                     "flat_groups": float(flat),
                                     **({"resample_rounds": float(rounds), "flat_groups_drawn": float(first_flat)}
                                        if rl.resample_flat else {})})

    def resample_flat(self, run: RunCtx, step: int, rollouts: Rollouts, r: torch.Tensor) -> tuple[
            Rollouts, torch.Tensor, int, float, bool]:
        """DAPO's dynamic sampling (Yu et al. 2025), per position: a group whose replies all got the same reward
        gives no advantage, so the problem at that position of the step is replaced by the one at the same
        position of the step's next redraw (round 1, 2, ... up to ``rl.resample_flat``) until its group is not
        flat. Every rank samples every round until no rank has a flat position left (one collective a round),
        so ranks do equal work; a position still flat after the last round keeps its first group. Positions,
        redraws and their replies are functions of (seed, step, round, position), so 2 ranks equal 1 and a
        resume is exact. Returns (rollouts, rewards, rounds sampled, their ms, whether any reward was bad)."""
        rl, info, G = run.cfg.rl, run.info, run.cfg.rl.group
        groups = [(rollouts, r, i) for i in range(len(rollouts.problems) // G)]  # each position's group
        flat = flat_rows(r.view(-1, G))
        rounds, ms = 0, 0.0
        while rounds < rl.resample_flat and any_rank(any(flat), info):
            rounds += 1
            new, r2, _, more_ms, bad = self.sample_and_score(run, step, run.model, rounds)
            ms += more_ms
            if bad:
                return rollouts, r, rounds, ms, True
            for i, still_flat in enumerate(flat_rows(r2.view(-1, G))):
                if flat[i] and not still_flat:
                    groups[i], flat[i] = (new, r2, i), False
        picks = [(ro, rr, j) for ro, rr, i in groups for j in range(i * G, (i + 1) * G)]  # each reply's source
        out = Rollouts(*([getattr(ro, f)[j] for ro, _, j in picks] for f in ("problems", "prompts", "replies", "texts")))
        return out, torch.stack([rr[j] for _, rr, j in picks]), rounds, ms, False

    def rewards(self, rollouts: Rollouts, run: RunCtx) -> torch.Tensor:
        """(N,) float32: the reward function of each reply's text, or the reward model's score of the
        prompt + reply tokens (``rl.reward_model``; ``accuracy`` stays the true task's, beside it). With
        ``rl.reward_norm`` each member's score is first whitened by the mean and std it gave the run's
        first batch (the starting policy's replies, every rank's), then the members are reduced."""
        if self.reward_model is not None:
            from gptforge.training.rm import reduce_member_scores, score_sequences

            seqs = [p + r for p, r in zip(rollouts.prompts, rollouts.replies, strict=True)]
            s = score_sequences(self.reward_model, seqs, self.pad, members=True)  # (members, N)
            if run.cfg.rl.reward_norm:
                s = self.state.whiten(s, run.info, run.log)
            return reduce_member_scores(s, self.reward_model.reduce).float()
        return torch.tensor(score(self.reward_fn, rollouts.problems, rollouts.texts), dtype=torch.float32)

    def policy(self, run: RunCtx) -> torch.nn.Module:
        """The model that generates (PPO's run model also holds a value model)."""
        return run.model

    def log_line(self, s: dict[str, float]) -> str:
        flat = f" | flat groups {int(s['flat_groups'])}/{self._prompts}" if s.get("flat_groups") else ""
        if s.get("resample_rounds"):
            flat += f" | resampled x{int(s['resample_rounds'])} ({int(s['flat_groups_drawn'])} flat before)"
        coef = f" (coef {s['kl_coef']:.4g})" if self._adaptive and "kl_coef" in s else ""
        name = "reward (rm score, logit)" if self.reward_model is not None else "reward"  # its scale, in the log
        return (f"{name} {s['reward']:.3f} | acc {s['accuracy']:.3f} | kl {s['kl']:.4f}{coef} | len {s['reply_len']:.1f} "
                f"| loss {s['loss']:.4f}{flat}")

    def evaluate(self, run: RunCtx, step: int, last: bool, force: bool = False) -> float | None:
        rl, info = run.cfg.rl, run.info
        if not self.held_out or not (force or last or (rl.eval_every and step % rl.eval_every == 0)):
            return None
        mine = self.held_out[info.rank :: info.world]  # every rank scores a share; the counts are summed
        with gathered(run.model):
            hits = held_out_correct(self.policy(run), self.enc, self.template, mine, rl.max_new_tokens,
                                    desc=f"held-out {rl.task} ({len(mine)} problems)" if info.is_main else None)
        total = all_reduce_sum(torch.tensor([float(hits), float(len(mine))], device=run.device), info).tolist()
        acc = total[0] / total[1]
        run.metrics.write("eval", step, task=rl.task, acc=acc, n=int(total[1]))
        run.log(f"step {step:>5} | held-out {rl.task} accuracy {acc:.4f} ({int(total[1])} problems)")
        return None
