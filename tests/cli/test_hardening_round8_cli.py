"""Hardening round eight of the command line: careless and hostile command lines across every command.

A single-valued option given twice with different values (``train --optim.lr 1e-3 ... --optim.lr 3e-4``, ``sample
--ckpt a --ckpt b``, ``plan --world 4 --gpus 8``) silently took the last one in every command (argparse's way).
``argparsing.OneLineParser`` now refuses it in one line naming the flag and both values; the walk below gives every
single-valued option of every command and sub-command (read from the CLI's own parsers, so a command added later is
covered) two different values, and every ``--section.key`` of every override-taking command too. The same value
twice is taken (the parser's docstring says why), and options meant to repeat keep every value.
"""

from __future__ import annotations

import argparse
import importlib

import pytest

from gptforge.cli import COMMANDS, build_parser, main

SINGLE = (argparse._StoreAction, argparse._StoreConstAction)  # store_true/false are store_const underneath


def _walk(p: argparse.ArgumentParser, path: list[str]):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _walk(sp, [*path, name])
        elif a.option_strings:
            yield path, p, a


def _options():
    for command in COMMANDS:
        for path, p, a in _walk(build_parser([command]), []):
            if path[:1] == [command] and isinstance(a, SINGLE):
                yield path, p, a


OPTIONS = list(_options())


def _two_values(a: argparse.Action) -> tuple[str, str]:
    """Two values the option's type takes, that differ."""
    if a.choices:
        first, second = list(a.choices)[:2]
        return str(first), str(second)
    name = getattr(a.type, "__name__", "")
    if name in ("port",):
        return "8101", "8102"
    if name in ("int", "count"):
        return "3", "4"
    if name in ("float", "finite"):
        return "0.5", "0.25"
    return "a.x", "b.x"


def _exit(argv) -> tuple[int, str]:
    try:
        return main(argv), ""
    except SystemExit as e:
        return int(e.code or 0), ""


def test_the_walk_sees_every_command():
    commands = {path[0] for path, _, _ in OPTIONS}
    # presets has no option of its own; every other command does
    assert commands == set(COMMANDS) - {"presets"}, set(COMMANDS) - commands
    assert len(OPTIONS) > 250


VALUED = [(path, p, a) for path, p, a in OPTIONS if a.nargs != 0 and not (a.choices and len(a.choices) < 2)]


def _refusal(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    """The one line the parser refuses ``argv`` with (parsed only: no command runs, whatever the parser does)."""
    with pytest.raises(SystemExit) as e:
        parser.parse_known_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("path", "parser", "action"), VALUED,
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in VALUED])
def test_a_single_valued_option_given_twice_with_different_values_is_refused(path, parser, action, capsys):
    flag = action.option_strings[-1]
    v1, v2 = _two_values(action)
    err = _refusal(parser, [flag, v1, f"{flag}={v2}"], capsys)
    assert f"{flag} given twice, {v1!r} and {v2!r}" in err and f"gptforge {' '.join(path)}" in err, err


def test_the_refusal_reaches_the_command_line(capsys):
    assert _exit(["sample", "--ckpt", "runs/a", "--ckpt", "runs/b"])[0] == 2
    assert "gptforge sample: error: --ckpt given twice, 'runs/a' and 'runs/b'" in capsys.readouterr().err


# one option under two names: the refusal names both as typed
ALIASED = [(path, p, a) for path, p, a in OPTIONS if a.nargs != 0 and len(a.option_strings) > 1]


@pytest.mark.parametrize(("path", "parser", "action"), ALIASED,
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in ALIASED])
def test_two_names_of_one_option_with_different_values_are_refused(path, parser, action, capsys):
    first, second = action.option_strings[0], action.option_strings[-1]
    v1, v2 = _two_values(action)
    err = _refusal(parser, [first, v1, second, v2], capsys)
    assert f"{first} {v1!r} and {second} {v2!r} set the same option" in err, err


def test_aliased_options_exist():
    assert any(a.option_strings[-1] == "--gpus" for _, _, a in ALIASED), ALIASED


@pytest.mark.parametrize(("path", "action"), [(p, a) for p, _, a in OPTIONS if a.nargs == 0][:1000],
                         ids=lambda x: " ".join(x) if isinstance(x, list) else x.option_strings[-1])
