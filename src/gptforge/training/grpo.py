"""GRPO on verifiable rewards (DeepSeekMath's Group Relative Policy Optimization), readable top to bottom.

    gptforge rl --init-from runs/sft --task arithmetic --out runs/rl --steps 100
    gptforge rl --out runs/rl --resume

Each step: take ``prompts`` problems, sample ``group`` replies to each with the KV cache
(``gptforge.generation``), score them with the reward function, turn rewards into group-relative
advantages ``(r - mean_group) / (std_group + eps)``, and minimise, per reply token,

    -[ min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A) - kl_coef * KL ]
    ratio = exp(logp - logp_old),  KL = exp(ref - logp) - (ref - logp) - 1   (k3, >= 0)

averaged over each reply's tokens, then over replies. ``ref`` is the frozen starting model; with one
update per batch (``updates_per_batch`` 1) ``logp_old`` is the sampling policy, so ratio = 1 and the
gradient is the plain policy gradient plus the KL term. Reward, KL, reply length and accuracy go to
metrics.jsonl every step; checkpoints carry the chat template and resume exactly (the problems and
the sampling seed are functions of the step).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gptforge.data.chat import ChatTemplate, ChatTokenizer
from gptforge.eval.tasks.verifiable import Problem, is_correct
from gptforge.generation import SamplingParams, stream_tokens
from gptforge.training.rewards import RewardFn, score


class RLError(ValueError):
    """Bad RL settings or inputs; the message names the flag."""


@dataclass
class RLConfig:
    task: str = "arithmetic"  # arithmetic | gsm8k
    reward: str = "exact_match"  # built-in name or module:function
    init_from: str = ""  # the starting (and reference) model: a checkpoint or run directory
    steps: int = 100
    prompts: int = 8  # problems per step
    group: int = 8  # replies sampled per problem
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    lr: float = 1e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    kl_coef: float = 0.02
    clip_eps: float = 0.2
    updates_per_batch: int = 1  # optimizer steps on each sampled batch (> 1: the ratio moves and clips)
    micro_batch: int = 16  # replies per forward/backward
    adv_eps: float = 1e-4
    eval_every: int = 0  # steps between held-out evaluations (0 = only at start and end)
    eval_n: int = 200  # held-out problems (never trained on)
    ckpt_every: int = 50
    keep_ckpts: int = 2
    seed: int = 0
    device: str = "auto"
    out_dir: str = "runs/rl"

    def check(self) -> None:
        for name in ("steps", "prompts", "group", "max_new_tokens", "updates_per_batch", "micro_batch"):
            if getattr(self, name) < 1:
                raise RLError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.group < 2:
            raise RLError(f"--group {self.group}: GRPO compares replies within a group; use >= 2")
        if self.lr <= 0 or self.temperature <= 0:
            raise RLError("--lr and --temperature must be > 0 (sampling a group needs temperature > 0)")
        if self.kl_coef < 0 or not 0 < self.clip_eps < 1:
            raise RLError("--kl-coef must be >= 0 and --clip-eps in (0, 1)")
        for name in ("eval_every", "eval_n", "ckpt_every", "keep_ckpts", "warmup_steps"):
            if getattr(self, name) < 0:
                raise RLError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 0")


# --- the math: advantages and the loss (tested against hand-computed numbers) ----------------------

def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """rewards (P, G) -> (P, G): standardised within each group (sample std, as TRL's GRPO)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


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


# --- sampling a group -------------------------------------------------------------------------------

@dataclass
class Rollouts:
    problems: list[Problem]  # one per reply (each problem repeated group times)
    prompts: list[list[int]]
    replies: list[list[int]]  # reply tokens, including the end token when the model produced it
    texts: list[str]


@torch.no_grad()
def sample_replies(model: Any, enc: Any, template: ChatTemplate | None, problems: Sequence[Problem], group: int,
                   params: SamplingParams) -> Rollouts:
    """``group`` sampled replies to each problem, in one left-padded batch with the KV cache. With a
    template a reply ends at ``<|end|>``; without (``--raw``) the prompt is ``Question: ...\nAnswer:``
    and a reply ends at <|endoftext|> or a blank line, as ``gptforge eval --raw`` reads them."""
    from gptforge.eval.generative import RAW_STOPS, prompt_ids

    probs = [p for p in problems for _ in range(group)]
    prompts = [prompt_ids(p, enc, template) for p in probs]
    end = template.end if template is not None else enc.eot_token
    replies: list[list[int]] = [[] for _ in probs]
    done = [False] * len(probs)
    for nxt in stream_tokens(model, prompts, params):
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                replies[i].append(t)
                done[i] = t == end or (template is None and any(s in enc.decode(replies[i]) for s in RAW_STOPS))
        if all(done):
            break
    texts = [enc.decode([t for t in r if t != end]) for r in replies]
    if template is None:
        texts = [min((x.split(s)[0] for s in RAW_STOPS), key=len) for x in texts]
    return Rollouts(probs, prompts, replies, [x.strip() for x in texts])


def _batch(rollouts: Rollouts, rows: Sequence[int], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt+reply sequences (n, T) and the reply-token mask over targets (n, T-1)."""
    seqs = [rollouts.prompts[i] + rollouts.replies[i] for i in rows]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T - 1)
    for k, i in enumerate(rows):
        s, n_p, n_r = seqs[k], len(rollouts.prompts[i]), len(rollouts.replies[i])
        ids[k, : len(s)] = torch.tensor(s)
        mask[k, n_p - 1 : n_p - 1 + n_r] = 1.0  # target t is token t+1: the reply starts at n_p
    return ids.to(device), mask.to(device)


# --- one GRPO step ------------------------------------------------------------------------------------

def grpo_step(model: torch.nn.Module, ref: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
              rollouts: Rollouts, rewards: torch.Tensor, cfg: RLConfig, pad: int) -> dict[str, float]:
    """Update ``model`` on one batch of rollouts; rewards (P, G). Returns loss and KL."""
    device = next(model.parameters()).device
    adv = group_advantages(rewards, cfg.adv_eps).flatten().to(device)
    N = adv.numel()
    chunks = [list(range(i, min(i + cfg.micro_batch, N))) for i in range(0, N, cfg.micro_batch)]
    batches = [_batch(rollouts, rows, pad, device) for rows in chunks]
    starts = [int(mask.any(dim=0).nonzero()[0]) for _, mask in batches]  # each chunk's first reply position
    batches = [(ids, mask[:, s:]) for (ids, mask), s in zip(batches, starts, strict=True)]
    with torch.no_grad():
        T = cfg.temperature
        refs = [token_logprobs(ref, ids, T, s) if ref is not None and cfg.kl_coef > 0 else None
                for (ids, _), s in zip(batches, starts, strict=True)]
        olds = ([token_logprobs(model, ids, T, s) for (ids, _), s in zip(batches, starts, strict=True)]
                if cfg.updates_per_batch > 1 else None)
    model.train()
    loss_sum, kl_sum = 0.0, 0.0
    for _ in range(cfg.updates_per_batch):
        loss_sum, kl_sum = 0.0, 0.0
        for k, ((ids, mask), rows) in enumerate(zip(batches, chunks, strict=True)):
            logp = token_logprobs(model, ids, cfg.temperature, starts[k])
            old = olds[k] if olds is not None else logp.detach()
            loss, kl = grpo_loss(logp, old, refs[k], adv[rows[0] : rows[-1] + 1], mask, cfg.clip_eps, cfg.kl_coef)
            (loss * len(rows) / N).backward()  # mean over all N replies, whatever the chunking
            loss_sum += loss.item() * len(rows) / N
            kl_sum += kl.item() * len(rows) / N
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return {"loss": loss_sum, "kl": kl_sum}


def _mix(*xs: int) -> int:
    """A seed from several integers, the same in every process (Python's str hash is not)."""
    import numpy as np

    return int(np.random.SeedSequence(list(xs)).generate_state(1)[0])


# --- the loop ------------------------------------------------------------------------------------------

def problem_stream(cfg: RLConfig) -> tuple[Callable[[int], list[Problem]], list[Problem]]:
    """(step -> that step's training problems, the held-out problems). Held-out problems are never
    trained on; a step's problems depend only on (seed, step), so a resumed run sees the same ones."""
    import random

    from gptforge.eval.generative import GENERATED, GENERATIVE

    if cfg.task not in GENERATIVE:
        raise RLError(f"--task {cfg.task!r}: built-in tasks are {', '.join(GENERATIVE)}")
    if cfg.task in GENERATED:
        make, eval_set = GENERATED[cfg.task]
        held_out = eval_set(cfg.eval_n or 1)[: cfg.eval_n]
        banned = {p.question for p in eval_set(0)} | {p.question for p in held_out}

        def at(step: int) -> list[Problem]:
            out: list[Problem] = []
            k = 0
            while len(out) < cfg.prompts:
                cand = make(cfg.prompts, seed=_mix(cfg.seed, step, 2, k))
                out += [p for p in cand if p.question not in banned][: cfg.prompts - len(out)]
                k += 1
            return out

        return at, held_out
    allp = GENERATIVE[cfg.task].problems(0)
    held_out, pool = allp[: cfg.eval_n], allp[cfg.eval_n :]
    if len(pool) < cfg.prompts:
        raise RLError(f"--eval-n {cfg.eval_n} leaves {len(pool)} {cfg.task} problems to train on; lower it")
    return (lambda step: random.Random(_mix(cfg.seed, step, 3)).sample(pool, cfg.prompts)), held_out


def held_out_accuracy(model: Any, enc: Any, template: ChatTemplate | None, problems: Sequence[Problem], max_new: int) -> float:
    from gptforge.eval.generative import generate_replies, prompt_ids

    if not problems:
        return float("nan")
    prompts = [prompt_ids(p, enc, template) for p in problems]
    replies = generate_replies(model, enc, prompts, template, max_new)
    return sum(is_correct(r, p.answer) for r, p in zip(replies, problems, strict=True)) / len(problems)


def train_rl(cfg: RLConfig, model: torch.nn.Module, template: ChatTemplate | None, enc: Any, reward_fn: RewardFn,
             resume_dir: Path | None = None, problems_at: Callable[[int], list[Problem]] | None = None,
             held_out: Sequence[Problem] | None = None, log: Callable[[str], None] = print,
             stop_at_step: int | None = None) -> dict[str, Any]:
    """Run GRPO per ``cfg`` on ``model`` (already holding the init weights, or the checkpoint's when
    resuming; the reference is a frozen copy of the init weights). Returns the last step's stats."""
    from gptforge.config import Config
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.metrics import MetricsLog

    cfg.check()
    if template is not None:  # None: --raw, plain "Question: ...\nAnswer:" prompts
        template.check_model(model.config)
        if model.config.vocab_size < template.vocab_size:
            raise RLError("the model's logits do not cover the chat tokens; RL needs a chat (SFT) checkpoint")
        enc = enc if isinstance(enc, ChatTokenizer) else ChatTokenizer(enc, template)
    if problems_at is None:
        problems_at, held_out = problem_stream(cfg)
    held_out = list(held_out or [])
    device = next(model.parameters()).device
    run_dir = Path(cfg.out_dir)
    ref = None
    if cfg.kl_coef > 0:
        ref = copy.deepcopy(model).eval()
        if resume_dir is not None:  # the reference is the init model, not the resumed weights
            from gptforge.load import ModelSource, load_model

            ref = load_model(ModelSource(ckpt=cfg.init_from)).to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    start = 0
    if resume_dir is not None:
        ckpt.load_model_weights(model, resume_dir)
        ckpt.load_optimizer(resume_dir, optimizer)
        start = int(ckpt.read_meta(resume_dir)["step"])
        log(f"resumed from {resume_dir} at step {start}")
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    meta = {"config": Config(model=model.config).to_dict(), "chat_template": template.to_dict() if template else None,
            "rl": dataclasses.asdict(cfg)}

    def evaluate(step: int) -> None:
        if held_out:
            acc = held_out_accuracy(model, enc, template, held_out, cfg.max_new_tokens)
            metrics.write("eval", step, task=cfg.task, accuracy=acc, n=len(held_out))
            log(f"step {step:>5} | held-out {cfg.task} accuracy {acc:.4f} ({len(held_out)} problems)")

    model.eval()
    if start == 0:
        metrics.write("start", 0, task=cfg.task, reward=cfg.reward, init_from=cfg.init_from)
        evaluate(0)
    stats: dict[str, Any] = {}
    for step in range(start, cfg.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        for g in optimizer.param_groups:
            g["lr"] = lr
        problems = problems_at(step)
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                top_k=cfg.top_k or None, seed=_mix(cfg.seed, step, 1))
        rollouts = sample_replies(model, enc, template, problems, cfg.group, params)
        t_sample = time.perf_counter()
        rewards = score(reward_fn, rollouts.problems, rollouts.texts)
        correct = [is_correct(t, p.answer) for t, p in zip(rollouts.texts, rollouts.problems, strict=True)]
        r = torch.tensor(rewards).view(len(problems), cfg.group)
        out = grpo_step(model, ref, optimizer, rollouts, r, cfg, pad=template.bos if template else enc.eot_token)
        steps_done = step + 1
        stats = {"reward": r.mean().item(), "kl": out["kl"], "loss": out["loss"], "lr": lr,
                 "accuracy": sum(correct) / len(correct),
                 "reply_len": sum(len(x) for x in rollouts.replies) / len(rollouts.replies),
                 "dt_ms": (time.perf_counter() - t0) * 1000, "sample_ms": (t_sample - t0) * 1000,
                 "cpu_ms": (time.process_time() - c0) * 1000}  # cpu_ms: this process's CPU time (not the machine's load)
        metrics.write("rl", steps_done, **stats)
        log(f"step {steps_done:>5}/{cfg.steps} | reward {stats['reward']:.3f} | acc {stats['accuracy']:.3f} | "
            f"kl {stats['kl']:.4f} | len {stats['reply_len']:.1f} | {stats['dt_ms']:.0f} ms")
        last = steps_done == cfg.steps
        if last or (cfg.eval_every and steps_done % cfg.eval_every == 0):
            evaluate(steps_done)
        stop = stop_at_step is not None and steps_done >= stop_at_step
        if last or stop or (cfg.ckpt_every and steps_done % cfg.ckpt_every == 0):
            path = ckpt.save_checkpoint(run_dir, steps_done, model, optimizer, meta, keep=cfg.keep_ckpts)
            log(f"checkpoint -> {path}")
        if stop:
            break
    return stats
