"""What a reader meets walking a guide top to bottom, checked without running it: a command that starts a run
in a folder an earlier command of the same page already trained into is refused (``... already holds
checkpoints; pass --resume ... --force ...``), so each such line must resume, force or take its own
``--out``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.test_docs import FENCE, JOURNEY_PAGES, _command_lines, _flag_values, _ignored_roots, _rel
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
