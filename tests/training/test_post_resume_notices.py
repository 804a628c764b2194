"""Every training command's ``--resume`` says what it will do, in the one notice (gptforge.run.resume, said by
gptforge.run.session.RunSession, which every recipe's run opens): a changed train.max_steps, a changed learning
rate, and a finished run, which exits 0 with the word and how to extend it, and trains, evaluates and writes
nothing. The commands are read from the CLI's table (tests/training/commands.py), so a new recipe is covered or
fails test_ctrl_c_every_command's check that it has a run.

Each case: a fresh 3-step run checkpointed at steps 2 and 3; ``--resume`` (complete); the step-3 checkpoint
removed, ``--resume --optim.lr`` doubled (step 3 again); ``--resume --train.max_steps 4`` (step 4)."""

from __future__ import annotations

import shutil

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from tests.training.commands import RUNS, case_id, training_commands

RESUMABLE = training_commands()
USE = {"train": "gptforge sample --ckpt {run}", "rm": "gptforge eval --ckpt {run} --preferences PAIRS.jsonl"}


def _checkpoint_every_2(argv: list[str]) -> list[str]:
    """The case's fresh run with a checkpoint at step 2 too (its --ckpt-every / train.ckpt_every 0 made 2)."""
    out = list(argv)
    i = next(i for i, a in enumerate(out) if a in ("--ckpt-every", "--train.ckpt_every"))
    out[i + 1] = "2"
    return out


@pytest.mark.parametrize("command,algo", RESUMABLE, ids=[case_id(c) for c in RESUMABLE])
def test_resume_says_a_finished_run_a_changed_lr_and_a_changed_length(world, tmp_path, capsys, command, algo):
    run = tmp_path / "run"
    assert main([*_checkpoint_every_2(RUNS[command, algo](world)), "--out", str(run)]) == 0
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002", "step_000003"]
    capsys.readouterr()

    # finished: the word and nothing else on stdout (no model built, no eval, no summary), exit 0, nothing written
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main([command, "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert out == (f"run {run} is complete: its newest checkpoint (step_000003) is at step 3 of train.max_steps 3; "
                   f"nothing to train. To train further: gptforge {command} --out {run} --resume --train.max_steps 6 "
                   f"(the LR schedule is stretched to the new length). To use it: "
                   f"{USE.get(command, 'gptforge chat --ckpt {run}').format(run=run)}\n")
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002", "step_000003"]

    # a changed learning rate on an unfinished run: said before the step it changes
    shutil.rmtree(run / "checkpoints" / "step_000003")
    lr = ckpt.read_meta(run / "checkpoints" / "step_000002")["config"]["optim"]["lr"]
    assert main([command, "--out", str(run), "--resume", "--optim.lr", repr(2 * lr)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"resuming at step 2 with a changed learning-rate schedule (optim.lr {lr:g} -> {2 * lr:g}; "
                          "saved -> this run): the log's first line (step 3) shows lr "), out[:400]
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["step"] == 3

    # a changed length: said, then trained
    assert main([command, "--out", str(run), "--resume", "--train.max_steps", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("extending the run from train.max_steps 3 to 4: the LR schedule ("), out[:400]
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["step"] == 4
