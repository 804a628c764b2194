"""Fused kernels for the GPT-2 block's non-matmul time, as llm.c does (issue 58).

    >>> s, y = add_layer_norm(x, r, ln.weight, ln.bias, ln.eps)   # s = x + r; y = LayerNorm(s)
    >>> y = bias_gelu(a, fc.bias)                                  # y = GELU_tanh(a + bias)

**add_layer_norm** (``model.fused_ln_residual``): the attention branch's residual add and the second
LayerNorm in one pass over each row (llm.c's ``fused_residual_forward``). Forward reads x and r and
writes s, y and two floats per row (mean, 1/std); backward reads d(y), d(s), s, the row stats and the
weight once, writes d(x) = d(residual) (s = x + r), in x's dtype and, where r's differs (autocast: a bf16
branch on a float32 stream), once more in r's, and per-program partial sums of d(weight) and d(bias),
summed by PyTorch over N/64 rows of partials.

**bias_gelu** (``model.fused_bias_gelu``): c_fc's bias and GPT-2's tanh GELU in one elementwise pass
(c_fc's matmul runs without its bias). Forward reads a, writes GELU(a + b); backward reads d(y) and a,
writes d(a) and per-program partial column sums of d(a) for d(bias), so the bias gradient needs no
separate pass over the 4C-wide gradient.

Both compute in float32 registers whatever their inputs and keep PyTorch's autocast dtypes: s in
``result_type(x, r)``, LayerNorm's y in float32, or under autocast in the autocast dtype the next matmul
would cast it to (the same single rounding, without a cast pass), GELU's output in a's dtype (bf16 under
autocast, as the plain path's). Each launcher is a ``torch.library`` custom op, so a
compiled model keeps one graph (no graph break per block); each pair is joined by a
``torch.autograd.Function``. On CPU the kernels run only under ``TRITON_INTERPRET=1`` (the tests);
``gptforge.training.switches`` refuses the switches elsewhere.

Predicted saving, GPT-2 124M, B 64, T 1024, one 524,288-token step on H100 (../shared/GPU-PROFILE.md:
1,147 ms a step; LayerNorm fwd+bwd 93 ms, GELU fwd+bwd 79 ms, copies/casts/transposes/sums 81 ms), with
~3 TB/s of HBM and 50.3M residual elements (B*T*C) per micro-step, 8 micro-steps:

- add_layer_norm, 12 of the 25 LayerNorms (the attention add + ln_2 inside each block): under
  torch.compile Inductor already fuses the add into the LayerNorm forward, so the forward gains
  nothing; the gain is LayerNorm backward's weight/bias reduction, which Inductor does as a second
  pass re-reading d(y) and x (8 B/element). 12 layers x 8 micro-steps x 50.3M x 8 B = 39 GB = ~13 ms.
  **Predicted: ~10 ms (0.9%), at most ~20 ms**, should Inductor's LayerNorm backward be two passes
  for every one of its LayerNorms and the add's backward a separate pass.
- bias_gelu: GELU alone is 4 B/element forward (bf16 in, bf16 out) and 6 B backward over 201M (B*T*4C)
  elements per micro-step: 12 x 8 x 201M x 10 B = 193 GB = ~64 ms floor against 79 ms measured, and
  c_fc's bias gradient is a separate column sum re-reading d(a) (2 B/element: 39 GB, ~13 ms, inside
  the 81 ms of sums). **Predicted: ~15 ms (1.3%)**: the bias-gradient pass (~13 ms) plus a little of
  the GELU kernels' gap to bandwidth. The whole 64 ms goes only with GELU in the matmul's epilogue
  (llm.c's cuBLASLt GELU_AUX epilogue), which a Triton elementwise kernel cannot reach.
"""

from __future__ import annotations

import torch

