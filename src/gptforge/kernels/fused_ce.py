"""Fused classifier: lm_head matmul, cross-entropy and d(logits) in one pass (llm.c's design).

    >>> loss = fused_linear_cross_entropy(x, model.lm_head.weight, targets, vocab_size=50257)
    >>> loss.backward()   # d_x = d_logits @ W, d_W = d_logits^T @ x: two matmuls, nothing else

The forward multiplies ``x`` (N, C) by ``W^T`` into one logits buffer (N, Vp) in the autocast dtype
(bf16 on GPU), then one Triton program per row streams the row twice in ``BLOCK``-wide tiles: an
online-softmax pass (running max and sum of exponentials, in float32 registers) gives the row's
log-sum-exp and loss, and a second pass writes ``(softmax - onehot) / num_valid`` over the logits
in place. So float32 logits never exist in memory, the buffer that held the logits holds
d(logits) for backward, and backward is the two matmuls scaled by the incoming gradient. Columns
from ``vocab_size`` to Vp (the padding to a multiple of 128) get no probability and a zero
gradient; targets equal to -1 are ignored (no loss, zero gradient), as in ``F.cross_entropy``.
The loss is the mean over the non-ignored rows (NaN when every row is ignored, like PyTorch).
Targets are not range-checked (that would cost a host sync per micro-step): the loader's tokens
are < vocab_size by construction. No row chunking is needed to keep float32 logits from existing:
the kernel upcasts in registers, and the one full-size buffer is the bf16 logits/d(logits), which
backward needs whole (llm.c keeps the same buffer).

The kernel needs ``triton``; on CPU it runs only under ``TRITON_INTERPRET=1`` (tests). The model
uses it for training forwards when ``model.fused_ce`` is true; evaluation and generation keep the
plain path, which is also the reference. The gradient is computed in the forward assuming the
loss is used once (``loss.backward()`` or ``loss * scale``): backward rescales it by the incoming
gradient, so a second backward through the same graph is not supported (the buffer is reused).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the plain path needs no triton; gptforge.training.switches refuses the switch
    triton = None


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _ce_loss_dlogits_kernel(
        logits_ptr,  # (N, n_cols) logits in, d(logits) out (in place)
        stride_row,
        targets_ptr,  # (N,) int64, -1 = ignore
        loss_ptr,  # (N,) float32 per-row loss out
        scale_ptr,  # (1,) float32: 1 / number of non-ignored rows
        n_real,  # real vocabulary size V (columns >= V are padding)
        n_cols,  # padded vocabulary size Vp
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride_row
        target = tl.load(targets_ptr + row)
        # pass 1: online softmax over the real columns -> log-sum-exp
        m = tl.full((), float("-inf"), tl.float32)
        d = tl.full((), 0.0, tl.float32)
        for start in range(0, n_real, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < n_real, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(d)
        valid = target >= 0
        safe_target = tl.where(valid, target, 0)
        x_t = tl.load(base + safe_target).to(tl.float32)
        tl.store(loss_ptr + row, tl.where(valid, lse - x_t, 0.0))
        scale = tl.where(valid, tl.load(scale_ptr), 0.0)
        # pass 2: d(logits) = (softmax - onehot) * scale, written over the logits; padding gets 0
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < n_real, other=float("-inf")).to(tl.float32)
            p = tl.exp(x - lse)
            g = (p - tl.where(cols == target, 1.0, 0.0)) * scale
            tl.store(base + cols, g.to(logits_ptr.dtype.element_ty), mask=cols < n_cols)


def loss_and_dlogits_(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, block: int = 4096,
                      num_warps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``logits`` (N, Vp) becomes d(mean loss)/d(logits). Returns (mean loss, num_valid)."""
    if triton is None:
        raise RuntimeError("the fused classifier needs triton (pip install 'gptforge[kernels]')")
    N, n_cols = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary")
    if not 0 < vocab_size <= n_cols:
        raise ValueError(f"vocab_size {vocab_size} must be in (0, {n_cols}]")
    targets = targets.reshape(-1).contiguous()
    n_valid = (targets >= 0).sum()
    scale = (1.0 / n_valid.clamp(min=1).float()).reshape(1)
    row_loss = torch.empty(N, dtype=torch.float32, device=logits.device)
    block = min(block, triton.next_power_of_2(n_cols))
    _ce_loss_dlogits_kernel[(N,)](logits, logits.stride(0), targets, row_loss, scale, vocab_size, n_cols,
                                  BLOCK=block, num_warps=num_warps)
    return row_loss.sum() / n_valid, n_valid


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        # the matmul runs in the autocast dtype when autocast is on (bf16 logits), else in x's dtype
        dev = x.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        x2 = x.reshape(-1, x.size(-1)).to(dtype)  # (N, C)
        w = weight.to(dtype)  # (Vp, C)
        with torch.autocast(dev, enabled=False):
            dlogits = x2 @ w.t()  # (N, Vp): the logits, soon their gradient
        loss, _ = loss_and_dlogits_(dlogits, targets, vocab_size)
        ctx.save_for_backward(dlogits, x2, w)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        dlogits, x2, w = ctx.saved_tensors
        g = grad_loss.to(torch.float32)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = ((dlogits @ w).float() * g).to(ctx.x_dtype).reshape(ctx.x_shape)  # (N, C)
        if ctx.needs_input_grad[1]:
            dw = ((dlogits.t() @ x2).float() * g).to(ctx.w_dtype)  # (Vp, C)
        return dx, dw, None, None


@torch.compiler.disable  # the kernel is its own fused op; the compiled trunk ends at the final LayerNorm
def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight^T`` (first ``vocab_size`` columns) against ``targets``."""
    return _FusedLinearCrossEntropy.apply(x, weight, targets, vocab_size)
