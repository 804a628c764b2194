"""gptforge plot draws an RL run: its loss, a reward row (mean reward and sampled accuracy per step)
and its held-out accuracy (``eval`` records with ``acc``), as it draws a pretraining run's curves."""

from __future__ import annotations

import json
import struct

import pytest

from gptforge.plot import _run_series, plot_runs


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


def _rl_run(folder):
    folder.mkdir()
    recs = [{"kind": "start", "step": 0}, {"kind": "eval", "step": 0, "task": "arithmetic", "acc": 0.1, "n": 8}]
    recs += [{"kind": "rl", "step": s, "loss": 0.5 / s, "reward": 0.1 * s, "accuracy": 0.05 * s, "kl": 0.01}
             for s in range(1, 6)]
    recs += [{"kind": "eval", "step": 5, "task": "arithmetic", "acc": 0.4, "n": 8}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def test_an_rl_run_has_a_reward_row_and_its_held_out_accuracy(tmp_path):
    pytest.importorskip("matplotlib")
    run = _rl_run(tmp_path / "rl")
    s = _run_series(run)
    assert sorted(s["rl"]) == [1, 2, 3, 4, 5] and s["train"] is s["rl"]  # the loss row shows RL's loss
    assert {step: r["acc"] for step, r in s["eval"]["arithmetic"].items()} == {0: 0.1, 5: 0.4}
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": k, "loss": 5.0 - k}) + "\n"
                                               for k in range(1, 4)))
    rows = {}
    for name, runs in (("pre", [pre]), ("rl", [run]), ("both", [pre, run])):
        out = plot_runs([str(r) for r in runs], tmp_path / f"{name}.png")
        rows[name] = _png_size(out)[1]
    # loss only; loss + reward + arithmetic; the same three rows when a pretraining run is beside it
    assert rows["rl"] == rows["both"] == pytest.approx(3 * rows["pre"], rel=0.02)
