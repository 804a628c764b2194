"""Hostile input to every training command, by construction: the commands come from the CLI's table
(those with ``--resume``: train, sft, rl, rm, dpo, see tests/training/commands.py) and the cases from
their own parsers, so a new command or flag is covered (or fails here naming what is missing):

* every ``--data`` flag: an empty file, blank lines, not JSON, not an object, missing fields, a
  conversation without a reply, every row bad under ``--skip-bad``;
* every model flag: ``--init-from`` a reward model or a missing path, ``--reward-model`` a checkpoint
  that is not a reward model or a missing path;
* every numeric flag: -1, and 1e30 for a count, nan and inf for a number; and the counts that would
  make a run generate or draw without end (10^9 problems, replies or pairs a step).

Each is exit status 2 with one line that names the flag (as typed) or the file and row, refused before
the run directory exists.
"""

from __future__ import annotations

import json

import pytest

from gptforge.cli import main
from gptforge.cli.common import count, finite
from tests.training.commands import RUNS, make_world, subparsers, training_commands

TRAINING = training_commands()
COMMAND_NAMES = sorted({c for c, _ in TRAINING}, key=[c for c, _ in TRAINING].index)
SUB = subparsers()


def _flags(command: str) -> dict:
    return SUB[command]._option_string_actions


def _run_argv(command: str, world: dict) -> list[str]:
    algo = next(a for c, a in TRAINING if c == command)
    return RUNS[command, algo](world)


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with ``flag``'s value replaced (or the flag added)."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, flag, value]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    w = make_world(tmp_path_factory.mktemp("hostile"))
    rm = f"{w['tmp']}/rm"
    assert main(["rm", "--init-from", w["chat"], "--data", w["prefs"], "--out", rm, "--steps", "1", "--val-count", "4",
                 "--micro-batch", "2", "--device", "cpu"]) == 0
    return {**w, "rm": rm}


def _refused(capsys, argv: list[str], out, *needles: str) -> str:
    capsys.readouterr()
    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as e:  # argparse's refusal of a value its type cannot read
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    last = err.strip().splitlines()[-1]  # argparse prints its usage above its one line
    assert "Traceback" not in err and (len(err.strip().splitlines()) == 1 or "usage:" in err), err
    for n in needles:
        assert n in last, (n, last)
    assert not out.exists(), f"{out} was made before the refusal"
    return last


# --- every --data flag ----------------------------------------------------------------------------------

PREF_WITHOUT_REPLY = {"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}
WITHOUT_REPLY = {"sft": {"messages": [{"role": "user", "content": "hi"}]}, "rm": PREF_WITHOUT_REPLY,
                 "dpo": PREF_WITHOUT_REPLY}  # a row whose conversation has no reply, per --data command
BAD_FILES = {"empty": ("", None), "blank_lines": ("\n \n", None), "not_json": ("hello\n", 1),
             "not_an_object": ("[1, 2]\n", 1), "missing_fields": ('{"x": 1}\n', 1), "no_reply": (None, 1),
             "all_skipped": ("hello\n[1]\n", None)}  # every row bad, with --skip-bad
DATA_COMMANDS = [c for c in COMMAND_NAMES if "--data" in _flags(c)]


@pytest.mark.parametrize("kind", list(BAD_FILES))
@pytest.mark.parametrize("command", DATA_COMMANDS)
def test_every_data_flag_refuses_a_bad_file_naming_it(world, tmp_path, capsys, command, kind):
    text, row = BAD_FILES[kind]
    if text is None:
        assert command in WITHOUT_REPLY, f"add a row without a reply for `{command} --data` to WITHOUT_REPLY"
        text = json.dumps(WITHOUT_REPLY[command]) + "\n"
    bad = tmp_path / f"{kind}.jsonl"
    bad.write_text(text)
    argv = _with(_run_argv(command, world), "--data", str(bad))
    if kind == "all_skipped":
        assert "--skip-bad" in _flags(command)
        argv.append("--skip-bad")
    _refused(capsys, argv, tmp_path / "run", f"{bad}:{row}:" if row else f"{bad}: no ")


# --- every model flag -------------------------------------------------------------------------------------

def _model_cases() -> list[tuple[str, str, str]]:
    cases = []
    for command, algo in TRAINING:
        for flag, wrong in (("--init-from", "rm"), ("--reward-model", "chat")):
            if flag in _flags(command):
                cases += [(command, algo, flag, wrong), (command, algo, flag, "missing")]
    return cases


@pytest.mark.parametrize("command,algo,flag,wrong", _model_cases())
def test_every_model_flag_refuses_the_wrong_kind_of_checkpoint(world, tmp_path, capsys, command, algo, flag, wrong):
    path = str(tmp_path / "nothing") if wrong == "missing" else world[wrong]
    says = {"rm": "is a reward model", "chat": "not a reward model", "missing": "does not exist"}[wrong]
    _refused(capsys, _with(RUNS[command, algo](world), flag, path), tmp_path / "run", f"{flag}: ", path, says)


def test_the_model_flags_are_where_the_class_expects_them():
    have = {f: [c for c in COMMAND_NAMES if f in _flags(c)] for f in ("--init-from", "--reward-model")}
    assert have == {"--init-from": ["train", "sft", "rl", "rm", "dpo"], "--reward-model": ["rl"]}, have


# --- every numeric flag -------------------------------------------------------------------------------------

def _numeric_cases() -> list[tuple[str, str, str]]:
    cases = []
    for command in COMMAND_NAMES:
        for a in SUB[command]._actions:
            if a.option_strings and a.type in (int, count):
                cases += [(command, a.option_strings[0], v) for v in ("-1", "1e30")]
            elif a.option_strings and a.type in (float, finite):
                cases += [(command, a.option_strings[0], v) for v in ("-1", "nan", "inf")]
    return cases


NUMERIC = _numeric_cases()


@pytest.mark.parametrize("command,flag,value", NUMERIC, ids=[f"{c}{f}={v}" for c, f, v in NUMERIC])
def test_every_numeric_flag_refuses_negative_and_absurd_values_naming_it(world, tmp_path, capsys, command, flag,
                                                                         value):
    _refused(capsys, _with(_run_argv(command, world), flag, value), tmp_path / "run", flag)


# counts that would make a run generate or draw without end before its first step
ENDLESS = [("rl", "--prompts", "1000000000", "replies a step"), ("rl", "--group", "1000000000", "replies a step"),
           ("rl", "--eval-n", "1000000000", "rl.eval_n"), ("rl", "--eval-n", "60000", "leave almost none to train"),
           ("dpo", "--eval-n", "1000000000", "dpo.eval_n"), ("rm", "--micro-batch", "1000000000", "training pairs"),
           ("dpo", "--micro-batch", "21", "more than the 20 training pairs")]


@pytest.mark.parametrize("command,flag,value,says", ENDLESS)
def test_counts_that_would_never_finish_are_refused(world, tmp_path, capsys, command, flag, value, says):
    argv = _with(_run_argv(command, world), flag, value)
    if "--eval-n" in flag and value == "60000":
        argv = [*argv, "--task", "compare"]  # 8,010 distinct compare problems: all held out
    _refused(capsys, argv, tmp_path / "run", flag, says)
