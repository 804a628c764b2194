"""The commands a command suggests next write inside the journey's own folder (issue 55): a run at
tmp/a/b/run is offered runs and files under tmp/a/b, never a fixed name (``runs/rl_rm``,
``prefs_judged.jsonl``, ``data/...``, ``exports/<run-name>``) that the repository root or another journey
shares. Every hinted command is parsed by the real parser; what a hint reads is the run, its data, its
starting model, or what an earlier hint of the same list writes. Also: a command whose reader closes
stdout early ends quietly (exit 141), not with a BrokenPipeError traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gptforge.cli import EXIT_STDOUT_CLOSED, build_parser, main

READS = ("ckpt", "init_from", "reward_model", "judge", "policy", "preferences", "data", "tokenizer")


def _parse(command: str):
    """``gptforge ...`` as the real parser reads it (no leftovers: every hinted flag exists)."""
    argv = shlex.split(command)
    assert argv[0] == "gptforge", command
    args, rest = build_parser(argv[1:]).parse_known_args(argv[1:])
    assert not rest, f"`{command}`: not flags of {args.command}: {rest}"
    return args


def _hinted(text: str) -> list[str]:
    """Every ``gptforge ...`` command in a command's output: a summary's next:/continue lines, or the one or two
    commands inside a prepare line's parentheses."""
    return [m.group(1) for m in re.finditer(r"(?<!`)(gptforge [a-z-]+ [^()`;]+?)(?= \(|\)|;|`|$)", text, flags=re.M)]


def _inside(path: str, *folders: Path) -> bool:
    return any(Path(path).absolute().is_relative_to(f.absolute()) for f in folders)


def _check(text: str, allowed: tuple[Path, ...], given: set[str]) -> list:
    """Each hinted command parses; each path it writes (--out) lies inside ``allowed``; each path it reads is
    one it was ``given`` or one an earlier hint writes."""
    cmds = _hinted(text)
    assert cmds, text
    written: set[str] = set()
    parsed = []
    for c in cmds:
        args = _parse(c)
        for flag in READS:  # placeholders and defaults: --init-from RUN, --judge task, --tokenizer gpt2
            value = getattr(args, flag, None)
            if value is not None:
                assert value in given | written | {"RUN", "task", "gpt2"}, f"`{c}` reads {flag}={value}: from nowhere"
        if getattr(args, "out", None):
            assert _inside(args.out, *allowed), f"`{c}` writes {args.out}, outside {[str(a) for a in allowed]}"
            written.add(args.out)
        parsed.append(args)
    return parsed


TRAINING = ["train", "sft", "rl", "rm", "dpo"]


@pytest.mark.parametrize("command", TRAINING)
@pytest.mark.parametrize("where", ["a/b", "a b/c"])  # nested, and a folder with a space (quoted, still parses)
def test_summary_hints_stay_in_the_runs_folder(command, where, tmp_path):
    from gptforge.cli.common import summary
    from gptforge.config import Config
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import write_conversations
    from gptforge.eval.tasks.verifiable import compare_problems
    from gptforge.training.loop import RunResult

    journey = tmp_path / where
    run, start = journey / "run", journey / "base"
    cfg = Config()
    data = ""
    if command == "sft":
        data = cfg.sft.data = str(write_conversations(compare_problems(2), journey / "conv.jsonl"))
    elif command in ("rm", "dpo"):
        data = str(write_preferences(preference_set("compare", 2), journey / "pairs.jsonl"))
        getattr(cfg, command).data = data
    cfg.rl.task = "compare"
    res = RunResult(run_dir=run, steps_done=1, stop_reason="signal")  # stopped: the `continue` line too
    text = summary(res, command, cfg, str(start))
    parsed = _check(text, (journey,), {str(run), str(start), data})
    verbs = [a.command for a in parsed]
    assert "export" in verbs and (command != "sft" or "rl" in verbs), verbs  # the walk saw the writing hints
    outs = {a.out for a in parsed if getattr(a, "out", None)} - {str(run)}
    assert len(outs) == {"train": 1, "sft": 2, "rl": 1, "rm": 4, "dpo": 1}[command], outs


def test_the_guides_layout_runs_and_exports_mirror_each_other(tmp_path, monkeypatch):
    """Relative to the working directory, as the guides run: runs/chat/sft's next run is runs/chat/rl and its
    export exports/chat/sft (hand-written); two journeys' hints never meet; nothing lands at the top level."""
    from gptforge.cli.hints import beside, export_dir, next_commands

    monkeypatch.chdir(tmp_path)
    assert beside("runs/chat/sft", "rl") == "runs/chat/rl" and export_dir("runs/chat/sft") == "exports/chat/sft"
    assert export_dir("runs/chat/sft/checkpoints/step_000400") == "exports/chat/sft"  # a checkpoint: its run's
    assert export_dir("/home/runs/proj/runs/chat/sft") == "/home/runs/proj/exports/chat/sft"  # the nearest runs/
    assert beside("conv.jsonl", "sft") == "runs/conv/sft" and export_dir("myrun") == "exports/myrun"
    assert beside("runs/chat/rl", "rl") == "runs/chat/rl_rl"  # never the path itself
    outs = {}
    for journey in ("chat", "prefs"):
        for command in TRAINING:
            run = f"runs/{journey}/{command}"
            for c in next_commands(command, run, "compare"):
                out = getattr(_parse(c), "out", None)
                if out is not None:
                    assert Path(out).parts[:2] in (("runs", journey), ("exports", journey)), c
                    assert outs.setdefault(out, run) == run, f"{run} and {outs[out]} both hint {out}"


