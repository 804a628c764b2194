"""Input leftovers, each tested as a class: every numeric flag and ``--section.key`` override refuses a number not
written in ASCII or with a stray underscore (walked over every parser, not a few examples); no refusal names its
flag twice (every wrap of an error with its flag goes through one helper); PromptError, whichever command raises
it, is one line at the door (exit 2)."""

from __future__ import annotations

import argparse
import typing

import pytest

from gptforge.cli import build_parser, main

# what int()/float() read as 10 (or 1000) without a word: full-width and Arabic-Indic digits, a no-break space,
# and underscores that are no thousands separator
NOT_ASCII = ("１０", "١٠", "\u00a010", "1０")
STRAY_UNDERSCORE = ("1_0", "10_", "_10", "1__000", "1_000_00")
BAD_NUMBERS = NOT_ASCII + STRAY_UNDERSCORE


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for the root and every command and sub-command under it."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _parsers(sub, path + (name,))


def _numeric(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Whether an option parses numbers: its type (``int``/``float`` through the parser's registry, or a function
    such as ``port``) turns "7" into a number. Found by what the type does, so a new numeric type is walked too."""
    if not action.option_strings or action.type is None:
        return False
    conv = parser._registry_get("type", action.type, action.type)
    try:
        return isinstance(conv("7"), int | float) and not isinstance(conv("7"), bool)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


class _Caught(Exception):
    pass


def _tool_parsers(monkeypatch) -> list[argparse.ArgumentParser]:
    """The parsers of the ``python -m gptforge.bench.*`` tools (built inside their main): caught at parse time."""
    import importlib

    from gptforge.argparsing import OneLineParser

    got: list[argparse.ArgumentParser] = []

    def catch(self, args=None, namespace=None):
        got.append(self)
        raise _Caught

    monkeypatch.setattr(OneLineParser, "parse_known_args", catch)
    for mod in ("trace", "readme_numbers", "tokenizer_train", "llmc"):
        with pytest.raises(_Caught):
            importlib.import_module(f"gptforge.bench.{mod}").main([])
    return got


def test_every_numeric_flag_of_every_command_and_tool_refuses_non_ascii_digits_and_stray_underscores(monkeypatch):
    walked = []
    roots = [build_parser()] + _tool_parsers(monkeypatch)
    for root in roots:
        for path, p in _parsers(root):
            for action in p._actions:
                if not _numeric(p, action):
                    continue
                flag = action.option_strings[-1]
                walked.append((path, flag))
                for bad in BAD_NUMBERS:
                    with pytest.raises(argparse.ArgumentError) as e:
                        p._get_value(action, bad)
                    said = str(e.value)
                    # one line naming the flag and the value as typed
                    assert flag in said and repr(bad) in said and "\n" not in said, (path, flag, said)
                # what the flag is for still parses: the refusal is of the writing, not of the number
                p._get_value(action, "10")
    flags = {f for _, f in walked}
    # the walk reached them all: the commands' counts and floats, serve's port, the tools' own
    assert {"--port", "--max-new-tokens", "--temperature", "--shard-tokens", "--vocab-size", "--steps"} <= flags, flags
    assert len(walked) > 100, len(walked)


def config_keys_of(bases: tuple[type, ...]) -> dict:
    """Every ``--section.key`` of both model families whose type (or Optional's inner type) is one of ``bases``:
    key -> (its type, a Config of the family that has it)."""
    from gptforge.config import Config, config_keys
    from gptforge.models.registry import switch_family

    out = {}
    for arch in ("gpt2", "llama"):
        cfg = Config()
        cfg.model = switch_family(cfg.model, arch)
        for key, tp in config_keys(cfg).items():
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            base = args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp
            if base in bases:
                out[key] = (tp, cfg)
    return out


def _config_numeric_keys():
    return {key: tp for key, (tp, _) in config_keys_of((int, float)).items()}


def test_every_numeric_config_key_refuses_non_ascii_digits_and_stray_underscores():
    from gptforge.config import ConfigError, parse_value

    keys = _config_numeric_keys()
    assert len(keys) > 60 and "optim.lr" in keys and "model.n_head" in keys, len(keys)
    for key, tp in keys.items():
        for bad in BAD_NUMBERS:
            with pytest.raises(ConfigError) as e:
                parse_value(key, bad, tp)
            assert str(e.value).startswith(f"--{key} {bad!r}") and "\n" not in str(e.value), str(e.value)
        assert parse_value(key, "32_768", tp) == 32768  # a thousands separator is what it looks like


def test_the_number_parser_says_what_it_refused_and_what_ascii_would_read():
    from gptforge.numbers import parse_float, parse_int

    for f in (parse_int, parse_float):
        with pytest.raises(ValueError, match=r"'１０' holds '１' \(FULLWIDTH DIGIT ONE\).*ASCII digits: 10$"):
            f("１０")
        with pytest.raises(ValueError, match=r"ARABIC-INDIC DIGIT ONE.*: 10$"):
            f("١٠")
        with pytest.raises(ValueError, match="'_' may only separate thousands"):
            f("1_0")
    # thousands separators keep their meaning, in an int, a float and an exponent's mantissa
    assert [parse_int(s) for s in ("32_768", "100_000_000", "-1_000", "+12_345e3")] == [32768, 10**8, -1000, 12345000]
    assert parse_float("1_000.5") == 1000.5


@pytest.mark.parametrize("argv", [["train", "--train.max_steps", "١٠"], ["train", "--optim.lr", "1_0"],
                                  ["sample", "--random", "d4", "--max-new-tokens", "１０"],
                                  ["prepare", "files", "x.txt", "--out", "o", "--shard-tokens", "1_0"]])
def test_through_the_command_it_is_one_line_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as e:  # argparse's refusals exit; an override's is the door's (return 2)
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argv[-2] in err and repr(argv[-1]) in err, err


# --- no refusal names its flag twice -------------------------------------------------------------------------


def test_flagged_puts_the_flag_first_once():
    from gptforge.errors import flagged

    assert flagged("--tokenizer", ValueError("--tokenizer x: not gpt2")) == "--tokenizer x: not gpt2"
    assert flagged("--tokenizer", "--tokenizer: empty") == "--tokenizer: empty"
    assert flagged("--tokenizer", "x.json: not JSON") == "--tokenizer: x.json: not JSON"
    assert flagged("--judge RM", "--judge RM: no such file") == "--judge RM: no such file"
    # another option's name at the head is no repetition: --ckpt's refusal of --ckpt-like words is prefixed
    assert flagged("--ckpt", "--ckpt-dir: gone") == "--ckpt: --ckpt-dir: gone"


def test_no_error_is_wrapped_with_its_flag_by_hand():
    """The class: every place that re-raises an error with its flag before it goes through errors.flagged, so no
    new wrap can say the flag twice. A hand-made ``f"--flag: {e}"`` / ``f"{flag}: {e}"`` anywhere in src fails."""
    import re
    from pathlib import Path

    import gptforge

    wrap = re.compile(r'f"(--[a-z][\w.-]*|\{[a-z_]*flag[a-z_]*\})[^"]{0,40}: \{(e|err|exc|error)\}')
    found = [f"{p.name}:{n}: {line.strip()}" for p in Path(gptforge.__file__).parent.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if wrap.search(line)]
    assert not found, found


@pytest.mark.parametrize("argv, flag", [
    (["prepare", "files", "x.txt", "--out", "o", "--tokenizer", "no-such-tokenizer"], "--tokenizer"),
    (["prepare", "shakespeare", "--out", "o", "--tokenizer", "no-such-tokenizer"], "--tokenizer"),
    (["train", "--model.arch", "nope"], "--model.arch"),
])
def test_through_the_command_the_flag_is_said_once(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.txt").write_text("some text")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count(flag) == 1, err


# --- PromptError, under any command, is one line at the door ---------------------------------------------------


def _prompt_error():
    from gptforge.generation import PromptError, check_prompt_ids

    with pytest.raises(PromptError) as e:  # the real refusal: GPT-2's ids prompted into a 64-id model
        check_prompt_ids([[50256, 15496]], 64)
    return e.value


@pytest.mark.parametrize("argv", [["eval", "--random", "d4"], ["bench-generate"], ["train"], ["rl", "--out", "r"],
                                  ["sample", "--random", "d4"]])
def test_a_prompt_error_under_any_command_is_one_line_exit_2(argv, monkeypatch, capsys):
    """Raised where the command did not expect it (eval's generative tasks, bench-generate, RL rollouts, training's
    samples all generate through check_prompt_ids): PromptError is a UserError, which the door prints as one line."""
    import gptforge.cli as cli

    err = _prompt_error()
    real = cli._fn

    def handler(*a, **k):
        raise err

    monkeypatch.setattr(cli, "_fn", lambda name, kind: handler if kind == "cmd" else real(name, kind))
    monkeypatch.setattr("gptforge.cli.outputs.check_outputs", lambda *a, **k: None)
    assert main(argv) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"gptforge {argv[0]}: error: {err}", said


def test_prompt_error_is_still_what_serve_and_sample_catch():
    from gptforge.errors import UserError
    from gptforge.generation import PromptError

    assert issubclass(PromptError, UserError) and issubclass(PromptError, ValueError)


# --- number variables of the environment: read as their C readers (torchrun, libgomp) read them -----------------


@pytest.mark.parametrize("raw", BAD_NUMBERS)
def test_number_variables_refuse_what_c_would_not_read(raw, monkeypatch):
    import re

    from gptforge.environment import NUMBER_VARIABLES, EnvError, number, omp_levels

    for name in NUMBER_VARIABLES:
        monkeypatch.setenv(name, raw)
        with pytest.raises(EnvError, match=re.escape(f"{name}={raw!r}")):
            number(name, 0)
    assert omp_levels(raw) is None and omp_levels(f"4,{raw}") is None  # libgomp takes neither: nor do its readers
    assert omp_levels("4, 1") == [4, 1]


@pytest.mark.parametrize("raw", BAD_NUMBERS)
def test_prepares_deadline_variable_reads_numbers_as_the_command_line_does(raw, monkeypatch):
    from gptforge.data.prepare.sources import SourceError
    from gptforge.data.prepare.workers import DOC_DEADLINE_ENV, deadline_floor

    monkeypatch.setenv(DOC_DEADLINE_ENV, raw)
    with pytest.raises(SourceError, match=DOC_DEADLINE_ENV):
        deadline_floor()
    monkeypatch.setenv(DOC_DEADLINE_ENV, "2.5")
    assert deadline_floor() == 2.5


@pytest.mark.parametrize("argv", [["bench", "--sweep-micro-batch", "8,１６"], ["bench-prepare", "--workers", "1,2_0"]])
def test_the_comma_separated_number_lists_refuse_them_too(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argv[1] in err and repr(argv[2]) in err, err
    assert "ASCII" in err or "thousands" in err, err  # the reason, not only the flag


def test_readme_numbers_seeds_refuse_them_too(capsys, monkeypatch):
    from gptforge.bench import readme_numbers
    from gptforge.bench.readme_numbers import main as readme_main

    monkeypatch.setattr(readme_numbers, "Ctx", lambda *a, **k: (_ for _ in ()).throw(_Caught("seeds taken")))
    with pytest.raises(SystemExit) as e:
        readme_main(["--seeds", "11,１２", "--only", "plan"])
    assert e.value.code == 2 and "ASCII" in capsys.readouterr().err
