"""Parallelism applied from outside the model: torchrun initialisation, DDP, FSDP2 (ZeRO-2/3).

    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b --dist.shard fsdp

``distributed``: joining the process group (``DistInfo``), wrapping a model (compile, then DDP or
FSDP2) and the collectives the loop needs (any-rank stop, mean of a metric, RNG states).
"""
