"""Parallelism applied from outside the model, through PyTorch's own engine.

    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b --dist.shard fsdp
    torchrun --nproc_per_node 4 -m gptforge train --preset tiny --dist.tp 2 --dist.pp 2

``distributed``: joining the process group (``DistInfo``), wrapping a model (compile, then DDP or
FSDP2, or the mesh's layouts) and the collectives the loop needs (any-rank stop, mean of a metric,
RNG states). Model parallelism on a device mesh: the mesh and its checks (:mod:`.mesh`), tensor +
sequence parallelism (:mod:`.tensor`), pipeline stages and schedules (:mod:`.pipeline`), applying
them to a model (:mod:`.apply`), losses and gradient norms across stages (:mod:`.grads`), counted
traffic (:mod:`.comm`).
"""
