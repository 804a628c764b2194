"""Choose a parallel layout: every (DP, TP, PP, virtual stages, micro-batch, recompute, shard) that can
run, costed by ``plan.cost``; the fastest that fits in memory wins.

    gptforge plan --preset gpt3-175b --gpus 1024 --gpu h100-80

TP runs over powers of two up to the GPUs in a node (and dividing the attention and key/value heads),
PP over the divisors of the layer count, DP is what is left of the GPU count, micro-batches are powers of
two dividing each data-parallel rank's share of the global batch (at least as many micro-batches as
stages), interleaving 1, 2 or 4 virtual stages; FSDP over the whole data dimension or, as HSDP, over
the GPUs of a node that TP leaves (replicas across nodes). Thousands of candidates, arithmetic only: well under a
second for any model size.
"""

from __future__ import annotations

import math

from gptforge.models.registry import counts
from gptforge.plan.cluster import Cluster
from gptforge.plan.cost import RECOMPUTES, SHARDS, Cost, Layout, check, estimate_cost, memory

GIB = 2**30


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def candidates(model_cfg, gpus: int, cluster: Cluster, global_batch: int):
    c = counts(model_cfg)
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= min(cluster.gpus_per_node, gpus) and gpus % t == 0]
    for tp in tps:
        hsdp = max(1, cluster.gpus_per_node // tp)  # HSDP: the FSDP group fills the rest of a node
        for pp in _divisors(math.gcd(c.n_layer, gpus // tp)):  # stages divide the layers and the GPUs left:
            # the divisors of their gcd, so the search costs O(sqrt(gpus)), whatever n_layer is
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            per_rank = global_batch // dp
            bs = [b for b in (1, 2, 4, 8, 16, 32, 64) if per_rank % b == 0 and (pp == 1 or per_rank // b >= pp)]
            for v in ((1, 2, 4) if pp > 1 else (1,)):
                for b in bs:
                    for rc in RECOMPUTES:
                        # under a mesh gptforge's data dimension is FSDP2 (shard groups of 1 for none): no zero1
                        shards = ("none",) if dp == 1 else SHARDS if tp * pp == 1 else ("none", "fsdp")
                        for shard in shards:
                            lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=b, recompute=rc, shard=shard, interleave=v)
                            if check(model_cfg, lay, global_batch) is None:
                                yield lay
                            if shard == "fsdp" and 1 < hsdp < dp and dp % hsdp == 0:  # shard in a node, replicate across
                                lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=b, recompute=rc, shard=shard,
                                             interleave=v, dp_shard=hsdp)
                                if check(model_cfg, lay, global_batch) is None:
                                    yield lay


def search(model_cfg, gpus: int, cluster: Cluster, global_batch: int, seq_len: int, reserve_gib: float = 2.0,
           keep: int = 5) -> tuple[list[Cost], int]:
    """The ``keep`` fastest layouts that fit ``cluster.mem_gib - reserve_gib`` (fastest first), and how
    many layouts were costed. An empty list: nothing fits."""
    budget = (cluster.mem_gib - reserve_gib) * GIB
    fits: list[Cost] = []
    n = 0
    for lay in candidates(model_cfg, gpus, cluster, global_batch):
        n += 1
        mem = memory(model_cfg, lay, cluster, global_batch, seq_len)
        if mem["total"] <= budget:
            fits.append(estimate_cost(model_cfg, lay, cluster, global_batch, seq_len, mem))
    fits.sort(key=lambda k: (k.step_s, k.mem["total"]))
    return fits[:keep], n
