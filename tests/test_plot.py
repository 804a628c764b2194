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


def test_an_rl_run_has_a_reward_row_and_its_held_out_accuracy(tmp_path, monkeypatch):
    """Each recipe on its own axes (issue 34): an RL run's surrogate loss (about 0) never lands on the
    token-loss axes beside an SFT or pretraining run; RL records count steps, not tokens, so their
    tokens panels say so instead of an empty 0-1 axis labelled in milli-tokens."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    run = _rl_run(tmp_path / "rl")
    s = _run_series(run)
    assert sorted(s["rl"]) == [1, 2, 3, 4, 5] and not s["train"]  # the RL loss is not a token loss
    assert {step: r["acc"] for step, r in s["eval"]["arithmetic"].items()} == {0: 0.1, 5: 0.4}
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": k, "loss": 5.0 - k,
                                                           "tokens": 2048 * k}) + "\n" for k in range(1, 4)))
    figs = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figs.append(fig), close(fig)))
    rows = {}
    for name, runs in (("pre", [pre]), ("rl", [run]), ("both", [pre, run])):
        out = plot_runs([str(r) for r in runs], tmp_path / f"{name}.png")
        rows[name] = _png_size(out)[1]
    # loss only; reward + arithmetic; loss + reward + arithmetic when a pretraining run is beside it
    assert rows["rl"] == pytest.approx(2 * rows["pre"], rel=0.02)
    assert rows["both"] == pytest.approx(3 * rows["pre"], rel=0.02)
    loss_step, loss_tokens = figs[-1].axes[0], figs[-1].axes[1]
    assert [ln.get_label() for ln in loss_step.lines] == ["pre train"]  # no "rl train" flat at 0
    assert "loss" in loss_step.get_title()
    reward_tokens = figs[-1].axes[3]
    assert not reward_tokens.lines and any("no token counts" in t.get_text() for t in reward_tokens.texts)
    labels = [t.get_text() for t in loss_tokens.get_xticklabels() if t.get_text()]
    assert labels and not any(lab.endswith("m") for lab in labels)  # whole tokens, not milli-tokens


@pytest.mark.parametrize("content", ["[" * 100_000, "[1]", '{"data": [1]}', '{"data": {"dir": 5}}', "\x80"])
def test_a_damaged_config_json_beside_the_metrics_is_a_warning(tmp_path, capsys, content):
    """config.json only says whether the run trained on FineWeb (its reference lines): damaged, the run is
    still drawn, with one warning naming the file where it cannot be read (not a traceback)."""
    run = _rl_run(tmp_path / "rl")
    (run / "config.json").write_text(content, encoding="latin-1")
    s = _run_series(run)
    assert sorted(s["rl"]) == [1, 2, 3, 4, 5] and s["fineweb"] is False
    err = capsys.readouterr().err
    assert (len(err.strip().splitlines()) == 1 and "config.json: " in err and "warning" in err) if content[0] in "[\x80" \
        else not err, err
    (run / "config.json").write_text(json.dumps({"data": {"dir": "data/fineweb10B"}}))
    assert _run_series(run)["fineweb"] is True


def _records(run_id, steps, loss0, replayed=False):
    start = {"kind": "start", "step": 0} | ({"run": run_id} if run_id else {})
    return [start] + [{"kind": "train", "step": s, "loss": loss0 - s, "tokens": 64 * s}
                      | ({"replayed": True} if replayed else {}) for s in steps]


def test_records_of_another_run_appended_to_the_file_are_named_not_drawn_silently(tmp_path, capsys):
    """Two runs' records in one metrics.jsonl (files joined, a run's log copied in) were drawn as one curve
    without a word: one warning names the file, the lines and the run they belong to, and what to do. A run's
    own resumes (one id), a dead first attempt a restart marked replayed, and files from before start records
    named their run draw as before, silently."""
    import torch

    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run import checkpoint as ckpt

    run = tmp_path / "run"
    run.mkdir()
    cases = {
        "joined": _records("aaaa", range(1, 7), 9.0) + _records("bbbb", range(1, 4), 5.0),
        "resumed": _records("aaaa", range(1, 4), 9.0) + _records("aaaa", range(4, 7), 9.0),
        "dead first attempt": _records("aaaa", range(1, 7), 9.0, replayed=True) + _records("bbbb", range(1, 4), 5.0),
        "before run ids": _records(None, range(1, 7), 9.0) + _records(None, range(1, 4), 5.0),
    }
    for name, recs in cases.items():
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        capsys.readouterr()
        s = _run_series(run)
        err = capsys.readouterr().err
        assert sorted(s["train"]) == [1, 2, 3, 4, 5, 6] if name != "dead first attempt" else [1, 2, 3]
        if name != "joined":
            assert err == "", (name, err)
            continue
        # no checkpoint: this run is the one that started last
        assert err == (f"gptforge plot: warning: {run / 'metrics.jsonl'}: lines 2-7 hold 6 records of another run "
                       "(run aaaa), not this one (bbbb); they are drawn into this run's curves as if one run: move "
                       "them out of this file (into a metrics.jsonl of their own, to plot beside it)\n")
    # the folder's checkpoint says which run it is: the other one's records are named
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cases["joined"]))
    torch.manual_seed(0)
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    ckpt.save_checkpoint(run, 6, GPT(mcfg), None, {"run_id": "aaaa", "config": Config(model=mcfg).to_dict()})
    capsys.readouterr()
    _run_series(run)
    err = capsys.readouterr().err
    assert "lines 9-11 hold 3 records of another run (run bbbb), not this one (aaaa)" in err, err
