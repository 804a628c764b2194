"""What an output may replace, checked before any work: an existing file (a non-empty folder) only with
``--force``; never, with or without it, a checkpoint, a run directory or a run's own files (those belong to
the run stack, which writes checkpoints its own way: run/checkpoint.py, a temporary folder renamed in), nor
a device, pipe or socket; and a path that names a folder of its own (``.``, ``..`` resolved).

    check_output("exports/hf", force=False, kind="dir")  # OutputExistsError: "--out exports/hf is not empty; ..."
"""
from __future__ import annotations

import os
from pathlib import Path

from gptforge.reading import not_a_file, path_fault
from gptforge.storage.faults import OutputError

# what marks a directory the run stack owns (run/checkpoint.py, run/lock.py, run/session.py)
RUN_DIR_MARKERS = ("checkpoints", "metrics.jsonl", ".gptforge.lock", "env.json")
CHECKPOINT_MARKER = "meta.json"
RUN_FILES = (*RUN_DIR_MARKERS, "config.json")  # a run directory's own files: a new report beside them is fine


class OutputExistsError(OutputError, FileExistsError):
    """The output exists and --force was not given, or it is a checkpoint or run directory."""


def run_owner(path: str | Path) -> tuple[str, Path] | None:
    """("checkpoint" | "run directory", where) when ``path`` is, or lies inside, a checkpoint or a run's
    checkpoints/ folder, or is a run directory: the markers run/checkpoint.py, run/lock.py and
    run/session.py leave (meta.json in a step_N folder; checkpoints/, metrics.jsonl, the lock)."""
    p = Path(path).absolute()
    for q in (p, *p.parents):
        if (q / CHECKPOINT_MARKER).is_file() and (q.name.startswith("step_") or q.parent.name == "checkpoints"
                                                  or (q / "model.safetensors").exists()):
            return "checkpoint", q
        if q.name == "checkpoints" and (any(q.glob("step_*"))
                                        or any((q.parent / m).exists() for m in RUN_DIR_MARKERS[1:])):
            return "run directory", q.parent
    if p.is_dir() and any((p / m).exists() for m in RUN_DIR_MARKERS):
        return "run directory", p
    return None


def special_output(path: Path, flag: str = "") -> str | None:
    """Why ``path`` (followed through symlinks) may not be written: a device, a pipe or a socket is there.
    Every output is written beside its path and renamed over it, so writing one would replace the special
    file itself with a regular one (run as root, /dev/null or a terminal's device gone for every process);
    --force never does that. None when ``path`` is a regular file, a folder, or nothing yet."""
    try:
        there = path.exists() and not path.is_file() and not path.is_dir()
    except OSError:  # a name too long, a loop: the writer's own error says it
        return None
    if not there:
        return None
    return (f"{(flag + ' ') if flag else ''}{path}: {not_a_file(path)}; outputs are written beside their path and "
            "renamed over it, which would replace it (--force never does): name a regular file or folder")


def literal_home(path: str | Path, flag: str = "--out") -> str | None:
    """Why ``path``, an output, may not be written as given: it begins with a literal ``~`` (or ``~user``), which
    the shell leaves unexpanded after ``=`` (``--out=~/runs/x``) and inside quotes, so the run, export or shards
    landed in a folder named ``~`` under the current one, where nobody looks, and a later ``rm -rf ~...`` to clean
    it up is a disaster. The fix is named (the path the shell would have made); ``./~/x`` means the folder
    ``~`` on purpose. None for any other path."""
    s = str(path)
    if not s.startswith("~"):
        return None
    head, _, rest = s.partition("/")
    home = os.path.expanduser(head)
    meant = f"{home}/{rest}" if rest else home
    fix = f"write {flag} {meant}" if home != head else f"give the full path (no user {head[1:]!r} here)"
    return (f"{flag} {s} begins with a literal {head!r}, which the shell leaves unexpanded after '=' and in quotes, "
            f"so it would make a folder named {head!r} in the current one; {fix}, or ./{s} for a folder named {head!r}")


