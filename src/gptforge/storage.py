"""A full disk, recognised and named the same way by every writer (checkpoints, prepared shards).

    try:
        write_something(tmp)
    except Exception as e:
        if is_disk_full(e, tmp, needed):
            raise DiskFullError(disk_full_message("checkpoint step 300", needed, tmp)) from e
        raise

Writers do not agree on how they report ENOSPC: Python raises ``OSError(errno.ENOSPC)``,
safetensors a ``SafetensorError`` whose text holds "No space left on device (os error 28)", and
``torch.save`` a bare ``RuntimeError`` ("basic_ios::clear: iostream error", or "unexpected pos ...")
with no errno at all. For the last kind the filesystem itself is asked: if it no longer has room
for what was still to be written, the failure is taken to be a full disk.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_ENOSPC_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


class DiskFullError(OSError):
    """No space left while writing: the message names what was being written and how much it needs."""


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor inside ``obj`` (nested dicts, lists and tuples): a size estimate.
    Duck-typed (numel/element_size), so this module does not import torch: prepare's workers load it."""
    if hasattr(obj, "numel") and hasattr(obj, "element_size"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def dir_bytes(paths: Iterable[Path] | Path) -> int:
    """Total size of the files under ``paths`` (a file, a folder, or several)."""
    if isinstance(paths, Path):
        paths = [paths]
    total = 0
    for p in paths:
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return total


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def is_disk_full(exc: BaseException, where: Path, needed: int = 0, written: int = 0) -> bool:
    """Whether ``exc``, raised while writing under ``where``, means the disk (or quota) is full.
    ``needed``: bytes the whole write needs; ``written``: bytes of it already on disk."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if e is not None and any(t in str(e) for t in _ENOSPC_TEXT):
            return True
    if isinstance(exc, RuntimeError):  # torch.save: no errno; ask the filesystem
        free = free_bytes(where)
        return free is not None and free < max(needed - written, 1 << 20)
    return False


RESUME_HINT = ("run the same command again with --resume: the run continues from its newest checkpoint "
               "that was written whole")


def disk_full_message(what: str, needed: int, where: Path, then: str = "run the same command again") -> str:
    """The one line a full disk gets, whoever was writing; ``then`` is how to continue (a training
    run continues with ``--resume``: :data:`RESUME_HINT`)."""
    free = free_bytes(where)
    free_s = f"; {free / 1e9:.2g} GB free there" if free is not None else ""
    return (f"no space left on device while writing {what} (needs about {needed / 1e9:.2g} GB) in {where}"
            f"{free_s}. Free some space (or point the output at a bigger disk) and {then}")



def current_umask() -> int:
    """The process umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(old)
    return old


def ordinary_file_mode(path: str | Path) -> None:
    """Give ``path`` the mode an ordinary new file gets (0666 minus the umask). safetensors writes
    through a private temporary file (0600), which would leave the weights unreadable to a group that
    can read every other file of the checkpoint."""
    os.chmod(path, 0o666 & ~current_umask())
