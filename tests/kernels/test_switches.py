"""The speed switches of issue 13 on CPU: what CPU can run matches its reference, the rest is refused.

GPU-only behaviour (cuDNN/efficient attention, float8 on Hopper, Inductor modes) is in
tests/test_gpu_lane.py, marked ``gpu``.
"""

from __future__ import annotations

import pytest
import torch

from gptforge.bench.train import run_bench
from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.kernels.fp8 import fp8_linear, fp8_linear_reference
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.presets import get_preset
from gptforge.training.switches import check_switches, switch_problem

CPU = torch.device("cpu")


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=300, **kw)).eval()


def _cfg(*overrides: str) -> Config:
    cfg = get_preset("tiny")
    cfg.train.device = "cpu"
    return apply_overrides(cfg, list(overrides))


# --- model.attn_backend ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["auto", "math", "flash"])
def test_cpu_attention_backends_match_explicit_attention(backend):
    """Every backend CPU has gives the explicit softmax(QK^T)V model's logits and gradients."""
    ref, got = _model(flash=False), _model(attn_backend=backend)
    got.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    l_ref, loss_ref = ref(idx, idx)
    l_got, loss_got = got(idx, idx)
    loss_ref.backward()
    loss_got.backward()
    assert torch.allclose(l_got, l_ref, atol=1e-5, rtol=0), (l_got - l_ref).abs().max()
    g_ref = ref.transformer.h[0].attn.c_attn.weight.grad
    assert torch.allclose(got.transformer.h[0].attn.c_attn.weight.grad, g_ref, atol=1e-6)


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_gpu_only_attention_backends_are_refused_on_cpu(backend):
    why = switch_problem(_cfg("--model.attn_backend", backend), CPU)
    assert why and f"model.attn_backend={backend}" in why and "auto" in why
    with pytest.raises(ConfigError, match="model.attn_backend"):
        check_switches(_cfg("--model.attn_backend", backend), CPU)


@pytest.mark.parametrize("arch,kv,gqa", [("gpt2", None, False), ("llama", 4, False), ("llama", 2, True)])
def test_the_backend_probe_uses_the_models_head_layout(monkeypatch, arch, kv, gqa):
    """SDPA's efficient kernel has no dense grouped-query path (seen on an H100, torch 2.11): the probe
    must ask with the model's own key/value head count, or a GQA run crashes after start-up."""
    import gptforge.kernels.attention as attention

    seen = []
    monkeypatch.setattr(attention, "sdpa_problem", lambda *a, **k: seen.append((a, k)))
    shape = ["--model.arch", arch, "--model.n_head", "4", "--model.attn_backend", "math"]
    switch_problem(_cfg(*shape, *(["--model.n_kv_head", str(kv)] if kv else [])), CPU)
    ((args, kwargs),) = seen
    assert args[0] == "math" and kwargs == {"gqa": gqa}


def test_gqa_probe_runs_a_grouped_query_call():
    """The probe itself with gqa=True: math and flash on CPU can run grouped-query attention."""
    from gptforge.kernels.attention import sdpa_problem

    assert sdpa_problem("math", CPU, torch.float32, 16, gqa=True) is None
    assert sdpa_problem("flash", CPU, torch.float32, 16, gqa=True) is None


def test_attention_backend_needs_sdpa_and_a_known_name():
    with pytest.raises(ConfigError, match="model.flash=true"):
        _cfg("--model.flash", "false", "--model.attn_backend", "math")
    with pytest.raises(ConfigError, match="allowed: auto, cudnn"):
        _cfg("--model.attn_backend", "fast")


def test_cuda_backend_in_a_checkpoint_falls_back_on_cpu_with_a_warning():
    """A model trained with cudnn attention still samples on CPU: SDPA's default, said once."""
    ref, got = _model(), _model(attn_backend="cudnn")
    idx = torch.randint(0, 300, (1, 9))
    with pytest.warns(UserWarning, match="attn_backend=cudnn has no cpu kernel"):
        out, _ = got(idx)
    assert torch.equal(out, ref(idx)[0])


def test_train_refuses_an_impossible_switch_with_exit_2(capsys):
    from gptforge.cli import main

    rc = main(["train", "--preset", "tiny", "--train.device", "cpu", "--model.attn_backend", "efficient"])
    assert rc == 2
    assert "model.attn_backend=efficient" in capsys.readouterr().err


# --- model.fused_ce ----------------------------------------------------------------------------------

