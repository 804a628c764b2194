"""A flag's bad value is one line and exit 2 in every command, like every other bad input.

argparse printed the command's whole usage above its error (16 lines for ``rl --temperature nan``, 9 for
``eval --limit abc``). ``cli._Parser`` turns its refusals into one line that points at ``--help``; the
sub-commands' parsers take its class. The walk gives every command's first typed option a value no type
accepts, so a command added later is covered. Planted: the top parser back to ``argparse.ArgumentParser``
(every case fails).
"""

from __future__ import annotations

import pytest

from gptforge.cli import COMMANDS, build_parser, main


def _typed_option(command: str) -> str | None:
    sub = next(a for a in build_parser([command])._actions if a.dest == "command")
    for action in sub.choices[command]._actions:
        if action.option_strings and action.type is not None and action.nargs is None:
            return action.option_strings[-1]
    return None


CASES = [(c, f) for c in COMMANDS if (f := _typed_option(c)) is not None]


def test_most_commands_have_a_typed_option_to_try():
    assert len(CASES) >= len(COMMANDS) // 2, CASES


@pytest.mark.parametrize("command,flag", CASES)
def test_a_bad_flag_value_is_one_line(command, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, flag, "%not-a-value%"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and f"gptforge {command} --help" in err, err


def test_no_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


# --- issue 56 class 5: every number flag and every --section.key override refuses what is not a finite number in
# range, in one line. `tokenizer train --vocab-size 1e400` was an OverflowError traceback (its own int parser).
# Planted: `_Parser.__init__` without its type registry (the type=int/float flags took nan, inf and 2**70),
# `parse_int` without its 64-bit bound, and `parse_float` without its isfinite check: each fails here.

def _parsers(parser, path=()):
    """(command words, parser) of every command and nested sub-command (``tokenizer train``)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _parsers(sub, (*path, name))


def _number_options():
    from gptforge.cli.common import count, finite

    out = []
    for c in COMMANDS:
        for words, parser in _parsers(build_parser([c])):
            if words[0] != c:
                continue
            for a in parser._actions:
                if a.option_strings and a.type in (int, float, count, finite):
                    out.append((words, a.option_strings[-1], a.type in (int, count)))
    return out


NUMBER_OPTIONS = _number_options()


def test_the_walk_finds_the_number_flags():
    """A hand count of some flags the walk must reach (a walk that finds none passes vacuously)."""
    found = {(" ".join(w), f) for w, f, _ in NUMBER_OPTIONS}
    for want in [("tokenizer train", "--vocab-size"), ("sample", "--temperature"), ("sample", "--max-new-tokens"),
                 ("serve", "--port")]:
        assert want in found or want[1] == "--port", (want, sorted(found)[:20])
    assert len(NUMBER_OPTIONS) >= 60, len(NUMBER_OPTIONS)


# (value, why it is refused): not finite for every number; past 64 bits or not whole for integers only
NOT_FINITE = ["1e400", "nan", "-inf", "inf"]
NOT_AN_INT64 = ["1e30", str(2**63), "-" + str(2**64), "2.5"]


@pytest.mark.parametrize("words,flag,whole", NUMBER_OPTIONS, ids=[f"{' '.join(w)} {f}" for w, f, _ in NUMBER_OPTIONS])
def test_every_number_flag_refuses_what_is_not_a_finite_number_in_range(words, flag, whole, capsys):
    parser = build_parser([words[0]])
    for value in NOT_FINITE + (NOT_AN_INT64 if whole else []):
        with pytest.raises(SystemExit) as e:  # parsing only: a value let through never runs the command
            parser.parse_known_args([*words, f"{flag}={value}"])  # "=": argparse reads a bare -inf as an option
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2, (value, err)
        assert len(err.splitlines()) == 1 and flag in err and value in err and "Traceback" not in err, (value, err)


def _number_keys():
    import typing

    from gptforge.config import Config, config_keys
    from gptforge.models.llama import LlamaConfig

    keys = {}
    for cfg in (Config(), Config(model=LlamaConfig())):
        for key, tp in config_keys(cfg).items():
            inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
            if inner[0] in (int, float):
                keys[key] = (tp, inner[0] is int)
    return sorted((k, tp, whole) for k, (tp, whole) in keys.items())


NUMBER_KEYS = _number_keys()


def test_the_walk_finds_the_number_keys():
    names = {k for k, _, _ in NUMBER_KEYS}
    assert {"model.vocab_size", "optim.lr", "train.max_steps", "model.rope_theta"} <= names, sorted(names)


@pytest.mark.parametrize("key,tp,whole", NUMBER_KEYS, ids=[k for k, _, _ in NUMBER_KEYS])
def test_every_number_key_refuses_what_is_not_a_finite_number_in_range(key, tp, whole):
    from gptforge.config import ConfigError, parse_value

    for value in NOT_FINITE + (NOT_AN_INT64 if whole else []):
        with pytest.raises(ConfigError) as e:
            parse_value(key, value, tp)
        assert f"--{key}" in str(e.value) and value in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert parse_value(key, "1e3" if whole else "3e-4", tp) == (1000 if whole else 3e-4)  # what it accepts


@pytest.mark.parametrize("argv", [["train", "--model.vocab_size", "1e400"], ["train", "--optim.lr", "nan"],
                                  ["bench", "--train.max_steps", "1e30"], ["plan", "--model.n_embd", "inf"]])
def test_an_override_past_range_is_one_line_through_the_command(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argv[1] in err and "Traceback" not in err, err


def test_the_number_parser_against_a_hand_table():
    from gptforge.numbers import parse_float, parse_int

    assert [parse_int(s) for s in ("7", "1e4", "32_768", "5.0", "-3", str(2**63 - 1), "9007199254740993")] == \
        [7, 10_000, 32_768, 5, -3, 2**63 - 1, 9007199254740993]  # the last one exactly: not through a float
    assert [parse_float(s) for s in ("3e-4", "1", "-0.5", "1e308")] == [3e-4, 1.0, -0.5, 1e308]
    for bad in ("", "x", "1e400", "nan", "inf", str(2**63), "0.5"):
        with pytest.raises(ValueError):
            parse_int(bad)
