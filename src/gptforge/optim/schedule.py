"""The learning-rate schedule: linear warmup, then cosine (llm.c) or warmup-stable-decay (modded-nanogpt).

    >>> lr = set_lr(optimizer, step, cfg.optim, cfg.train.max_steps)

Every param group carries a ``base_lr`` (``optim.lr`` when absent); the schedule multiplies all of
them by one factor, so Muon's and AdamW's groups (and ``optim.embed_lr``) keep their ratio.
"""

from __future__ import annotations

import math

import torch

from gptforge.config import OptimConfig


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Set every group's lr for 0-based ``step``: its ``base_lr`` (``optim.lr`` for plain AdamW
    groups) times the schedule's factor. Returns the AdamW lr (what the logs show)."""
    lr = lr_at(step, cfg, max_steps)
    factor = lr / cfg.lr
    for group in optimizer.param_groups:
        group["lr"] = group.get("base_lr", cfg.lr) * factor
    return lr


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup from lr/warmup to lr over ``warmup_steps``, then (``optim.schedule``)
    ``cosine``: cosine decay to ``min_lr_frac * lr`` at ``max_steps`` (llm.c's schedule), or
    ``wsd``: warmup-stable-decay, constant lr until the last ``cooldown_frac`` of the steps, then a
    linear decay to ``min_lr_frac * lr`` at ``max_steps`` (modded-nanogpt). Step is 0-based."""
    min_lr = cfg.lr * cfg.min_lr_frac
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= max_steps:
        return min_lr
    if cfg.schedule == "wsd":
        cooldown = max(1, round(cfg.cooldown_frac * max_steps)) if cfg.cooldown_frac > 0 else 0
        left = max_steps - step  # steps still to take, this one included
        if left > cooldown:
            return cfg.lr
        return min_lr + (left / cooldown) * (cfg.lr - min_lr)
    decay_steps = max(1, max_steps - cfg.warmup_steps)
    ratio = (step - cfg.warmup_steps) / decay_steps
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return min_lr + coeff * (cfg.lr - min_lr)


def schedule_note(cfg: OptimConfig, max_steps: int) -> str | None:
    """The one line a run says when its schedule cannot be the one its settings describe: ``optim.warmup_steps``
    past ``train.max_steps`` (a preset's warmup of 700 kept while a quick run sets 100 steps, or a typo), so the
    learning rate climbs for the whole run, never reaches ``optim.lr`` and never decays. Said, not refused: a
    short smoke run of a long preset is a fair thing to ask for. (A warmup of exactly the run's steps reaches
    optim.lr at its last step, as asked.)"""
    if not 0 < max_steps < cfg.warmup_steps:
        return None
    top = lr_at(max_steps - 1, cfg, max_steps)
    return (f"optim.warmup_steps={cfg.warmup_steps:,} > train.max_steps={max_steps:,}: the learning rate warms up "
            f"for the whole run and never reaches optim.lr={cfg.lr:g} (it ends at {top:.2e}), with no decay; lower --optim.warmup_steps "
            "(a few percent of the steps) for a warmup and a decay")
