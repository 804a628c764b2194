"""torchrun initialisation and parallel wrapping (DDP, ZeRO-1, FSDP2), applied from outside the model.

    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b --dist.shard zero1

``init_distributed`` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE (NCCL on GPUs, gloo on CPU)
with ``dist.timeout`` as the collective timeout. ``wrap_model`` compiles and then wraps in DDP, or
applies FSDP2 ``fully_shard`` per transformer block and at the root (``--dist.shard fsdp``).
The optimizer (ZeRO-1 included) is built by :mod:`gptforge.optim`. The model never knows its world
size.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gptforge import environment
from gptforge.config import ConfigError, DistConfig
from gptforge.parallel.mesh import build_mesh, data_coordinate, wants_mesh
from gptforge.runtime import resolve_device

_JOINS = 0  # process groups this process has joined (see init_distributed)


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    zero: int = 0  # 1 = optimizer state sharded with ZeroRedundancyOptimizer
    fsdp: bool = False  # parameters, gradients and optimizer state sharded with FSDP2
    owns_group: bool = False  # init_distributed created the process group, so cleanup() destroys it
    # the device mesh of a model-parallel / HSDP run (gptforge.parallel.mesh), else None. Under a
    # mesh the state is DTensor-sharded, so ``fsdp`` is true too (DCP checkpoints, no DDP no_sync)
    mesh: Any = None
    dp_rank: int = 0  # this rank's place in the data dimension: what the loaders read
    dp_world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def sharded(self) -> str:
        """How state is sharded in this run: "fsdp", "zero1", "none", or the mesh ("pp2.dp1x1.tp2")."""
        if self.mesh is not None:
            pp, rep, shard, tp = self.mesh.shape
            return f"pp{pp}.dp{rep}x{shard}.tp{tp}"
        return "fsdp" if self.fsdp else "zero1" if self.zero else "none"

    @property
    def layout(self) -> str:
        """The parallel layout that runs, in words ("tensor parallel (dist.tp 2)", "FSDP"): for messages."""
        return layout_words(self.sharded)


def layout_words(sharding: str) -> str:
    """meta.json's ``sharding`` (``DistInfo.sharded``: "fsdp", "zero1", "none" or a mesh such as
    "pp2.dp1x1.tp1") in words: the parallel layout that ran, not an assumed FSDP."""
    if sharding == "fsdp":
        return "FSDP"
    if sharding == "zero1":
        return "ZeRO-1"
    m = re.fullmatch(r"pp(\d+)\.dp(\d+)x(\d+)\.tp(\d+)", sharding or "")
    if not m:
        return sharding or "one process"
    pp, rep, shard, tp = (int(x) for x in m.groups())
    parts = [f"tensor parallel (dist.tp {tp})" if tp > 1 else "", f"pipeline parallel (dist.pp {pp})" if pp > 1 else "",
             f"FSDP over {shard}" if shard > 1 else "", f"replicated x{rep}" if rep > 1 else ""]
    return " + ".join(p for p in parts if p) or "one process"


def init_distributed(device_name: str = "auto", dist_cfg: DistConfig | None = None,
                     flag: str = "train.device") -> DistInfo:
    """Join the torchrun job if there is one. Sharding switches are checked against the device and
    world here, before any data or model is touched. ``flag``: the setting a device refusal names."""
    dist_cfg = dist_cfg or DistConfig()
    if "RANK" not in os.environ:
        # nothing to shard across one process: ZeRO/FSDP switches (e.g. from a world-2 checkpoint's
        # config) are accepted and have no effect, so a sharded run can be resumed on one device
        return DistInfo(device=resolve_device(device_name, flag=flag))
    rank, local_rank, world = (int(environment.number(k, 0)) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = resolve_device(device_name, local_rank, flag=flag)
    if dist_cfg.shard == "fsdp" and device.type not in ("cuda", "cpu"):
        raise ConfigError(
            f"dist.shard=fsdp on device {device.type!r}: FSDP2 runs on CUDA (NCCL) or CPU (gloo) only; "
            "use --dist.shard none or zero1 (DDP), or --train.device cuda/cpu"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = not dist.is_initialized()  # a caller that joined already (a test harness) keeps its group
    if owns_group:
        global _JOINS
        timeout = datetime.timedelta(seconds=dist_cfg.timeout)
        # torchrun's store outlives a worker group: after an elastic restart (or a second train() in
        # one process) the old group's keys are still there, and gloo would dial a dead rank's
        # address. A prefix per restart and per join keeps each group's rendezvous keys apart.
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"gptforge/restart{restart}/join{_JOINS}", store)
        _JOINS += 1
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=world,
            timeout=timeout, device_id=device if device.type == "cuda" else None,
        )
    if wants_mesh(dist_cfg, world):  # tensor / pipeline parallel or HSDP: a named DeviceMesh
        mesh = build_mesh(device.type, dist_cfg, world)
        dp_rank, dp_world = data_coordinate(mesh)
        return DistInfo(rank=rank, local_rank=local_rank, world=world, device=device, fsdp=True,
                        owns_group=owns_group, mesh=mesh, dp_rank=dp_rank, dp_world=dp_world)
    sharding = world > 1
    return DistInfo(dp_rank=rank, dp_world=world, rank=rank, local_rank=local_rank, world=world, device=device,
                    zero=int(sharding and dist_cfg.shard == "zero1"), fsdp=sharding and dist_cfg.shard == "fsdp",
                    owns_group=owns_group)


def wrap_model(
    model: torch.nn.Module,
    info: DistInfo,
    compile: bool,
    dist_cfg: DistConfig | None = None,
    param_dtype: torch.dtype | None = None,
    compile_mode: str = "default",
) -> torch.nn.Module:
    """Compile, then DDP (world > 1), or FSDP2 when ``info.fsdp``. Returns the module to train with.

    DDP: keep ``model`` itself (the raw module) for saving and evaluation. FSDP2 changes ``model`` in
    place (its parameters become DTensor shards), so the returned module *is* ``model``; build the
    optimizer after this call. ``param_dtype`` (bf16 on CUDA) is FSDP's mixed-precision policy:
    parameters are all-gathered in it, gradients reduced in float32.
    """
    if info.mesh is not None:
        from gptforge.parallel.apply import parallelize

        return parallelize(model, info, compile, dist_cfg or DistConfig(), param_dtype, compile_mode)
    if info.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dist_cfg = dist_cfg or DistConfig()
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        blocks = model.blocks
        for i, block in enumerate(blocks):
            if compile:  # per-block compile composes with per-block sharding (torchtitan's order)
                block.compile(mode=None if compile_mode == "default" else compile_mode)
            # the last block's parameters are needed again at once by backward: keep them gathered
            reshard = dist_cfg.reshard_after_forward and i < len(blocks) - 1
            fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp, reshard_after_forward=dist_cfg.reshard_after_forward)
        return model
    wrapped = torch.compile(model, mode=None if compile_mode == "default" else compile_mode) if compile else model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        # gradients live in DDP's communication buckets instead of beside them: one copy, not two
        wrapped = DDP(wrapped, device_ids=ids, gradient_as_bucket_view=True)
    return wrapped


def grad_sync(wrapped: torch.nn.Module, info: DistInfo, sync: bool):
    """Context for one micro-step's backward. DDP all-reduces only on the last micro-step (no_sync
    before). FSDP2 reduce-scatters every micro-step so gradients stay sharded (ZeRO-2/3 memory)."""
    if info.enabled and not info.fsdp and not sync:
        return wrapped.no_sync()
    return contextlib.nullcontext()


@contextlib.contextmanager
def gathered(model: torch.nn.Module):
    """Under FSDP2: every FSDP module of ``model`` all-gathered once on entry and kept whole until exit, so
    the forwards inside issue no collective and ranks may run different numbers of them (an evaluation's
    rank shares, replies of different lengths, samples on rank 0 only). Outside, a forward all-gathers its
    block, so ranks that run unequal forward counts wait on each other for ever. Entering is a collective:
    every rank enters, at the same point. The whole model's weights (not its gradients or optimizer state)
    are then on every rank, as TRL's ``unwrap_model_for_generation`` gathers them under ZeRO-3. Without
    FSDP it does nothing."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if mods and mods[0] is model:  # FSDP2 takes the first module to run forward as the root: a part called alone
        model._get_fsdp_state()._lazy_init()  # (PPO's policy, value) would become one, and the root's forward fail
    # whether each module reshards after forward (FSDP2 keeps it per parameter group: a post-forward mesh
    # or none); restored on exit so training's memory and traffic are what they were
    kept = [(m, bool(m._get_fsdp_state()._fsdp_param_group is not None
                     and m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None)) for m in mods]
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m, reshard in kept:
            m.reshard()
            m.set_reshard_after_forward(reshard, recurse=False)