def test_fused_ce_is_refused_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    why = switch_problem(_cfg("--model.fused_ce", "true"), CPU)
    assert why and "model.fused_ce=true" in why and "CUDA" in why


# --- model.lm_head_fp8 -------------------------------------------------------------------------------

def test_fp8_lm_head_matches_its_quantized_reference_and_the_exact_matmul():
    """torch._scaled_mm (CPU build) against the same rowwise quantization in float32 ops, and both
    against the float64 matmul within e4m3's 3-bit mantissa."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=g)
    w = torch.randn(96, 64, generator=g) * 0.02
    w[5] *= 50  # an outlier row: rowwise scales keep it from flattening the others
    exact = (x.double() @ w.double().t())
    got, ref = fp8_linear(x, w), fp8_linear_reference(x, w)
    assert got.shape == (3, 7, 96)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-6)
    # e4m3 rounds each operand to within 2^-4 relative, so each product to within ~0.13 of |x||w|
    err = (got.double() - exact).abs()
    assert (err <= 0.13 * (x.double().abs() @ w.double().abs().t()) + 1e-6).all()
    assert err.max() > 1e-4  # really quantized, not a plain matmul
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got16 = fp8_linear(x, w)
    assert got16.dtype == torch.bfloat16
    assert torch.allclose(got16.float(), ref, atol=2e-2 * ref.abs().max().item())


def test_fp8_lm_head_backward_is_the_plain_matmul_gradient():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 32, generator=g, requires_grad=True)
    w = torch.randn(48, 32, generator=g, requires_grad=True)
    up = torch.randn(10, 48, generator=g)
    (fp8_linear(x, w) * up).sum().backward()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ((xr @ wr.t()) * up.double()).sum().backward()
    assert torch.allclose(x.grad.double(), xr.grad, atol=1e-5) and torch.allclose(w.grad.double(), wr.grad, atol=1e-5)


def test_fp8_model_logits_close_to_plain():
    plain, fp8 = _model(), _model(lm_head_fp8=True)
    idx = torch.randint(0, 300, (2, 16))
    a, b = plain(idx)[0], fp8(idx)[0]
    assert a.shape == b.shape and (a - b).abs().max() < 0.07 * a.abs().max()


def test_fp8_is_refused_without_a_float8_gpu():
    why = switch_problem(_cfg("--model.lm_head_fp8", "true"), CPU)
    assert why and "model.lm_head_fp8=true" in why and "8.9" in why
    with pytest.raises(ConfigError, match="cannot be combined"):
        _cfg("--model.lm_head_fp8", "true", "--model.fused_ce", "true")


# --- train.compile_mode ------------------------------------------------------------------------------

def test_compile_mode_is_validated_and_refused_where_it_would_measure_something_else():
    with pytest.raises(ConfigError, match="train.compile_mode"):
        _cfg("--train.compile_mode", "fastest")
    assert "compile true" in switch_problem(_cfg("--train.compile_mode", "max-autotune"), CPU)
    why = switch_problem(_cfg("--train.compile_mode", "max-autotune", "--train.compile", "true"), CPU)
    assert "train.compile_mode=max-autotune" in why and "default" in why
    assert switch_problem(_cfg(), CPU) is None


def test_compile_mode_reaches_torch_compile(monkeypatch):
    from gptforge.parallel.distributed import DistInfo, wrap_model

    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, mode=None: seen.append(mode) or m)
    model = _model()
    wrap_model(model, DistInfo(device=CPU), True, compile_mode="max-autotune-no-cudagraphs")
    wrap_model(model, DistInfo(device=CPU), True)
    assert seen == ["max-autotune-no-cudagraphs", None]


# --- bench --switch: on and off side by side ---------------------------------------------------------

def test_bench_times_each_switch_beside_the_base_and_skips_what_cpu_cannot_do(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = _cfg("--model.vocab_size", "256")
    report = run_bench(cfg, steps=1, warmup=0, switches=["model.attn_backend=math", "model.fused_ce=true"])
    base, math_, fused = report["results"]
    assert base["switches"]["attn_backend"] == "auto" and math_["switches"]["attn_backend"] == "math"
    assert math_["name"] == "model.attn_backend=math" and math_["tokens_per_s"] > 0
    assert "model.fused_ce=true" in fused["skipped"]
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        run_bench(cfg, steps=1, warmup=0, switches=["model.fused_ce"])
