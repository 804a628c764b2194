"""`gptforge race` on two tiny presets (seconds): the JSON's numbers are read back against each
run's own metrics.jsonl, and the race stops the second run at the target."""

from __future__ import annotations

import json

import pytest

from gptforge.cli import main
from gptforge.config import OptimConfig
from gptforge.presets import PRESETS
from gptforge.run.metrics import read_metrics
from tests.conftest import tiny_config


@pytest.fixture
def race_presets(monkeypatch, shard_dir, tmp_path):
    def adamw():
        cfg = tiny_config(shard_dir, tmp_path / "unused", max_steps=24, val_tokens=512)
        cfg.model.dropout = 0.0
        return cfg

    def muon():
        cfg = adamw()
        cfg.optim = OptimConfig(name="muon", lr=3e-3, muon_lr=0.03, warmup_steps=2, min_lr_frac=0.1, schedule="wsd")
        return cfg

    monkeypatch.setitem(PRESETS, "race-adamw", adamw)
    monkeypatch.setitem(PRESETS, "race-muon", muon)


def test_race_json_on_a_tiny_run(race_presets, tmp_path, capsys):
    out = tmp_path / "race"
    assert main(["race", "race-adamw", "race-muon", "--evals", "12", "--out", str(out)]) == 0
    summary = json.loads((out / "race.json").read_text())
    a, b = summary["runs"]
    assert (a["preset"], b["preset"]) == ("race-adamw", "race-muon")
    val_a = [r for r in read_metrics(out / "race-adamw") if r["kind"] == "val"]
    assert [r["step"] for r in val_a] == list(range(2, 25, 2))  # 24 steps, 12 validations
    assert summary["target_val_loss"] == val_a[-1]["val_loss"] and summary["target_from"] == "race-adamw"
    assert a["reached"] and b["reached"]
    first_a = next(r for r in val_a if r["val_loss"] <= summary["target_val_loss"])
    assert (a["steps"], a["tokens"]) == (first_a["step"], first_a["step"] * 128)
    val_b = [r for r in read_metrics(out / "race-muon") if r["kind"] == "val"]
    assert val_b[-1]["step"] == b["steps"] and val_b[-1]["val_loss"] <= summary["target_val_loss"]  # stopped there
    assert all(r["val_loss"] > summary["target_val_loss"] for r in val_b[:-1])
    train_b = [r for r in read_metrics(out / "race-muon") if r["kind"] == "train"]
    assert len(train_b) == b["steps"] and b["tokens"] == b["steps"] * 128
    assert b["train_seconds"] == pytest.approx(sum(r["dt_ms"] for r in train_b) / 1000, abs=2e-3)
    assert b["token_ratio"] == pytest.approx(a["tokens"] / b["tokens"], rel=1e-3)
    assert (out / "race.png").stat().st_size > 1000
    out_text = capsys.readouterr().out
    assert "target val loss" in out_text
    # the second run stopped because it reached the target: nothing to continue
    assert "reached the target val loss" in out_text and "continue with --resume" not in out_text


def test_race_bad_input_exits_2(race_presets, tmp_path, capsys):
    assert main(["race", "race-adamw", "--out", str(tmp_path)]) == 2
    assert "at least two presets" in capsys.readouterr().err
    assert main(["race", "race-adamw", "race-muon", "--train.seq_len", "8", "--optim.nope", "1"]) == 2
    assert "optim.nope" in capsys.readouterr().err
    assert main(["race", "race-adamw", "race-muon,train.seq_len=8"]) == 2  # val loss at another context
    assert "train.seq_len differs" in capsys.readouterr().err
    assert main(["race", "race-adamw", "race-muon,optim.lr"]) == 2
    assert "PRESET,section.key=value" in capsys.readouterr().err


def test_race_per_preset_overrides(race_presets, tmp_path):
    from gptforge.bench.race import race_configs

    a, b = race_configs(["race-adamw", "race-muon,optim.name=adamw,train.max_steps=12"], ["--train.seed", "3"],
                        tmp_path, evals=4)
    assert (a.optim.name, b.optim.name, b.train.max_steps, b.train.val_every) == ("adamw", "adamw", 12, 3)
    assert a.train.seed == b.train.seed == 3 and b.optim.schedule == "wsd"
    assert b.train.out_dir == str(tmp_path / "race-muon_optim.name-adamw_train.max_steps-12")  # a safe folder name


def test_race_folders_get_safe_unique_names():
    from gptforge.bench.race import run_folder

    assert run_folder("speedrun-d4,optim.name=adamw", set()) == "speedrun-d4_optim.name-adamw"
    assert run_folder("a,data.dir=../x y", set()) == "a_data.dir-._x_y"  # no slash, no space, no ".."
    assert run_folder("-x", set()) == "x" and run_folder("...", set()) == "run"
    assert run_folder("a,b=c", {"a_b-c"}) == "a_b-c_2"


def test_race_table_when_the_first_preset_misses_an_explicit_target():
    """--target given and the first preset never reaches it: the others have no ratio, and the
    table says so instead of failing after every run has trained."""
    from gptforge.bench.race import format_race

    runs = [{"preset": "a", "reached": False, "final_val_loss": 6.7, "token_ratio": None},
            {"preset": "b", "reached": True, "steps": 46, "tokens": 40704, "train_seconds": 12.5,
             "token_ratio": None, "final_val_loss": 6.3}]
    lines = format_race({"target_val_loss": 6.33, "target_from": "--target", "runs": runs}).splitlines()
    assert lines[2].split()[:2] == ["a", "no"] and "final val loss 6.7000" in lines[2]
    assert lines[3].split() == ["b", "yes", "46", "40,704", "12.5", "-"]
    # issue 34: a raw float is rounded, and a long preset name keeps the columns
    runs[0].update(preset="shakespeare-cpu,train.lr=3e-3,model.n_layer=6", final_val_loss=7.019979000091553)
    lines = format_race({"target_val_loss": 6.33, "target_from": "--target", "runs": runs}).splitlines()
    assert "(final val loss 7.0200)" in lines[2] and "7.0199" not in lines[2]
    ends = {__import__("re").match(r"\S+\s+\S+", line).end() for line in lines[1:]}  # the 'reached' column
    assert len(ends) == 1
