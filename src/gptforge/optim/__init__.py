"""Optimizers and the learning-rate schedule, one home for both.

    from gptforge.optim import build_optimizer, set_lr
    opt = build_optimizer(model, cfg.optim, device_type="cpu")     # AdamW or Muon + AdamW (+ ZeRO-1)
    lr = set_lr(opt, step, cfg.optim, cfg.train.max_steps)         # warmup, then cosine or WSD

``build``: parameter groups (only matrices decay) and the optimizer; ``muon``: Muon + AdamW as one
optimizer; ``schedule``: the lr as a function of the step.
"""

from gptforge.optim.build import build_optimizer, fused_available, muon_param_groups, param_groups, untied_embeddings
from gptforge.optim.schedule import lr_at, schedule_note, set_lr

__all__ = ["build_optimizer", "fused_available", "lr_at", "muon_param_groups", "param_groups", "schedule_note", "set_lr",
           "untied_embeddings"]
