"""Muon: the Newton-Schulz step against an independent reference, the whole step against
torch.optim.Muon, the AdamW part against torch.optim.AdamW, parameter selection, the WSD
schedule, and bit-exact resume with Muon state."""

from __future__ import annotations

import pytest
import torch

from gptforge.config import ConfigError, OptimConfig
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.optim import build_optimizer, lr_at, set_lr
from gptforge.optim.muon import MuonAdamW, newton_schulz, orthogonalize
from gptforge.training.loop import train
from tests.conftest import tiny_config


def reference_ns(G: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The published quintic iteration (Jordan et al. 2024), written from the formula:
    X0 = G / ||G||_F; X_{k+1} = a X + b (X X^T) X + c (X X^T)^2 X, on the wide orientation."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(dtype)
    transpose = X.shape[0] > X.shape[1]
    if transpose:
        X = X.transpose(0, 1)
    X = X / (torch.linalg.matrix_norm(X, ord="fro") + 1e-7)
    for _ in range(steps):
        gram = torch.matmul(X, X.transpose(0, 1))
        X = a * X + b * torch.matmul(gram, X) + c * torch.matmul(torch.matmul(gram, gram), X)
    return X.transpose(0, 1) if transpose else X


@pytest.mark.parametrize("shape", [(32, 48), (48, 32), (24, 24)])
@pytest.mark.parametrize("use_torch", [False, True])
def test_newton_schulz_matches_reference(shape, use_torch):
    g = torch.Generator().manual_seed(0)
    G = torch.randn(*shape, generator=g)
    ours = orthogonalize(G, use_torch=use_torch).double()
    ref = reference_ns(G, dtype=torch.float64)
    assert ours.shape == G.shape
    # bfloat16 has ~3 significant digits; the iteration keeps the error at that level
    assert (ours - ref).abs().max() < 0.03, (ours - ref).abs().max()
    # and the result is nearly orthogonal: singular values pulled from ~0 into about [0.6, 1.2]
    s = torch.linalg.svdvals(ours)
    assert s.min() > 0.5 and s.max() < 1.3, s
    sref = torch.linalg.svdvals(ref)
    assert torch.allclose(s, sref, atol=0.03)


def test_our_kernel_equals_torchs_kernel():
    """Where torch has Muon, orthogonalize() uses its kernel; ours computes the same bits."""
    G = torch.randn(40, 24, generator=torch.Generator().manual_seed(1))
    assert torch.equal(newton_schulz(G), orthogonalize(G, use_torch=True))


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_step_equals_torch_muon(nesterov):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(8, 24))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = MuonAdamW([{"params": ours, "kind": "muon", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.9,
                      "nesterov": nesterov}], use_torch_ns=False)
    ref_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov)
    for step in range(4):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[ours[0]]["momentum_buffer"], ref_opt.state[ref[0]]["momentum_buffer"])


