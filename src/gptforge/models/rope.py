"""Rotary position frequencies, with the two rope scalings small open models ship: ``linear`` and ``llama3``.

A rotary embedding turns channel pair i of a head by ``pos * inv_freq[i]``, ``inv_freq[i] =
theta^(-2i/head_dim)``. Scaling stretches the context a model was trained on by dividing some of
those frequencies (Hugging Face's ``rope_scaling`` / ``rope_parameters``, ``modeling_rope_utils.py``):

* ``linear`` (position interpolation): every frequency divided by ``factor``;
* ``llama3`` (Llama 3.1/3.2): wavelengths shorter than ``original_context / high_freq_factor`` kept,
  those longer than ``original_context / low_freq_factor`` divided by ``factor``, a smooth blend between.

Computed in float32 in the same order of operations as transformers, so the angles agree to the bit.
llama.cpp stores the same thing as a per-frequency divisor (the GGUF tensor ``rope_freqs.weight``):
:func:`rope_factors` gives it.

    >>> inv_freq(64, 500_000.0, "llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
    ...          original_context=8192).shape
    torch.Size([32])
"""

from __future__ import annotations

import math

import torch

ROPE_TYPES = ("default", "linear", "llama3")


def inv_freq(head_dim: int, theta: float, rope_type: str = "default", factor: float = 1.0,
             low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_context: int = 0,
             device: torch.device | str | None = None) -> torch.Tensor:
    """The (head_dim/2,) float32 rotation frequencies of each channel pair, scaled as ``rope_type`` says."""
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if rope_type == "default":
        return base
    if rope_type == "linear":
        return base / factor
    if rope_type != "llama3":
        raise ValueError(f"model.rope_type={rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / factor, base)  # long wavelengths: interpolated
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_factors(head_dim: int, theta: float, **scaling) -> torch.Tensor:
    """llama.cpp's per-frequency divisors (``rope_freqs.weight``): unscaled / scaled frequencies, float32."""
    return inv_freq(head_dim, theta) / inv_freq(head_dim, theta, **scaling)


def check_config(cfg) -> None:
    """ValueError naming the ``model.rope_*`` field a Llama config gets wrong (called by its ``__post_init__``)."""
    if cfg.rope_type not in ROPE_TYPES:
        raise ValueError(f"model.rope_type={cfg.rope_type!r}; allowed: {', '.join(ROPE_TYPES)} (other scalings, "
                         "yarn, dynamic, longrope, are not implemented)")
    if not (cfg.rope_factor > 0 and math.isfinite(cfg.rope_factor)):
        raise ValueError(f"model.rope_factor={cfg.rope_factor} must be a positive number")
    if cfg.rope_type == "default" and cfg.rope_factor != 1.0:
        raise ValueError(f"model.rope_factor={cfg.rope_factor} scales nothing with model.rope_type=default; "
                         "set model.rope_type linear or llama3")
    if cfg.rope_original_context < 0:
        raise ValueError(f"model.rope_original_context={cfg.rope_original_context} must be >= 0")
    if cfg.rope_type == "llama3":
        lo, hi = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        if not (0 < lo < hi and math.isfinite(hi)):
            raise ValueError(f"model.rope_low_freq_factor={lo} and model.rope_high_freq_factor={hi}: llama3 rope "
                             "scaling needs 0 < low < high")
        if cfg.rope_original_context < 1:
            raise ValueError("model.rope_original_context=0: llama3 rope scaling needs the context the model was "
                             "trained on (Hugging Face's original_max_position_embeddings)")


def scaling_of(cfg) -> dict:
    """The keyword arguments :func:`inv_freq` takes after ``head_dim`` and ``theta``, from a Llama config."""
    return dict(rope_type=cfg.rope_type, factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor, original_context=cfg.rope_original_context)
