"""Attention backend switch: ``model.attn_backend`` picks the kernel behind PyTorch's SDPA.

    >>> sdpa = sdpa_for("cudnn")          # then sdpa(q, k, v, is_causal=True)
    >>> sdpa_problem("efficient", torch.device("cpu"), torch.float32, 64)
    'model.attn_backend=efficient: SDPA has no efficient kernel for cpu float32 ...'

"auto" lets SDPA choose (cuDNN on H100 with torch 2.11). The others pin one kernel with
``torch.nn.attention.sdpa_kernel``; ``sdpa_problem`` probes the device once with a tiny call so a
backend the GPU, dtype or torch build cannot run is refused before training, never measured as
another. On CPU only math and flash exist.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS: dict[str, SDPBackend | None] = {
    "auto": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CPU_BACKENDS = ("auto", "math", "flash")


def sdpa_for(backend: str) -> Callable[..., torch.Tensor]:
    """``F.scaled_dot_product_attention``, run inside the chosen backend when it is not "auto"."""
    if backend not in BACKENDS:
        raise ValueError(f"model.attn_backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "auto":
        return F.scaled_dot_product_attention
    kernel = BACKENDS[backend]
    warned: list[bool] = []

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        if q.device.type != "cuda" and backend not in CPU_BACKENDS:
            # e.g. a checkpoint trained with cudnn attention, sampled on CPU: fall back, say so once
            if not warned:
                warnings.warn(f"model.attn_backend={backend} has no {q.device.type} kernel; using auto", stacklevel=2)
                warned.append(True)
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    return sdpa


def sdpa_problem(backend: str, device: torch.device, dtype: torch.dtype, head_size: int,
                 gqa: bool = False) -> str | None:
    """Why ``backend`` cannot run causal attention on ``device`` in ``dtype``, or None (probed with the
    model's own head layout: ``gqa`` = fewer key/value heads than query heads, which some kernels lack)."""
    if backend == "auto":
        return None
    where = f"{device.type} {str(dtype).replace('torch.', '')} head size {head_size}" + (
        " with grouped-query attention" if gqa else "")
    if device.type != "cuda" and backend not in CPU_BACKENDS:
        return (f"model.attn_backend={backend}: SDPA has no {backend} kernel on {where} (CPU has "
                f"{', '.join(CPU_BACKENDS)}); use --model.attn_backend auto")
    q = torch.randn(1, 2, 16, head_size, device=device, dtype=dtype)
    kv = q[:, :1] if gqa else q
    try:
        with sdpa_kernel(BACKENDS[backend]):
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=gqa)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0][:160]
        return (f"model.attn_backend={backend}: SDPA has no {backend} kernel for {where} here ({first}); "
                "use --model.attn_backend auto")
    return None
