"""Model parallelism on a device mesh, through PyTorch's own engine: the mesh and its checks
(:mod:`.mesh`), tensor + sequence parallelism (:mod:`.tensor`), pipeline stages and schedules
(:mod:`.pipeline`), and applying them to a model (:mod:`.apply`).

    torchrun --nproc_per_node 4 -m gptforge train --preset tiny --dist.tp 2 --dist.pp 2
"""
