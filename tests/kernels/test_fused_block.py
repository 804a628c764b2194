"""The GPT-2 block's fused kernels (gptforge.kernels.fused_block) against a float64 PyTorch reference.

add_layer_norm: s = x + r, y = LayerNorm(s); backward gives d(x), d(r), d(weight), d(bias) from the
gradients of both outputs (s feeds the residual stream on, y the MLP). bias_gelu: GELU_tanh(a + b).

On CPU the Triton kernels run under ``TRITON_INTERPRET=1``, which must be set before the kernels are
defined, so the checks run in a fresh subprocess (``python -m tests.kernels.test_fused_block cpu``);
the ``gpu`` tests run the same checks compiled on CUDA, plus 124M shapes in bf16.

Tolerances (norm-relative, ||got - ref|| / ||ref||): float32 carries eps = 1.2e-7 per operation; the
kernels sum at most max(C, N) terms in a changed order (LayerNorm's mean and variance over C columns,
d(weight)/d(bias) over N rows), and each element goes through a handful of further operations, so
``eps * max(C, N) * 4`` bounds the error (3e-5 for the shapes here, whose measured errors are ~1e-7);
a bf16 output is rounded once to 8 bits (2^-8 = 3.9e-3 relative per element, a norm error below it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
EPS32 = torch.finfo(torch.float32).eps
BF16 = 2.0 ** -8  # bf16 keeps 8 significant bits: one rounding is at most this relative error


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(got).all(), "non-finite output"
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def _check(named: dict, tol: float) -> None:
    for name, (got, ref) in named.items():
        err = _rel(got, ref)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g}"


def _add_ln_case(device: str, N: int, C: int, r_dtype: torch.dtype, bias: bool, seed: int):
    from gptforge.kernels.fused_block import add_layer_norm

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, C, generator=g) * 2 + 0.5).to(device)
    r = torch.randn(N, C, generator=g).to(r_dtype).to(device)
    w = (1 + 0.3 * torch.randn(C, generator=g)).to(device)
    b = (0.2 * torch.randn(C, generator=g)).to(device) if bias else None
    gs, gy = torch.randn(N, C, generator=g).to(device), torch.randn(N, C, generator=g).to(device)
    leaves = [t.clone().requires_grad_() for t in (x, r, w)] + ([b.clone().requires_grad_()] if bias else [])
    s, y = add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3] if bias else None, 1e-5)
    assert s.dtype == torch.float32 and y.dtype == torch.float32 and s.shape == y.shape == (N, C)
    ((s * gs).sum() + (y * gy).sum()).backward()
    ref = [t.detach().double().cpu().requires_grad_() for t in leaves]
    S = ref[0] + ref[1]
    Y = F.layer_norm(S, (C,), ref[2], ref[3] if bias else None, 1e-5)
    ((S * gs.double().cpu()).sum() + (Y * gy.double().cpu()).sum()).backward()
    assert leaves[1].grad.dtype == r_dtype  # each input's gradient in its own dtype
    names = ["d_x", "d_residual", "d_weight", "d_bias"]
    out = {"s": (s, S), "y": (y, Y)}
    out.update({names[i]: (leaves[i].grad, ref[i].grad) for i in range(len(leaves))})
    return out


def check_add_layer_norm_float32(device: str) -> None:
    """70 rows (two backward programs of 64 rows, the second a tail), C 48 (not a power of two)."""
    _check(_add_ln_case(device, 70, 48, torch.float32, True, 0), EPS32 * 70 * 4)


def check_add_layer_norm_without_bias(device: str) -> None:
    _check(_add_ln_case(device, 9, 40, torch.float32, False, 1), EPS32 * 40 * 4)


def check_add_layer_norm_bf16_residual(device: str) -> None:
    """An autocast block: the residual stream float32, the attention output bf16; d(residual) in bf16."""
    got = _add_ln_case(device, 33, 64, torch.bfloat16, True, 2)
    d_r = got.pop("d_residual")
    _check(got, EPS32 * 64 * 4)  # the inputs are exactly representable: float32 everywhere else
    _check({"d_residual": d_r}, BF16)


def check_add_layer_norm_under_autocast(device: str) -> None:
    """Under bf16 autocast y comes out in bf16 (what the next matmul would cast autocast's float32 LayerNorm
    to: one rounding), s and d(x) stay float32."""
    from gptforge.kernels.fused_block import add_layer_norm

    g = torch.Generator().manual_seed(7)
    x = torch.randn(21, 64, generator=g).to(device).requires_grad_()
    r = torch.randn(21, 64, generator=g).bfloat16().to(device).requires_grad_()
    w, b = (1 + 0.3 * torch.randn(64, generator=g)).to(device), (0.2 * torch.randn(64, generator=g)).to(device)
    gy = torch.randn(21, 64, generator=g).bfloat16().to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        s, y = add_layer_norm(x, r, w, b, 1e-5)
    assert (s.dtype, y.dtype) == (torch.float32, torch.bfloat16)
    (y.float() * gy.float()).sum().backward()
    X, R = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    Y = F.layer_norm(X + R, (64,), w.double(), b.double(), 1e-5)
    (Y * gy.double()).sum().backward()
    assert x.grad.dtype == torch.float32 and r.grad.dtype == torch.bfloat16
    _check({"s": (s, X + R), "d_x": (x.grad, X.grad)}, EPS32 * 64 * 4)
    _check({"y": (y, Y), "d_residual": (r.grad, R.grad)}, BF16)


def _gelu_case(device: str, N: int, C: int, dtype: torch.dtype, seed: int):
    from gptforge.kernels.fused_block import bias_gelu

    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(N, C, generator=g) * 2).to(dtype).to(device)  # x2: most of GELU's curve, -6..6
    b = (0.5 * torch.randn(C, generator=g)).to(device)
    gy = torch.randn(N, C, generator=g).to(dtype).to(device)
    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = bias_gelu(al, bl)
    assert y.dtype == dtype and al.dtype == dtype
    (y.float() * gy.float()).sum().backward()
    A, B = a.double().cpu().requires_grad_(), b.double().cpu().requires_grad_()
    Y = F.gelu(A + B, approximate="tanh")
    (Y * gy.double().cpu()).sum().backward()
    assert al.grad.dtype == dtype and bl.grad.dtype == torch.float32
    return {"y": (y, Y), "d_a": (al.grad, A.grad), "d_bias": (bl.grad, B.grad)}


def check_bias_gelu_float32(device: str) -> None:
    """70 x 200: tiles of 32 rows x 128 columns with a tail in both directions."""
    _check(_gelu_case(device, 70, 200, torch.float32, 3), EPS32 * 70 * 4)


def check_bias_gelu_bf16(device: str) -> None:
    got = _gelu_case(device, 45, 136, torch.bfloat16, 4)
    _check({k: got[k] for k in ("y", "d_a")}, BF16)  # rounded once to bf16 from float32 work
    _check({"d_bias": got["d_bias"]}, BF16)  # a float32 sum of bf16-rounded d(a)


def check_model_matches_plain(device: str) -> None:
    """GPT-2 with both switches against the same weights on the plain ops, float32, training forward:
    the loss and every gradient; evaluation takes the plain ops (bit for bit)."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=48, block_size=16, vocab_size=96, fused_ce=False)
    torch.manual_seed(0)
    plain = GPT(cfg).to(device).train()
    fused = GPT(GPTConfig(**{**cfg.to_dict(), "fused_ln_residual": True, "fused_bias_gelu": True})).to(device)
    fused.load_state_dict(plain.state_dict())
    fused.train()
    with torch.no_grad():  # biases and LayerNorm weights away from their zero/one init, so their paths count
        for (_, p), (_, q) in zip(plain.named_parameters(), fused.named_parameters(), strict=True):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(device))
            q.copy_(p)
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 96, (2, 11), generator=g).to(device)
    t = torch.randint(0, 96, (2, 11), generator=g).to(device)
    _, ref = plain(idx, t)
    _, got = fused(idx, t)
    ref.backward()
    got.backward()
    _check({"loss": (got.detach(), ref.detach())}, EPS32 * 48 * 4)
    grads = dict(fused.named_parameters())
    _check({f"grad of {n}": (grads[n].grad, p.grad) for n, p in plain.named_parameters()}, EPS32 * 48 * 4 * 4)
    plain.eval()
    fused.eval()
    with torch.no_grad():
        assert torch.equal(plain(idx)[0], fused(idx)[0])


