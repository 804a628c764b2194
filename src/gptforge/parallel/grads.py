"""The training step's pieces that depend on the mesh: the loss context (``loss_parallel`` under
tensor parallelism) and the global gradient norm over DTensor shards and pipeline stages.

    norm = grad_norm_and_clip(list(model.parameters()), 1.0, info)
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def loss_context(info):
    """``loss_parallel`` under tensor parallelism (cross-entropy on vocabulary-sharded logits,
    forward and backward), else nothing."""
    if info.mesh is not None and info.mesh["tp"].size() > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def grad_norm_and_clip(params: list[torch.Tensor], max_norm: float, info, skip: set[int] | None = None) -> torch.Tensor:
    """The global pre-clip gradient norm over every rank's parameters, then clipping to ``max_norm``
    (0 = no clipping). DTensor gradients (TP/FSDP shards) are reduced by DTensor; across pipeline
    stages, which hold different parameters, the squared norms are summed over the ``pp`` group.
    ``skip``: ids of parameters held by two stages (a tied embedding), counted on one of them."""
    from torch.distributed.tensor import DTensor

    for p in params:
        # a sequence-parallel norm's weight is replicated over TP, but its gradient comes out of the
        # backward a Partial sum over the sequence shards; reduce it once here (Megatron-LM's all-reduce
        # of the layer-norm gradients), or the norm and then every optimizer op touching it would each
        # all-reduce it again (fused AdamW: twice per step in all)
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(placements=p.placements)
    grads = [p.grad for p in params if p.grad is not None and id(p) not in (skip or set())]
    if grads:
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()
    else:
        total = torch.zeros((), device=info.device)
    if info.mesh is not None and info.mesh["pp"].size() > 1:
        sq = total.float() ** 2
        dist.all_reduce(sq, group=info.mesh["pp"].get_group())
        total = sq.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_([p for p in params if p.grad is not None], max_norm, total)
    return total