def test_prepare_hints_put_the_next_run_beside_the_file(tmp_path, capsys):
    journey = tmp_path / "x y" / "chat"
    conv = journey / "conv.jsonl"
    assert main(["prepare", "conversations", "compare", "--n", "3", "--out", str(conv)]) == 0
    (sft,) = _check(capsys.readouterr().out, (journey,), {str(conv)})
    assert sft.command == "sft" and sft.out == str(journey / "sft")
    pairs, held = journey / "pairs.jsonl", journey / "held.jsonl"
    assert main(["prepare", "preferences", "compare", "--n", "3", "--out", str(pairs)]) == 0
    trained = _check(capsys.readouterr().out, (journey,), {str(pairs)})
    assert sorted(a.command for a in trained) == ["dpo", "rm"]
    assert main(["prepare", "preferences", "compare", "--n", "3", "--held-out", "--out", str(held)]) == 0
    (scored,) = _check(capsys.readouterr().out, (journey,), {str(held), *(a.out for a in trained)})
    assert scored.ckpt == next(a.out for a in trained if a.command == "rm")  # the reward model the pairs' hint trains


def test_tokenizer_train_hints_shards_beside_the_tokenizer(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat and the dog sat on the log\n" * 50)
    tok = tmp_path / "a" / "tok"
    assert main(["tokenizer", "train", str(corpus), "--out", str(tok), "--vocab-size", "300", "--trainer",
                 "tokenizers", "--no-progress"]) == 0
    (prep,) = _check(capsys.readouterr().out.split("next:")[1], (tmp_path / "a",), {str(tok)})
    assert prep.tokenizer == str(tok) and prep.out == str(tmp_path / "a" / "shards")


# --- a reader that closes stdout early ------------------------------------------------------------


def test_a_closed_stdout_ends_the_command_quietly_in_process(monkeypatch, capsys):
    """main itself: the print meets a pipe with no reader; exit 141 and nothing on stderr."""
    r, w = os.pipe()
    os.close(r)
    with open(w, "w", buffering=1) as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        code = main(["presets"])
        monkeypatch.undo()
    assert code == EXIT_STDOUT_CLOSED and capsys.readouterr().err == ""


def test_help_config_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """`--help-config` prints and exits from inside the parser (SystemExit): what it left buffered meets the
    closed pipe in main's flush, not at interpreter exit."""
    r, w = os.pipe()
    os.close(r)
    with open(w, "w", buffering=1 << 20) as closed:  # all of it buffered: the write itself does not fail
        monkeypatch.setattr(sys, "stdout", closed)
        code = main(["sft", "--help-config"])
        monkeypatch.undo()
    assert code == EXIT_STDOUT_CLOSED and capsys.readouterr().err == ""


def test_a_broken_pipe_that_is_not_stdouts_is_not_swallowed(monkeypatch, capsys):
    """A BrokenPipeError from elsewhere (a worker's pipe, a socket) while stdout is fine stays an error."""
    import gptforge.cli.data as data

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(data, "cmd_presets", broken)
    with pytest.raises(BrokenPipeError):
        main(["presets"])


def test_head_closing_the_pipe_prints_no_traceback(tmp_path):
    """The real entry point (`gptforge train --help-config | head`): the reader is gone before the first write;
    Python's own exit flush must not complain either ("Exception ignored ... BrokenPipeError"). A subprocess
    (~2 s of CPU, importing torch for the model sizes) because only a real interpreter exit shows that."""
    r, w = os.pipe()
    os.close(r)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "GPTFORGE_ALLOCATOR": "system"}
    try:
        p = subprocess.run([sys.executable, "-m", "gptforge", "presets"], stdout=w, stderr=subprocess.PIPE,
                           text=True, env=env, timeout=300)
    finally:
        os.close(w)
    assert (p.returncode, p.stderr) == (EXIT_STDOUT_CLOSED, "")


def test_a_reward_models_hints_are_the_preference_guides_lines(tmp_path, monkeypatch):
    """docs/preferences.md makes runs/prefs/prefs_eval.jsonl beside the pairs it trains on (runs/prefs/prefs.jsonl)
    and scores runs/prefs/rm on it: that reward model's next: lines are those two lines, so a newcomer following
    either makes and scores one file. A held-out file already there is scored, not made again."""
    from gptforge.cli.hints import next_commands, run_hints
    from gptforge.config import Config
    from gptforge.eval.tasks.preferences import preference_set, write_preferences

    guide = (Path(__file__).resolve().parents[2] / "docs" / "preferences.md").read_text()
    monkeypatch.chdir(tmp_path)
    cfg = Config()
    cfg.rm.data = str(write_preferences(preference_set("compare", 2), Path("runs/prefs/prefs.jsonl")))
    cfg.rm.init_from = "runs/chat/sft"
    prepare, score = next_commands("rm", "runs/prefs/rm", **run_hints("rm", cfg))[:2]
    assert prepare.startswith("gptforge prepare preferences compare ") and prepare in guide, prepare
    assert score.startswith("gptforge eval ") and score in guide, score
    Path(_parse(prepare).out).write_text("")
    assert next_commands("rm", "runs/prefs/rm", **run_hints("rm", cfg))[0] == score
