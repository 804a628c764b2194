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
