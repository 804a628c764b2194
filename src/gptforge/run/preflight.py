"""Checks on the operator's choices that must fail before any compute, each with one line naming the
flag: the run directory (``--out`` / ``train.out_dir``), and where any output can be written at all
(``place_fault``: a file where a folder is needed above it, a read-only or foreign folder), which the CLI
asks of every output a command declares (cli/outputs.py) before the command does its work.

    >>> check_run_dir("runs/exp1")   # raises ConfigError if it is a file or cannot be written
    >>> place_fault("/etc/passwd/x.json")  # (Path('/etc/passwd'), 'is a file'): nothing can be made under it
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else the nearest folder above it that does (where it would be made)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def write_probe(where: Path) -> OSError | None:
    """Whether a file can be made in the folder ``where``: an anonymous temporary, gone when closed (nothing stays
    behind). The OSError that refused it (read-only, permission, a pseudo-filesystem), or None."""
    try:
        with tempfile.TemporaryFile(dir=where, prefix=".gptforge-write-test-"):
            pass
    except OSError as e:
        return e
    return None


def place_fault(path: str | os.PathLike, flag: str) -> str | None:
    """Why nothing can be written at ``path``, the output of ``flag`` (a file or a folder to be made there), in one
    line: a file standing where a folder is needed above it (every writer met it only at its mkdir, after the
    work, as "file exists"), or a nearest existing folder where no file can be made (read-only, not this user's,
    a pseudo-filesystem). None when the place can take it; what ``path`` itself holds is the output check's
    (storage.guards.check_output)."""
    from gptforge.storage.guards import link_fault

    fault = link_fault(path, flag)  # a link whose target's folder is missing: the writers refuse it (link_target)
    if fault:
        return fault
    path = Path(path)
    probe = nearest_existing(path.parent if path.exists() and not path.is_dir() else path)
    if probe.exists() and not probe.is_dir():
        return (f"{flag} {path} cannot be written: {probe} is a file, not a folder; choose a path under a folder "
                f"(or move {probe} away)")
    if not probe.exists():  # nothing above it exists (a relative path from a deleted folder): the writer says it
        return None
    e = write_probe(probe)
    if e is None:
        return None
    fix = ("make it this user's to write (chmod u+w) or choose another path" if e.errno in (errno.EACCES, errno.EPERM)
           else "choose a path on a writable filesystem")
    return f"{flag} {path} cannot be written ({probe}: {e.strerror or e}); {fix}"


def check_run_dir(path: str | os.PathLike) -> None:
    """``train.out_dir`` must be a directory, or creatable, on a writable filesystem, and its
    ``checkpoints`` (if there) a writable directory, not a file or a broken link. Probes with a
    temporary file in the directory (or its nearest existing parent) and creates nothing that stays,
    so a run refused later for another reason leaves no empty run directory behind."""
    from gptforge.config import ConfigError  # here, not above: place_fault serves commands that never load torch
    from gptforge.storage.guards import literal_home, run_owner

    home = literal_home(path, "--train.out_dir")  # --train.out_dir=~/x, which --out's check never sees
    if home:
        raise ConfigError(home)
    path = Path(path)
    owner = run_owner(path)  # a run of its own inside another's checkpoint, or among its step folders
    if owner is not None and (owner[0] == "checkpoint" or owner[1] != path.absolute()):
        raise ConfigError(f"train.out_dir={str(path)!r} is {'' if owner[1] == path.absolute() else 'inside '}the "
                          f"{owner[0]} {owner[1]}{'' if owner[0] == 'checkpoint' else ' (its checkpoints folder)'}: a "
                          "new run there would be read as that run's files; give --out (--train.out_dir) a folder of "
                          "its own (the run directory itself to resume it)")
    probe = nearest_existing(path)
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == path else f"cannot be created: {probe} is a file"
        raise ConfigError(f"train.out_dir={str(path)!r} {what}; give --out (--train.out_dir) a directory")
    ckpts = path / "checkpoints"  # where every save goes: a file or a broken link there fails only at the first save
    if ckpts.is_symlink() and not ckpts.exists():
        raise ConfigError(f"train.out_dir={str(path)!r}: {ckpts} is a link to {os.readlink(ckpts)}, which does not "
                          "exist (a disk not mounted?); mount it or remove the link, then run again")
    if ckpts.exists() and not ckpts.is_dir():
        raise ConfigError(f"train.out_dir={str(path)!r}: {ckpts} is a file, where the run keeps its checkpoints; "
                          "move it away (or give --out another directory), then run again")
    metrics = path / "metrics.jsonl"  # appended to in place: a writable folder does not make it writable
    if metrics.is_file() and not os.access(metrics, os.W_OK):
        raise ConfigError(f"train.out_dir={str(path)!r}: {metrics} is read-only (a run appends to it); make it this "
                          "user's to write (chmod u+w) or give --out (--train.out_dir) another directory")
    for where in (probe, *([ckpts] if ckpts.is_dir() else [])):  # a linked checkpoints/ may be on another disk
        e = write_probe(where)
        if e is not None:
            fix = ("make it this user's to write (chmod -R u+w) or give --out (--train.out_dir) another directory"
                   if e.errno in (errno.EACCES, errno.EPERM) else
                   "give --out (--train.out_dir) a directory on a writable filesystem")
            raise ConfigError(f"train.out_dir={str(path)!r} cannot be written ({where}: {e.strerror or e}); {fix}") from None
