"""Evaluation in the training loop, the `eval` and `plot` commands, and their bad-input exits."""

from __future__ import annotations

import json

import pytest

from gptforge import assets
from gptforge.cli import EXIT_BAD_INPUT, main
from gptforge.config import EvalConfig
from gptforge.eval.run import evaluate, prepare_tasks
from gptforge.load import ModelSource, load_model
from gptforge.models.gpt2 import GPTConfig
from gptforge.run.metrics import read_metrics
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory, eval_data, tokenizer):
    """A 4-step run of a tiny GPT-2-vocabulary model with HellaSwag and LAMBADA every 2 steps."""
    from gptforge.training.loop import train
    from tests.conftest import make_shards

    root = tmp_path_factory.mktemp("evalrun")
    cfg = tiny_config(make_shards(root / "data"), root / "run", max_steps=4, val_every=2)
    cfg.model = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=50257)
    cfg.eval = EvalConfig(every=2, tasks="hellaswag,lambada", limit=6)
    train(cfg)
    return root / "run"


def test_loop_writes_eval_records(eval_run):
    recs = [r for r in read_metrics(eval_run) if r["kind"] == "eval"]
    assert sorted((r["step"], r["task"]) for r in recs) == [
        (2, "hellaswag"), (2, "lambada"), (4, "hellaswag"), (4, "lambada")]
    for r in recs:
        assert r["n"] == 6 and r["tokens"] == r["step"] * 128 and 0 <= r["acc"] <= 1
        assert ("acc_norm" in r) == (r["task"] == "hellaswag") and ("ppl" in r) == (r["task"] == "lambada")


def test_loop_eval_equals_standalone_eval_of_the_checkpoint(eval_run, tokenizer):
    last = {r["task"]: r for r in read_metrics(eval_run) if r["kind"] == "eval" and r["step"] == 4}
    model = load_model(ModelSource(ckpt=str(eval_run)))
    res = evaluate(model, prepare_tasks("hellaswag,lambada", limit=6, enc=tokenizer))
    assert res["hellaswag"]["acc"] == last["hellaswag"]["acc"]
    assert res["hellaswag"]["acc_norm"] == last["hellaswag"]["acc_norm"]
    assert res["lambada"]["ppl"] == pytest.approx(last["lambada"]["ppl"], rel=1e-5)


def test_plot_writes_a_png_from_a_real_run(eval_run, tmp_path):
    out = tmp_path / "curves.png"
    assert main(["plot", str(eval_run), str(eval_run), "--labels", "a,b", "--image", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_eval_command_writes_json(eval_run, tmp_path, capsys):
    from gptforge.eval.stats import wilson

    out = tmp_path / "eval.json"
    assert main(["eval", "--tasks", "winogrande,piqa", "--ckpt", str(eval_run), "--limit", "5",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert res["winogrande"]["n"] == 5 and res["piqa"]["n"] == 5 and "acc_norm" in res["piqa"]
    # both tasks are two-choice: chance 0.5, and at n 5 every interval holds it
    for r in res.values():
        assert r["chance"] == 0.5 and r["acc_ci95"] == pytest.approx(wilson(r["acc"] * 5, 5))
    table = capsys.readouterr().out
    assert "95% CI" in table and "chance" in table and "not distinguishable from guessing" in table


def test_eval_bench_writes_json(tmp_path, eval_data, tokenizer):
    out = tmp_path / "bench.json"
    assert main(["eval", "--tasks", "winogrande", "--random", "d2", "--limit", "6", "--bench", "--repeats", "1",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]["winogrande"]
    assert res["examples"] == 6 and res["identical_predictions"] == 6
    assert res["batched_examples_per_s"] > 0 and res["reference_examples_per_s"] > 0


@pytest.mark.parametrize("argv", [
    ["eval", "--tasks", "hellaswag"],  # no model
    ["eval", "--random", "d2", "--hf", "gpt2"],  # two models
    ["eval", "--random", "d99"],
    ["eval", "--random", "d2", "--tasks", "hellaswag,nope"],
    ["eval", "--random", "d2", "--limit", "-1"],
    ["plot", "no/such/run", "--image", "x.png"],
])
def test_bad_eval_and_plot_input_exits_2(argv, capsys, eval_data, tokenizer):
    assert main(argv) == EXIT_BAD_INPUT
    assert "error:" in capsys.readouterr().err


def test_missing_eval_data_exits_2_naming_both_ways(tmp_path, monkeypatch, capsys, tokenizer):
    monkeypatch.setenv("GPTFORGE_GPT2_RANKS", str(assets.gpt2_ranks_path()))
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    assert main(["eval", "--random", "d2", "--tasks", "piqa"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "gptforge assets evals" in err and "--online" in err


def test_bad_eval_config_exits_2_before_compute(shard_dir, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--dry-run", "--eval.tasks", "hellaswag,bogus"]) == EXIT_BAD_INPUT
    assert "eval.tasks" in capsys.readouterr().err
    # a model that cannot read GPT-2 tokens cannot be scored: refused at start-up
    assert main(["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(tmp_path / "r"),
                 "--model.vocab_size", "512", "--eval.every", "2"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "eval.every=2" in err and "vocab_size is 512" in err
    assert not (tmp_path / "r" / "checkpoints").exists()
