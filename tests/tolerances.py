"""Tolerances derived from float32 rounding, for tests that compare two computations taking different float
paths (2 ranks against 1 accumulating, a packed row against one row per reply, another allocator or CPU).

Two runs of the same math on different paths agree only as far as rounding lets them: each reordered sum
of n terms of size M moves by up to ~n * eps * M (eps = 2**-23), and, as rounding errors are signed, by
~sqrt(n) * eps * M in practice. Which kernel a CPU picks (AVX2 or AVX-512, oneDNN's blocking, a block's
alignment) changes the order, so a tolerance fitted to one machine's difference fails on another; these
helpers state the bound and what it is made of instead.

Quantities whose exact value is zero are pure rounding noise, whatever their size on one machine: GPT-2's
attention key bias is one (softmax is shift-invariant, so its gradient is zero in exact arithmetic, and
Adam, which divides by the gradient's own RMS, turns that noise into steps of a sizeable share of the
learning rate). They are compared against the largest move the optimizer can make, never against a
rounding bound.
"""

from __future__ import annotations

import math

import torch

EPS32 = 2.0**-23  # float32's machine epsilon


def sum_tol(magnitude: float, n_terms: int, safety: float = 4.0) -> float:
    """The rounding of a reordered float32 sum of ``n_terms`` terms of size ``magnitude``: sqrt(n) * eps * M
    (signed errors partly cancel), times ``safety`` for the tail of that random walk."""
    return safety * math.sqrt(n_terms) * EPS32 * magnitude


def _key_slice(name: str, t: torch.Tensor) -> slice | None:
    """The key third of a fused GPT-2 q/k/v bias (``...attn.c_attn.bias``), else None."""
    if name.endswith("attn.c_attn.bias") and t.dim() == 1 and t.numel() % 3 == 0:
        n = t.numel() // 3
        return slice(n, 2 * n)
    return None


def assert_adam_trained_alike(w1: dict[str, torch.Tensor], w2: dict[str, torch.Tensor], *, lr: float, steps: int,
                              grad_rel: float = 1e-3, noise_only: tuple[str, ...] = ()) -> None:
    """Two state dicts trained by Adam(W) from the same start on the same data along different float paths.

    Adam's update is m/sqrt(v): homogeneous of degree 0 in the gradient, so a relative gradient difference r
    becomes a difference of at most ~r * lr per step. ``grad_rel`` bounds r for a gradient that is a reordered
    sum (1e-3 ~ 8,400 eps: sums of up to a few thousand tokens' terms of either sign, such as an embedding row
    gathered over the batch); every element then agrees to ``steps * lr * grad_rel``, plus 1e-4 relative for
    the weight's own size (its last bits after ``steps`` additions).

    The key bias's gradient is rounding noise (see the module docstring), so Adam moves it by up to ~lr a
    step in a direction the noise picks: it is checked against ``2 * lr * steps``, the most two runs can part.
    A bug in what a rank contributes (a dropped, doubled or misaligned micro-batch) changes gradients by O(1)
    and the weights by ~lr, far above ``steps * lr * grad_rel``.

    ``noise_only``: name suffixes of further tensors whose gradient is zero in exact arithmetic for the loss
    at hand (the caller says why), bounded like the key bias."""
    assert w1.keys() == w2.keys()
    atol = steps * lr * grad_rel
    for k in w1:
        a, b = w1[k].detach().double(), w2[k].detach().double()
        if k.endswith(noise_only) and noise_only:
            torch.testing.assert_close(a, b, rtol=0, atol=2 * lr * steps,
                                       msg=lambda m, k=k: f"{k} (zero gradient in exact arithmetic): {m}")
            continue
        key = _key_slice(k, a)
        if key is not None:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=2 * lr * steps,
                                       msg=lambda m, k=k: f"{k} (key third, rounding noise under Adam): {m}")
            keep = torch.ones_like(a, dtype=torch.bool)
            keep[key] = False
            a, b = a[keep], b[keep]
        _close_but_for_cancelled_gradients(k, a, b, atol=atol, most=2 * lr * steps)


# Of a tensor's elements, the share that may part by up to Adam's largest move: those whose gradient is a sum
# that cancels to within rounding of zero. Such a gradient has no bounded relative error, and Adam's normalised
# step m/sqrt(v) then goes whichever way the rounding says (a tied embedding row of a token the batch barely
# holds gets +/- terms from the head's softmax over every position). They are few: 1 in 10,000 allows 160 of
# GPT-2 d4's 1.6M embedding elements. A bug in what a rank contributes (a dropped, doubled or misaligned
# micro-batch) changes O(1) of every gradient, so it moves most elements of every tensor by ~lr, far past this.
CANCELLED_SHARE = 1e-4


def _close_but_for_cancelled_gradients(name: str, a: torch.Tensor, b: torch.Tensor, *, atol: float,
                                       most: float) -> None:
    """Every element of ``a`` within ``atol`` (+1e-4 relative) of ``b``, but for at most CANCELLED_SHARE of
    them (at least one), which may part by up to ``most``."""
    diff = (a - b).abs()
    over = diff > atol + 1e-4 * b.abs()
    n_over, allowed = int(over.sum()), max(1, int(CANCELLED_SHARE * a.numel()))
    if n_over == 0:
        return
    worst = float(diff[over].max())
    assert n_over <= allowed and worst <= most, (
        f"{name}: {n_over} of {a.numel()} elements differ by more than {atol:.3g} (+1e-4 relative), the most by "
        f"{worst:.3g}; at most {allowed} (gradients that cancel to rounding) may, each by up to {most:.3g}")
