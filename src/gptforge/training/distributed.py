"""torchrun initialisation and model wrapping, applied from outside the model.

    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b

``init_distributed`` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE (NCCL on GPUs, gloo on CPU);
``wrap_model`` compiles and then wraps in DDP. The model never knows its world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"train.device={name!r} but CUDA is not available here; use --train.device cpu or auto")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def init_distributed(device_name: str = "auto") -> DistInfo:
    if "RANK" not in os.environ:
        return DistInfo(device=resolve_device(device_name))
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = resolve_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank=rank, local_rank=local_rank, world=world, device=device)


def wrap_model(model: torch.nn.Module, info: DistInfo, compile: bool) -> torch.nn.Module:
    """Compile, then DDP when world > 1. Returns the module to train with; keep ``model`` itself
    (the raw module) for saving and evaluation."""
    wrapped = torch.compile(model) if compile else model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        wrapped = DDP(wrapped, device_ids=ids)
    return wrapped


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.device.type == "cuda" else dist.ReduceOp.SUM)
        if t.device.type != "cuda":  # gloo has no AVG
            t /= info.world
    return t


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
