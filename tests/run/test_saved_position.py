"""What a resume reads back from meta.json besides the config is data too (issue 21's class, for the run
position): every training command of the CLI's table (tests/training/commands.py) makes a real
checkpoint, then each field of its ``loader`` state (the data position; an RL run's adaptive KL
coefficient) and the top-level ``step``, ``world``, ``rng`` and ``tokens_seen`` are replaced, one at a time, with values
of the wrong type or out of range. ``--resume`` must refuse each with exit 2 and one line naming the
meta.json file (or the loader's own message), never a traceback and never a run from a position the
checkpoint did not hold (a negative cursor once indexed from the end). A field that is only deleted
may be optional (checkpoints from before it existed), and a huge count may have no bound to break (an
epoch number): then resuming may also succeed, but never with a traceback. The step must be the one
the checkpoint directory is named by."""

from __future__ import annotations

import json
import shutil

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from tests.training.commands import RUNS, case_id, training_commands

RESUMABLE = training_commands()
DELETED = object()  # the field removed from meta.json
HUGE = 10**15  # refused where the field has a bound (a cursor past the items), else harmless (an epoch count)
BAD = {  # by the type of the field's good value
    int: [-1, HUGE, "7", 2.5, True, [1], DELETED],
    bool: ["false", 1, DELETED],
    float: [-1.0, 0.0, "0.1", True, DELETED],
    str: ["nope", 5, DELETED],
    list: [["nope"], "x", 5, DELETED],
    dict: ["x", [1], 5, DELETED],
}
EXTRA = {"rl": ["--kl-target", "0.01"]}  # so an RL checkpoint carries state of its own (the KL coefficient)
ONE_MORE = {"train": "--train.max_steps", "sft": "--train.max_steps"}  # else --steps: resume to step 4


def _cases(meta: dict) -> list[tuple[str, str | None, object]]:
    """(section, key, bad value): every loader field, the loader itself, and step / world / rng."""
    out = [("loader", k, bad) for k, v in meta["loader"].items() for bad in BAD[type(v)]]
    out += [("", "loader", bad) for bad in ("x", [1], 5)]
    out += [("", k, bad) for k in ("step", "world", "rng", "tokens_seen") if k in meta for bad in BAD[type(meta[k])]
            if not (k == "rng" and bad is DELETED)]  # (no rng: an RL checkpoint from before the run stack)
    return out


@pytest.mark.parametrize("command,algo", RESUMABLE, ids=[case_id(c) for c in RESUMABLE])
def test_damaged_run_position_is_refused_naming_the_file(world, tmp_path, capsys, command, algo):
    run = tmp_path / "run"
    assert main([*RUNS[command, algo](world), *EXTRA.get(command, []), "--out", str(run)]) == 0
    where = ckpt.latest_checkpoint(run)
    meta_path = where / "meta.json"
    good = json.loads(meta_path.read_text())
    assert good["loader"], f"{command}: its checkpoint saved no position to test"
    capsys.readouterr()
    for section, key, bad in _cases(good):
        meta = json.loads(json.dumps(good))
        holder = meta[section] if section else meta
        if bad is DELETED:
            del holder[key]
        else:
            holder[key] = bad
        meta_path.write_text(json.dumps(meta))
        code = main([command, "--out", str(run), "--resume", str(where), ONE_MORE.get(command, "--steps"), "4"])
        err = capsys.readouterr().err
        for later in set(ckpt.list_checkpoints(run)) - {where}:  # a resume that went on: start over from `where`
            shutil.rmtree(later)
        name = f"{section + '.' if section else ''}{key} = {'(deleted)' if bad is DELETED else repr(bad)}"
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, (name, err)
        if (bad is DELETED or bad == HUGE) and code == 0:
            continue  # an optional field (a checkpoint from before it was saved), or a count with no bound
        assert code == 2, (name, code, err)
        assert str(meta_path) in err or "checkpoint" in err, (name, err)
    meta_path.write_text(json.dumps(good))
    assert main([command, "--out", str(run), "--resume", str(where), ONE_MORE.get(command, "--steps"), "4"]) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000004"
