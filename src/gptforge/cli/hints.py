"""Where the commands a command suggests next ("next:", "train on them: ...") write: always derived from
the paths the user gave (the run's --out, the data file's folder), never a fixed name, so a newcomer who
follows the advice stays inside the journey's own folder and never writes into the repository root or
into another journey's files (issue 55: ``runs/sft``, ``runs/rl_rm``, ``prefs_judged.jsonl`` and
``exports/<run-name>`` collided across journeys). Every command's hints use these helpers, so a new
command inherits them.

    >>> beside("runs/chat/conv.jsonl", "sft")     # the next step goes in the same folder
    'runs/chat/sft'
    >>> export_dir("runs/chat/sft")               # an export mirrors the run's place under exports/
    'exports/chat/sft'
    >>> beside("conv.jsonl", "sft")               # a bare name at the top level: its own folder under runs/
    'runs/conv/sft'
"""

from __future__ import annotations

import shlex
from pathlib import Path

CHECKPOINTS = "checkpoints"  # a run's checkpoints folder: RUN/checkpoints/step_N (run.checkpoint)


def _path(path: str | Path) -> Path:
    p = Path(path)
    return p.resolve() if p.name in ("", "..") else p  # "." or "..": the folder it names


def run_dir(path: str | Path) -> Path:
    """The run a path names: RUN for RUN/checkpoints/step_N (what --init-from and --ckpt also take)."""
    p = _path(path)
    if p.parent.name == CHECKPOINTS and p.name.startswith("step_"):
        return p.parent.parent
    return p.parent if p.name == CHECKPOINTS else p


def home(path: str | Path) -> Path:
    """The folder what follows ``path`` (a data file or a run) goes in: the folder holding it. A bare name in
    the working directory (``--out conv.jsonl``) gets ``runs/<its stem>``, so a hint never puts a new file
    or run into the repository root, and two such names never share a folder."""
    p = run_dir(path)
    if not p.is_absolute() and p.parent == Path("."):
        return Path("runs") / (p.stem or p.name)
    return p.parent


def beside(path: str | Path, name: str) -> str:
    """``name`` in :func:`home` of ``path``: where the next command writes its file or run (never ``path``
    itself: a run already named ``name`` gets ``<its name>_<name>``)."""
    p = run_dir(path)
    out = home(p) / name
    return str(home(p) / f"{p.stem}_{name}" if out == p else out)


def export_dir(run: str | Path) -> str:
    """Where ``export`` of a run writes: the run's path with its nearest ``runs`` folder read as ``exports``
    (runs/chat/sft -> exports/chat/sft, the guides' layout; .gitignore holds both); a run outside any runs/
    folder gets an ``exports`` folder beside it (a top-level ``myrun``: exports/myrun)."""
    p = run_dir(run)
    parts = p.parts
    above = parts[:-1]
    if "runs" in above:
        i = len(above) - 1 - above[::-1].index("runs")
        return str(Path(*parts[:i], "exports", *parts[i + 1:]))
    return str(p.parent / "exports" / p.name)


def q(path: str | Path) -> str:
    """A path as a shell word: a hinted command pastes and parses as printed, spaces and all."""
    return shlex.quote(str(path))
