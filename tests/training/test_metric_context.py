"""Every printed rate has its context (issue 34): the class test walks the summaries and eval outputs
of the commands that print accuracies, win rates and reward scores, on tiny models, and checks each
printed rate carries its 95% interval (and the chance level where one applies), each reward-model
score its scale."""

from __future__ import annotations

import re

import pytest

from gptforge.cli import main
from gptforge.eval.stats import RM_SCORE_SCALE, fmt_rate
from gptforge.eval.tasks.preferences import preference_set, write_preferences
from tests.conftest import tiny_chat_checkpoint

CPU = ["--device", "cpu", "--ckpt-every", "0"]
RATE = re.compile(r"\b(accuracy|win rate|acc_norm|acc)\b")
NUMBER = re.compile(r"\b[01]\.\d{2,}")


def rate_lines_have_context(text: str, chance_expected: bool) -> int:
    """Every line naming a rate next to a value has '95% CI' and n; a chance (or parity) level where
    the rate has one. Returns how many rate lines it checked (a check of nothing proves nothing)."""
    checked = 0
    for line in text.splitlines():
        if RATE.search(line) and NUMBER.search(line):
            checked += 1
            assert "95% CI" in line and ", n " in line, f"a rate without its interval: {line!r}"
            if chance_expected:
                assert "chance" in line or "parity" in line, f"a rate without its chance level: {line!r}"
        if "reward-model score" in line or ("reward" in line and "score" in line):
            assert "logit" in line or "(" in line, f"a score without its scale: {line!r}"
    return checked


def _summary(out: str, command: str) -> str:
    return out[out.index(f"--- {command} summary"):]


def test_fmt_rate_warns_below_chance_and_names_its_parts():
    assert fmt_rate("pair accuracy", 0.28, 100, 0.5).startswith(
        "pair accuracy 0.280 (95% CI 0.201-0.375, n 100, chance 0.500)  WARNING: below chance")
    assert "within noise" in fmt_rate("x", 0.45, 40, 0.5) and "WARNING" not in fmt_rate("x", 0.45, 40, 0.5)
    assert fmt_rate("acc", 0.7, 10) == "acc 0.700 (95% CI 0.397-0.892, n 10)"


def test_every_command_that_prints_a_rate_gives_its_context(tmp_path, tokenizer, capsys):
    sft = tiny_chat_checkpoint(tmp_path / "sft")
    prefs = write_preferences(preference_set("compare", 24, seed=1), tmp_path / "prefs.jsonl")
    pairs = ["--data", str(prefs), "--val-count", "8", "--micro-batch", "4", "--steps", "1", *CPU]

    assert main(["rm", "--init-from", str(sft), "--out", str(tmp_path / "rm"), *pairs]) == 0
    out = _summary(capsys.readouterr().out, "rm")
    assert rate_lines_have_context(out, chance_expected=True) == 1 and "pair accuracy" in out

    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "dpo"), "--task", "compare",
                 "--eval-n", "4", *pairs]) == 0
    out = _summary(capsys.readouterr().out, "dpo")
    assert rate_lines_have_context(out, chance_expected=True) == 2 and "--tasks compare" in out

    rl = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "4",
          "--steps", "1", *CPU]
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "ppo"), "--algo", "ppo",
                 "--reward-model", str(tmp_path / "rm"), *rl]) == 0
    full = capsys.readouterr().out
    out = _summary(full, "rl")
    assert rate_lines_have_context(out, chance_expected=True) == 2 and RM_SCORE_SCALE in out
    assert "reward (rm score, logit) " in full  # the per-step log line names the scale too

    assert main(["eval", "--ckpt", str(tmp_path / "rm"), "--preferences", str(prefs)]) == 0
    out = capsys.readouterr().out
    assert rate_lines_have_context(out, chance_expected=True) == 1 and "24 preference pairs" in out

    assert main(["eval", "--tasks", "compare", "--limit", "3", "--ckpt", str(sft), "--against", str(sft),
                 "--reward-model", str(tmp_path / "rm")]) == 0
    out = capsys.readouterr().out
    assert rate_lines_have_context(out, chance_expected=True) == 3 and RM_SCORE_SCALE in out

    assert main(["eval", "--tasks", "compare", "--limit", "3", "--ckpt", str(sft), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    header, row = out.strip().splitlines()[-2:]
    assert "95% CI" in header and "chance" in header and "0.500" in row  # the table: interval and chance columns


def test_pretraining_summary_gives_its_in_loop_evals_interval(tmp_path):
    import json

    from gptforge.cli.common import summary
    from gptforge.training.loop import RunResult

    rec = {"kind": "eval", "step": 4, "task": "hellaswag", "acc": 0.3, "acc_norm": 0.25, "n": 40, "chance": 0.25}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    text = summary(RunResult(run_dir=tmp_path, steps_done=4), "train")
    assert rate_lines_have_context(text, chance_expected=True) == 1 and "hellaswag: acc_norm (step 4) 0.250" in text


@pytest.mark.parametrize("line", ["held-out    pair accuracy 0.280", "win rate 0.4775 over 40 prompts"])
def test_the_checker_catches_a_bare_rate(line):
    with pytest.raises(AssertionError):
        rate_lines_have_context(line, chance_expected=True)
