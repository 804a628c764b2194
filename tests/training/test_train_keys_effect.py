"""The ``train.*`` keys that shape a pretraining run, tested through to their effect (issue 36; the config-key
walk in tests/cli/test_every_config_key_has_an_effect.py names these tests): one tiny run, and what it logs
compared with counts made by hand from the settings, never with another run of the same code.
"""

from __future__ import annotations

import pytest

import gptforge.generation as generation
from gptforge.run.metrics import read_metrics
from gptforge.training.loop import train
from tests.conftest import tiny_config


def test_batch_logging_validation_and_sample_keys_shape_the_run(shard_dir, tmp_path, capsys, monkeypatch):
    """seq_len 16 and micro_batch 2 with total_batch_tokens 128: 4 micro-batches of 32 tokens a step, 128
    tokens a step counted in the metrics; val_every 4 of 6 steps: val losses at 4 and at the end (6), over
    val_tokens 96 / 32 = 3 batches; log_every 4: printed step lines at 4 and at the end only (metrics every
    step); sample_every 3: samples at 3 and 6, each generating sample_tokens 5 new tokens."""
    asked = []
    real = generation.generate

    def spy(model, idx, max_new_tokens, **kw):
        asked.append(max_new_tokens)
        return real(model, idx, max_new_tokens=max_new_tokens, **kw)

    monkeypatch.setattr(generation, "generate", spy)
    cfg = tiny_config(shard_dir, tmp_path / "run", micro_batch=2, seq_len=16, total_batch_tokens=128, max_steps=6,
                      val_every=4, val_tokens=96, log_every=4, sample_every=3, sample_tokens=5)
    cfg.model.vocab_size = 50304  # samples are decoded with GPT-2's tokenizer (none below its vocabulary)
    cfg.model.dropout = 0.0
    train(cfg)
    log = capsys.readouterr().out
    recs = read_metrics(tmp_path / "run")
    steps = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["tokens"] for r in steps] == [128 * k for k in range(1, 7)]
    assert "B 2 T 16 x accum 4 = 128 tokens/step" in log
    assert [r["step"] for r in recs if r["kind"] == "val"] == [4, 6]
    assert log.count("(3 batches)") == 2
    printed = [int(line.split("/")[0].split()[-1]) for line in log.splitlines() if line.startswith("step ") and "/6 |" in line]
    assert printed == [4, 6]
    assert sorted({r["step"] for r in recs if r["kind"] == "sample"}) == [3, 6]
    assert asked == [5, 5]


@pytest.mark.parametrize("start, per_step", [(0.25, [1, 2, 3, 3, 4, 4]), (0.5, [2, 3, 3, 4, 4, 4])])
def test_the_batch_ramp_keys_set_each_steps_micro_batches(shard_dir, tmp_path, start, per_step):
    """batch_warmup_steps 4 from batch_warmup_start of the 4 micro-batches (32 tokens each): the step's
    micro-batches ramp linearly, rounded half up, at least one, to the full batch at step 4. By hand, for
    start 0.25: 1, 1.75, 2.5, 3.25 -> 1, 2, 3, 3; for 0.5: 2, 2.5, 3, 3.5 -> 2, 3, 3, 4."""
    cfg = tiny_config(shard_dir, tmp_path / "run", micro_batch=2, seq_len=16, total_batch_tokens=128, max_steps=6,
                      val_every=0, batch_warmup_steps=4, batch_warmup_start=start)
    train(cfg)
    tokens = [r["tokens"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert [b - a for a, b in zip([0, *tokens], tokens, strict=False)] == [32 * n for n in per_step]


def test_the_eval_keys_score_those_tasks_at_those_steps(shard_dir, tmp_path, eval_data, monkeypatch):
    """eval.every 2 of 4 steps: task scores at steps 2 and 4 (and at the end, which is 4), one record per task
    of eval.tasks, each over eval.limit 3 rows; eval.batch_tokens 512 is what the batched scorer is given
    (the scorer's batching is checked against one-at-a-time scoring in tests/eval/test_eval.py)."""
    import gptforge.training.evaluate as during

    given = []
    real = during.evaluate

    def spy(model, prepared, device, autocast, batch_tokens, *rest):
        given.append(batch_tokens)
        return real(model, prepared, device, autocast, batch_tokens, *rest)

    monkeypatch.setattr(during, "evaluate", spy)
    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=4, val_every=0)
    cfg.model.vocab_size = 50304  # the tasks are GPT-2 text
    cfg.eval.every, cfg.eval.tasks, cfg.eval.limit, cfg.eval.batch_tokens = 2, "piqa,lambada", 3, 512
    train(cfg)
    evals = [(r["step"], r["task"], r["n"]) for r in read_metrics(tmp_path / "run") if r["kind"] == "eval"]
    assert sorted(evals) == [(s, t, 3) for s in (2, 4) for t in ("lambada", "piqa")]
    assert given == [512, 512]


def test_val_split_names_the_shards_validation_reads(shard_dir, tmp_path, capsys):
    """data.val_split dev: validation reads the toy_dev shard (100 tokens: 100 // (2 x 16) = 3 batches,
    counted by hand), not toy_val's 8,000 tokens (val_tokens 1,024 would give 32 batches there)."""
    from gptforge.data.shards import write_shard

    write_shard(shard_dir / "toy_dev_000000.bin", list(range(100)))
    cfg = tiny_config(shard_dir, tmp_path / "run", micro_batch=2, seq_len=16, total_batch_tokens=64, max_steps=2,
                      val_every=2, val_tokens=1024)
    cfg.data.val_split = "dev"
    train(cfg)
    assert "val loss" in (log := capsys.readouterr().out) and "(3 batches)" in log and "(32 batches)" not in log


def test_threads_is_the_intra_op_thread_count_the_run_computes_with(shard_dir, tmp_path, capsys):
    """train.threads 3 (not this machine's default): torch computes with 3 intra-op threads and the start
    line says so."""
    import torch

    before = torch.get_num_threads()
    try:
        cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=1, val_every=0, threads=3)
        train(cfg)
        assert torch.get_num_threads() == 3
        assert "| 3 CPU threads |" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_data_dir_and_train_split_name_the_shards_training_reads(shard_dir, tmp_path, monkeypatch):
    """data.dir and data.train_split: the training loader is given exactly that folder's shards of that split
    (here a lone toy_dev shard in a folder of its own), nothing of the other folder or split."""
    import shutil

    import gptforge.training.pretrain as pretrain

    other = tmp_path / "other"
    other.mkdir()
    for f in shard_dir.iterdir():
        shutil.copy(f, other / f.name)
    shutil.copy(other / "toy_train_000000.bin", other / "toy_dev_000000.bin")
    given = []
    real = pretrain.make_loader

    def spy(files, *a, **kw):
        given.append([str(f) for f in files])
        return real(files, *a, **kw)

    monkeypatch.setattr(pretrain, "make_loader", spy)
    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=1, val_every=0)
    cfg.data.dir, cfg.data.train_split = str(other), "dev"
    train(cfg)
    assert given == [[str(other / "toy_dev_000000.bin")]]


