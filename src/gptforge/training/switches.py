"""The speed switches checked against the device before any compute (issue 13).

    >>> check_switches(cfg, torch.device("cpu"))   # raises ConfigError naming the switch, or returns

``model.fused_ce`` (Triton fused classifier), ``model.lm_head_fp8`` (rowwise float8 lm_head),
``model.attn_backend`` (SDPA kernel) and ``train.compile_mode`` (Inductor mode) each need a GPU,
a torch build or a library that may be missing. A switch that cannot run is refused with a message
that names it and says what to do; it is never silently measured as something else. ``switch_problem``
returns that message instead of raising, for the benchmark's per-configuration "skipped" reports.
"""

from __future__ import annotations

import os

import torch

from gptforge.config import Config, ConfigError
from gptforge.runtime import resolve_dtype


def switch_problem(cfg: Config, device: torch.device) -> str | None:
    """Why ``device`` (with this torch and these libraries) cannot run cfg's speed switches, or None."""
    m, t = cfg.model, cfg.train
    fused_ce, fp8 = getattr(m, "fused_ce", False), getattr(m, "lm_head_fp8", False)  # GPT-2 family fields
    attn_backend = getattr(m, "attn_backend", "auto")
    if fused_ce:
        from gptforge.kernels.fused_ce import triton_available

        if not triton_available():
            return "model.fused_ce=true needs triton: pip install 'gptforge[kernels]' (or --model.fused_ce false)"
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return (f"model.fused_ce=true runs a Triton kernel on a CUDA GPU; this run is on {device.type}: "
                    "use --model.fused_ce false (the plain loss)")
    if fp8:
        from gptforge.kernels.fp8 import fp8_problem

        why = fp8_problem(device)
        if why:
            return why
        if resolve_dtype(device, t.dtype) != "bfloat16":
            return "model.lm_head_fp8=true gives bf16 logits: it needs --train.dtype bfloat16 (or auto on a GPU)"
    if attn_backend != "auto":
        from gptforge.kernels.attention import sdpa_problem

        dtype = torch.bfloat16 if resolve_dtype(device, t.dtype) == "bfloat16" else torch.float32
        why = sdpa_problem(attn_backend, device, dtype, m.n_embd // m.n_head,
                           gqa=getattr(m, "kv_heads", m.n_head) != m.n_head)
        if why:
            return why
    if t.compile_mode != "default":
        compiled = device.type == "cuda" if t.compile is None else t.compile
        if not compiled:
            return f"train.compile_mode={t.compile_mode} tunes torch.compile, which is off here: add --train.compile true"
        if device.type != "cuda":
            return (f"train.compile_mode={t.compile_mode} autotunes GPU kernels and CUDA graphs; on {device.type} "
                    "use --train.compile_mode default")
    return None


def check_switches(cfg: Config, device: torch.device) -> None:
    """Raise ConfigError (the CLI's exit status 2) when a speed switch cannot run on ``device``."""
    why = switch_problem(cfg, device)
    if why:
        raise ConfigError(why)
