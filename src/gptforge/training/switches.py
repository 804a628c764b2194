"""The speed switches checked against the device before any compute (issue 13).

    >>> check_switches(cfg, torch.device("cpu"))   # raises ConfigError naming the switch, or returns

``model.fused_ce`` (Triton fused classifier), ``model.lm_head_fp8`` (rowwise float8 lm_head),
``model.attn_backend`` (SDPA kernel) and ``train.compile_mode`` (Inductor mode) each need a GPU,
a torch build or a library that may be missing. A switch that cannot run is refused with a message
that names it and says what to do; it is never silently measured as something else. ``switch_problem``
returns that message instead of raising, for the benchmark's per-configuration "skipped" reports.

``model.fused_ce`` defaults to auto (None): ``resolve_model_switches`` decides it once per run from
``fused_ce_problem``, the one list of what stops the fused classifier (issue 58). Under auto a
reason turns it off with one logged line; under true the same reason refuses the run. The saved
config keeps auto, so a checkpoint resumes on whatever device it lands on.
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
    if fused_ce is True:  # None (auto) never refuses: resolve_model_switches turns it off with a reason
        why = fused_ce_refusal(cfg, device)
        if why:
            return why
    for key in TRITON_SWITCHES:  # the GPT-2 block's fused kernels (gptforge.kernels.fused_block)
        if getattr(m, key, False):
            why = triton_problem(device)
            if why:
                return f"model.{key}=true: {why}; use --model.{key} false (the PyTorch ops)"
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


TRITON_SWITCHES = ("fused_ln_residual", "fused_bias_gelu")  # GPT-2 model fields, default off until measured


def triton_problem(device: torch.device, triton: bool | None = None) -> str | None:
    """Why a Triton kernel cannot run on ``device`` (None: it can). The CPU runs one only under
    ``TRITON_INTERPRET=1`` (the tests' interpreter). ``triton``: whether the machine that will run it has
    triton; None asks this one (``gptforge plan`` passes its target GPU's, not the planning machine's)."""
    from gptforge.kernels.fused_ce import triton_available

    if not (triton_available() if triton is None else triton):
        return "it needs triton (pip install 'gptforge[kernels]')"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"it runs a Triton kernel on a CUDA GPU and this run is on {device.type}"
    return None


def fused_ce_problem(cfg: Config, device: torch.device, triton: bool | None = None) -> str | None:
    """Why the fused classifier cannot run for ``cfg`` on ``device``, in a phrase, or None. The one list
    both ``model.fused_ce=true`` (refused) and auto (off, with this reason logged) read; ``triton`` as
    in :func:`triton_problem`."""
    m, d = cfg.model, cfg.dist
    if not hasattr(m, "fused_ce"):
        return f"model.arch={m.arch} has no fused classifier"
    if getattr(m, "lm_head_fp8", False):
        return "model.lm_head_fp8 computes the logits in float8 and the fused classifier takes them from its own matmul"
    if getattr(m, "logit_softcap", 0.0):
        return f"model.logit_softcap={m.logit_softcap} caps the logits and the fused classifier takes them raw"
    if d.tp > 1:
        return f"dist.tp={d.tp} splits the output head over ranks and the fused classifier needs it whole on one"
    if d.pp > 1:
        return f"dist.pp={d.pp}: the pipeline schedule computes the loss from the last stage's logits"
    return triton_problem(device, triton)


def fused_ce_refusal(cfg: Config, device: torch.device, triton: bool | None = None) -> str | None:
    """The one-line refusal of ``model.fused_ce=true`` where the fused classifier cannot run, or None."""
    if getattr(cfg.model, "fused_ce", False) is not True:
        return None
    why = fused_ce_problem(cfg, device, triton)
    return f"model.fused_ce=true: {why}; use --model.fused_ce auto or false (the plain loss)" if why else None


def resolve_model_switches(cfg: Config, device: torch.device, log=None, triton: bool | None = None):
    """``cfg.model`` with ``fused_ce`` = auto decided for ``device``: a copy to build the model from (the
    run's saved config keeps auto). When something other than the device's kind stops it, ``log`` gets
    one line saying why; on a CPU auto is off without a word, as most CPU runs are. ``triton``: whether
    the machine that runs it has triton (None: this one; ``gptforge plan`` decides for its target GPU)."""
    import dataclasses

    m = cfg.model
    if getattr(m, "fused_ce", False) is not None:
        return m
    if device.type != "cuda":  # not even under TRITON_INTERPRET: the interpreter is for tests that ask for it
        return dataclasses.replace(m, fused_ce=False)
    why = fused_ce_problem(cfg, device, triton)
    if why and log is not None:
        log(f"model.fused_ce=auto: off, {why} (the plain loss; set --model.fused_ce false to silence this)")
    return dataclasses.replace(m, fused_ce=why is None)


def check_switches(cfg: Config, device: torch.device) -> None:
    """Raise ConfigError (the CLI's exit status 2) when a speed switch cannot run on ``device``."""
    why = switch_problem(cfg, device)
    if why:
        raise ConfigError(why)
