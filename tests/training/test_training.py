"""The training loop: gradient accumulation, schedule, exact resume, checkpoints."""

import json
import math

import pytest
import torch

from gptforge.config import ConfigError, OptimConfig
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import list_shards
from gptforge.models.gpt2 import GPT
from gptforge.optim import build_optimizer, lr_at, param_groups
from gptforge.parallel.distributed import DistInfo
from gptforge.run import checkpoint as ckpt
from gptforge.runtime import set_precision
from gptforge.training.loop import train
from gptforge.training.step import train_step
from tests.conftest import tiny_config


def _grads_for_split(shard_dir, tmp_path, B, accum):
    cfg = tiny_config(shard_dir, tmp_path / "r", micro_batch=B, total_batch_tokens=B * 16 * accum)
    cfg.model.dropout = 0.0
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = build_optimizer(model, cfg.optim, "cpu")
    loader = ShardLoader(list_shards(shard_dir, "train"), B, 16)
    autocast, _, _ = set_precision(cfg, torch.device("cpu"))
    opt.step = lambda: None  # keep the gradients: look at them instead of applying them
    opt.zero_grad = lambda set_to_none=True: None
    loss, norm = train_step(model, model, opt, loader, accum, autocast, DistInfo(), grad_clip=0.0)
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradients_do_not_depend_on_the_split(shard_dir, tmp_path):
    loss1, g1 = _grads_for_split(shard_dir, tmp_path, B=8, accum=1)
    loss4, g4 = _grads_for_split(shard_dir, tmp_path, B=2, accum=4)
    assert abs(loss1 - loss4) < 1e-5
    for n in g1:
        assert torch.allclose(g1[n], g4[n], atol=1e-6, rtol=1e-4), n


def test_schedule_warmup_peak_end():
    cfg = OptimConfig(lr=6e-4, warmup_steps=10, min_lr_frac=0.1)
    assert lr_at(0, cfg, 100) == pytest.approx(6e-5)
    assert lr_at(9, cfg, 100) == pytest.approx(6e-4)  # peak at the end of warmup
    assert lr_at(10, cfg, 100) == pytest.approx(6e-4)
    assert lr_at(55, cfg, 100) == pytest.approx(6e-5 + 0.5 * (6e-4 - 6e-5))  # cosine midpoint
    assert lr_at(100, cfg, 100) == pytest.approx(6e-5)
    assert all(lr_at(s, cfg, 100) >= lr_at(s + 1, cfg, 100) for s in range(10, 100))


def test_weight_decay_only_on_matrices():
    model = GPT(tiny_config("x", "y").model)
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_embed_lr_moves_only_untied_input_embeddings(name):
    """optim.embed_lr: the Llama's untied embed_tokens gets its own group and peak lr, which the
    schedule scales like the others; GPT-2's tied wte is the head too and keeps optim.lr (only its
    position table wpe is an input-only embedding)."""
    from gptforge.models.registry import build_model, size_config
    from gptforge.optim import build_optimizer, set_lr

    cfg = OptimConfig(name=name, lr=1e-3, embed_lr=0.05, warmup_steps=0, min_lr_frac=0.0)
    llama = build_model(size_config("llama-tiny"))
    opt = build_optimizer(llama, cfg, "cpu")
    fast = [g for g in opt.param_groups if g["lr"] == 0.05]
    assert len(fast) == 1 and fast[0]["params"] == [llama.model.embed_tokens.weight]
    assert all(p is not llama.model.embed_tokens.weight for g in opt.param_groups if g["lr"] != 0.05
               for p in g["params"])
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(llama.parameters()))
    set_lr(opt, 50, cfg, 100)  # cosine halfway: every group at half its peak
    assert fast[0]["lr"] == pytest.approx(0.025)
    gpt = GPT(tiny_config("x", "y").model)
    fast = [g for g in build_optimizer(gpt, cfg, "cpu").param_groups if g["lr"] == 0.05]
    assert [p for g in fast for p in g["params"]] == [gpt.transformer.wpe.weight]
    with pytest.raises(ValueError, match="optim.embed_lr"):
        OptimConfig(embed_lr=-1.0)