def test_adamw_part_equals_torch_adamw():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(8))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = MuonAdamW([{"params": ours[:1], "kind": "adamw", "lr": 1e-2, "weight_decay": 0.1},
                     {"params": ours[1:], "kind": "adamw", "lr": 1e-2, "weight_decay": 0.0}],
                    betas=(0.9, 0.95), eps=1e-8)
    ref_opt = torch.optim.AdamW([{"params": ref[:1], "weight_decay": 0.1}, {"params": ref[1:], "weight_decay": 0.0}],
                                lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for step in range(5):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _tiny_model() -> GPT:
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512))


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    model = _tiny_model()
    opt = build_optimizer(model, OptimConfig(name="muon", muon_lr=0.05, lr=1e-3), "cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    kinds = {names[id(p)]: (g["kind"], g["base_lr"]) for g in opt.param_groups for p in g["params"]}
    assert len(kinds) == len(names)  # every parameter exactly once
    muon = sorted(n for n, (k, _) in kinds.items() if k == "muon")
    assert muon == sorted(f"transformer.h.{i}.{m}.weight" for i in range(2)
                          for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert kinds["transformer.wte.weight"] == ("adamw", 1e-3)  # tied embedding / head stays AdamW
    assert kinds["transformer.h.0.ln_1.weight"][0] == "adamw"
    # the schedule scales both parts by one factor
    cfg = OptimConfig(name="muon", muon_lr=0.05, lr=1e-3, warmup_steps=10)
    lr = set_lr(opt, 4, cfg, 100)
    assert lr == pytest.approx(5e-4)
    assert {g["kind"]: g["lr"] for g in opt.param_groups} == {"muon": pytest.approx(0.025), "adamw": pytest.approx(5e-4)}


def test_muon_asked_for_a_vector_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"transformer\.h\.0\.ln_1\.weight.*2-D"):
        build_optimizer(_tiny_model(), OptimConfig(name="muon", muon_params="transformer.h.*"), "cpu")
    with pytest.raises(ConfigError, match="selects no parameter"):
        build_optimizer(_tiny_model(), OptimConfig(name="muon", muon_params="nothing.*"), "cpu")
    with pytest.raises(ConfigError, match="optim.muon_momentum"):
        OptimConfig(muon_momentum=1.5)


def test_cli_refuses_a_bad_muon_parameter_with_exit_2(shard_dir, tmp_path, capsys):
    from gptforge.cli import main

    rc = main(["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--model.vocab_size", "512",
               "--train.out_dir", str(tmp_path / "r"), "--train.device", "cpu",
               "--optim.name", "muon", "--optim.muon_params", "transformer.h.*.bias"])
    assert rc == 2
    assert "transformer.h.0.ln_1.bias" in capsys.readouterr().err


def test_wsd_schedule_warmup_stable_cooldown():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_frac=0.1, schedule="wsd", cooldown_frac=0.4)
    lrs = [lr_at(s, cfg, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0
    assert all(x == 1.0 for x in lrs[10:60])  # stable until the last 40 steps
    assert lrs[60] == 1.0 and lrs[80] == pytest.approx(0.1 + 0.9 * 20 / 40)
    assert all(a > b for a, b in zip(lrs[60:], lrs[61:], strict=False))  # linear cooldown
    assert lrs[99] == pytest.approx(0.1 + 0.9 / 40) and lr_at(100, cfg, 100) == pytest.approx(0.1)
    off = OptimConfig(lr=1.0, warmup_steps=10, schedule="wsd", cooldown_frac=0.0)
    assert lr_at(99, off, 100) == 1.0


def _muon_config(shard_dir, out, **train):
    cfg = tiny_config(shard_dir, out, **train)
    cfg.optim = OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, warmup_steps=2, min_lr_frac=0.1,
                            schedule="wsd", cooldown_frac=0.5)
    return cfg


def test_muon_lowers_the_loss_in_30_steps(shard_dir, tmp_path):
    res = train(_muon_config(shard_dir, tmp_path / "run", max_steps=30, val_every=0))
    assert res.train_losses[30] < res.train_losses[1] - 1.0


def test_resume_with_muon_is_bit_exact(shard_dir, tmp_path):
    full = train(_muon_config(shard_dir, tmp_path / "full", max_steps=10))
    part = train(_muon_config(shard_dir, tmp_path / "part", max_steps=10), stop_at_step=4)
    rest = train(_muon_config(shard_dir, tmp_path / "part", max_steps=10), resume="latest")
    assert set(rest.train_losses) == set(range(5, 11))
    for s in range(1, 11):
        got = part.train_losses.get(s, rest.train_losses.get(s))
        assert got == full.train_losses[s], (s, got, full.train_losses[s])  # bit for bit
    assert rest.val_losses[10] == full.val_losses[10]


def test_muon_on_the_llama_takes_its_projections_and_leaves_embeddings_and_head():
    from gptforge.presets import get_preset

    cfg = get_preset("speedrun-124m")
    assert (cfg.optim.name, cfg.optim.schedule, cfg.model.arch, cfg.data.align) == ("muon", "wsd", "llama", "bos")
    from gptforge.models.registry import build_model, size_config

    model = build_model(size_config("llama-tiny", block_size=32))
    opt = build_optimizer(model, OptimConfig(name="muon"), "cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    muon = sorted(names[id(p)].split(".")[-2] for g in opt.param_groups if g["kind"] == "muon" for p in g["params"])
    assert set(muon) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, muon
    adamw = {names[id(p)] for g in opt.param_groups if g["kind"] == "adamw" for p in g["params"]}
    assert "lm_head.weight" in adamw and any("embed" in n for n in adamw)
