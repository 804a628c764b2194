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
  run directory: :mod:`gptforge.storage.guards` decides what an output may replace.
* **Errors**: a full or read-only disk, a file past ``ulimit -f`` or an I/O error becomes one line
  naming the file, what failed and what to do: :mod:`gptforge.storage.faults`.

No torch import here (nor in the two modules beside it): prepare's workers load this package.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gptforge.storage.faults import OutputError, output_errors, write_fault_message
from gptforge.storage.guards import OutputExistsError, check_output, link_target, named, special_output


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

# fsync's answer on a filesystem that cannot sync (some FUSE and network mounts, a special file): EINVAL says
# so in POSIX, EOPNOTSUPP/ENOTSUP in practice. The data is written; it cannot be made more durable there.
_NO_SYNC = {errno.EINVAL, errno.EBADF, getattr(errno, "EOPNOTSUPP", -1), getattr(errno, "ENOTSUP", -1)}


def fsync_fd(fd: int) -> None:
    """``os.fsync(fd)``, where the filesystem supports it; every writer's fsync goes through here (a
    checkpoint's files, atomic outputs), so a filesystem without fsync is no traceback at the first save.
    A real failure (EIO, ENOSPC: a disk that reserves space late) is raised as it is."""
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_SYNC:
            raise


def fsync_dir(path: str | Path) -> None:
    """Make a rename in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder``, then ``folder``: a folder built to be renamed into place
    (an export, a checkpoint) holds its files' bytes and their names after a power cut, not only the rename."""
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not f.is_symlink():
            fsync_file(f)
    for d in sorted((q for q in folder.rglob("*") if q.is_dir()), reverse=True):
        fsync_dir(d)
    fsync_dir(folder)


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
def atomic_path(path: str | Path, what: str | None = None, needed: int = 0, sole: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for any writer (safetensors, torch.save, matplotlib) to
    write; on success it is fsynced and renamed to ``path``, on failure deleted. Disk errors become
    one-line :class:`OutputError` s naming ``what`` (default: the file's name). ``sole``: refuse (one line) while
    another process writes ``path`` too, rather than let the last whole write win silently
    (:func:`gptforge.storage.lock.claim_output`: the temporary is locked until it is renamed in)."""
    path = named(path, "output")
    path = link_target(path)  # a link to the real file (on a bigger disk): replace that file, keep the link
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
        claim = None
        try:
            if sole:
                claim = _claim(tmp, path, what)
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
        finally:
            if claim is not None:
                claim.release()
        fsync_dir(path.parent)


def _claim(tmp: Path, path: Path, what: str):
    from gptforge.storage.lock import Held, claim_output

    try:
        return claim_output(tmp, path)
    except Held as e:
        raise OutputError(f"{path}: another process is writing it now ({e.holders}); two writers of {what} would "
                          "leave only the last one's, without a word: wait for it to finish, or write another "
                          "--out") from None


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", what: str | None = None, sole: bool = False,
                **kw: Any) -> Iterator[Any]:
    """``open(path, mode)`` that writes a temporary beside ``path`` and renames it over ``path`` only
    when the block ends without an error (see :func:`atomic_path`, and its ``sole``)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r} (w or wb)")
    with atomic_path(path, what, sole=sole) as tmp, open(tmp, mode, **kw) as f:
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


def swap_dirs(new: Path, path: Path, old: Path) -> Path:
    """Put the folder ``new`` in place of the existing folder ``path``: in one step where the platform allows
    (:func:`exchange`), else two renames (``path`` to ``old``, ``new`` to ``path``), the earlier folder put back
    at once if the second fails. A kill between the two leaves the earlier folder whole at ``old``, where the
    caller's reader looks for it (``.NAME.old-*`` here, a checkpoint's ``step_N.old``). Returns the folder that
    holds the earlier content now (``new`` after an exchange, else ``old``), for the caller to delete."""
    if exchange(new, path):
        return new
    os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(old, path)
        raise
    return old


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
    path = link_target(path, flag)  # a link to the real folder: build beside it, on its filesystem; keep the link
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
            fsync_tree(tmp)
            old = None
            if path.is_dir() and any(path.iterdir()):
                old = swap_dirs(tmp, path, _temp_name(path, "old"))
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
