"""Rotary position embeddings: the frequencies, with the two rope scalings small open models ship
(``linear`` and ``llama3``), the angles (:func:`rope_cos_sin`) and the rotation (:func:`apply_rope`).

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


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float, **scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary angles for positions ``pos`` ((T,) or (B, T)) -> cos, sin of shape (..., T, head_dim).

    Channel i and i + head_dim/2 form a pair rotated by pos * theta^(-2i/head_dim) (HF's layout, not
    the interleaved pairs of Meta's reference code), the frequencies scaled as ``scaling`` says
    (:func:`inv_freq`). Computed in float32 on the fly: no table to outgrow, nothing for
    ``.to(bfloat16)`` to round."""
    inv = inv_freq(head_dim, theta, device=pos.device, **scaling)  # (the name is this module's function)
    freqs = pos.float()[..., None] * inv  # (..., T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, hd)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hd); cos/sin (T, hd) or (B, T, hd), float32. The rotation is done in float32 (as
    HF does) and returned in x's dtype, so bf16 attention gets bf16 inputs with exact angles."""
    if cos.dim() == 3:  # per-row positions: broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


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
    for name in ("rope_low_freq_factor", "rope_high_freq_factor"):  # checked whatever the type: a saved -1 is a typo
        v = getattr(cfg, name)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"model.{name}={v} must be a positive number")
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


def scaling_from_factors(head_dim: int, theta: float, factors: torch.Tensor,
                         original_context: int | None = None) -> dict | None:
    """The inverse of :func:`rope_factors`: llama.cpp's per-frequency divisors (a GGUF's
    ``rope_freqs.weight``, which Llama 3.1/3.2 files carry instead of their scaling parameters) back
    to :func:`inv_freq`'s keyword arguments, or None when no parameters reproduce them (to 1e-5).

    All ones is no scaling, one value everywhere is ``linear``; otherwise ``llama3``: its factor is
    the divisor of the longest wavelength, and the blend between the two thresholds is linear in
    1/wavelength, so two blended frequencies fix ``low/high_freq_factor`` once ``original_context``
    is known (when it is not, ``low_freq_factor`` 1, Meta's value, fixes it)."""
    r = factors.double()
    if r.shape != (head_dim // 2,) or not bool(torch.isfinite(r).all()) or bool((r <= 0).any()):
        return None
    if bool(torch.allclose(r, torch.ones_like(r), rtol=0, atol=1e-6)):
        return {"rope_type": "default"}
    if bool(torch.allclose(r, r[-1].expand_as(r), rtol=1e-6, atol=0)):
        return {"rope_type": "linear", "factor": round(float(r[-1]), 6)}
    factor = float(r[-1])
    wavelen = 2 * math.pi / inv_freq(head_dim, theta).double()
    s = (1 / r - 1 / factor) / (1 - 1 / factor)  # 0 where divided by factor, 1 where kept
    blend = ((s > 1e-5) & (s < 1 - 1e-5)).nonzero().flatten()
    if len(blend) < 2:
        return None
    i, j = int(blend[0]), int(blend[-1])
    a = float((s[j] - s[i]) / (1 / wavelen[j] - 1 / wavelen[i]))  # s = a / wavelen - b
    b = float(a / wavelen[i] - s[i])
    if not (a > 0 and b > 0):
        return None
    orig = original_context or round(a / b)  # low_freq_factor = b * orig / a, high = low + orig / a
    for digits in (3, 4, 5, 6, None):  # the round numbers configs are written with, else the exact fit
        low, high = b * orig / a, b * orig / a + orig / a
        if digits:
            low, high = round(low, digits), round(high, digits)
        out = dict(rope_type="llama3", factor=round(factor, 6) if digits else factor, low_freq_factor=low,
                   high_freq_factor=high, original_context=int(orig))
        if bool(torch.allclose(rope_factors(head_dim, theta, **out).double(), r, rtol=1e-5, atol=0)):
            return out
    return None


def config_fields(scaling: dict) -> dict:
    """:func:`inv_freq`'s keyword arguments as a Llama config's ``rope_*`` fields (the inverse of :func:`scaling_of`)."""
    names = dict(rope_type="rope_type", factor="rope_factor", low_freq_factor="rope_low_freq_factor",
                 high_freq_factor="rope_high_freq_factor", original_context="rope_original_context")
    return {names[k]: v for k, v in scaling.items()}
