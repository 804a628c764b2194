"""Rowwise-scaled float8 (e4m3) matmul for the lm_head, through ``torch._scaled_mm``.

    >>> logits = fp8_linear(x, model.lm_head.weight)   # (..., C) @ (V, C)^T -> (..., V)

Forward: every row of ``x`` and every row of ``W`` (one per vocabulary entry) gets its own scale
``amax / 448`` (e4m3's largest finite value), is cast to float8, and ``torch._scaled_mm``
multiplies them with the scales applied in its epilogue, giving bf16 (or float32) logits.
Rowwise scales keep one outlier token or embedding row from flattening the rest, which is what lost
with per-tensor scaling at C=768 (GPU-PROFILE.md). Backward runs in the forward's 16-bit dtype
(``d_x = g @ W``, ``d_W = g^T @ x``): float8 only where the lm_head's largest matmul is, forward.
``fp8_linear_reference`` is the same quantization done in float32 ops, for tests.

Needs a GPU of compute capability 8.9 or newer (Ada, Hopper) for speed; torch's CPU build also
has ``_scaled_mm``, which is how the math is tested without one. ``K`` and ``V`` must be multiples
of 16 (768 and 50304 are).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def quantize_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) -> (float8_e4m3fn (M, K), float32 scale (M, 1)) with t ~= q * scale."""
    amax = t.detach().abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out_dtype = _out_dtype(x)
        x2 = x.reshape(-1, x.size(-1))  # (M, K)
        xq, sx = quantize_rowwise(x2)
        wq, sw = quantize_rowwise(weight)  # (N, K), (N, 1)
        # mat2 must be column-major: wq.t() of a row-major wq is
        out = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), out_dtype=out_dtype)  # (M, N)
        ctx.save_for_backward(x2.to(out_dtype), weight.to(out_dtype))
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return out.reshape(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, w = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1)).to(x2.dtype)  # (M, N)
        dx = (g @ w).to(ctx.x_dtype).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = (g.t() @ x2).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return dx, dw


def fp8_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T`` with both operands in rowwise-scaled float8 (forward), 16-bit backward."""
    return _Fp8Linear.apply(x, weight)


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same rowwise quantization, dequantized and multiplied in float32 (no ``_scaled_mm``)."""
    x2 = x.reshape(-1, x.size(-1))
    xq, sx = quantize_rowwise(x2)
    wq, sw = quantize_rowwise(weight)
    out = (xq.float() * sx) @ (wq.float() * sw).t()
    return out.reshape(*x.shape[:-1], weight.size(0))


def fp8_problem(device: torch.device) -> str | None:
    """Why ``model.lm_head_fp8`` cannot run on ``device`` with this torch, or None."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"model.lm_head_fp8=true needs torch._scaled_mm and float8 (torch {torch.__version__} lacks them)"
    if device.type != "cuda":
        return (f"model.lm_head_fp8=true needs a CUDA GPU of compute capability >= 8.9 (Ada/Hopper); "
                f"this run is on {device.type}: use --model.lm_head_fp8 false")
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9):
        return (f"model.lm_head_fp8=true needs compute capability >= 8.9; {torch.cuda.get_device_name(device)} "
                f"is {cc[0]}.{cc[1]}: use --model.lm_head_fp8 false")
    return None
