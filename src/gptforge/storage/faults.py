"""What a failed write means, in one line: a full disk (or quota), a read-only or not-permitted folder, a
file past ``ulimit -f`` or the filesystem's largest, an I/O error. Every writer (the atomic writer in
:mod:`gptforge.storage`, checkpoints, metrics, prepare's shards) turns its exception into one of these
:class:`OutputError` s, which the CLI prints with exit status 2, as ``train`` does for a full disk.

    with output_errors(out / "report.json", "the report"):
        ...  # ENOSPC here raises DiskFullError("no space left on device while writing the report ...")

ENOSPC/EDQUOT become :class:`DiskFullError`, EROFS/EACCES/EPERM :class:`NotWritableError`, both
:class:`OutputError`: one line naming the file, what failed and what to do.

Writers do not agree on how they report ENOSPC: Python raises ``OSError(errno.ENOSPC)``, numpy's
``tofile`` an ``OSError`` with no errno ("4096 requested and 0 written", a short write), safetensors a
``SafetensorError`` whose text holds "No space left on device (os error 28)", and ``torch.save`` a bare
``RuntimeError`` ("basic_ios::clear: iostream error", or "unexpected pos ...")
with no errno at all. For the last kind the filesystem itself is asked: if it no longer has room
for what was still to be written, the failure is taken to be a full disk. No torch import here:
prepare's workers load this module.
"""
from __future__ import annotations

import contextlib
import errno
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_ENOSPC_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
# numpy's tofile (the GGUF writer's tensors, prepare's spill files) reports ENOSPC as a short fwrite with no
# errno: "4096 requested and 0 written". A write the disk took only part of is a full disk (or quota).
_SHORT_WRITE = re.compile(r"\b\d+ requested and \d+ written\b")
_TOO_LARGE_TEXT = ("File too large", "os error 27)")  # EFBIG: past `ulimit -f` or the filesystem's largest file


class OutputError(OSError):
    """An output gptforge could not (or may not) write; the message is one line naming the file."""


class DiskFullError(OutputError):
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
        if isinstance(e, OSError) and e.errno is None and _SHORT_WRITE.search(str(e)):  # a short write
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



_NOT_WRITABLE = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted"}
_NOT_WRITABLE_TEXT = {"os error 30": "read-only file system", "Read-only file system": "read-only file system",
                      "os error 13": "permission denied", "Permission denied": "permission denied"}
class NotWritableError(OutputError):
    """The output's folder is read-only or not this user's to write."""


def not_writable_reason(exc: BaseException) -> str | None:
    """"read-only file system" / "permission denied" when ``exc`` (or its cause) says so, else None."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno in _NOT_WRITABLE:
            return _NOT_WRITABLE[e.errno]
        if e is not None and not isinstance(e, OSError):
            for text, reason in _NOT_WRITABLE_TEXT.items():
                if text in str(e):
                    return reason
    return None


def file_size_limit() -> int | None:
    """This process's limit on the size of a file it writes (``ulimit -f``, RLIMIT_FSIZE), in bytes; None
    when there is none (or the platform has no such limit)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def _largest_file(where: Path) -> int:
    try:
        if where.is_file():
            return where.stat().st_size
        if where.is_dir():
            return max((f.stat().st_size for f in where.rglob("*") if f.is_file()), default=0)
    except OSError:
        pass
    return 0


def is_file_too_large(exc: BaseException, where: Path | None = None) -> bool:
    """Whether ``exc`` means a file grew past what may be written: the process's file size limit
    (``ulimit -f``: the kernel cuts the write at the limit, then refuses with EFBIG) or the filesystem's
    largest file. Python and safetensors say EFBIG ("File too large", os error 27); torch.save says only
    "unexpected pos" and numpy a short write, so for those a finite limit that a file being written under
    ``where`` (the temporary file or folder) has reached is taken as the cause."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno == errno.EFBIG:
            return True
        if e is not None and any(t in str(e) for t in _TOO_LARGE_TEXT):
            return True
    limit = file_size_limit()
    if limit is None or where is None:  # (where: only a temporary its writer names, never a guess such as ".")
        return False
    no_errno = isinstance(exc, RuntimeError) or (isinstance(exc, OSError) and exc.errno is None
                                                 and _SHORT_WRITE.search(str(exc)) is not None)
    return no_errno and _largest_file(Path(where)) >= limit


def write_fault_message(exc: BaseException, path: Path, what: str, then: str = "run the same command again",
                        written_at: Path | None = None) -> str | None:
    """The one line for a write the disk or the process refused for another reason than space or
    permission: a file past the size limit (EFBIG) or an I/O error (EIO: the disk or its connection
    failed). ``written_at``: the temporary file or folder being written, where a file that reached the
    limit is looked for (writers that say no errno). None when ``exc`` is neither."""
    if is_file_too_large(exc, written_at):
        limit = file_size_limit()
        if limit is not None:
            return (f"cannot write {what} to {path}: file too large, past this process's file size limit "
                    f"({limit:,} bytes, set by `ulimit -f`). Raise the limit (ulimit -f unlimited) and {then}")
        return (f"cannot write {what} to {path}: file too large for the filesystem there (FAT32 stops at 4 GiB). "
                f"Point the output at another filesystem and {then}")
    for e in (exc, exc.__cause__, exc.__context__):
        if (isinstance(e, OSError) and e.errno == errno.EIO) or (e is not None and "os error 5)" in str(e)):
            return (f"cannot write {what} to {path}: input/output error (the disk or its connection failed; the "
                    f"kernel log, dmesg, says which). Check the disk, then {then}")
    return None


def output_error(exc: BaseException, path: Path, what: str, needed: int = 0,
                 written: int = 0, then: str = "run the same command again",
                 written_at: Path | None = None) -> OutputError | None:
    """The one-line error ``exc`` (raised while writing ``what`` at ``path``) means, or None when it is
    not the disk's doing (then the caller re-raises ``exc``). ``then``: how to continue; ``written_at``:
    the file being written, when its writer says no errno (see :func:`is_file_too_large`)."""
    if isinstance(exc, OutputError):
        return exc
    where = Path(path).parent
    fault = write_fault_message(exc, Path(path), what, then, written_at)
    if fault is not None:  # before the full-disk test: numpy's short write under `ulimit -f` is no full disk
        return OutputError(fault)
    if is_disk_full(exc, where, needed, written):
        return DiskFullError(disk_full_message(f"{what} ({path})", needed, where, then))
    reason = not_writable_reason(exc)
    if reason is not None:
        fix = ("a writable disk" if reason.startswith("read-only") else
               "a folder this user can write (or fix its permissions)")
        return NotWritableError(f"cannot write {what} to {path}: {reason}. Point the output at {fix} and {then}")
    return None


@contextlib.contextmanager
def output_errors(path: str | Path, what: str, needed: int = 0, then: str = "run the same command again") -> Iterator[None]:
    """Around writing ``what`` at ``path``: a full disk or a read-only target becomes its one-line error."""
    try:
        yield
    except Exception as e:
        err = output_error(e, Path(path), what, needed, then=then)
        if err is None or err is e:
            raise
        raise err from e
