"""The machines ``gptforge plan`` plans for: GPUs per node, memory, bandwidths and peak FLOP/s.

    gptforge plan --preset gpt3-175b --gpus 1024 --gpu h100-80

Presets (dense bf16 peak, HBM, NVLink and the per-GPU network port), from the vendors' datasheets:

* ``a100-40`` / ``a100-80``: NVIDIA A100 Tensor Core GPU datasheet (SXM4): 312 TFLOP/s bf16 dense,
  40 GB HBM2 at 1,555 GB/s / 80 GB HBM2e at 2,039 GB/s, NVLink 3 600 GB/s per GPU (both directions,
  so 300 GB/s each way); DGX A100 user guide: 8 GPUs per node on NVSwitch and 8 single-port Mellanox
  ConnectX-6 HDR InfiniBand (200 Gb/s = 25 GB/s) for compute traffic, one per GPU (Selene, where
  Megatron-LM's Tables 1 and 2 ran, is DGX A100 80GB nodes on such a rail-optimised HDR fat tree).
* ``h100-80``: NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOP/s bf16 dense, 80 GB HBM3 at
  3.35 TB/s, NVLink 4 900 GB/s per GPU (450 each way); DGX H100: 8 GPUs, 8 ConnectX-7 400 Gb/s
  NDR InfiniBand ports (50 GB/s), one per GPU.
* ``h200``: NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOP/s bf16 dense, 141 GB HBM3e at
  4.8 TB/s, NVLink 900 GB/s; DGX H200: 8 GPUs, 8 ConnectX-7 400 Gb/s ports.

Memory is what ``nvidia-smi`` reports as total (GiB), before the CUDA context; the planner keeps a
reserve (``--reserve``, default 2 GiB) out of it.

Two efficiencies turn datasheet numbers into achievable ones (both stated assumptions, the same for
every preset): ``link_eff`` 0.8 of a link's one-way rate for a large NCCL collective (the order that
nccl-tests bus bandwidths reach on NVLink and InfiniBand; not measured here), and ``matmul_eff``,
the fraction of peak a transformer layer's matmuls reach, 0.65, fitted to one measured row that is
none of the planner's goals (Megatron-LM Table 1's 18.4B model, TP 8 PP 1 on 256 A100s, 135 TFLOP/s;
see ``plan/megatron.py`` and docs/benchmarks.md). On Hopper that fraction is an unmeasured assumption.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    mem_gib: float  # device memory per GPU
    peak_flops: float  # dense bf16 FLOP/s per GPU
    hbm_bw: float  # bytes/s per GPU
    nvlink_bw: float  # bytes/s one way per GPU inside a node (NVSwitch)
    nic_bw: float  # bytes/s one way per GPU between nodes (its own network port)
    link_eff: float = 0.8  # achievable fraction of a link's rate for a large collective
    matmul_eff: float = 0.65  # achievable fraction of peak for the layers' matmuls (see the docstring)

    def as_dict(self) -> dict:
        return asdict(self)


CLUSTERS: dict[str, Cluster] = {
    "a100-40": Cluster("a100-40", 8, 40.0, 312e12, 1555 * GB, 300 * GB, 25 * GB),
    "a100-80": Cluster("a100-80", 8, 80.0, 312e12, 2039 * GB, 300 * GB, 25 * GB),
    "h100-80": Cluster("h100-80", 8, 79.6, 989e12, 3350 * GB, 450 * GB, 50 * GB),
    "h200": Cluster("h200", 8, 140.4, 989e12, 4800 * GB, 450 * GB, 50 * GB),
}


def get_cluster(name: str, **overrides) -> Cluster:
    """The preset ``name`` with fields overridden (``gpus_per_node=4``, ``mem_gib=40`` ...)."""
    if name not in CLUSTERS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(CLUSTERS)}")
    return replace(CLUSTERS[name], **{k: v for k, v in overrides.items() if v is not None})