def test_dtype_bfloat16_computes_the_loss_under_bf16_autocast(shard_dir, tmp_path, capsys):
    """train.dtype bfloat16 on CPU: the model's linear layers compute in bf16 (float32 without it), so the same
    run's first loss moves from float32's by bf16 rounding (far less than a different model), and the start line
    names the precision.

    How far the loss moves is no property: at initialisation the logits are small and the loss sits near
    ln(vocab), so bf16's rounding moves it by ~1e-5 (1.3e-5 on AVX-512 and AVX2 here, 2.2e-5 without vector
    kernels), which a CPU with other bf16 kernels (AMX, or none) may halve; the dtype each layer gives is."""
    import torch

    losses, dtypes = {}, {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_config(shard_dir, tmp_path / dtype, max_steps=1, val_every=0, dtype=dtype)
        cfg.model.dropout = 0.0
        seen = set()
        hook = torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out, seen=seen: seen.add(out.dtype) if isinstance(m, torch.nn.Linear) else None)
        try:
            train(cfg)
        finally:
            hook.remove()
        dtypes[dtype] = seen
        losses[dtype] = [r["loss"] for r in read_metrics(tmp_path / dtype) if r["kind"] == "train"][0]
        assert f"| {dtype} |" in capsys.readouterr().out
    assert dtypes == {"float32": {torch.float32}, "bfloat16": {torch.bfloat16}}, dtypes
    assert 0 < abs(losses["bfloat16"] - losses["float32"]) < 0.05, losses


@pytest.mark.parametrize("compile_on", [False, True])
def test_compile_reaches_torch_compile_on_the_run_path(shard_dir, tmp_path, capsys, monkeypatch, compile_on):
    """train.compile from the config to ``torch.compile`` through a whole run (recorded here, the model returned
    as it is: the GPU lane compiles for real): true calls it once, with torch's default mode (the only one CPU
    allows: tests/kernels/test_switches.py passes the others through), false never; the start line says which."""
    import torch

    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, mode=None, **kw: seen.append(mode) or m)
    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=1, val_every=0, compile=compile_on)
    train(cfg)
    assert seen == ([None] if compile_on else [])
    assert f"| compile {compile_on} |" in capsys.readouterr().out


def test_tf32_sets_cudas_matmul_switches_and_names_the_precision():
    """train.tf32 on a CUDA device: cuBLAS and cuDNN may use TF32 (torch's two switches, set either way) and
    a float32 run's precision is named tf32 (its MFU counts TF32's peak); off, both switches are off."""
    import torch

    from gptforge.config import Config
    from gptforge.runtime import set_precision

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for on in (True, False):
            cfg = Config()
            cfg.train.tf32, cfg.train.dtype, cfg.train.compile = on, "float32", False
            _, precision, _ = set_precision(cfg, torch.device("cuda"))
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
            assert precision == ("tf32" if on else "float32")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
