"""Issue 33's smaller classes: a command's own checks on every path it takes (eval --against), floats
that must be finite everywhere (plan --gpu-mem), old readers that tripped on odd records (plot), and a
resume that says only what it did to metrics.jsonl."""

from __future__ import annotations

import json

import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run.checkpoint import save_checkpoint


def test_eval_checks_come_before_every_path(tmp_path, capsys):
    from tests.conftest import tiny_chat_checkpoint

    sft = tiny_chat_checkpoint(tmp_path / "sft")
    for argv in (["eval", "--ckpt", str(sft), "--tasks", "compare", "--against", str(sft), "--reward-model", str(sft),
                  "--limit", "-3"],
                 ["eval", "--ckpt", str(sft), "--preferences", "x.jsonl", "--limit", "-3"]):
        assert main(argv) == 2
        assert "--limit must be >= 0" in capsys.readouterr().err
    # a reference model without the chat template's rows: refused naming --against, not an IndexError
    torch.manual_seed(0)
    base = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50257)
    ref = save_checkpoint(tmp_path / "base", 1, GPT(base), None, {"config": Config(model=base).to_dict()})
    rm_dir = tmp_path / "rm"
    from gptforge.eval.tasks.preferences import preference_set, write_preferences

    prefs = write_preferences(preference_set("compare", 16, seed=1), tmp_path / "p.jsonl")
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", str(rm_dir), "--steps", "1",
                 "--val-count", "4", "--micro-batch", "4", "--device", "cpu", "--ckpt-every", "0"]) == 0
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(sft), "--tasks", "compare", "--limit", "2", "--against", str(ref),
                 "--reward-model", str(rm_dir)]) == 2
    err = capsys.readouterr().err
    assert "--against" in err and "Traceback" not in err


def test_plan_gpu_mem_must_be_finite(capsys):
    for bad in ("nan", "inf", "-inf"):
        try:
            code = main(["plan", "--preset", "tiny", f"--gpu-mem={bad}"])
        except SystemExit as e:  # argparse's refusal of the value
            code = e.code
        assert code == 2
        assert "finite" in capsys.readouterr().err


def test_plot_skips_records_without_a_step(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "train", "step": 1, "loss": 5.0, "tokens": 10}, {"kind": "train", "loss": 4.0},
            {"kind": "val", "step": "x", "val_loss": 3.0}, {"kind": "train", "step": 2, "loss": 4.5, "tokens": 20}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(run), "--image", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_replaying_resume_on_an_intact_log_does_not_claim_a_cut(tmp_path, capsys):
    from tests.conftest import make_shards

    data = make_shards(tmp_path / "data")
    args = ["train", "--preset", "tiny", "--data.dir", str(data), "--out", str(tmp_path / "run"), "--model.vocab_size",
            "512", "--train.val_every", "0", "--train.device", "cpu", "--train.ckpt_every", "2"]
    assert main([*args, "--train.max_steps", "3"]) == 0
    import shutil

    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000003")  # as if killed before step 3's save
    capsys.readouterr()
    assert main([*args, "--resume", "--train.max_steps", "4"]) == 0  # resumes at step 2: step 3 is replayed
    out = capsys.readouterr().out
    assert "metrics.jsonl: marked 2 records after step 2 as replayed" in out and "torn" not in out


def test_plans_search_does_not_grow_with_the_layer_count(capsys):
    """issue 33, class 6: the layout search takes the pipeline depths that divide both the layers and
    the GPUs (the divisors of their gcd): a billion layers costs what twelve do."""
    import time

    t = time.thread_time()  # this thread's CPU: what the search costs, not what a loaded machine's other work takes
    assert main(["plan", "--preset", "gpt2-124m", "--gpu", "h100-80", "--gpus", "64", "--model.n_layer",
                 "1000000000"]) == 1  # 1: planned, and nothing fits (7 quadrillion parameters)
    assert time.thread_time() - t < 30
    out = capsys.readouterr().out
    assert "layouts costed" in out and "nothing fits" in out


def test_parallel_keys_on_one_process_say_they_do_nothing(tmp_path, capsys):
    """issue 33, class 5: a key either acts or says why not. On one process the mesh degrees and the
    sharding mode are accepted (a checkpoint written under them resumes here) and said to do nothing."""
    from tests.conftest import make_shards

    data = make_shards(tmp_path / "data")
    assert main(["train", "--preset", "tiny", "--data.dir", str(data), "--out", str(tmp_path / "run"),
                 "--model.vocab_size", "512", "--train.max_steps", "1", "--train.device", "cpu",
                 "--dist.tp", "1000000000", "--dist.pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "dist.tp=1000000000, dist.pp=4 split the work across processes; on one process they have no effect" in out


def test_a_model_larger_than_the_memory_is_refused_before_it_is_built(capsys, tmp_path):
    """issue 33, class 6: size before work. Every command builds through registry.build_model, which
    checks the float32 parameters against the memory free now."""
    # serve binds its port before it builds the model: --port 0, a free one, not 8000
    for argv in (["export", "gguf", "--random", "gpt3-175b", "--out", str(tmp_path / "g")],
                 ["sample", "--random", "megatron-1t"], ["serve", "--random", "gpt3-175b", "--port", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "GiB in float32" in err and "free" in err and "Traceback" not in err
    assert not (tmp_path / "g").exists()  # refused before the output folder is made
