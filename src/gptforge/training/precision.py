"""Autocast dtype resolution shared by training, evaluation and benchmarks.

    >>> autocast = autocast_for(torch.device("cuda"), "auto")   # bf16 where the GPU supports it
    >>> with autocast(): logits, _ = model(idx)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

DTYPES = ("auto", "float32", "bfloat16")


def resolve_dtype(device: torch.device, dtype: str = "auto") -> str:
    """"auto" -> "bfloat16" on a CUDA device that supports it, else "float32"."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype


def autocast_for(device: torch.device, dtype: str = "auto") -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of autocast contexts: bf16 autocast, or a no-op for float32."""
    if resolve_dtype(device, dtype) == "float32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
