"""metrics.jsonl after a kill: a torn last line is cut on resume, the abandoned attempt's records of
replayed steps are marked ``replayed``, and plot skips a bad line naming its line number.
Reference: an uninterrupted run's per-step losses."""

from __future__ import annotations

import json
import shutil

import pytest

from gptforge.run import checkpoint as ckpt
from gptforge.run.metrics import MetricsLog, read_metrics, repair_torn_tail
from gptforge.training.loop import train
from tests.conftest import tiny_config


def _lines(path):
    return path.read_text().splitlines()


def test_torn_tail_is_cut_to_the_last_complete_record(tmp_path):
    p = tmp_path / "metrics.jsonl"
    good = "".join(json.dumps({"kind": "train", "step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3))
    for torn in ('{"kind": "train", "st', '{"kind": "train", "step": 4}', "\x00\x00\x00\x00", '[1, 2]\n'):
        p.write_text(good + torn)
        assert repair_torn_tail(p) == len(torn.encode())
        assert p.read_text() == good
    assert repair_torn_tail(p) == 0  # an intact file is left alone
    p.write_text('{"kind": "tr')
    assert repair_torn_tail(p) == len(b"{\"kind\": \"tr") and p.read_text() == ""


def test_killed_run_resumed_gives_one_clean_record_per_step(shard_dir, tmp_path):
    full = train(tiny_config(shard_dir, tmp_path / "full", max_steps=10, ckpt_every=4))
    run = tmp_path / "run"
    train(tiny_config(shard_dir, run, max_steps=10, ckpt_every=4), stop_at_step=6)
    # as if killed at step 6 mid-write, before its checkpoint: the newest checkpoint is step 4
    shutil.rmtree(run / "checkpoints" / "step_000006")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 7, "lo')
    res = train(tiny_config(shard_dir, run, max_steps=10, ckpt_every=4), resume="latest")
    assert min(res.train_losses) == 5
    lines = _lines(run / "metrics.jsonl")
    recs = [json.loads(line) for line in lines]  # every line parses: the torn one is gone
    marked = [(r["kind"], r["step"]) for r in recs if r.get("replayed")]
    assert sorted(marked) == [("train", 5), ("train", 6)]  # the abandoned attempt's steps after 4
    effective = read_metrics(run)
    train_steps = [r["step"] for r in effective if r["kind"] == "train"]
    assert train_steps == list(range(1, 11))  # de-duplicated view: one record per step, in order
    assert {r["step"]: r["loss"] for r in effective if r["kind"] == "train"} == full.train_losses
    assert len(read_metrics(run, replayed=True)) == len(recs)  # nothing was deleted


def test_a_fresh_start_marks_an_earlier_attempts_records(shard_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(shard_dir, run, max_steps=3))
    shutil.rmtree(ckpt.ckpt_root(run))  # killed before any checkpoint: the next run starts at 0
    train(tiny_config(shard_dir, run, max_steps=3))
    steps = [r["step"] for r in read_metrics(run) if r["kind"] == "train"]
    assert steps == [1, 2, 3]


def test_read_metrics_skips_bad_lines_naming_them(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n\n{"kind": "train", "st\n'
                 '{"kind": "train", "step": 2, "loss": 1.0}\n"just a string"\n')
    warned = []
    recs = read_metrics(p, warn=warned.append)
    assert [r["step"] for r in recs] == [1, 2]
    assert warned[0].startswith(f"{p}:3: not a JSON record") and warned[1].startswith(f"{p}:5:")
    with pytest.warns(UserWarning) as caught:  # the default: a warning per bad line
        read_metrics(p)
    assert [str(w.message).split(": ")[0] for w in caught] == [f"{p}:3", f"{p}:5"]


def test_plot_skips_a_bad_line_with_a_warning(shard_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from gptforge.cli import main

    run = tmp_path / "run"
    train(tiny_config(shard_dir, run, max_steps=4))
    lines = _lines(run / "metrics.jsonl")
    lines.insert(2, '{"kind": "train", "step": 9, "lo')  # a garbled line 3
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["plot", str(run), "--image", str(tmp_path / "curves.png")]) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl:3: not a JSON record" in err and "skipped" in err
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_metrics_log_begin_is_a_no_op_without_a_file(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    assert log.begin(0) == (0, 0)
    log.write("train", 1, loss=1.0)
    assert log.begin(0) == (0, 1)  # a step after the start is an earlier attempt's record
