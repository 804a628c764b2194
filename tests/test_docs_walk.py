"""What a reader meets walking a guide top to bottom, checked without running it: a command that starts a run
in a folder an earlier command of the same page already trained into is refused (``... already holds
checkpoints; pass --resume ... --force ...``), so each such line must resume, force or take its own
``--out``; and output a guide quotes (```text blocks) for a command cheap to run here is what it prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.test_docs import DOCS, FENCE, JOURNEY_PAGES, REPO, _command_lines, _flag_values, _ignored_roots, _rel
from tests.test_docs_round7 import _implicit_out

# commands that start a run directory and refuse one holding checkpoints without --resume or --force
# (run/session.py's start check; `import hf|gguf` its own, cli/interop.py)
STARTS_RUN = ("train", "sft", "rl", "dpo", "rm", "import")


def _run_dir(argv: list[str]) -> str | None:
    if argv[0] not in STARTS_RUN or {"--help", "-h", "--help-config"} & set(argv):
        return None
    out = _flag_values(argv, ("--out", "--train.out_dir")) or [_implicit_out(argv)]
    return str(Path(out[-1])) if out[-1] else None


def _restarted_runs(page: Path) -> list[str]:
    """Commands of ``page``, in reading order, that start a run in a folder an earlier one trained into."""
    roots = _ignored_roots()
    started: dict[str, str] = {}
    problems = []
    # the commands a reader runs: ```bash blocks (a ```text block's `$ gptforge ...` echoes one shown above)
    for block in (body for lang, body in FENCE.findall(page.read_text()) if lang in ("bash", "sh", "shell", "")):
        for cmd in _command_lines(block):
            argv = shlex.split(cmd)
            run = _run_dir(argv)
            if not run or Path(run).parts[0] not in roots:
                continue  # a placeholder (RUN, DIR) or no run folder
            if run in started and not {"--resume", "--force"} & set(argv):
                problems.append(f"`gptforge {cmd}` starts {run}, which `gptforge {started[run]}` already trained "
                                "into: it is refused there (add --out NAME, or say --resume/--force)")
            started.setdefault(run, cmd)
    return problems


@pytest.mark.parametrize("page", JOURNEY_PAGES, ids=_rel)
def test_no_command_starts_a_run_an_earlier_one_made(page):
    """pretraining.md's Llama line (`train --preset shakespeare-cpu --model.arch llama`) wrote into the
    path's `runs/shakespeare-cpu` and was refused when followed in order."""
    problems = _restarted_runs(page)
    assert not problems, "\n".join(problems)


def test_the_restart_walk_sees_a_restart(tmp_path):
    """The walk finds an implicit run folder started twice, and lets --resume and another --out pass."""
    page = tmp_path / "guide.md"
    page.write_text("```bash\ngptforge train --preset tiny\ngptforge train --preset tiny --resume\n"
                    "gptforge train --preset tiny --out runs/other\ngptforge sft --init-from runs/tiny --out runs/s\n"
                    "gptforge train --preset tiny --model.arch llama\n```\n")
    problems = _restarted_runs(page)
    assert len(problems) == 1 and "--model.arch llama" in problems[0] and "runs/tiny" in problems[0]


# --- what a guide says a command prints is what it prints ---------------------------------------------------


def _quoted(page: Path, command: str) -> list[str]:
    """The output lines ``page``'s ```text blocks show under ``$ gptforge COMMAND...`` (up to the next ``$``)."""
    out: list[str] = []
    for lang, body in FENCE.findall(page.read_text()):
        if lang not in ("text", "console"):
            continue
        taking = False
        for line in body.splitlines():
            if line.startswith("$ "):
                taking = line.startswith(f"$ gptforge {command}")
            elif taking:
                out.append(line)
    assert out, f"{_rel(page)} quotes no output of `gptforge {command}`"
    return out


def _unmatched(quoted: list[str], printed: str) -> list[str]:
    """Quoted lines (``...`` standing for anything, a line of only ``...`` for any lines) that the printed text
    does not hold, in order."""
    lines, at, missing = printed.splitlines(), 0, []
    for q in quoted:
        if q.strip() in ("", "..."):
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in q.split("...")))
        hit = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])), None)
        if hit is None:
            missing.append(q)
        else:
            at = hit + 1
    return missing


def test_the_finished_run_notice_is_quoted_as_train_prints_it():
    """README's tour quotes what `train --resume` says on a finished run; the text is run/resume.py's, for the
    default job's run at its last step."""
    from gptforge.presets import get_preset
    from gptforge.run import resume

    cfg = get_preset("shakespeare-cpu")
    run = Path(cfg.train.out_dir)
    where = run / "checkpoints" / f"step_{cfg.train.max_steps:06d}"
    complete, notice = resume.resume_notice(cfg, cfg, cfg.train.max_steps, where)
    assert complete
    quoted = _quoted(REPO / "README.md", "train --preset shakespeare-cpu --resume")
    assert not _unmatched(quoted, notice), (quoted, notice)


@pytest.mark.parametrize("page,command", [("chat.md", "prepare conversations"), ("preferences.md", "prepare preferences")])
def test_prepare_lines_are_quoted_as_prepare_prints_them(page, command, tmp_path, monkeypatch, capsys):
    """chat.md and preferences.md quote what `prepare conversations|preferences` prints: run as quoted (the
    generators take a second), the printed lines hold the quoted ones."""
    from gptforge.cli import main

    path = DOCS / page
    line = next(ln for _, body in FENCE.findall(path.read_text()) for ln in body.splitlines()
                if ln.startswith(f"$ gptforge {command}"))
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(line.removeprefix("$ gptforge "))) == 0
    out = capsys.readouterr()
    missing = _unmatched(_quoted(path, command), out.out + out.err)
    assert not missing, f"{page} quotes lines `gptforge {command}` does not print: {missing}\nit printed: {out.out}"


def test_the_quote_matcher_finds_drift():
    """``...`` matches anything, lines are taken in order, and a changed word is missing."""
    printed = "wrote 40 pairs to x.jsonl (train on them: a)\nstep 1 | loss 2.0\n"
    assert not _unmatched(["wrote ... pairs to x.jsonl (train on them: ...)", "...", "step 1 | loss ..."], printed)
    assert _unmatched(["wrote ... pairs to x.jsonl (to train on them: ...)"], printed)
    assert _unmatched(["step 1 | loss ...", "wrote ..."], printed)  # out of order
