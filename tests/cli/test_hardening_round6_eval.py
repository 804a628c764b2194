"""Hardening round 6, `gptforge eval`'s numbers: a --limit past a generated task's held-out set (500 problems,
the ones every training draw leaves out) is the whole set, said in one line as the scored tasks say it, instead
of scoring problems training may have drawn (and generating 2 x limit problems first: --limit 1e11 never
finished); each bad numeric flag is named alone; a task named twice is refused."""

from __future__ import annotations

import time

import pytest

from gptforge.cli import main
from gptforge.eval.generative import GENERATED, HELD_OUT, task_problems


@pytest.mark.parametrize("name", sorted(GENERATED))
@pytest.mark.parametrize("limit", [HELD_OUT + 1, 2_000])
def test_a_limit_past_the_held_out_set_is_the_held_out_set(name, limit):
    whole = task_problems(name, 0)
    assert len(whole) == HELD_OUT
    assert [p.question for p in task_problems(name, limit)] == [p.question for p in whole]
    assert [p.question for p in task_problems(name, 7)] == [p.question for p in whole[:7]]


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_a_huge_limit_costs_nothing(name):
    start = time.thread_time()  # CPU of this thread: what the call costs (~0.01 s), not a loaded machine's wait
    assert len(task_problems(name, 10**11)) == HELD_OUT
    assert time.thread_time() - start < 5


def test_eval_says_the_limit_was_clamped_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from tests.conftest import tiny_chat_checkpoint

    sft = tiny_chat_checkpoint(tmp_path / "sft")
    seen = {}

    def fake(model, enc, names, template, limit=0, **kw):  # no generation: the limit it is given is the point
        seen["n"] = {n: len(task_problems(n, limit, kw.get("offset", 0))) for n in names}
        return []

    monkeypatch.setattr("gptforge.eval.generative.evaluate_generative", fake)
    assert main(["eval", "--ckpt", str(sft), "--device", "cpu", "--tasks", "arithmetic,compare",
                 "--limit", "99999999999"]) == 0
    out = capsys.readouterr().out
    assert "arithmetic: limit 99999999999 exceeds the 500 held-out problems; using all 500" in out
    assert "compare: limit 99999999999 exceeds the 500 held-out problems; using all 500" in out
    assert seen["n"] == {"arithmetic": 500, "compare": 500}


@pytest.mark.parametrize("argv, flag", [
    (["--limit", "-1"], "--limit must be >= 0 (0 = all); got -1"),
    (["--batch-tokens", "0"], "--batch-tokens must be >= 1; got 0"),
    (["--repeats", "0", "--bench"], "--repeats must be >= 1; got 0"),
    (["--tasks", "arithmetic,compare,arithmetic"], "--tasks: arithmetic given more than once"),
    (["--tasks", "hellaswag, hellaswag"], "--tasks: hellaswag given more than once"),
])
def test_a_bad_eval_flag_is_named_alone(tmp_path, capsys, argv, flag):
    assert main(["eval", "--random", "d2", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