def check_compiles_to_one_graph(device: str) -> None:
    """The custom ops keep a compiled model one graph (a break per block would cost a compiled trunk its
    fusion), and the compiled training step (AOTAutograd, no code generation) gives the eager gradients."""
    import torch._dynamo

    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=48, block_size=16, vocab_size=96, fused_ce=False,
                          fused_ln_residual=True, fused_bias_gelu=True)).to(device).train()
    idx = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(3)).to(device)
    explained = torch._dynamo.explain(model)(idx, idx)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    model(idx, idx)[1].backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch.compile(model, backend="aot_eager", fullgraph=True)(idx, idx)[1].backward()
    _check({f"compiled grad of {n}": (p.grad, eager[n]) for n, p in model.named_parameters()}, EPS32 * 48 * 4 * 4)


CHECKS = [check_add_layer_norm_float32, check_add_layer_norm_without_bias, check_add_layer_norm_bf16_residual,
          check_add_layer_norm_under_autocast,
          check_bias_gelu_float32, check_bias_gelu_bf16, check_model_matches_plain, check_compiles_to_one_graph]


@pytest.mark.slow  # ~10 s of CPU on the shared machine: a fresh interpreter, Triton's interpreter and one dynamo trace
def test_fused_block_kernels_against_float64_reference_interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.test_fused_block", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == len(CHECKS), proc.stdout


