"""Evaluation: HellaSwag and other zero-shot tasks through one task interface and one batched scorer.

    gptforge eval --tasks hellaswag,piqa,winogrande --ckpt runs/shakespeare-cpu --limit 200

``tasks/`` renders each dataset's rows (one small module per task, with its reference numbers),
``scorer`` scores candidates in batches on every rank, ``reference`` is the one-at-a-time check,
``run`` ties them together for the CLI and the training loop, ``bench`` times scorer vs reference.
"""
