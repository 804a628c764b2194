"""Time the GPT-2 block's fused kernels against what torch.compile makes of the same ops (CUDA only).

    python scripts/bench_fused_block.py [--json OUT.json]

GPT-2 124M shapes, one micro-step of B 64, T 1024, under bf16 autocast as in training: the attention add
+ ln_2 at C 768 (x float32, the attention output bf16, y cast to bf16 for c_fc) and bias + tanh GELU at 4C 3072 in bf16, forward and backward
each, median of ``triton.testing.do_bench`` over fresh random inputs (never zeros). Prints ms per
micro-step and per 524,288-token step (x 12 layers x 8 micro-steps) beside the bandwidth floor and the
prediction written in gptforge/kernels/fused_block.py.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F


def _bench(fn, warmup=25, rep=100) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_fused_block.py: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from gptforge.kernels.fused_block import add_layer_norm, bias_gelu

    dev, N, C = "cuda", args.batch * 1024, 768
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, C, device=dev, generator=g, requires_grad=True)
    r = torch.randn(N, C, device=dev, generator=g).bfloat16().requires_grad_()
    w = torch.randn(C, device=dev, generator=g).requires_grad_()
    b = torch.randn(C, device=dev, generator=g).requires_grad_()
    a = torch.randn(N, 4 * C, device=dev, generator=g).bfloat16().requires_grad_()
    bb = torch.randn(4 * C, device=dev, generator=g).requires_grad_()
    gs = torch.randn(N, C, device=dev, generator=g)
    gy = torch.randn(N, C, device=dev, generator=g).bfloat16()  # y feeds c_fc: bf16 under autocast
    gg = torch.randn(N, 4 * C, device=dev, generator=g).bfloat16()

    def ln_plain(x, r, w, b):  # as the block runs it under autocast: float32 LayerNorm, cast for c_fc
        s = x + r
        return s, F.layer_norm(s, (C,), w, b, 1e-5).to(torch.bfloat16)

    def gelu_plain(a, bb):
        return F.gelu(a + bb.to(a.dtype), approximate="tanh")

    ln_compiled, gelu_compiled = torch.compile(ln_plain), torch.compile(gelu_plain)
    rows = []

    def fwd_bwd(name, f, inputs, grads):
        def fwd():
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                f(*inputs)

        def both():
            for t in inputs:
                t.grad = None  # no gradient accumulation inside the timing
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = f(*inputs)
            out = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(out, grads)

        both()  # compile / autotune outside the timing
        rows.append({"what": name, "fwd_ms": _bench(fwd), "fwd_bwd_ms": _bench(both)})

    fwd_bwd("add+LayerNorm, torch.compile", ln_compiled, (x, r, w, b), (gs, gy))
    fwd_bwd("add+LayerNorm, fused kernel", lambda *t: add_layer_norm(*t, 1e-5), (x, r, w, b), (gs, gy))
    fwd_bwd("bias+GELU, torch.compile", gelu_compiled, (a, bb), (gg,))
    fwd_bwd("bias+GELU, fused kernel", bias_gelu, (a, bb), (gg,))
    # floors at the measured copy bandwidth: bytes each way (see fused_block.py's docstring)
    n = torch.empty(1 << 28, device=dev, dtype=torch.float32)
    copy_ms = _bench(lambda: n.clone())
    bw = 2 * n.numel() * 4 / (copy_ms / 1e3)  # bytes read + written per second
    # add+LN: forward reads x (4) and r (2), writes s (4) and y (2); backward reads d(y) (2), d(s) (4), s (4),
    # writes d(x) (4) and d(r) (2). bias+GELU: 2 + 2 forward, 2 + 2 + 2 backward
    floors = {"add+LayerNorm": N * C * (12 + 16) / bw * 1e3, "bias+GELU": N * 4 * C * 10 / bw * 1e3}
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; B {args.batch} T 1024; x 12 layers x 8 micro-steps = one 524,288-token step")
    print(f"{'kernel':34} {'fwd ms':>8} {'fwd+bwd ms':>11} {'per step ms':>12} {'floor/step':>11}")
    for row in rows:
        floor = floors[row["what"].split(",")[0]] * 96
        row["per_step_ms"] = row["fwd_bwd_ms"] * 96
        print(f"{row['what']:34} {row['fwd_ms']:8.3f} {row['fwd_bwd_ms']:11.3f} {row['per_step_ms']:12.1f} {floor:11.1f}")
    print("predicted saving per step (fused_block.py): add+LayerNorm ~10 ms, bias+GELU ~15 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bandwidth_Bps": bw,
                       "rows": rows, "floor_ms_per_micro_step": floors}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
