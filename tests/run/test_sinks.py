"""TensorBoard and W&B sinks: the same scalars as metrics.jsonl, read back from TensorBoard's own
event files; a resumed run's replayed steps appear once; a missing package is a one-line exit 2."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from gptforge.cli import main
from gptforge.run import sinks
from gptforge.run.metrics import read_metrics
from gptforge.training.loop import train
from tests.conftest import tiny_config

pytest.importorskip("tensorboard")


def _events(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 = keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _jsonl(run_dir, kind: str, key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in read_metrics(run_dir) if r["kind"] == kind and r.get(key) is not None]


def test_tensorboard_has_the_metrics_jsonl_scalars(shard_dir, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(shard_dir, run, max_steps=6, val_every=3)
    cfg.train.log_to = "tensorboard"
    train(cfg)
    ev = _events(run / "tensorboard")
    for kind, key in [("train", "loss"), ("train", "lr"), ("train", "grad_norm"), ("val", "val_loss")]:
        want = _jsonl(run, kind, key)
        got = ev[f"{kind}/{key}"]
        assert [s for s, _ in got] == [s for s, _ in want] and len(want) == (6 if kind == "train" else 2)
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a == pytest.approx(b, rel=1e-6)  # TensorBoard stores float32
    assert "train/tokens_per_s" in ev and "sample/index" not in ev


def test_resumed_run_shows_each_step_once(shard_dir, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(shard_dir, run, max_steps=4, val_every=0, ckpt_every=2)
    cfg.train.log_to = "tensorboard"
    train(cfg)
    shutil.rmtree(run / "checkpoints" / "step_000004")  # as if killed after step 4, before its checkpoint
    train(cfg, resume="latest")  # replays steps 3 and 4
    steps = [s for s, _ in _events(run / "tensorboard")["train/loss"]]
    assert steps == [1, 2, 3, 4], steps
    assert [s for s, _ in _jsonl(run, "train", "loss")] == [1, 2, 3, 4]  # read_metrics: each step once
    kept = [(r["step"], bool(r.get("replayed"))) for r in read_metrics(run, replayed=True) if r["kind"] == "train"]
    assert kept == [(1, False), (2, False), (3, True), (4, True), (3, False), (4, False)]  # the file keeps both


def test_scalars_tags_and_skips():
    rec = {"kind": "eval", "step": 7, "time": 1.0, "task": "hellaswag", "acc": 0.25, "n": 10, "ok": True,
           "loss": None, "loss_str": "nan"}
    assert sinks.scalars(rec) == {"eval/hellaswag/acc": 0.25, "eval/hellaswag/n": 10.0}


def test_wandb_sink_logs_the_same_scalars(tmp_path, monkeypatch):
    """W&B itself is not installed in CI (a heavy optional extra): a recording stand-in for the
    ``wandb`` module checks what the sink sends, that a resume (a later start step) reuses the run id and
    that a run starting at step 0 again (--force, or a first run that died before its first checkpoint)
    gets a new one: W&B drops steps below its run's last, so the old id would hide the new curves."""
    calls: dict[str, list] = {"init": [], "log": [], "finish": []}

    class Run:
        def log(self, values, step):
            calls["log"].append((step, values))

        def finish(self):
            calls["finish"].append(True)

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: (calls["init"].append(kw), Run())[1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(sinks, "check_available", lambda names: None)
    rec = {"kind": "train", "step": 3, "time": 0.0, "loss": 2.5, "lr": 1e-3}
    for start in (0, 2, 0, 5):  # fresh, resumed at 2, started over, resumed at 5
        (sink,) = sinks.open_sinks("wandb", tmp_path / "run", start, {"optim": {"lr": 1e-3}})
        sink.write(rec)
        sink.close()
    ids = [c["id"] for c in calls["init"]]
    assert ids[0] == ids[1] != ids[2] == ids[3] and len(ids[0]) == len(ids[2]) == 8
    assert calls["init"][0]["resume"] == "allow"
    assert calls["init"][0]["dir"] == str(tmp_path / "run") and calls["init"][0]["config"] == {"optim": {"lr": 1e-3}}
    assert calls["log"][0] == (3, {"train/loss": 2.5, "train/lr": 1e-3}) and len(calls["finish"]) == 4


@pytest.mark.parametrize("value, words", [("tensorbored", "unknown tensorbored"),
                                          ("wandb", "pip install 'gptforge[wandb]'")])
def test_bad_or_missing_sink_exits_2(shard_dir, tmp_path, capsys, monkeypatch, value, words):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find(name, *a))
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--model.vocab_size", "512",
            "--train.device", "cpu", "--out", str(tmp_path / "run"), "--train.log_to", value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "train.log_to" in err and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