def named(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a path with a name of its own, which the temporary beside it is named after: ``.``, ``..``,
    ``x/..`` resolved to the folders they mean (``Path('.').with_name`` raised a ValueError, and ``..``'s
    temporary ``....tmp-*`` landed in the current folder, inside the output it was to replace, so the
    carry-over copied it into itself until the name was too long); the filesystem root refused."""
    p = Path(path)
    if p.name in ("", ".", ".."):
        p = p.resolve()
    if not p.name:
        raise OutputExistsError(f"{flag} {path} is the root of the filesystem; choose a folder under it")
    return p


def link_fault(path: str | Path, flag: str = "") -> str | None:
    """Why the link ``path`` cannot be written through, in one line naming it and its target: the target's folder
    does not exist (or is not a folder). A writer replaces a link's target and keeps the link (the real file on a
    bigger disk); making the folders above a target nobody named (a stale link, a mistyped one: ``/nonexist/x``)
    is not that. A folder above ``path`` that is a link to nothing is the same (the writers' mkdir met it, after the
    work, as "file exists"); so is a link loop, or a name too long, met on the way (reading.path_fault). None when ``path`` is no link, or its target's folder is there (the target itself
    need not be)."""
    p = Path(path)
    try:
        for q in p.parents:  # nearest first, up to the first that exists
            if q.is_symlink() and not q.exists():
                try:  # a loop (exists() says False for one too): said as the loop it is
                    os.stat(q)
                except OSError as e:
                    if path_fault(e):
                        return path_fault(e)
                return (f"{(flag + ' ') if flag else ''}{path}: {q} is a link to {os.readlink(q)}, which does not "
                        "exist; make that folder, point the link at one that exists, or remove the link")
            if q.exists():
                break
        if not p.is_symlink():
            return None
        target = p.resolve()
        folder = target.parent
        if folder.is_dir():
            return None
        state = "is not a folder" if folder.exists() else "does not exist"
    except (OSError, RuntimeError) as e:  # a name too long, a link loop: the words every path gets (reading.path_fault)
        return path_fault(e)
    return (f"{(flag + ' ') if flag else ''}{path} is a link to {os.readlink(p)}, whose folder {folder} {state}; "
            "make that folder, point the link at a file in one that exists, or remove the link to write a file "
            "in its place")


def link_target(path: Path, flag: str = "") -> Path:
    """Where a writer puts ``path``: the file or folder a link points to (the link kept), ``path`` itself when it
    is no link; OutputError (:func:`link_fault`) for a link whose target's folder does not exist. The one place
    every writer (storage.atomic_path, atomic_dir) follows a link; the check before the work (:func:`check_output`, run/preflight.place_fault) asks :func:`link_fault` the
    same, so it refuses what the writer would refuse, before the work."""
    fault = link_fault(path, flag)
    if fault:
        raise OutputError(fault)
    return path.resolve() if path.is_symlink() else path


def check_shard_folder(path: str | Path, flag: str = "--out") -> None:
    """Refuse a shard folder (prepare's resumable output) that is, or lies inside, a run directory or a
    checkpoint: prepare wrote its shards, manifest.json and tokenizer/ there, so a checkpoint's own tokenizer
    bundle was replaced (and its checksums failed after) and a run's folder filled with data; shards only beside
    a run, never in it."""
    owner = run_owner(path)
    if owner is not None:
        what = "that is" if owner[1] == Path(path).absolute() else "that is inside"
        raise OutputExistsError(f"{flag} {path}: {what} the {owner[0]} {owner[1]}, which only training writes; "
                                "prepare its shards in a folder of their own (e.g. data/NAME)")


def check_output(path: str | Path, force: bool, kind: str = "file", flag: str = "--out") -> Path:
    """Refuse, before any work, an output that would replace something it may not: an existing file
    (a non-empty folder) without ``force``, and, with or without it, a checkpoint or run directory
    or a file inside one that the run stack wrote. ``kind``: "file" or "dir"."""
    p = named(path, flag)
    fault = link_fault(p, flag)  # a link whose target's folder is missing: refused here, not after the work
    if fault:
        raise OutputError(fault)
    special = special_output(p, flag)
    if special:
        raise OutputExistsError(special)
    owner = run_owner(p if kind == "dir" or p.is_dir() else p.parent)
    if owner is not None and (kind == "dir" or p.exists() or owner[0] == "checkpoint" or p.name in RUN_FILES):
        what = "that is" if kind == "dir" and owner[1] == p.absolute() else "that is inside"
        raise OutputExistsError(f"{flag} {p}: {what} the {owner[0]} {owner[1]}, which only training writes; --force "
                                "never replaces one. Choose another path")
    if kind == "dir":
        if p.exists() and not p.is_dir():
            raise OutputExistsError(f"{flag} {p} exists and is not a folder; choose a folder")
        if p.is_dir() and any(p.iterdir()) and not force:
            raise OutputExistsError(f"{flag} {p} is not empty; choose an empty folder or pass --force to replace "
                                    "what it holds")
    else:
        if p.is_dir():
            raise OutputExistsError(f"{flag} {p} is a folder; name the file to write")
        if p.exists() and not force:
            raise OutputExistsError(f"{flag} {p} exists; pass --force to replace it (or choose another name)")
    return p