def frozen_copy(module: torch.nn.Module, build: Any) -> torch.nn.Module:
    """A frozen copy of ``module``'s weights as they are now, whole on this rank (a reference model):
    ``copy.deepcopy``; or, where FSDP2 has sharded ``module`` (it refuses deepcopy), ``build()`` (a fresh
    module of the same shape) loaded with the gathered full state dict, in the weights' dtype and on their
    device: a collective, so every rank calls it."""
    import copy

    from torch.distributed.fsdp import FSDPModule

    if not any(isinstance(m, FSDPModule) for m in module.modules()):
        out = copy.deepcopy(module)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        first = next(iter(full.values()))
        out = build().to(device=first.device, dtype=first.dtype)
        out.load_state_dict(full)
    return out.eval().requires_grad_(False)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor result (e.g. FSDP's grad norm); plain tensors pass through."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.device.type == "cuda" else dist.ReduceOp.SUM)
        if t.device.type != "cuda":  # gloo has no AVG
            t /= info.world
    return t


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when ``flag`` is true on any (a signal that reached one rank stops all of
    them at the same step, so they checkpoint together instead of waiting on each other)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def from_main(obj: Any, info: DistInfo) -> Any:
    """Collective: rank 0's ``obj`` (any picklable value) on every rank; ``obj`` itself on one process. For
    what one rank works out and every rank needs the same answer to (a model's sha256: hashing a multi-GB
    file once, not once per rank on the same disk)."""
    if not info.enabled:
        return obj
    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0, device=info.device)
    return box[0]


