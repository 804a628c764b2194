"""Hardening round fourteen: what the last round left.

* The ``python -m gptforge...`` tools (bench.trace, llmc, tokenizer_train, readme_numbers) take ``--json`` /
  ``--out``, but went through environment.tool, which could not see them: ``... --json r.json | true`` ended at
  the first print (141) with no r.json, as the commands did before environment.delivering. Each tool's module
  declares what it writes (``OUTPUTS``, the words that mean so when given), and environment.tool runs an
  invocation that writes under delivering (environment.tool_writes_files).
* A link whose target's folder does not exist (``eval --json LINK``, LINK -> /nonexist/x): the writer made
  ``/nonexist/`` and wrote there (storage.atomic_path's "a link: write its target", with parents made); a link to
  nothing above the output (``--json LINK/r.json``) failed at the writer's mkdir after the work ("file exists").
  Both refused in one line naming the link and its target (storage.guards.link_target, which the writers and the
  output check before the work both follow), nothing made.
* ``train --resume --optim.lr X`` (or the warmup, schedule, min_lr_frac ...) with max_steps unchanged: the lr
  jumped at the resume step and only the step log showed it; a changed max_steps alone had a notice. The same
  notice (run/resume.py's resume_notice) now says the changed settings, saved -> this run, and the lr at the
  resume step under each.

Probed and left: ``sample --temperature 1e300`` divides the logits before top-k, as transformers' processors do
(temperature, then top-k); the order only matters where the division itself loses the ranking (every logit
/1e300 underflows to 0 or a denormal), which it does in both.
"""

from __future__ import annotations

import ast
import copy
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gptforge import environment
from gptforge.cli import build_parser, main
from gptforge.optim import lr_at
from gptforge.run.checkpoint import latest_checkpoint
from gptforge.run.resume import resume_notice
from gptforge.storage.faults import OutputError
from tests.run.faults import copy_run, one_line, train_argv

SRC = Path(__file__).resolve().parents[2] / "src"


# --- 1. a tool's files, with a stdout whose reader left ----------------------------------------------------------

def test_a_tool_writes_its_json_when_stdout_s_reader_has_left(tmp_path):
    """``python -m gptforge.bench.trace T --json o.json | true``: 141 and no o.json before; the file now, still 141."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
                     '"ts": 0, "dur": 5}]}')
    r, w = os.pipe()
    os.close(r)  # the reader has gone before the tool prints a thing: every write is EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "gptforge.bench.trace", str(trace), "--json", str(tmp_path / "o.json")],
                           stdout=w, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
                           timeout=60)
    finally:
        os.close(w)
    assert p.returncode == environment.EXIT_STDOUT_CLOSED, p.stderr
    assert "Traceback" not in p.stderr
    assert '"aten::mm"' in (tmp_path / "o.json").read_text()


def _tools() -> dict[str, Path]:
    """Every module run as ``python -m gptforge...`` through environment.tool."""
    return {".".join(f.relative_to(SRC).with_suffix("").parts): f for f in sorted(SRC.rglob("*.py"))
            if "environment.tool(" in f.read_text(encoding="utf-8") and f.name != "environment.py"}


def _flags(source: str) -> set[str]:
    """The option strings and subcommand names a tool's parser is given (add_argument / add_parser literals)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "add_argument", "add_parser"):
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return out


def test_every_tool_with_an_output_flag_delivers_it():
    """The walk: every tool whose parser takes an output flag of the commands' vocabulary (cli/outputs.OUTPUTS:
    --json, --out, --trace, --image, --workdir) declares it, so a closed stdout does not cost that file; what a
    tool declares is a flag or subcommand it has; and a tool invocation without its output still ends at once."""
    from gptforge.cli.outputs import OUTPUTS as COMMAND_OUTPUTS

    vocabulary = {key.rpartition(" ")[2] for table in COMMAND_OUTPUTS.values() for key in table} - {""}
    tools = _tools()
    assert {"gptforge.bench.trace", "gptforge.bench.llmc", "gptforge.bench.tokenizer_train",
            "gptforge.bench.readme_numbers"} <= set(tools)  # the walk sees the tools
    for name, path in tools.items():
        module = importlib.import_module(name)
        flags = _flags(path.read_text(encoding="utf-8"))
        declared = getattr(module, "OUTPUTS", ())
        assert set(declared) - {""} <= flags, f"{name} declares outputs its parser does not take: {declared}"
        for flag in flags & vocabulary:
            for argv in ([flag, "x"], [f"{flag}=x"], [flag[:4], "x"]):  # argparse takes --js for --json too
                assert environment.tool_writes_files(module.main, argv), f"{name} {flag}: not declared in OUTPUTS"
        if "" not in declared:
            assert not environment.tool_writes_files(module.main, []), name
            assert not environment.tool_writes_files(module.main, ["--", *declared]), name  # after --: an argument


# --- 2. a link whose target's folder does not exist --------------------------------------------------------------

