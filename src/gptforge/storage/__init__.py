"""The one writer of every file gptforge produces, and a full or read-only disk named in one line
(the one reader of users' files is ``gptforge.reading``).

    from gptforge import storage
    storage.write_json("eval.json", results)                 # reports, generated data, caches
    with storage.atomic_path(out / "model-f16.gguf") as tmp:  # any writer that takes a path
        gguf_writer.write_header_to_file(path=tmp) ...
    with storage.atomic_dir("exports/hf", force=False) as tmp:  # a folder of files that belong together
        export_hf(model, tmp)

How it writes, after git's lock files (``index.lock``: write beside, fsync, rename) and PyTorch
DCP's commit (every file first, then the one step that makes the checkpoint visible):

* **A file** goes to a temporary name in the *same* folder (same filesystem, so the rename is
  atomic), ``.NAME.tmp-PID-XXXXXX[.suffix]`` (hidden, never mistaken for an output; the suffix kept
  for writers that pick a format by it), is fsynced, renamed over NAME with ``os.replace``, and the
  folder is fsynced so the rename itself survives a power cut. A crash, a kill or a full disk at any
  point leaves the old file or the new one under NAME, never a part of one. A failure the writer
  sees deletes the temporary; one a SIGKILL leaves is deleted by the next write of NAME (its
  process is gone).
* **A folder output** (export hf: weights, config and tokenizer files, which only make sense
  together) is built whole in a temporary sibling folder, every file and folder fsynced, then
  renamed into place. Writing each file atomically in place would not do: a kill between two of
  them leaves new weights beside an old config.json. Replacing an earlier folder (``force``) keeps
  the entries the new output does not write (hard links: no copy of large files) and swaps the two
  folders in one step (Linux ``renameat2(RENAME_EXCHANGE)``); where that is missing, two renames,
  and a kill between them leaves the old folder whole as ``.NAME.old-...``, which the next write of
  NAME puts back first (the checkpoint writer's scheme).
* **Overwriting** an existing output needs ``force``, and ``force`` never replaces a checkpoint or a
  run directory, nor a run's own files (:func:`check_output`; those belong to the run stack, which
  writes checkpoints its own way: run/checkpoint.py, a temporary folder renamed in).
* **Errors**: ENOSPC/EDQUOT become :class:`DiskFullError`, EROFS/EACCES/EPERM
  :class:`NotWritableError`, both :class:`OutputError`: one line naming the file, what failed and
  what to do, which the CLI prints with exit status 2, as ``train`` does for a full disk.

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
import glob
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gptforge.reading import not_a_file

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


# --- the one writer (see the module docstring) -----------------------------------------------------

_NOT_WRITABLE = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted"}
_NOT_WRITABLE_TEXT = {"os error 30": "read-only file system", "Read-only file system": "read-only file system",
                      "os error 13": "permission denied", "Permission denied": "permission denied"}
# what marks a directory the run stack owns (run/checkpoint.py, run/lock.py, run/session.py)
RUN_DIR_MARKERS = ("checkpoints", "metrics.jsonl", ".gptforge.lock", "env.json")
CHECKPOINT_MARKER = "meta.json"
RUN_FILES = (*RUN_DIR_MARKERS, "config.json")  # a run directory's own files: a new report beside them is fine


class NotWritableError(OutputError):
    """The output's folder is read-only or not this user's to write."""


class OutputExistsError(OutputError, FileExistsError):
    """The output exists and --force was not given, or it is a checkpoint or run directory."""


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


def check_output(path: str | Path, force: bool, kind: str = "file", flag: str = "--out") -> Path:
    """Refuse, before any work, an output that would replace something it may not: an existing file
    (a non-empty folder) without ``force``, and, with or without it, a checkpoint or run directory
    or a file inside one that the run stack wrote. ``kind``: "file" or "dir"."""
    p = named(path, flag)
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


def fsync_dir(path: str | Path) -> None:
    """Make a rename in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):  # filesystems without directory fsync
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(path: Path, kind: str, suffix: str = "") -> Path:
    """``.NAME.tmp-PID-XXXXXX[SUFFIX]``: hidden, beside NAME, naming its writer's process; a file's keeps
    its suffix, for writers that choose a format by it (matplotlib, a .gz trace)."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(3)}{suffix}")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of this writer's temporaries (``.NAME.tmp-PID-XXXXXX``, or the earlier
    folder ``.NAME.old-PID-XXXXXX`` during a swap)."""
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_temporaries(path: Path) -> None:
    """Delete the temporaries a killed writer of ``path`` left beside it (their process is gone)."""
    if not path.parent.is_dir():
        return
    name = glob.escape(path.name)
    for q in [*path.parent.glob(f".{name}.tmp-*"), *path.parent.glob(f".{name}.old-*")]:
        pid = re.split(r"\.(?:tmp|old)-", q.name)[-1].split("-")[0]  # .NAME.tmp-PID-XXXXXX[.suffix]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(q, ignore_errors=True) if q.is_dir() and not q.is_symlink() else q.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path, what: str | None = None, needed: int = 0) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for any writer (safetensors, torch.save, matplotlib) to
    write; on success it is fsynced and renamed to ``path``, on failure deleted. Disk errors become
    one-line :class:`OutputError` s naming ``what`` (default: the file's name)."""
    path = named(path, "output")
    if path.is_symlink():  # a link to the real file (on a bigger disk): replace that file, keep the link
        path = path.resolve()
    special = special_output(path)
    if special:  # the last guard, for writers that never went through check_output
        raise OutputExistsError(special)
    if path.is_dir():  # the same guard for a folder: os.replace over it was an IsADirectoryError traceback
        raise OutputExistsError(f"{path} is a folder; name the file to write")
    what = what or path.name
    tmp = None
    with output_errors(path, what, needed):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        tmp = _temp_name(path, "tmp", path.suffix)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the mode an ordinary file gets
        try:
            yield tmp
            fsync_file(tmp)
            os.replace(tmp, path)
        except BaseException as e:
            fault = write_fault_message(e, path, what, written_at=tmp) if isinstance(e, Exception) else None
            with contextlib.suppress(OSError):
                tmp.unlink()
            if fault is not None:  # judged while the temporary was there to show a file at the size limit
                raise OutputError(fault) from e
            raise
        fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", what: str | None = None, **kw: Any) -> Iterator[Any]:
    """``open(path, mode)`` that writes a temporary beside ``path`` and renames it over ``path`` only
    when the block ends without an error (see :func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r} (w or wb)")
    with atomic_path(path, what) as tmp, open(tmp, mode, **kw) as f:
        yield f


def write_bytes(path: str | Path, data: bytes, what: str | None = None) -> Path:
    with atomic_open(path, "wb", what) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str, what: str | None = None, encoding: str = "utf-8") -> Path:
    with atomic_open(path, "w", what, encoding=encoding) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, obj: Any, what: str | None = None, indent: int | None = 2, **kw: Any) -> Path:
    """``obj`` as JSON (a trailing newline) at ``path``, atomically; ``kw`` goes to json.dumps."""
    return write_text(path, json.dumps(obj, indent=indent, **kw) + "\n", what)


def _carry_over(old: Path, new: Path, top: bool = True) -> None:
    """Hard-link (copy where links are refused) the entries of ``old`` that ``new`` does not have; an
    entry ``new`` has (a file or a whole subfolder, e.g. tokenizer/) replaces the old one whole."""
    for entry in old.iterdir():
        target = new / entry.name
        if top and (target.exists() or target.is_symlink() or is_temporary(entry.name)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            target.mkdir()
            _carry_over(entry, target, top=False)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        else:
            try:
                os.link(entry, target)
            except OSError:
                shutil.copy2(entry, target)


def exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the platform or
    filesystem cannot, and the caller falls back to two renames."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _restore_interrupted(path: Path) -> None:
    """A swap killed between its two renames left NAME missing and ``.NAME.old-*`` whole: put it back."""
    if path.exists():
        return
    olds = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime) \
        if path.parent.is_dir() else []
    if olds:
        os.replace(olds[-1], path)


@contextlib.contextmanager
def atomic_dir(path: str | Path, force: bool = False, what: str | None = None, flag: str = "--out") -> Iterator[Path]:
    """Build a folder output in a temporary sibling folder (yielded) and rename it into place when
    the block succeeds (see the notes above). ``force`` replaces an existing non-empty folder (its
    other entries are kept); never a checkpoint or run directory."""
    given, path = path, named(path, flag)
    try:
        here: Path | None = Path.cwd()
    except OSError:  # a deleted current folder: nothing to protect
        here = None
    if here is not None and (path.resolve() == here or path.resolve() in here.parents):
        raise OutputExistsError(f"{flag} {given} is the folder this command runs in, or holds it: the output is built "
                                "beside it and swapped in, which would leave this shell in a deleted folder that "
                                f"looks empty; give a folder of its own (e.g. {flag} exports/NAME)")
    if path.is_symlink():  # a link to the real folder: build beside it, on its filesystem; keep the link
        path = path.resolve()
    what = what or f"the folder {path.name}"
    with output_errors(path, what):
        _restore_interrupted(path)
        check_output(path, force, "dir", flag)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        tmp = _temp_name(path, "tmp")
        tmp.mkdir()
        try:
            yield tmp
            if path.is_dir():
                _carry_over(path, tmp)
            for f in sorted(tmp.rglob("*")):
                if f.is_file() and not f.is_symlink():
                    fsync_file(f)
            for d in sorted((q for q in tmp.rglob("*") if q.is_dir()), reverse=True):
                fsync_dir(d)
            fsync_dir(tmp)
            old = None
            if path.is_dir() and any(path.iterdir()):
                if exchange(tmp, path):  # one atomic step: tmp now holds the old folder
                    old = tmp
                else:
                    old = _temp_name(path, "old")
                    os.replace(path, old)
                    try:
                        os.replace(tmp, path)
                    except BaseException:  # the earlier folder back under its name, at once
                        os.replace(old, path)
                        old = None
                        raise
            else:
                os.replace(tmp, path)  # onto a missing or empty folder: one atomic step
            fsync_dir(path.parent)
        except BaseException as e:
            fault = write_fault_message(e, path, what, written_at=tmp) if isinstance(e, Exception) else None
            shutil.rmtree(tmp, ignore_errors=True)
            if fault is not None:
                raise OutputError(fault) from e
            if isinstance(e, OutputError) and str(tmp) in str(e):  # a file's writer inside: name the output
                raise type(e)(str(e).replace(str(tmp), str(path))) from e
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