def once_per_machine(fn: Callable[[], Any], info: DistInfo) -> list[Any]:
    """Collective: ``fn()`` run by each machine's first process (LOCAL_RANK 0), every answer on every rank in rank
    order (None for the ranks that did not run it). For a check of files each machine reads from its own disk (a
    model's sha256 on resume): each machine's copy read once, not once per rank, and every rank gets the same
    verdict. An exception in ``fn`` is raised on every rank, so none waits for ever on the others."""
    try:
        mine = (fn() if info.local_rank == 0 else None), None
    except Exception as e:
        mine = None, e
    if not info.enabled:
        if mine[1] is not None:
            raise mine[1]
        return [mine[0]]
    every: list[Any] = [None] * info.world
    dist.all_gather_object(every, mine)
    for _, err in every:
        if err is not None:
            raise err
    return [answer for answer, _ in every]


def gather_rng_states(info: DistInfo) -> dict[str, torch.Tensor]:
    """Collective: every rank's CPU RNG state (and its own GPU's), keyed ``rank{r}.cpu`` /
    ``rank{r}.cuda``, returned on rank 0 (empty elsewhere and at world 1). A plain all_gather of
    the fixed-size byte states, symmetric on every rank (NCCL needs them on the GPU)."""
    if not info.enabled:
        return {}
    parts = {"cpu": torch.get_rng_state()}
    if info.device.type == "cuda":
        parts["cuda"] = torch.cuda.get_rng_state(info.device)
    flat = torch.cat(list(parts.values())).to(info.device)
    everyone = [torch.empty_like(flat) for _ in range(info.world)]
    dist.all_gather(everyone, flat)
    if not info.is_main:
        return {}
    out = {}
    for r, t in enumerate(everyone):
        pieces = torch.split(t.cpu(), [p.numel() for p in parts.values()])
        out.update({f"rank{r}.{k}": v.clone() for k, v in zip(parts, pieces, strict=True)})
    return out


def seed_rank(seed: int, info: DistInfo, step: int = 0) -> None:
    """Give each rank its own random stream (dropout masks differ across ranks, as they would across
    the micro-batches of one process). Called after the model is built, so initial weights agree."""
    if info.enabled:
        torch.manual_seed(seed + info.rank + 1_000_003 * step)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()
