"""The optimizer: AdamW, or Muon + AdamW, optionally with ZeRO-1 sharded state.

    >>> opt = build_optimizer(model, cfg.optim, device_type="cuda")
    >>> opt = build_optimizer(model, cfg.optim, "cuda", zero=True)   # torchrun + --dist.shard zero1

``optim.name adamw``: AdamW with decoupled weight decay on >=2-D parameters only (GPT-2 / llm.c).
``optim.name muon``: :class:`gptforge.optim.muon.MuonAdamW`, Muon on the hidden matrices at
``optim.muon_lr`` and AdamW on the rest at ``optim.lr``. Every group carries a ``base_lr``; the
schedule multiplies all of them by one factor, so the two parts keep their ratio.
"""

from __future__ import annotations

import inspect

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


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str,
                    zero: bool = False) -> torch.optim.Optimizer:
    """The optimizer of ``optim.name`` over :func:`param_groups` (or :func:`muon_param_groups`).
    ``zero``: a ``ZeroRedundancyOptimizer`` over the same groups (``dist.shard zero1``, llm.c's
    ``-z 1``): each rank keeps the state of its share of the parameters; needs a process group."""
    fused = fused_available(device_type) if cfg.fused is None else cfg.fused
    if fused and not fused_available(device_type):
        raise ValueError(f"optim.fused=true but fused AdamW is not available on {device_type}; use --optim.fused auto")
    if cfg.name == "muon":
        from gptforge.optim.muon import MuonAdamW

        groups, cls, kwargs = muon_param_groups(model, cfg), MuonAdamW, {}
    else:
        groups, cls = param_groups(model, cfg.weight_decay, cfg.embed_lr), torch.optim.AdamW
        kwargs = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, "fused": fused}
    if not zero:
        return cls(groups, **kwargs)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    # ZeRO assigns whole parameters to ranks, so each rank's Muon orthogonalises whole matrices
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, **kwargs)


def muon_param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict]:
    """Groups for MuonAdamW: the hidden matrices (Muon), then AdamW with and without weight decay
    (and the untied input embeddings at ``optim.embed_lr``, when set).
    A parameter Muon cannot take is a ConfigError naming it (exit 2)."""
    from gptforge.optim.muon import MuonParamError, muon_split

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
