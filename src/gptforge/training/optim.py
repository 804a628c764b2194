"""AdamW with decoupled weight decay on >=2-D parameters only, and the learning-rate schedule.

    >>> opt = build_optimizer(model, cfg.optim, device_type="cuda")
    >>> lr = lr_at(step, cfg.optim, cfg.train.max_steps)
"""

from __future__ import annotations

import inspect
import math

import torch

from gptforge.config import OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Matrices and embeddings decay; biases and LayerNorm gains do not (GPT-2 / llm.c)."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def fused_available(device_type: str) -> bool:
    """Fused AdamW kernels exist for CUDA (torch >= 2.0) and CPU (torch >= 2.4)."""
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return False
    if device_type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    fused = fused_available(device_type) if cfg.fused is None else cfg.fused
    if fused and not fused_available(device_type):
        raise ValueError(f"optim.fused=true but fused AdamW is not available on {device_type}; use --optim.fused auto")
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused,
    )


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup from lr/warmup to lr over ``warmup_steps``, then cosine decay to
    ``min_lr_frac * lr`` at ``max_steps`` (llm.c's schedule; step is 0-based)."""
    min_lr = cfg.lr * cfg.min_lr_frac
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= max_steps:
        return min_lr
    decay_steps = max(1, max_steps - cfg.warmup_steps)
    ratio = (step - cfg.warmup_steps) / decay_steps
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return min_lr + coeff * (cfg.lr - min_lr)
