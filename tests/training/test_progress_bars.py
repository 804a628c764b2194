"""The long passes with no log line of their own draw a bar on stderr (issue 55: no silent minute):
DPO's reference log-probs, generative eval and RL's held-out eval. Each bar counts every item of its
pass (the pairs in the file, the problems asked for), from 0 at its start."""

from __future__ import annotations

import json

import pytest
import tqdm as tqdm_module

from gptforge.cli import main
from tests.training.commands import RUNS


class Recorded(tqdm_module.tqdm):
    """tqdm that remembers each bar: its name, total, unit and the count it reached."""

    bars: list[dict] = []

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.row = {"desc": k.get("desc"), "total": k.get("total"), "unit": k.get("unit"), "shown": not self.disable}
        Recorded.bars.append(self.row)

    def close(self):
        self.row["n"] = self.n
        super().close()


@pytest.fixture
def bars(monkeypatch):
    Recorded.bars = []
    monkeypatch.setattr(tqdm_module, "tqdm", Recorded)
    return Recorded.bars


def test_dpo_reference_pass_counts_every_pair(world, bars, tmp_path):
    assert main([*RUNS[("dpo", None)](world), "--out", str(tmp_path / "dpo")]) == 0
    pairs = sum(1 for line in open(world["prefs"]) if line.strip())  # the file, counted by hand
    val = 4  # RUNS' --val-count
    ref = {b["desc"]: b for b in bars if b["desc"].startswith("reference log-probs")}
    assert ref == {"reference log-probs (train)": {"desc": "reference log-probs (train)", "total": pairs - val,
                                                   "unit": "pair", "shown": True, "n": pairs - val},
                   "reference log-probs (val)": {"desc": "reference log-probs (val)", "total": val, "unit": "pair",
                                                 "shown": True, "n": val}}


def test_rl_held_out_eval_counts_every_problem(world, bars, tmp_path):
    assert main([*RUNS[("rl", "grpo")](world), "--out", str(tmp_path / "rl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    held = [b for b in bars if b["desc"] == "held-out arithmetic (2 problems)"]  # RUNS' --eval-n 2
    assert len(held) == len(evals) >= 1 and all(b["total"] == b["n"] == 2 and b["shown"] for b in held), bars


def test_generative_eval_draws_its_bar_on_stderr(world, capsys):
    assert main(["eval", "--tasks", "arithmetic", "--ckpt", world["chat"], "--limit", "3", "--device", "cpu"]) == 0
    cap = capsys.readouterr()
    assert "arithmetic (3 problems)" in cap.err and "0/3" in cap.err and "arithmetic (3 problems)" not in cap.out


def test_generative_eval_bar_counts_every_problem(world, bars):
    assert main(["eval", "--tasks", "arithmetic,compare", "--ckpt", world["chat"], "--limit", "3",
                 "--device", "cpu"]) == 0
    assert [(b["desc"], b["total"], b["n"]) for b in bars] == [("arithmetic (3 problems)", 3, 3),
                                                              ("compare (3 problems)", 3, 3)]
