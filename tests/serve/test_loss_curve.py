"""``read_loss_curve`` (the page's /api/metrics) on hand-written metrics files (issue 36: lane serve-app's
survivors): each series takes only its own kind with a number, held-out accuracy only from a GRPO run, a
line still being written or not JSON is skipped without a warning, non-finite values are dropped after
thinning, and the answer names the file."""

from __future__ import annotations

import json
import math
import warnings

from gptforge.serve.app import read_loss_curve


def _write(path, recs, tail: str = "") -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return str(path)


def test_each_series_takes_its_own_kind_with_a_number(tmp_path):
    recs = [{"kind": "start", "step": 0, "recipe": "grpo"},
            {"kind": "train", "step": 1, "loss": 3.5}, {"kind": "train", "step": 2, "loss": None},
            {"kind": "val", "step": 2, "val_loss": 3.0}, {"kind": "val", "step": 3, "val_loss": "x"},
            {"kind": "val", "step": 4},
            {"kind": "rl", "step": 5, "reward": 0.5}, {"kind": "rl", "step": 6, "reward": None},
            {"kind": "eval", "step": 6, "acc": 0.25}, {"kind": "eval", "step": 7, "acc": "high"},
            # numbers under other kinds' names belong to no series
            {"kind": "sample", "step": 8, "loss": 1.0, "val_loss": 1.0, "reward": 1.0, "acc": 1.0},
            {"step": 9, "val_loss": 2.0, "reward": 2.0, "acc": 2.0}, {"kind": "val", "step": 10, "loss": 9.0}]
    p = _write(tmp_path / "metrics.jsonl", recs, '[1, 2]\nnot json\n{"kind": "tra')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the page polls this file while it is written: no warnings
        got = read_loss_curve(p)
    assert got == {"available": True, "path": p, "train": [[1, 3.5]], "val": [[2, 3.0]], "reward": [[5, 0.5]],
                   "held_out": [[6, 0.25]]}


def test_held_out_accuracy_only_from_a_grpo_run(tmp_path):
    evals = [{"kind": "eval", "step": 1, "acc": 0.5}, {"kind": "eval", "step": 2, "acc": 0.75}]
    for recipe in ("sft", "ppo", None):
        start = {"kind": "start", "step": 0, **({"recipe": recipe} if recipe else {})}
        assert read_loss_curve(_write(tmp_path / "m.jsonl", [start, *evals]))["held_out"] == [], recipe
    # an eval before the start record is not a GRPO run's
    assert read_loss_curve(_write(tmp_path / "m.jsonl", [evals[0], {"kind": "start", "recipe": "grpo"},
                                                         evals[1]]))["held_out"] == [[2, 0.75]]


def test_thinning_keeps_every_stride_th_point_and_drops_non_finite_ones(tmp_path):
    losses = [5.0, math.nan, 4.0, math.inf, 3.0, 2.5, -math.inf]
    recs = [{"kind": "train", "step": s, "loss": v} for s, v in enumerate(losses)]
    p = _write(tmp_path / "metrics.jsonl", recs)  # json writes NaN and Infinity, which it reads back
    assert read_loss_curve(p)["train"] == [[0, 5.0], [2, 4.0], [4, 3.0], [5, 2.5]]
    assert read_loss_curve(p, max_points=7)["train"] == [[0, 5.0], [2, 4.0], [4, 3.0], [5, 2.5]]
    # 7 points into 3: a stride of ceil(7 / 3) = 3 keeps steps 0, 3, 6, and then the finite ones
    assert read_loss_curve(p, max_points=3)["train"] == [[0, 5.0]]
    assert read_loss_curve(p, max_points=2)["train"] == [[0, 5.0], [4, 3.0]]  # stride 4: steps 0 and 4


def test_no_file_is_no_curve(tmp_path):
    for missing in (None, tmp_path / "none.jsonl", str(tmp_path / "none.jsonl")):
        assert read_loss_curve(missing) == {"available": False, "train": [], "val": []}
    (tmp_path / "run").mkdir()
    _write(tmp_path / "run" / "metrics.jsonl", [{"kind": "train", "step": 1, "loss": 2.0}])
    assert read_loss_curve(tmp_path / "run")["train"] == [[1, 2.0]]  # a run directory holds its metrics.jsonl


def test_the_page_gets_at_most_2000_points_by_default(tmp_path):
    p = _write(tmp_path / "metrics.jsonl", [{"kind": "train", "step": s, "loss": 1.0} for s in range(2001)])
    train = read_loss_curve(p)["train"]
    assert len(train) == 1001 and train[-1] == [2000, 1.0]  # a stride of 2
    p = _write(tmp_path / "metrics.jsonl", [{"kind": "train", "step": s, "loss": 1.0} for s in range(2000)])
    assert len(read_loss_curve(p)["train"]) == 2000
