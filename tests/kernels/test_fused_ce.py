"""The fused classifier (gptforge.kernels.fused_ce) against a float64 PyTorch reference.

On CPU the Triton kernel runs under ``TRITON_INTERPRET=1``, which must be set before triton is
imported, so the checks run in a fresh subprocess (``python -m tests.kernels.test_fused_ce cpu``); the
``gpu`` test runs the same checks compiled on CUDA, plus 124M-like shapes in bf16.
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
V, VP = 50257, 50304  # GPT-2's vocabulary, padded to a multiple of 128


def _reference(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, vocab: int, grad_scale: float = 1.0):
    """Loss and grads of x and W in float64 with F.cross_entropy on the sliced logits."""
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    logits = (xr @ wr.t())[..., :vocab]
    loss = F.cross_entropy(logits.reshape(-1, vocab), t.reshape(-1), ignore_index=-1)
    (loss * grad_scale).backward()
    return loss.detach(), xr.grad, wr.grad


def _fused(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, vocab: int, grad_scale: float = 1.0):
    from gptforge.kernels.fused_ce import fused_linear_cross_entropy

    xf, wf = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fused_linear_cross_entropy(xf, wf, t, vocab)
    (loss * grad_scale).backward()
    return loss.detach(), xf.grad, wf.grad


def _close(got: torch.Tensor, ref: torch.Tensor, rtol: float, what: str) -> None:
    err = (got.double() - ref.double()).abs().max().item()
    bound = rtol * max(ref.abs().max().item(), 1e-30)
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def check_odd_shapes_float32(device: str) -> None:
    """21 rows (not a multiple of any block), vocab 50257 padded to 50304, two ignored targets."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 16, generator=g).to(device)
    w = (torch.randn(VP, 16, generator=g) * 0.5).to(device)
    t = torch.randint(0, V, (3, 7), generator=g)
    t[0, 2] = t[2, 6] = -1
    t = t.to(device)
    ref = _reference(x, w, t, V, grad_scale=2.0)
    got = _fused(x, w, t, V, grad_scale=2.0)
    for name, a, b in zip(("loss", "d_x", "d_W"), got, ref, strict=True):
        _close(a, b, 1e-5, name)
    assert got[2][V:].abs().max().item() == 0.0, "padded vocabulary rows got a gradient"


def check_bf16_autocast(device: str) -> None:
    """Under bf16 autocast the logits buffer is bf16 and d(logits) is written back in bf16."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(19, 32, generator=g).bfloat16().float().to(device)
    w = (torch.randn(VP, 32, generator=g) * 0.3).bfloat16().float().to(device)
    t = torch.randint(0, V, (19,), generator=g)
    t[4] = -1
    t = t.to(device)
    ref = _reference(x, w, t, V)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = _fused(x, w, t, V)
    assert got[1].dtype == got[2].dtype == torch.float32  # grads in the parameters' dtype
    _close(got[0], ref[0], 5e-3, "loss")  # bf16 logits: ~3 significant digits
    _close(got[1], ref[1], 3e-2, "d_x")
    _close(got[2], ref[2], 3e-2, "d_W")


def check_tiles_and_rows(device: str) -> None:
    """The kernel alone, with tiles narrower than the row: a 1000-word vocabulary padded to 1024."""
    from gptforge.kernels.fused_ce import loss_and_dlogits_

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(5, 1024, generator=g) * 4).to(device)
    t = torch.tensor([0, 999, -1, 517, 3]).to(device)
    lr = logits.double()[:, :1000].requires_grad_()
    ref = F.cross_entropy(lr, t, ignore_index=-1)
    ref.backward()
    buf = logits.clone()
    loss, n_valid = loss_and_dlogits_(buf, t, 1000, block=128)
    assert int(n_valid) == 4
    _close(loss, ref.detach(), 1e-6, "loss")
    _close(buf[:, :1000], lr.grad, 1e-5, "d_logits")
    assert buf[:, 1000:].abs().max().item() == 0.0 and buf[2].abs().max().item() == 0.0


def check_all_ignored(device: str) -> None:
    from gptforge.kernels.fused_ce import loss_and_dlogits_

    buf = torch.randn(3, 256).to(device)
    loss, _ = loss_and_dlogits_(buf, torch.full((3,), -1).to(device), 250)
    ref = F.cross_entropy(torch.randn(3, 250), torch.full((3,), -1), ignore_index=-1)
    assert torch.isnan(loss) and torch.isnan(ref)  # PyTorch's mean over no targets is NaN too
    assert buf.abs().max().item() == 0.0


def check_model_matches_plain(device: str) -> None:
    """GPT with model.fused_ce against the same weights on the plain path: loss and every grad
    (float32 both; the kernel's softmax is float32 whatever the input)."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)
    torch.manual_seed(0)
    plain = GPT(cfg).to(device)
    fused = GPT(GPTConfig(**{**cfg.to_dict(), "fused_ce": True})).to(device)
    fused.load_state_dict(plain.state_dict())
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, V, (2, 9), generator=g).to(device)
    t = torch.randint(0, V, (2, 9), generator=g)
    t[1, :3] = -1
    t = t.to(device)
    _, ref = plain(idx, t)
    logits, got = fused(idx, t)
    assert logits is None
    ref.backward()
    got.backward()
    _close(got, ref.detach(), 1e-6, "loss")
    grads = dict(fused.named_parameters())
    for name, p in plain.named_parameters():
        _close(grads[name].grad, p.grad, 1e-5, f"grad of {name}")


CHECKS = [check_odd_shapes_float32, check_bf16_autocast, check_tiles_and_rows, check_all_ignored, check_model_matches_plain]


@pytest.mark.slow  # ~15 s on a shared 2-core machine: a fresh interpreter and Triton's interpreter
def test_fused_ce_against_float64_reference_interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.test_fused_ce", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == len(CHECKS), proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_fused_ce_cuda(check):
    check("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_ce_cuda_124m_shapes_bf16():
    """B 8 x T 1024 rows, C 768, bf16 autocast: against float64 on the same bf16-rounded inputs."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, 1024, 768, device="cuda", generator=g).bfloat16().float()
    w = (torch.randn(VP, 768, device="cuda", generator=g) * 0.02).bfloat16().float()
    t = torch.randint(0, V, (8, 1024), device="cuda", generator=g)
    t[:, -5:] = -1
    ref = _reference(x, w, t, V)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = _fused(x, w, t, V)
    _close(got[0], ref[0], 2e-3, "loss")
    _close(got[1], ref[1], 2e-2, "d_x")  # bf16 d(logits) and matmuls: ~3 significant digits
    _close(got[2], ref[2], 2e-2, "d_W")
    assert got[2][V:].abs().max().item() == 0.0


if __name__ == "__main__":  # python -m tests.kernels.test_fused_ce cpu (with TRITON_INTERPRET=1 on CPU)
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    for check in CHECKS:
        check(dev)
        print(f"ok {check.__name__}", flush=True)
