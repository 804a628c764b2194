"""The run directory contract, shared by every recipe and read by every tool.

    runs/NAME/
        config.json  env.json  metrics.jsonl  [tensorboard/]
        checkpoints/step_000300/{model.safetensors, optimizer.pt, rng.pt, meta.json}

``checkpoint``: the on-disk format (atomic write, checksums, safe loading); ``identity``: which checkpoints
are the run's own and which a command may read; ``checkpointer``: save and
restore a whole run (``TrainState``), bit for bit; ``dcp``: the sharded (FSDP) variant; ``metrics``:
``metrics.jsonl``, its repair after a kill, the environment record; ``sinks``: TensorBoard / W&B;
``signals``: SIGINT/SIGTERM/SIGHUP as a request to checkpoint and stop; ``preflight``: checks before any
compute; ``resume``: what ``--resume`` / ``--force`` will do; ``faults``: exit codes, elastic restarts.
``serve``, ``plot``, ``load`` and the command line read runs through this package only.
"""
