"""Counting a training step's communication: every collective and point-to-point call, by mesh
dimension and kind, in bytes, to hold against the planner's prediction
(:func:`gptforge.plan.cost.comm_volume`, whose docstring states the communication model).

    torchrun --nproc_per_node 2 -m gptforge train --preset tiny --dist.tp 2 --dist.count_comm 10

Under ``dist.count_comm N`` every N-th step runs inside :class:`CommCounter` and rank 0 writes its
bytes into that step's ``metrics.jsonl`` record as ``"comm": {"<dim>.<kind>": bytes, ...}`` (dim:
``tp``, ``pp``, ``dp``, or ``world`` / ``other`` for a group that is no mesh dimension; kind:
``all_gather``, ``reduce_scatter``, ``all_reduce``, ``send``, ``broadcast``). The counter is a dispatch mode in the
manner of DTensor's ``CommDebugMode``: it sees the functional collectives DTensor issues, the c10d
calls FSDP2 and the pipeline schedules make, and ``torch.distributed``'s own (it steps aside for
DTensor ops, so their inner collectives reach it). It is slow (Python on every op): a check, not a
mode to train in.

The unit is a call's *payload*, the logical tensor handed to it: an all-gather's gathered output, a
reduce-scatter's whole input, an all-reduce's tensor, a send's tensor (receives are not counted: each
is the other side's send). Scalar all-reduces (the loss mean, the gradient norm, the stop flag) are
kept apart under ``comm.scalars`` (calls, not bytes): they cost latency, not bandwidth, and the
planner does not model them.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# op name -> kind (the argument comments say where the payload and the group are)
_FUNCTIONAL = {  # torch.ops._c10d_functional (DTensor's redistributions): (input, ..., group_name)
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_reduce": "all_reduce",
}
_C10D = {  # torch.ops.c10d (torch.distributed's calls: FSDP2, pipelining, the loop's reductions)
    "_allgather_base_": "all_gather",  # (output, input, group, ...)
    "allgather_into_tensor_coalesced_": "all_gather",  # (outputs, inputs, group, ...)
    "_reduce_scatter_base_": "reduce_scatter",  # (output, input, group, ...)
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",  # (outputs, inputs, group, ...)
    "allreduce_": "all_reduce",  # (tensors, group, ...)
    "allreduce_coalesced_": "all_reduce",
    "send": "send",  # (tensors, group, dst, tag)
    "broadcast_": "broadcast",  # (tensors, group, ...): DDP's buffers
}
_OTHER_C10D = ("allgather_", "reduce_scatter_", "alltoall_", "alltoall_base_", "gather_",
               "scatter_", "reduce_")


def _bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return sum(_bytes(t) for t in x)


def _numel(x) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else sum(_numel(t) for t in x)


class CommCounter(TorchDispatchMode):
    """Adds up the payload bytes of every collective issued while active, in ``self.bytes``
    (``"<dim>.<kind>"`` -> bytes); ``groups`` names process groups by their ranks (a frozenset of
    global ranks -> mesh dimension: DTensor may reach one dimension through several group objects),
    others count as ``world`` (the whole world) or ``other``. Collectives this model has no kind for
    (broadcast, all-to-all, ...) land in ``self.unknown`` by op name."""

    def __init__(self, groups: dict[frozenset, str] | None = None):
        from torch.distributed.tensor import DTensor

        super().__init__()
        self._dtensor = DTensor
        self.groups = dict(groups or {})
        self.bytes: Counter = Counter()
        self.scalars: Counter = Counter()
        self.unknown: Counter = Counter()

    def _dim(self, group) -> str:
        if isinstance(group, str):
            group = dist.distributed_c10d._resolve_process_group(group)
        elif isinstance(group, torch.ScriptObject):  # how a c10d op's argument reaches a dispatch mode
            group = dist.ProcessGroup.unbox(group)
        ranks = frozenset(dist.get_process_group_ranks(group))
        if len(ranks) == 1:
            return ""  # a one-rank group (HSDP's replicas when there is one): nothing moves
        if ranks in self.groups:
            return self.groups[ranks]
        return "world" if len(ranks) == dist.get_world_size() else "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is self._dtensor for t in types):
            return NotImplemented  # let DTensor run the op; its collectives come back through this mode
        ns, name = func.namespace, func._overloadpacket.__name__
        if ns == "_c10d_functional" and name in _FUNCTIONAL:
            kind, t = _FUNCTIONAL[name], args[0]
            n = _bytes(t) * (int(args[1]) if kind == "all_gather" else 1)  # gathered: every rank's input
            self._add(self._dim(args[-1]), kind, n, t.numel())
        elif ns == "c10d" and name in _C10D:
            kind = _C10D[name]
            if kind in ("send", "all_reduce", "broadcast"):
                payload, group = args[0], args[1]
            else:  # an all-gather's output, a reduce-scatter's input
                payload, group = (args[0] if kind == "all_gather" else args[1]), args[2]
            self._add(self._dim(group), kind, _bytes(payload), _numel(payload))
        elif ns == "c10d" and name in _OTHER_C10D:
            self.unknown[name] += 1
        return func(*args, **(kwargs or {}))

    def _add(self, dim: str, kind: str, nbytes: int, numel: int) -> None:
        if not dim:
            return
        if kind == "all_reduce" and numel == 1:
            self.scalars[f"{dim}.{kind}"] += 1
        else:
            self.bytes[f"{dim}.{kind}"] += nbytes


def mesh_groups(mesh) -> dict[frozenset, str]:
    """This rank's groups along a gptforge mesh's dimensions, by their ranks -> the planner's dims
    (``tp``, ``pp``, ``dp``: the replicas, the shards, and both together)."""
    if mesh is None:
        return {}
    out = {}
    for dims in [(d,) for d in mesh.mesh_dim_names] + [("dp_replicate", "dp_shard")]:
        sub = mesh[dims]
        ranks = frozenset(sub.mesh.flatten().tolist())
        out.setdefault(ranks, "dp" if dims[0].startswith("dp") else dims[0])
    return out


@contextlib.contextmanager
def count_comm(enabled: bool, info, wrapped=None):
    """Count the collectives of the ``with`` body when ``enabled``: yields a dict that afterwards holds
    ``{"comm": {"<dim>.<kind>": bytes, ..., "scalars": calls}}`` (empty when not enabled or on one
    process). Without a mesh every group is the data dimension; a pipeline's tied-embedding pair
    (``wrapped.tied_group``) counts as ``pp``."""
    out: dict = {}
    if not enabled or not dist.is_initialized():
        yield out
        return
    world = frozenset(range(dist.get_world_size()))
    groups = mesh_groups(info.mesh) if info.mesh is not None else {world: "dp"}
    tied = getattr(wrapped, "tied_group", None)
    if tied is not None:
        groups[frozenset(dist.get_process_group_ranks(tied))] = "pp"
    counter = CommCounter(groups)
    with counter:
        yield out
    if counter.unknown:
        raise RuntimeError(f"dist.count_comm: collectives the count has no kind for: {dict(counter.unknown)}")
    out["comm"] = {**dict(sorted(counter.bytes.items())), "scalars": sum(counter.scalars.values())}