def test_a_switch_given_twice_is_taken_as_once(path, action):
    """``--force --force`` parses as ``--force`` does (both succeed alike, or both fail with the same error)."""
    p = next(sp for q, sp, a in OPTIONS if a is action)
    flag = action.option_strings[-1]

    def parse(argv):
        try:
            ns, rest = p.parse_known_args(argv)
            return vars(ns), rest
        except SystemExit as e:
            return e.code

    assert parse([flag, flag]) == parse([flag])


def test_the_same_value_twice_is_taken(capsys):
    sub = next(a for a in build_parser(["plan"])._actions if isinstance(a, argparse._SubParsersAction))
    ns, _ = sub.choices["plan"].parse_known_args(["--world", "4", "--gpus", "4.0", "--tokens", "1e9",
                                                 "--tokens", "1_000_000_000"])
    assert ns.world == 4 and ns.tokens == 1e9


OVERRIDE_COMMANDS = [c for c, (_, takes, _) in COMMANDS.items() if takes]


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
@pytest.mark.parametrize("spelled", ["space", "equals"])
def test_a_config_key_given_twice_with_different_values_is_refused(command, spelled, capsys):
    def key(v):
        return ["--train.max_steps", v] if spelled == "space" else [f"--train.max_steps={v}"]

    err = _refusal(build_parser([command]), [command, *key("5"), "--optim.lr", "1e-3", *key("50")], capsys)
    assert f"gptforge {command}: error: --train.max_steps given twice, '5' and '50'" in err, err


def test_a_config_key_given_twice_with_one_value_is_taken(capsys):
    assert main(["train", "--preset", "tiny", "--optim.lr", "1e-3", "--optim.lr=0.001", "--train.max_steps", "7",
                 "--train.max_steps", "7", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"lr": 0.001' in out and '"max_steps": 7' in out


def test_repeatable_options_keep_every_value():
    def sub(command):
        return next(a for a in build_parser([command])._actions
                    if isinstance(a, argparse._SubParsersAction)).choices[command]

    ns, _ = sub("sample").parse_known_args(["--prompt", "a", "--prompt", "b", "--stop", "x", "--stop", "y"])
    assert ns.prompt == ["a", "b"] and ns.stop == ["x", "y"]
    ns, _ = sub("bench").parse_known_args(["--switch", "model.fused_ce=true", "--switch", "optim.fused=false"])
    assert ns.switch == ["model.fused_ce=true", "optim.fused=false"]
    tok = sub("tokenizer")
    ns, _ = tok.parse_known_args(["train", "f.txt", "--out", "t.json", "--special", "<a>", "--special", "<b>"])
    assert ns.special == ["<a>", "<b>"]


# the bench modules run as tools (python -m gptforge.bench.X) take the same parser class
TOOLS = [("trace", ["t.json", "--top", "3", "--top", "4"], "--top"),
         ("tokenizer_train", ["--copies", "1", "--copies", "2"], "--copies"),
         ("readme_numbers", ["--out", "a", "--out", "b"], "--out"),
         ("llmc", ["report", "--skip", "1", "--skip", "2"], "--skip")]


class _Parsed(Exception):
    """The tool's parser took its command line: the test stops there, before the tool would run."""


@pytest.mark.parametrize(("tool", "argv", "flag"), TOOLS)
def test_tools_refuse_a_flag_given_twice(tool, argv, flag, capsys, monkeypatch):
    from gptforge.argparsing import OneLineParser

    real = OneLineParser.parse_args

    def parse_only(self, *a, **k):
        real(self, *a, **k)
        raise _Parsed

    monkeypatch.setattr(OneLineParser, "parse_args", parse_only)
    module = importlib.import_module(f"gptforge.bench.{tool}")
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    assert e.value.code == 2
    assert f"{flag} given twice" in capsys.readouterr().err


def test_an_override_before_a_commands_positionals_keeps_its_value(capsys):
    """``race --train.max_steps 5 tiny llama-tiny`` raced a preset named '5' (argparse gave the override's value
    to the positional); the override is one word to argparse now, wherever it stands."""
    assert main(["race", "--train.max_steps", "5", "tiny", "llama-tiny", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "values of preset 'tiny'" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("--train.max_steps"))
    assert line.split()[-2:] == ["default", "5"], line