# --- the switches, in this process (no kernel runs) ---------------------------------------------------

SWITCHES = ("fused_ln_residual", "fused_bias_gelu")


def _cfg(*overrides: str):
    from gptforge.config import apply_overrides
    from gptforge.presets import get_preset

    cfg = get_preset("tiny")
    cfg.train.device = "cpu"
    return apply_overrides(cfg, list(overrides))


@pytest.mark.parametrize("key", SWITCHES)
def test_switch_is_refused_where_triton_cannot_run_and_under_tensor_parallelism(monkeypatch, key):
    from gptforge.config import ConfigError
    from gptforge.parallel.mesh import check_layout
    from gptforge.training.switches import switch_problem

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = _cfg(f"--model.{key}", "true")
    why = switch_problem(cfg, torch.device("cpu"))
    assert why and why.startswith(f"model.{key}=true") and "CUDA" in why and f"--model.{key} false" in why
    assert switch_problem(_cfg(), torch.device("cpu")) is None  # off by default
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert switch_problem(cfg, torch.device("cpu")) is None  # the interpreter runs it (these tests)
    cfg.dist.tp = 2
    with pytest.raises(ConfigError, match=f"model.{key}"):
        check_layout(cfg, 2, 2)


def test_train_exits_2_naming_the_switch_on_cpu(monkeypatch, capsys):
    from gptforge.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rc = main(["train", "--preset", "tiny", "--train.device", "cpu", "--model.fused_bias_gelu", "true"])
    assert rc == 2 and "model.fused_bias_gelu=true" in capsys.readouterr().err


def test_bias_gelu_needs_the_bias():
    from gptforge.config import ConfigError

    with pytest.raises(ConfigError, match="model.fused_bias_gelu.*model.bias=true"):
        _cfg("--model.bias", "false", "--model.fused_bias_gelu", "true")


def test_a_model_with_the_switches_evaluates_on_the_plain_ops_without_triton(monkeypatch):
    """Evaluation and sampling never launch the kernels: a checkpoint trained with them runs on any CPU,
    bit for bit as the plain model (no TRITON_INTERPRET here)."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)).eval()
    fused = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                          **dict.fromkeys(SWITCHES, True))).eval()
    fused.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 9))
    assert torch.equal(plain(idx)[0], fused(idx)[0])
    with torch.no_grad():
        fused.train()  # a training-mode forward without gradients (in-loop evaluation) too
        plain.train()
        assert torch.equal(plain(idx)[0], fused(idx)[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_fused_block_cuda(check):
    check("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_block_cuda_124m_shapes_bf16():
    """B 4 x T 1024 rows at C 768 (LayerNorm) and 4C 3072 (GELU), bf16 as under autocast."""
    got = _add_ln_case("cuda", 4096, 768, torch.bfloat16, True, 5)
    d_r = got.pop("d_residual")
    _check(got, EPS32 * 4096 * 4)
    _check({"d_residual": d_r}, BF16)
    _check(_gelu_case("cuda", 4096, 3072, torch.bfloat16, 6), BF16)


if __name__ == "__main__":  # python -m tests.kernels.test_fused_block cpu (with TRITON_INTERPRET=1 on CPU)
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    for check in CHECKS:
        check(dev)
        print(f"ok {check.__name__}", flush=True)
