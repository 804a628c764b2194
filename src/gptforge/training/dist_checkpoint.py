"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), for runs whose state is sharded.

    torchrun --nproc_per_node 2 -m gptforge train --preset tiny --dist.fsdp true   # writes step_*/dcp/
    gptforge train --preset tiny --resume                                          # resumes it on 1 process

With ``--dist.fsdp`` every rank writes its own shards of the model and optimizer into
``step_XXXXXX.tmp/dcp/`` (keys are fully-qualified parameter names, from
``get_state_dict``); rank 0 adds ``rng.pt`` and ``meta.json`` and renames the directory once every
rank has finished, so a rank that dies mid-save leaves only a ``.tmp`` that resume ignores. DCP
reshards on load, so the checkpoint resumes at any world size, with or without FSDP. ZeRO-1 runs
consolidate the optimizer on rank 0 and write the ordinary single-file checkpoint instead
(see :mod:`gptforge.training.checkpoint`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gptforge.training import checkpoint as ckpt

DCP_DIR = "dcp"


def is_sharded(ckpt_dir: str | Path) -> bool:
    return (Path(ckpt_dir) / DCP_DIR).is_dir()


def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as sd

    return dcp, sd


def save_sharded(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 meta: dict[str, Any], keep: int, is_main: bool,
                 rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> Path | None:
    """Collective: every rank calls it. Returns the final directory on rank 0, None elsewhere."""
    dcp, sd = _dcp()
    tmp = ckpt.ckpt_root(run_dir) / f"{ckpt.CKPT_PREFIX}{step:06d}.tmp"
    if is_main:
        tmp = ckpt.begin_checkpoint(run_dir, step)
    dist.barrier()  # the empty .tmp exists before anyone writes into it
    model_sd, optim_sd = sd.get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
    dist.barrier()  # every rank's shards are on disk before the directory becomes a checkpoint
    final = ckpt.finalize_checkpoint(run_dir, tmp, {**meta, "format": "dcp"}, keep, rng) if is_main else None
    dist.barrier()
    return final


def _check_shapes(model: torch.nn.Module, ckpt_dir: Path) -> None:
    dcp, _ = _dcp()
    stored = dcp.FileSystemReader(str(ckpt_dir / DCP_DIR)).read_metadata().state_dict_metadata
    wrong = []
    for name, p in model.state_dict().items():
        meta = stored.get(f"model.{name}")
        size = getattr(meta, "size", None)
        if size is not None and tuple(size) != tuple(p.shape):  # DTensor .shape is the global shape
            wrong.append(f"{name}: checkpoint {tuple(size)} vs model {tuple(p.shape)}")
    if wrong:
        raise ckpt.CheckpointError(
            f"{ckpt_dir} does not fit the model (shapes differ): {'; '.join(wrong[:3])}. Resume with the "
            "checkpoint's own model config (drop --model.* overrides) or start a new run"
        )


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, ckpt_dir: str | Path) -> None:
    """Load a DCP checkpoint into ``model`` (FSDP-wrapped or a plain module) and a matching plain
    optimizer (AdamW over ``model``'s parameters), resharding to the current world."""
    dcp, sd = _dcp()
    ckpt_dir = Path(ckpt_dir)
    _check_shapes(model, ckpt_dir)
    no_dist = not dist.is_initialized()
    with warnings.catch_warnings():
        if no_dist:  # loading on one process is intended here: DCP reshards to a single copy
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        _load(model, optimizer, ckpt_dir, no_dist)


def _load(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, ckpt_dir: Path, no_dist: bool) -> None:
    dcp, sd = _dcp()
    if optimizer is None:
        model_sd = sd.get_model_state_dict(model)
        state = {"model": model_sd}
        dcp.load(state, checkpoint_id=str(ckpt_dir / DCP_DIR), no_dist=no_dist)
        sd.set_model_state_dict(model, state["model"])
        return
    model_sd, optim_sd = sd.get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(ckpt_dir / DCP_DIR), no_dist=no_dist)
    sd.set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter name, unsharded (to carry it into an FSDP optimizer)."""
    _, sd = _dcp()
    return sd.get_optimizer_state_dict(model, optimizer, options=sd.StateDictOptions(full_state_dict=True))


def set_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Shard a :func:`full_optimizer_state` dict into the optimizer of an FSDP-wrapped ``model``."""
    _, sd = _dcp()
    sd.set_optimizer_state_dict(model, optimizer, state, options=sd.StateDictOptions(full_state_dict=True))
