"""Advisory ``flock`` holds on one file, never waiting: one writer (exclusive), or many readers (shared).

    hold = Flock(folder / ".gptforge-prepare.lock").acquire()   # Held names who has it, in one line's words
    ...
    hold.release()

The one mechanism under every "one at a time" of gptforge: a run directory (:mod:`gptforge.run.lock`), a shard
folder (one ``prepare`` writing, or any number of readers: :mod:`gptforge.data.shards`) and a file that only
one process may be writing at a time (:func:`gptforge.storage.atomic_path`'s ``sole``). The kernel drops a ``flock`` when
its holder dies, however it dies, so nothing a killed process leaves blocks the next one. ``flock`` belongs to
an open file description: two opens of one file in one process are two holders, as two processes are.

Who holds a file is read from ``/proc/locks`` (Linux: every holder's pid and kind, readers included), else from
what an exclusive holder wrote into the file ("pid N: command line"). A filesystem that cannot lock (ENOLCK,
EOPNOTSUPP: some NFS and FUSE mounts), and a lock file that cannot be opened at all (a read-only folder or
mount, a file this user may not read: EROFS, EACCES, EPERM), is not "held": the hold says why in
``unsupported`` and goes on without a lock (a writer that cannot make its lock file cannot write there either:
that error is its own).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path

# flock's answers when another open file description holds the lock (EACCES: some systems' fcntl dialect)
HELD_ERRNOS = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}
# the lock file cannot be opened (or made): a read-only folder or mount, or one this user may only read
CANNOT_OPEN = {errno.EROFS, errno.EACCES, errno.EPERM}


class Held(Exception):
    """Another process (or another open file description) holds the lock. ``holders``: one line's words naming
    them ("pid N: its command line", readers' pids); ``readers``: True when the holders are shared (readers)."""

    def __init__(self, holders: str, readers: bool, pids: list[int] | None = None):
        super().__init__(holders)
        self.holders, self.readers, self.pids = holders, readers, pids or []  # pids: where they can be known


class Flock:
    """A non-blocking ``flock`` on ``path``: exclusive (``shared`` False: the holder's pid and command line are
    written into the file, for the message another one gets) or shared. The file is made if missing; a shared
    hold in a folder where it cannot be (read-only) locks the one there read-only, or goes on unlocked."""

    def __init__(self, path: str | os.PathLike, shared: bool = False, note: bool = True):
        self.path = Path(path)
        self.shared = shared
        self.note = note and not shared  # write "pid N: command line" into the file (an exclusive lock file's)
        self.fd: int | None = None
        self.unsupported: str | None = None  # why there is no lock to hold (then nothing is held)

    def acquire(self) -> Flock:
        """Take the lock, or raise :class:`Held`; a filesystem that cannot lock sets ``unsupported``."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if not self.shared or e.errno not in CANNOT_OPEN:  # a writer that cannot make it cannot write there
                raise
            fd = self._read_only(e)
            if fd is None:
                return self
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in HELD_ERRNOS:
                who = holders(fd, self.path)
                os.close(fd)
                raise Held(*who) from None
            # the filesystem cannot lock (ENOLCK, EOPNOTSUPP): the file stays open, unlocked (RunLock.check
            # still tells a moved folder by it)
            self.unsupported = f"this filesystem cannot lock files ({(e.strerror or str(e)).lower()})"
        if self.note:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}: {' '.join(sys.argv)}\n".encode(errors="replace"))
        self.fd = fd
        return self

    def _read_only(self, e: OSError) -> int | None:
        """A lock file a reader cannot make or write: the one there is locked read-only (flock needs no write
        access); where there is none, or it cannot be read, there is nothing to lock, said in ``unsupported``."""
        try:
            return os.open(self.path, os.O_RDONLY)
        except OSError as e2:
            e = e2 if e2.errno != errno.ENOENT else e
        self.unsupported = f"{(e.strerror or str(e)).lower()}: no lock file can be made or opened here"
        return None

    def release(self) -> None:
        if self.fd is None:
            return
        if self.unsupported is None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> Flock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def locks_on(fd: int) -> list[tuple[int, str]] | None:
    """(pid, "READ" or "WRITE") of every flock on the file open as ``fd``, from ``/proc/locks`` (holders only, not
    waiters); None where that cannot be read (not Linux). A pid is the process that took the lock."""
    try:
        st = os.fstat(fd)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's line has "->" after the number
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == dev and f[4].isdigit():
            out.append((int(f[4]), f[3]))
    return out


def describe_pid(pid: int) -> str:
    """"pid N: its command line" (shortened), or "pid N" where the command line cannot be read."""
    try:
        cmd = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())  # one line
    except OSError:
        cmd = ""
    return f"pid {pid}: {cmd[:200]}" if cmd else f"pid {pid}"


def holders(fd: int, path: Path) -> tuple[str, bool, list[int]]:
    """Who holds the lock on ``path`` (open as ``fd``), in words; whether they are readers (shared holders); their
    pids where they can be known."""
    found = locks_on(fd)
    if found:
        readers = sorted({pid for pid, kind in found if kind == "READ"})
        if readers and not any(kind == "WRITE" for _, kind in found):
            return "; ".join(describe_pid(p) for p in readers[:4]) + (
                f" and {len(readers) - 4} more" if len(readers) > 4 else ""), True, readers
    else:  # no /proc/locks, or its device numbers are not fstat's (overlay mounts): a probe of our own says
        # which kind holds it (a shared lock we can take means the holders are readers)
        try:
            probe = os.open(path, os.O_RDONLY)  # another open file description: a probe of its own
        except OSError:
            probe = None
        if probe is not None:
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return "another process (its pid cannot be read here)", True, []
            except OSError:
                pass
            finally:
                os.close(probe)
    return _written(fd), False, []


def _written(fd: int) -> str:
    """What the exclusive holder wrote ("pid N: command line"), or a plain description if it has not yet."""
    try:
        text = " ".join(os.pread(fd, 4096, 0).decode(errors="replace").split())  # one line, whatever argv held
    except OSError:
        text = ""
    return text[:300] if text else "another process, which has not yet written its pid"


class FolderLock:
    """A :class:`Flock` on ``folder/name``, the folder made if missing (exclusive holds). If this hold made the
    folder and nothing but the lock file is in it at release (refused before writing anything), both are removed
    again, with the folders above it this hold made (``runs/`` under ``runs/x``) where they are empty: no empty
    output folder is left behind. A shared hold never makes the folder."""

    def __init__(self, folder: str | os.PathLike, name: str, shared: bool = False):
        self.folder = Path(folder)
        self.lock = Flock(self.folder / name, shared=shared)
        self.created = False
        self.made: list[Path] = []  # the folders acquire made, deepest first

    @property
    def path(self) -> Path:
        return self.lock.path

    @property
    def fd(self) -> int | None:
        return self.lock.fd

    @property
    def unsupported(self) -> str | None:
        return self.lock.unsupported

    def acquire(self) -> FolderLock:
        if not self.lock.shared:
            self.made, p = [], self.folder
            while not p.exists() and p != p.parent:
                self.made.append(p)
                p = p.parent
            self.created = bool(self.made)
            self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self.lock.acquire()
        except BaseException:
            self._tidy()
            raise
        return self

    def _tidy(self) -> None:
        try:  # (a folder deleted or moved under its holder: nothing to tidy)
            only_lock = self.created and {p.name for p in self.folder.iterdir()} <= {self.path.name}
        except OSError:
            only_lock = False
        if only_lock:
            self.path.unlink(missing_ok=True)
            for made in self.made:  # the folder, then the ones above it this hold made, while each is empty
                try:
                    made.rmdir()
                except OSError:
                    break

    def release(self) -> None:
        if self.lock.fd is not None or self.created:
            self._tidy()
        self.lock.release()
        self.created = False

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_output(tmp: Path, path: Path) -> Flock:
    """This writer's temporary ``tmp`` of ``path`` locked (exclusive) until released, and :class:`Held` when
    another temporary of the same ``path`` is locked: another process is writing that file now, and the last
    whole write would win, without a word. Each writer locks its own temporary before it looks at the others', so
    of two started at once the second to look always sees the first (both may refuse; neither is lost)."""
    hold = Flock(tmp, note=False).acquire()  # made by the caller; a fresh file nobody else holds
    import glob

    for other in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        if other.name == tmp.name:
            continue
        try:
            fd = os.open(other, os.O_RDONLY)
        except OSError:  # gone since: that writer finished (or failed)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in HELD_ERRNOS:
                named = other.name.split(".tmp-")[-1].split("-")[0]  # .NAME.tmp-PID-XXXXXX: its writer's pid
                pids = [p for p, _ in locks_on(fd) or []] or ([int(named)] if named.isdigit() else [])
                hold.release()
                raise Held(describe_pid(pids[0]) if pids else "another process", False, pids[:1]) from None
        finally:
            os.close(fd)
    return hold

