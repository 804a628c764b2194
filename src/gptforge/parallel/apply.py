"""Applying a mesh to a model: tensor parallelism, pipeline stages, FSDP2 over the data dimensions.

    torchrun --nproc_per_node 4 -m gptforge train --preset tiny --dist.tp 2 --dist.shard fsdp

Order (torchtitan's): tensor parallelism on the ``tp`` mesh, then pipeline stages (each rank keeps
its layers), then FSDP2 ``fully_shard`` per block and at the root over the data dimensions
(``dp_replicate`` x ``dp_shard``: HSDP when both are > 1, plain replicas when ``dp_shard`` is 1).
Parameters end up DTensors on the (dp, tp) mesh; the optimizer, DCP checkpoints and Muon (which
``full_tensor()``-gathers each matrix) see them as they see FSDP's.
"""

from __future__ import annotations

import torch


def parallelize(model: torch.nn.Module, info, compile: bool, dist_cfg, param_dtype=None,
                compile_mode: str = "default") -> torch.nn.Module:
    """Shard ``model`` in place over ``info.mesh``; returns the module to train with (``model``
    itself, or a pipeline runner under ``dist.pp`` > 1)."""
    mesh = info.mesh
    tp = mesh["tp"].size()
    if tp > 1:
        from gptforge.parallel.tensor import apply_tp

        apply_tp(model, mesh["tp"])
    runner = None
    if mesh["pp"].size() > 1:
        from gptforge.parallel.pipeline import build_pipeline

        runner = build_pipeline(model, info, dist_cfg)
    if compile:  # per block, as the FSDP path (torchtitan's order: parallelize, compile, shard)
        for block in _blocks(model):
            block.compile(mode=None if compile_mode == "default" else compile_mode)
    if info.dp_world > 1:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from gptforge.parallel.tensor import fsdp_placement

        dp_mesh = mesh["dp_replicate", "dp_shard"]
        kw = dict(mesh=dp_mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
                  shard_placement_fn=fsdp_placement)
        blocks = _blocks(model)
        for i, block in enumerate(blocks):
            reshard = dist_cfg.reshard_after_forward and i < len(blocks) - 1
            fully_shard(block, reshard_after_forward=reshard, **kw)
        # the root of each forward: the model, or under a pipeline each stage (its embeddings, norm and
        # head; the schedule then runs FSDP's end-of-backward for it, as for torchtitan's model chunks)
        for root in (runner.parts if runner is not None else [model]):
            fully_shard(root, reshard_after_forward=dist_cfg.reshard_after_forward, **kw)
        if runner is not None:
            runner.retie(model)
    return runner if runner is not None else model


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    blocks = model.blocks
    return list(blocks.values()) if isinstance(blocks, torch.nn.ModuleDict) else list(blocks)