from gptforge.kernels.fused_ce import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _add_ln_fwd_kernel(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps,
                           HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        off = row * n_cols + cols
        s = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32) + tl.load(r_ptr + off, mask=mask,
                                                                               other=0.0).to(tl.float32)
        s = s.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + off, s, mask=mask)
        s = s.to(tl.float32)  # normalise s as stored (a bf16 s as rounded), as LayerNorm(x + r) would
        mean = tl.sum(s, axis=0) / n_cols
        diff = tl.where(mask, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / n_cols + eps)
        y = diff * rstd * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def _add_ln_bwd_kernel(dy_ptr, ds_ptr, s_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr, dw_ptr, db_ptr,
                           n_rows, n_cols, rows_per_prog,
                           HAS_DS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK,), tl.float32)
        db = tl.zeros((BLOCK,), tl.float32)
        start = pid * rows_per_prog
        for i in range(0, rows_per_prog):
            row = (start + i).to(tl.int64)
            if row < n_rows:
                off = row * n_cols + cols
                s = tl.load(s_ptr + off, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
                mean = tl.load(mean_ptr + row)
                rstd = tl.load(rstd_ptr + row)
                xhat = tl.where(mask, (s - mean) * rstd, 0.0)
                wdy = w * dy
                c1 = tl.sum(xhat * wdy, axis=0) / n_cols
                c2 = tl.sum(wdy, axis=0) / n_cols
                dx = (wdy - (xhat * c1 + c2)) * rstd
                if HAS_DS:  # the gradient reaching s from the residual stream's later uses
                    dx += tl.load(ds_ptr + off, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                if SPLIT:  # x and r of different dtypes (autocast: float32 stream, bf16 branch): each its own
                    tl.store(dr_ptr + off, dx.to(dr_ptr.dtype.element_ty), mask=mask)
                dw += dy * xhat
                db += dy
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)
        tl.store(db_ptr + pid * n_cols + cols, db, mask=mask)

    @triton.jit
    def _tanh(z):
        return 2.0 / (1.0 + tl.exp(-2.0 * z)) - 1.0  # exact in float32 up to rounding; no overflow either way

    @triton.jit
    def _biased_tile(a_ptr, b_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's (BLOCK_R, BLOCK_C) tile of a + b in float32, its offsets, its mask and its columns."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        off = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        h = tl.load(a_ptr + off, mask=mask, other=0.0).to(tl.float32)
        h += tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
        return h, off, mask, cols

    @triton.jit
    def _bias_gelu_fwd_kernel(a_ptr, b_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        h, off, mask, cols = _biased_tile(a_ptr, b_ptr, n_rows, n_cols, BLOCK_R, BLOCK_C)
        k = 0.7978845608028654  # sqrt(2 / pi)
        y = 0.5 * h * (1.0 + _tanh(k * (h + 0.044715 * h * h * h)))
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _bias_gelu_bwd_kernel(dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n_rows, n_cols,
                              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        h, off, mask, cols = _biased_tile(a_ptr, b_ptr, n_rows, n_cols, BLOCK_R, BLOCK_C)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        k = 0.7978845608028654
        u = k * (h + 0.044715 * h * h * h)
        t = _tanh(u)
        # d/dh 0.5 h (1 + tanh(u)) = 0.5 (1 + t) + 0.5 h (1 - t^2) k (1 + 3 * 0.044715 h^2)
        dh = dy * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * k * (1.0 + 0.134145 * h * h))
        dh = tl.where(mask, dh, 0.0)
        tl.store(da_ptr + off, dh.to(da_ptr.dtype.element_ty), mask=mask)
        tl.store(db_ptr + tl.program_id(0) * n_cols + cols, tl.sum(dh, axis=0), mask=cols < n_cols)


def _need_triton() -> None:
    if triton is None:
        raise RuntimeError("the fused block kernels need triton (pip install 'gptforge[kernels]')")


_ROWS_PER_PROG = 64  # LayerNorm backward: rows per program, so d(weight)/d(bias) partials are N/64 rows
_GELU_ROWS, _GELU_COLS = 32, 128  # bias_gelu's tile: 32 rows of partial bias sums per (4C)-wide row


# --- the launchers, as custom ops: torch.compile sees one opaque op each, not a graph break -----------

@torch.library.custom_op("gptforge::add_ln_fwd", mutates_args=())
def _add_ln_fwd(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float,
                y_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _need_triton()
    C = x.shape[-1]
    x2, r2 = x.reshape(-1, C).contiguous(), r.reshape(-1, C).contiguous()
    N = x2.shape[0]
    s = torch.empty(N, C, dtype=torch.result_type(x, r), device=x.device)
    y = torch.empty(N, C, dtype=y_dtype, device=x.device)
    mean = torch.empty(N, dtype=torch.float32, device=x.device)
    rstd = torch.empty(N, dtype=torch.float32, device=x.device)
    _add_ln_fwd_kernel[(N,)](x2, r2, w.contiguous(), w if b is None else b.contiguous(), s, y, mean, rstd, C, eps,
                             HAS_BIAS=b is not None, BLOCK=triton.next_power_of_2(C), num_warps=4)
    return s.view(x.shape), y.view(x.shape), mean, rstd


@_add_ln_fwd.register_fake
def _(x, r, w, b, eps, y_dtype):
    N = x.numel() // x.shape[-1]
    return (x.new_empty(x.shape, dtype=torch.result_type(x, r)), x.new_empty(x.shape, dtype=y_dtype),
            x.new_empty(N, dtype=torch.float32), x.new_empty(N, dtype=torch.float32))


@torch.library.custom_op("gptforge::add_ln_bwd", mutates_args=())
def _add_ln_bwd(dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor, w: torch.Tensor, mean: torch.Tensor,
                rstd: torch.Tensor, x_dtype: torch.dtype,
                r_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """d(x), d(r) (empty when the dtypes agree: d(x) is both), d(weight), d(bias), written in one pass."""
    _need_triton()
    C = s.shape[-1]
    s2, dy2 = s.reshape(-1, C).contiguous(), dy.reshape(-1, C).contiguous()
    N = s2.shape[0]
    progs = triton.cdiv(N, _ROWS_PER_PROG)
    dx = torch.empty(N, C, dtype=x_dtype, device=s.device)
    split = r_dtype != x_dtype
    dr = torch.empty(N if split else 0, C, dtype=r_dtype, device=s.device)
    dw = torch.empty(progs, C, dtype=torch.float32, device=s.device)
    db = torch.empty(progs, C, dtype=torch.float32, device=s.device)
    ds2 = dy2 if ds is None else ds.reshape(-1, C).contiguous()
    _add_ln_bwd_kernel[(progs,)](dy2, ds2, s2, w.contiguous(), mean, rstd, dx, dx if dr.numel() == 0 else dr, dw, db,
                                 N, C, _ROWS_PER_PROG, HAS_DS=ds is not None, SPLIT=split,
                                 BLOCK=triton.next_power_of_2(C), num_warps=4)
    return dx.view(s.shape), dr.view(s.shape) if split else dr, dw.sum(0), db.sum(0)


@_add_ln_bwd.register_fake
def _(dy, ds, s, w, mean, rstd, x_dtype, r_dtype):
    C = s.shape[-1]
    dr = s.new_empty(s.shape if r_dtype != x_dtype else (0, C), dtype=r_dtype)
    return s.new_empty(s.shape, dtype=x_dtype), dr, s.new_empty(C, dtype=torch.float32), \
        s.new_empty(C, dtype=torch.float32)


@torch.library.custom_op("gptforge::bias_gelu_fwd", mutates_args=())
def _bias_gelu_fwd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _need_triton()
    C = a.shape[-1]
    a2 = a.reshape(-1, C).contiguous()
    N = a2.shape[0]
    y = torch.empty_like(a2)
    grid = (triton.cdiv(N, _GELU_ROWS), triton.cdiv(C, _GELU_COLS))
    _bias_gelu_fwd_kernel[grid](a2, b.contiguous(), y, N, C, BLOCK_R=_GELU_ROWS, BLOCK_C=_GELU_COLS, num_warps=4)
    return y.view(a.shape)


@_bias_gelu_fwd.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op("gptforge::bias_gelu_bwd", mutates_args=())
def _bias_gelu_bwd(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _need_triton()
    C = a.shape[-1]
    a2, dy2 = a.reshape(-1, C).contiguous(), dy.reshape(-1, C).contiguous()
    N = a2.shape[0]
    da = torch.empty_like(a2)
    progs = triton.cdiv(N, _GELU_ROWS)
    db = torch.empty(progs, C, dtype=torch.float32, device=a.device)
    _bias_gelu_bwd_kernel[(progs, triton.cdiv(C, _GELU_COLS))](dy2, a2, b.contiguous(), da, db, N, C,
                                                                BLOCK_R=_GELU_ROWS, BLOCK_C=_GELU_COLS, num_warps=4)
    return da.view(a.shape), db.sum(0)


@_bias_gelu_bwd.register_fake
def _(dy, a, b):
    return torch.empty_like(a), a.new_empty(a.shape[-1], dtype=torch.float32)


# --- autograd --------------------------------------------------------------------------------------

class _AddLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, r, w, b, eps, y_dtype):
        s, y, mean, rstd = _add_ln_fwd(x, r, w, b, eps, y_dtype)
        ctx.save_for_backward(s, w, mean, rstd)
        ctx.dtypes = (x.dtype, r.dtype, w.dtype, None if b is None else b.dtype)
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        s, w, mean, rstd = ctx.saved_tensors
        x_dt, r_dt, w_dt, b_dt = ctx.dtypes
        dx, dr, dw, db = _add_ln_bwd(dy, ds, s, w, mean, rstd, x_dt, r_dt)
        return dx, dx if r_dt == x_dt else dr, dw.to(w_dt), None if b_dt is None else db.to(b_dt), None, None


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _bias_gelu_fwd(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        da, db = _bias_gelu_bwd(dy, a, b)
        return da, db.to(b.dtype)


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + r`` and ``y = LayerNorm(s)`` over the last dimension, in one kernel each way.
    Returns (s, y): s in ``result_type(x, r)``; y in float32, or in the autocast dtype under autocast:
    autocast's LayerNorm gives float32 that the next matmul casts to bf16 at once, one rounding either
    way, so the kernel writes the bf16 (2 bytes an element instead of 4, and no cast pass)."""
    dev = x.device.type
    y_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.float32
    return _AddLayerNorm.apply(x, r, weight, bias, eps, y_dtype)


def bias_gelu(a: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``GELU_tanh(a + bias)`` (bias broadcast over the rows) in a's dtype, in one kernel each way."""
    return _BiasGelu.apply(a, bias)
