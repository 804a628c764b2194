"""Optional fast paths for the model: a fused classifier (Triton), float8 lm_head, SDPA backends.

Each is switched on from the config (``model.fused_ce``, ``model.lm_head_fp8``,
``model.attn_backend``) and checked against the device by :mod:`gptforge.training.switches`
before any compute; the plain PyTorch path stays the reference.
"""
