"""A recipe's short flag and the config key it sets, both on one command line (``rl --steps 10
--train.max_steps 20``), are refused by name: before, the later one silently won. The class: every
(flag, key) pair of sft, rl, rm and dpo, read from the CLI's own tables, with both spellings of the key."""

from __future__ import annotations

import argparse

import pytest

from gptforge.cli import build_parser, main
from gptforge.cli.align import DPO_FLAGS, PAIR_FLAGS
from gptforge.cli.post import RL_FLAGS, SFT_FLAGS


def _sub(command: str) -> argparse.ArgumentParser:
    return next(a for a in build_parser()._subparsers._group_actions if a.dest == "command").choices[command]


def _pairs():
    tables = {"sft": SFT_FLAGS, "rl": RL_FLAGS, "rm": {k: v.format(s="rm") for k, v in PAIR_FLAGS.items()},
              "dpo": {**{k: v.format(s="dpo") for k, v in PAIR_FLAGS.items()}, **DPO_FLAGS}}
    for command, table in tables.items():
        for dest, key in table.items():
            yield command, dest, key


def _value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []  # store_true
    if action.choices:
        return [str(list(action.choices)[-1])]
    return ["x.jsonl"] if action.type in (None, str) else ["3"]  # int, float and the CLI's checked numbers


PAIRS = list(_pairs())


def test_every_flag_of_the_tables_is_a_flag_of_its_command():
    assert len(PAIRS) > 40
    for command, dest, _ in PAIRS:
        assert any(a.dest == dest and a.option_strings for a in _sub(command)._actions), (command, dest)


@pytest.mark.parametrize(("command", "dest", "key"), PAIRS)
def test_a_flag_and_its_key_together_are_refused(command, dest, key, tmp_path, capsys, monkeypatch):
    action = next(a for a in _sub(command)._actions if a.dest == dest and a.option_strings)
    flag = max(action.option_strings, key=len)
    start = [] if dest in ("init_from", "data") else ["--init-from", str(tmp_path / "none")]
    if command != "rl" and dest != "data":
        start += ["--data", str(tmp_path / "none.jsonl")]
    for spelled in ([f"--{key}", "4"], [f"--{key}=4"]):
        argv = [command, *start, "--out", str(tmp_path / "run"), flag, *_value(action), *spelled]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{flag} and --{key} both set {key}" in err, (argv, err)
    assert not (tmp_path / "run").exists()
