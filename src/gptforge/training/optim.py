"""The optimizer (AdamW, or Muon + AdamW) and the learning-rate schedule (cosine or WSD).

    >>> opt = build_optimizer(model, cfg.optim, device_type="cuda")
    >>> lr = set_lr(opt, step, cfg.optim, cfg.train.max_steps)

``optim.name adamw``: AdamW with decoupled weight decay on >=2-D parameters only (GPT-2 / llm.c).
``optim.name muon``: :class:`gptforge.training.muon.MuonAdamW`, Muon on the hidden matrices at
``optim.muon_lr`` and AdamW on the rest at ``optim.lr``. Every group carries a ``base_lr``; the
schedule multiplies all of them by one factor, so the two parts keep their ratio.
"""

from __future__ import annotations

import inspect
import math

import torch

from gptforge.config import ConfigError, OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float, embed_lr: float = 0.0) -> list[dict]:
    """Matrices and embeddings decay; biases and LayerNorm gains do not (GPT-2 / llm.c). With
    ``embed_lr``, the untied input embeddings are a third group with that peak lr."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    embeds = {id(p) for p in untied_embeddings(model)} if embed_lr else set()
    decay = [p for p in params if p.dim() >= 2 and id(p) not in embeds]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if embeds:
        groups.append({"params": [p for p in params if id(p) in embeds], "weight_decay": weight_decay,
                       "lr": embed_lr, "base_lr": embed_lr})
    return groups


def untied_embeddings(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Weights of the ``nn.Embedding`` modules that no ``nn.Linear`` shares (a tied GPT-2 ``wte`` is
    also the output head, so it keeps the head's lr)."""
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return [m.weight for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad and id(m.weight) not in linear]


def fused_available(device_type: str) -> bool:
    """Fused AdamW kernels exist for CUDA (torch >= 2.0) and CPU (torch >= 2.4)."""
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return False
    if device_type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    if cfg.name == "muon":
        from gptforge.training.muon import MuonAdamW

        return MuonAdamW(muon_param_groups(model, cfg))
    fused = fused_available(device_type) if cfg.fused is None else cfg.fused
    if fused and not fused_available(device_type):
        raise ValueError(f"optim.fused=true but fused AdamW is not available on {device_type}; use --optim.fused auto")
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay, cfg.embed_lr),
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused,
    )


def muon_param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict]:
    """Groups for MuonAdamW: the hidden matrices (Muon), then AdamW with and without weight decay
    (and the untied input embeddings at ``optim.embed_lr``, when set).
    A parameter Muon cannot take is a ConfigError naming it (exit 2)."""
    from gptforge.training.muon import MuonParamError, muon_split

    try:
        muon, adamw = muon_split(model, cfg.muon_params)
    except MuonParamError as e:
        raise ConfigError(str(e)) from e
    embeds = {id(p) for p in untied_embeddings(model)} if cfg.embed_lr else set()
    adam = {"kind": "adamw", "lr": cfg.lr, "base_lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
    groups = [
        {"params": [p for _, p in muon], "kind": "muon", "lr": cfg.muon_lr, "base_lr": cfg.muon_lr,
         "weight_decay": cfg.muon_weight_decay, "momentum": cfg.muon_momentum, "nesterov": cfg.muon_nesterov,
         "ns_steps": cfg.muon_ns_steps},
        {"params": [p for _, p in adamw if p.dim() >= 2 and id(p) not in embeds], "weight_decay": cfg.weight_decay,
         **adam},
        {"params": [p for _, p in adamw if p.dim() < 2], "weight_decay": 0.0, **adam},
        {"params": [p for _, p in adamw if id(p) in embeds], "weight_decay": cfg.weight_decay,
         **adam, "lr": cfg.embed_lr, "base_lr": cfg.embed_lr},
    ]
    return [g for g in groups if g["params"]]


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
