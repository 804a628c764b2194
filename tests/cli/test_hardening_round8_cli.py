"""Hardening round eight of the command line: careless and hostile command lines across every command.

A single-valued option given twice with different values (``train --optim.lr 1e-3 ... --optim.lr 3e-4``, ``sample
--ckpt a --ckpt b``, ``plan --world 4 --gpus 8``) silently took the last one in every command (argparse's way).
The last is still taken (a script appends its own settings to a shared line), and ``argparsing.OneLineParser`` now
says so in one line naming the flag, both values and the one taken; the walk below gives every single-valued option
of every command and sub-command (read from the CLI's own parsers, so a command added later is covered) two
different values, and every ``--section.key`` of every override-taking command too. The same value twice says
nothing, and options meant to repeat keep every value.
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


def _said(parser: argparse.ArgumentParser, argv: list[str], capsys) -> tuple[argparse.Namespace | None, str]:
    """(the namespace, or None where the parse stops later for another reason: a required flag not given; the
    first line on stderr). Parsed only: no command runs, whatever the parser does."""
    try:
        ns, _ = parser.parse_known_args(argv)
    except SystemExit as e:
        assert e.code == 2
        ns = None
    err = capsys.readouterr().err.strip().splitlines()
    return ns, err[0] if err else ""


def _alone(parser: argparse.ArgumentParser, argv: list[str], dest: str):
    """The value ``dest`` takes from ``argv`` alone (the reference the repeated line must give), or a marker."""
    try:
        return getattr(parser.parse_known_args(argv)[0], dest)
    except SystemExit:
        return _alone


@pytest.mark.parametrize(("path", "parser", "action"), VALUED,
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in VALUED])
def test_a_single_valued_option_given_twice_takes_the_last_and_says_so(path, parser, action, capsys):
    flag = action.option_strings[-1]
    v1, v2 = _two_values(action)
    ns, line = _said(parser, [flag, v1, f"{flag}={v2}"], capsys)
    assert line == f"gptforge {' '.join(path)}: {flag} given twice, {v1!r} then {v2!r}: the last, {v2!r}, is taken"
    if ns is not None:
        assert getattr(ns, action.dest) == _alone(parser, [flag, v2], action.dest)


def test_the_line_reaches_the_command_line_and_the_last_value_is_used(tmp_path, capsys):
    assert _exit(["sample", "--ckpt", str(tmp_path / "a"), "--ckpt", str(tmp_path / "b")])[0] == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("gptforge sample: --ckpt given twice, ") and err[0].endswith("is taken")
    assert str(tmp_path / "b") in err[-1] and str(tmp_path / "a") not in err[-1]  # the missing one named is b


# one option under two names: the refusal names both as typed
ALIASED = [(path, p, a) for path, p, a in OPTIONS if a.nargs != 0 and len(a.option_strings) > 1]


@pytest.mark.parametrize(("path", "parser", "action"), ALIASED,
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in ALIASED])
def test_two_names_of_one_option_with_different_values_take_the_last_and_say_so(path, parser, action, capsys):
    first, second = action.option_strings[0], action.option_strings[-1]
    v1, v2 = _two_values(action)
    ns, line = _said(parser, [first, v1, second, v2], capsys)
    assert line.endswith(f": {first} {v1!r} and {second} {v2!r} set the same option: the last, {second} {v2!r}, "
                         "is taken"), line
    if ns is not None:
        assert getattr(ns, action.dest) == _alone(parser, [second, v2], action.dest)


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


def test_the_same_value_twice_is_taken_without_a_word(capsys):
    sub = next(a for a in build_parser(["plan"])._actions if isinstance(a, argparse._SubParsersAction))
    ns, _ = sub.choices["plan"].parse_known_args(["--world", "4", "--gpus", "4.0", "--tokens", "1e9",
                                                 "--tokens", "1_000_000_000"])
    assert ns.world == 4 and ns.tokens == 1e9 and capsys.readouterr().err == ""


def test_a_third_value_is_compared_with_the_one_it_replaces(capsys):
    sub = next(a for a in build_parser(["plan"])._actions if isinstance(a, argparse._SubParsersAction))
    ns, _ = sub.choices["plan"].parse_known_args(["--world", "4", "--world", "8", "--world", "8", "--world", "2"])
    assert ns.world == 2
    assert capsys.readouterr().err.splitlines() == [
        "gptforge plan: --world given twice, '4' then '8': the last, '8', is taken",
        "gptforge plan: --world given twice, '8' then '2': the last, '2', is taken"]


OVERRIDE_COMMANDS = [c for c, (_, takes, _) in COMMANDS.items() if takes]


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
@pytest.mark.parametrize("spelled", ["space", "equals"])
def test_a_config_key_given_twice_with_different_values_takes_the_last_and_says_so(command, spelled, capsys):
    def key(v):
        return ["--train.max_steps", v] if spelled == "space" else [f"--train.max_steps={v}"]

    _, line = _said(build_parser([command]), [command, *key("5"), "--optim.lr", "1e-3", *key("50")], capsys)
    assert line == f"gptforge {command}: --train.max_steps given twice, '5' then '50': the last, '50', is taken"


def test_the_last_config_value_is_the_one_the_run_uses(capsys):
    assert main(["train", "--preset", "tiny", "--optim.lr", "1e-3", "--train.max_steps", "5", "--optim.lr=3e-4",
                 "--dry-run"]) == 0
    cap = capsys.readouterr()
    assert '"lr": 0.0003' in cap.out and "--optim.lr given twice, '1e-3' then '3e-4'" in cap.err


def test_a_config_key_given_twice_with_one_value_is_taken(capsys):
    assert main(["train", "--preset", "tiny", "--optim.lr", "1e-3", "--optim.lr=0.001", "--train.max_steps", "7",
                 "--train.max_steps", "7", "--dry-run"]) == 0
    cap = capsys.readouterr()
    assert '"lr": 0.001' in cap.out and '"max_steps": 7' in cap.out and "given twice" not in cap.err


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
def test_tools_say_a_flag_given_twice(tool, argv, flag, capsys, monkeypatch):
    from gptforge.argparsing import OneLineParser

    real = OneLineParser.parse_args

    def parse_only(self, *a, **k):
        real(self, *a, **k)
        raise _Parsed

    monkeypatch.setattr(OneLineParser, "parse_args", parse_only)
    module = importlib.import_module(f"gptforge.bench.{tool}")
    with pytest.raises((_Parsed, SystemExit)):  # parsed, or stopped later for a required flag (llmc report)
        module.main(argv)
    assert f"{flag} given twice" in capsys.readouterr().err.splitlines()[0]


def test_an_override_before_a_commands_positionals_keeps_its_value(capsys):
    """``race --train.max_steps 5 tiny llama-tiny`` raced a preset named '5' (argparse gave the override's value
    to the positional); the override is one word to argparse now, wherever it stands."""
    assert main(["race", "--train.max_steps", "5", "tiny", "llama-tiny", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "values of preset 'tiny'" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("--train.max_steps"))
    assert line.split()[-2:] == ["default", "5"], line


# --- gptforge plot (and serve's /api/metrics) on a long metrics.jsonl ---------------------------------------------
# A 1M-line metrics.jsonl took 21 s and 1.4 GB: read_metrics held every record. Now the file is streamed
# (iter_metrics) and each curve keeps at most MAX_POINTS records (StepSeries), so what plot holds does not grow
# with the file: checked by the peak of traced allocations at n and 4n lines, a ratio that does not depend on the
# machine (bounded: about 1; holding every record: about 4).


def _metrics(path, n: int) -> None:
    import json

    with open(path, "w") as f:
        f.write(json.dumps({"kind": "start", "recipe": "pretrain", "time": 0.0}) + "\n")
        for i in range(1, n + 1):
            f.write(json.dumps({"kind": "train", "step": i, "loss": 5.0 - i / n, "tokens": 64 * i, "lr": 1e-3,
                                "dt_ms": 10.0, "grad_norm": 1.0, "time": i * 0.01}) + "\n")
            if i % 50 == 0:
                f.write(json.dumps({"kind": "val", "step": i, "val_loss": 5.0 - i / n, "tokens": 64 * i}) + "\n")


def _peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_plot_holds_a_bounded_number_of_records_whatever_the_files_length(tmp_path, monkeypatch):
    from gptforge import plot

    monkeypatch.setattr(plot, "MAX_POINTS", 64)
    peaks = []
    for n in (4000, 16000):
        run = tmp_path / f"run{n}"
        run.mkdir()
        _metrics(run / "metrics.jsonl", n)
        series = plot._run_series(run)
        assert len(series["train"]) <= 65 and min(series["train"]) == 1 and max(series["train"]) == n
        assert len(series["val"]) <= 65 and max(series["val"]) == n
        peaks.append(_peak(lambda r=run: plot._run_series(r)))
    assert peaks[1] < 1.5 * peaks[0], peaks  # four times the lines, not four times the memory


def test_serve_loss_curve_holds_a_bounded_number_of_points(tmp_path):
    from gptforge.serve.app import read_loss_curve

    peaks = []
    for n in (4000, 16000):
        f = tmp_path / f"m{n}.jsonl"
        _metrics(f, n)
        curve = read_loss_curve(f, max_points=50)
        assert len(curve["train"]) == 50 and curve["train"][0] == [1, 5.0 - 1 / n]
        peaks.append(_peak(lambda f=f: read_loss_curve(f, max_points=50)))
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_step_series_keeps_a_spread_of_steps_the_ends_and_the_last_record_of_a_step():
    from gptforge.run.metrics import StepSeries

    n, cap = 100_000, 64
    for step0, every in ((1, 1), (1, 2), (7, 7), (0, 10)):  # every step, odd steps only, multiples of 7 or 10
        s = StepSeries(cap)
        steps = list(range(step0, n, every))
        for st in steps:
            s.add(st, st)
        kept = sorted(s.items())
        assert len(kept) <= cap + 1 and kept[0] == steps[0] and kept[-1] == steps[-1], (every, len(kept))
        # the gap doubles only past cap points, so it stays under 2 * span / cap and consecutive points under twice it
        assert max(b - a for a, b in zip(kept, kept[1:], strict=False)) <= 4 * (steps[-1] - steps[0]) / cap
        assert len(kept) >= cap // 4
    s = StepSeries(8)
    for st in range(1, 101):
        s.add(st, "first")
    held = s._prev  # the step held last: writing it again is closer than the gap to the one held before
    assert s.gap > 2
    s.add(held, "resumed")  # a step written again (a resume, before replayed records were marked): the last one wins
    s.add(101, "first")
    assert s.items()[held] == "resumed"


# --- a command's flag and the config key it stands for, with different values ---------------------------------------
# `train --out a --train.out_dir b` wrote to a (--out was appended after the overrides); `--trust-checkpoint
# --train.trust_checkpoint false` trusted (the two were OR'ed); rm and dpo ignored --train.trust_checkpoint true.
# The class: every command that starts a run, both spellings of the key.
RUN_START = {"train": ["--preset", "tiny"], "bench": ["--preset", "tiny"], "sft": ["--init-from", "NONE", "--data", "x"],
             "rl": ["--init-from", "NONE"], "rm": ["--init-from", "NONE", "--data", "x"],
             "dpo": ["--init-from", "NONE", "--data", "x"]}


def _start(command, tmp_path):
    return [command, *[str(tmp_path / "none") if a == "NONE" else a for a in RUN_START[command]]]


@pytest.mark.parametrize("command", list(RUN_START))
@pytest.mark.parametrize("equals", [False, True])
def test_out_and_train_out_dir_with_different_values_are_refused(command, equals, tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    key = [f"--train.out_dir={b}"] if equals else ["--train.out_dir", b]
    dry = ["--dry-run"] if command != "bench" else []  # bench has none: a stray option, refused as such first
    assert _exit([*_start(command, tmp_path), "--out", a, *key, *dry])[0] == 2
    err = capsys.readouterr().err
    assert f"--out {a!r} and --train.out_dir {b!r} both set train.out_dir" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_out_and_train_out_dir_with_one_value_are_taken(tmp_path, capsys):
    a = str(tmp_path / "a")
    assert main(["train", "--preset", "tiny", "--out", a, "--train.out_dir", a, "--dry-run"]) == 0
    assert f'"out_dir": "{a}"' in capsys.readouterr().out


@pytest.mark.parametrize("command", [c for c in RUN_START if c != "bench"])
def test_trust_checkpoint_flag_and_key_false_are_refused(command, tmp_path, capsys):
    argv = [*_start(command, tmp_path), "--out", str(tmp_path / "a"), "--train.trust_checkpoint", "false"]
    has_flag = any("--trust-checkpoint" in a.option_strings for _, p, a in OPTIONS
                   if p.prog == f"gptforge {command}")
    if has_flag:
        assert _exit([*argv, "--trust-checkpoint"])[0] == 2
        err = capsys.readouterr().err
        assert "--trust-checkpoint and --train.trust_checkpoint 'false' both set" in err, err


@pytest.mark.parametrize("command", [c for c in RUN_START if c != "bench"])
def test_the_trust_key_reaches_every_run_command(command, tmp_path, monkeypatch):
    """--train.trust_checkpoint true is this command line's trust in every run command (rm and dpo dropped it)."""
    from gptforge.cli import common

    seen = {}

    def stop(out, resume, overrides, recipe, fresh, trusted=False, **kw):
        seen["trusted"] = trusted
        raise common.CliError("stopped here")

    monkeypatch.setattr(common, "resolve_run", stop)
    for module in ("run", "post", "align"):
        monkeypatch.setattr(f"gptforge.cli.{module}.resolve_run", stop)
    _exit([*_start(command, tmp_path), "--out", str(tmp_path / "a"), "--train.trust_checkpoint", "true"])
    assert seen == {"trusted": True}


@pytest.mark.parametrize(("command", "key"), [("rl", "rl.init_from"), ("dpo", "dpo.init_from")])
def test_init_from_and_its_key_with_different_values_are_refused(command, key, tmp_path, capsys):
    """``dpo --init-from A --dpo.init_from B`` started from A's weights and recorded B as the starting model."""
    argv = _start(command, tmp_path)
    a = argv[argv.index("--init-from") + 1]
    b = str(tmp_path / "other")
    assert _exit([*argv, "--out", str(tmp_path / "r"), f"--{key}", b, "--dry-run"])[0] == 2
    err = capsys.readouterr().err
    assert f"--init-from {a!r} and --{key} {b!r} both set {key}" in err, err