def test_training_reduces_loss_and_writes_run_dir(shard_dir, tmp_path):
    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=30, val_every=10, ckpt_every=10, keep_ckpts=2)
    res = train(cfg)
    assert res.train_losses[30] < res.train_losses[1] - 1.0
    assert math.log(512) - 0.5 < res.train_losses[1] < math.log(512) + 0.5
    assert sorted(res.val_losses) == [10, 20, 30]
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 30
    assert "torch" in json.loads((run / "env.json").read_text())
    kinds = [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("train") == 30 and kinds.count("val") == 3 and kinds[0] == "start"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000020", "step_000030"]  # keep 2


def test_resume_is_bit_exact(shard_dir, tmp_path):
    full = train(tiny_config(shard_dir, tmp_path / "full", max_steps=12))
    part = train(tiny_config(shard_dir, tmp_path / "part", max_steps=12), stop_at_step=5)
    assert part.interrupted and part.steps_done == 5
    rest = train(tiny_config(shard_dir, tmp_path / "part", max_steps=12), resume="latest")
    assert set(rest.train_losses) == set(range(6, 13))
    for s in range(1, 13):
        got = part.train_losses.get(s, rest.train_losses.get(s))
        assert got == full.train_losses[s], (s, got, full.train_losses[s])  # bit for bit
    assert rest.val_losses[12] == full.val_losses[12]


def test_refuses_to_overwrite_a_run(shard_dir, tmp_path):
    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=2)
    train(cfg)
    with pytest.raises(ConfigError, match="--resume"):
        train(tiny_config(shard_dir, tmp_path / "run", max_steps=2))
    train(tiny_config(shard_dir, tmp_path / "run", max_steps=2), force=True)


def test_checkpoint_is_self_describing_and_safe(shard_dir, tmp_path):
    train(tiny_config(shard_dir, tmp_path / "run", max_steps=3))
    d = ckpt.latest_checkpoint(tmp_path / "run")
    assert sorted(p.name for p in d.iterdir()) == ["meta.json", "model.safetensors", "optimizer.pt", "rng.pt"]
    meta = ckpt.read_meta(d)
    assert meta["step"] == 3 and meta["config"]["model"]["n_layer"] == 2 and "loader" in meta
    torch.load(d / "optimizer.pt", weights_only=True)  # loading never executes code
    # a half-written checkpoint (crash mid-save) is never picked as the latest
    (d.parent / "step_000009.tmp").mkdir()
    (d.parent / "step_000009.tmp" / "meta.json").write_text("{}")
    assert ckpt.latest_checkpoint(tmp_path / "run") == d


def test_resume_without_checkpoint_names_the_place(shard_dir, tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint"):
        train(tiny_config(shard_dir, tmp_path / "empty"), resume="latest")


def test_batch_that_does_not_divide_is_rejected(shard_dir, tmp_path):
    cfg = tiny_config(shard_dir, tmp_path / "r", micro_batch=3, total_batch_tokens=128)
    with pytest.raises(ConfigError, match="not divisible"):
        cfg.validate()


def test_sigint_saves_a_checkpoint_and_resume_finishes(shard_dir, tmp_path):
    """A real Ctrl-C: the run finishes its step, writes a checkpoint, exits 130; --resume completes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"

    def cmd(max_steps, *extra):
        return [sys.executable, "-u", "-m", "gptforge", "train", "--preset", "tiny", "--data.dir", str(shard_dir),
                "--out", str(out), "--model.vocab_size", "512", "--train.max_steps", str(max_steps),
                "--train.val_every", "0", "--train.ckpt_every", "0", "--train.device", "cpu", *extra]

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd(100_000), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 120
    for line in proc.stdout:  # wait until training is really under way
        if line.startswith("step      3/"):
            break
        assert time.time() < deadline, "training did not start"
    proc.send_signal(signal.SIGINT)
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130, rest
    assert "continue with --resume" in rest
    saved = ckpt.latest_checkpoint(out)
    assert saved is not None
    step = ckpt.read_meta(saved)["step"]
    assert step >= 3
    r = subprocess.run(cmd(step + 2, "--resume"), capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {saved}" in r.stdout
    assert ckpt.read_meta(ckpt.latest_checkpoint(out))["step"] == step + 2