@pytest.fixture
def dangling(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nonexist" / "x")
    return link


def _refused(message: str, link: Path) -> None:
    assert f"{link} is a link to {link.parent / 'nonexist' / 'x'}" in message, message
    assert f"whose folder {link.parent / 'nonexist'} does not exist" in message and "\n" not in message


@pytest.mark.parametrize("above", [False, True])  # the output is the link; a folder above it is a link to nothing
@pytest.mark.parametrize("writer", ["write_json", "atomic_dir", "check_output", "place_fault"])
def test_no_writer_makes_the_folders_a_dangling_link_points_into(dangling, writer, above):
    """Every writer and both checks before the work follow a link through storage.guards.link_target. A link to
    nothing above the output (``--json LINK/r.json``) met the writers' mkdir after the work, as "LINK: file exists"."""
    import gptforge.storage as storage
    from gptforge.run.preflight import place_fault
    from gptforge.storage.guards import check_output

    path = dangling / "r.json" if above else dangling
    if writer == "place_fault":
        message = place_fault(path, "--out")
    else:
        with pytest.raises(OutputError) as e:
            if writer == "write_json":
                storage.write_json(path, {})
            elif writer == "atomic_dir":
                with storage.atomic_dir(path):
                    pass
            else:
                check_output(path, False, "file", "--json")
        message = str(e.value)
    if above:
        assert f"{path}: {dangling} is a link to {dangling.parent / 'nonexist' / 'x'}, which does not exist" in message
    else:
        _refused(message, dangling)
    assert not (dangling.parent / "nonexist").exists() and dangling.is_symlink()


def test_a_link_into_a_folder_that_exists_is_still_written_through(tmp_path):
    """The deliberate case stays: a link to a file on another disk (or not there yet) writes that file, keeps the link."""
    import gptforge.storage as storage

    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real" / "x.json")
    storage.write_json(link, {"a": 1})
    assert link.is_symlink() and (tmp_path / "real" / "x.json").read_text().strip().startswith("{")


def test_a_command_refuses_a_dangling_link_before_its_work(dangling, capsys):
    """``plan --json LINK`` made LINK's target's folder and wrote; ``eval --json LINK`` scored everything first.
    The output check (cli/outputs.check_outputs) refuses both before the command runs."""
    from gptforge.cli.common import CliError
    from gptforge.cli.outputs import check_outputs

    assert main(["plan", "--preset", "tiny", "--json", str(dangling)]) == 2
    _refused(one_line(capsys.readouterr().err), dangling)
    args, _ = build_parser().parse_known_args(["eval", "--ckpt", "c", "--json", str(dangling)])
    with pytest.raises((OutputError, CliError)) as e:
        check_outputs("eval", args)
    _refused(str(e.value), dangling)
    assert not (dangling.parent / "nonexist").exists()


# --- 3. a resume that changes the schedule but not its length ----------------------------------------------------

def _saved_and_changed(**changes):
    from gptforge.config import Config

    saved = Config()
    saved.train.max_steps, saved.optim.lr, saved.optim.warmup_steps, saved.optim.min_lr_frac = 10, 1e-3, 2, 0.1
    cfg = copy.deepcopy(saved)
    for key, value in changes.items():
        setattr(cfg.optim, key, value)
    return saved, cfg


@pytest.mark.parametrize("changes,said", [
    ({"lr": 3e-3}, "optim.lr 0.001 -> 0.003"),
    ({"warmup_steps": 6}, "optim.warmup_steps 2 -> 6"),
    ({"schedule": "wsd"}, "optim.schedule cosine -> wsd"),
    ({"min_lr_frac": 0.5}, "optim.min_lr_frac 0.1 -> 0.5"),
])
def test_a_resume_with_another_schedule_says_the_lr_jump(tmp_path, changes, said):
    saved, cfg = _saved_and_changed(**changes)
    complete, msg = resume_notice(saved, cfg, 5, tmp_path / "run")
    assert not complete and msg is not None
    before, after = lr_at(5, saved.optim, 10), lr_at(5, cfg.optim, 10)  # the figures step 6's log line prints
    assert msg.startswith(f"resuming at step 5 with a changed learning-rate schedule ({said}; saved -> this run): ")
    assert f"(step 6) shows lr {after:.2e} where the saved schedule had {before:.2e}" in msg


@pytest.mark.parametrize("changes", [{}, {"cooldown_frac": 0.9}, {"muon_lr": 0.5}, {"weight_decay": 0.5}])
def test_a_resume_whose_schedule_is_the_same_says_nothing(tmp_path, changes):
    """Under cosine and AdamW, cooldown_frac and muon_lr are inert; weight decay is no part of the schedule."""
    saved, cfg = _saved_and_changed(**changes)
    assert resume_notice(saved, cfg, 5, tmp_path / "run") == (False, None)


def test_train_resume_with_a_new_lr_says_it_before_the_first_step(world, base_run, tmp_path, capsys):
    """Through the command: the notice is printed, and its figure is what the step log then shows."""
    run = copy_run(base_run, tmp_path)
    newest = latest_checkpoint(run)
    shutil.rmtree(newest)  # resume at step 2 of 4: the same max_steps, two steps to train
    step = latest_checkpoint(run)
    assert step.name == "step_000002"
    assert main(train_argv(world["shards"], run, "--resume", "--optim.lr", "0.05")) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    notice = next(i for i, line in enumerate(lines) if line.startswith("resuming at step 2 with a changed"))
    shown = lines[notice].split("shows lr ")[1].split()[0]
    first = next(i for i, line in enumerate(lines) if re.match(r"step +3/4 \|", line))
    assert notice < first and f"| lr {shown} |" in lines[first] and shown == f"{0.05:.2e}"  # tiny: warmup 2, so step 2 is the peak


@pytest.mark.parametrize("output", ["loop", "loop/r.json"])
def test_a_tool_refuses_a_link_loop_in_one_line_before_its_work(tmp_path, output, capsys):
    """A tool's --json through a link loop: its check before the work (argparsing.check_tool_output) passed it,
    and the writer's resolve raised "Symlink loop" as a traceback after the work. link_fault says it first."""
    from gptforge.bench import trace

    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(SystemExit) as e:
        trace.main([str(tmp_path / "missing.json"), "--json", str(tmp_path / output)])  # refused before it is read
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{tmp_path / 'loop'}: a symlink loop" in err and "Traceback" not in err, err
