"""Ctrl-C on every training command, by construction: each command of the CLI's table that offers
``--resume`` (and each ``--algo`` it can run) gets a real SIGINT after step 2 of 3, must exit 130 with
an intact step-2 checkpoint, and ``--resume`` must then finish bit-exactly as the uninterrupted run
(every metrics record but timings, and every weight). A new resumable command without a case here
fails :func:`test_every_resumable_command_has_a_case`
(the runs are in tests/training/commands.py).

The signal is ``GPTFORGE_FAULT_INJECT=0:2:int``: ``os.kill(own pid, SIGINT)`` right after step 2's
optimizer step, through the real handler (:mod:`gptforge.run.signals`) and the real exit status, in
this process so each case costs three tiny runs and no interpreter start. A signal at an arbitrary
moment of a real subprocess is covered for ``train`` (test_training.py, test_run_endings.py) and
``rl`` (test_rl_guards.py).
"""

from __future__ import annotations

import signal

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from tests.training.commands import RUNS, assert_same_run, case_id, history, training_commands

RESUMABLE = training_commands()


def test_every_resumable_command_has_a_case():
    assert {c for c, _ in RESUMABLE} >= {"train", "sft", "rl", "rm", "dpo"}  # the enumeration itself works
    missing = [c for c in RESUMABLE if c not in RUNS]
    assert not missing, f"add a run for {missing} to tests/training/commands.py RUNS"


@pytest.mark.parametrize("command,algo", RESUMABLE, ids=[case_id(c) for c in RESUMABLE])
def test_ctrl_c_saves_exits_130_and_resumes_bit_exactly(world, tmp_path, monkeypatch, capsys, command, algo):
    if (command, algo) not in RUNS:
        pytest.fail(f"no run for {case_id((command, algo))}: add one to tests/training/commands.py RUNS")
    argv = RUNS[command, algo](world)
    full, part = tmp_path / "full", tmp_path / "part"
    def unhandled(signum, frame):  # without this, a command that installed no stop handler would end the session
        raise AssertionError(f"SIGINT reached the test: `{command}` did not install the run's stop handler")

    before = signal.signal(signal.SIGINT, unhandled)
    try:
        assert main([*argv, "--out", str(full)]) == 0
        monkeypatch.setenv("GPTFORGE_FAULT_INJECT", "0:2:int")
        capsys.readouterr()
        assert main([*argv, "--out", str(part)]) == 130
        io = capsys.readouterr()
        assert "got SIGINT" in io.err and "stopped at step 2; continue with --resume" in io.out, io.out + io.err
        saved = ckpt.latest_checkpoint(part)
        assert saved is not None and ckpt.read_meta(saved)["step"] == 2
        ckpt.verify_checkpoint(saved)
        monkeypatch.delenv("GPTFORGE_FAULT_INJECT")
        assert main([command, "--out", str(part), "--resume"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)  # a stopped run leaves its handler for the grace window
    assert f"resumed from {saved}" in capsys.readouterr().out
    assert ckpt.read_meta(ckpt.latest_checkpoint(part))["step"] == 3
    a, b = history(full), history(part)
    assert {1, 2, 3} <= {r["step"] for r in a} and len(a) == len(b)
    assert_same_run(full, part)
