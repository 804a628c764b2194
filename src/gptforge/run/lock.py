"""One writer per run directory: an advisory ``flock`` on ``RUN/.gptforge.lock``, held for the whole run.

    with RunLock("runs/exp1"):   # a second run on runs/exp1 fails at once, naming this process
        ...

Two runs on the same ``--out`` would interleave ``metrics.jsonl`` and prune each other's checkpoints.
The lock is taken by :class:`gptforge.run.session.RunSession` on rank 0 before anything in the
directory is read or written, and released at teardown. The kernel drops a ``flock`` when its
process dies, however it dies, so a lock left by a killed run never blocks the next one. The file
holds the holder's pid and command line (for the message); it is left in place (unlinking a locked
file lets a third process lock a new inode while a second still holds the old one).

A shard folder has a lock of its own, on the same mechanism (:mod:`gptforge.storage.lock`): ``prepare`` holds
it exclusive and every reader of the shards shared (:func:`gptforge.data.shards.writing`, ``reading``).

The lock also knows which folder it holds (device and inode): :meth:`RunLock.check` says, in one
line, when the run directory was deleted, moved or replaced while the run trained, and the run's
writers (metrics.jsonl, checkpoints) call it before each write, so a run never starts a new half
run in a fresh folder under the old name (the checkpoint writer makes its folders as needed).
"""

from __future__ import annotations

import os
from pathlib import Path

from gptforge.data.shards import SHARD_LOCK_NAME
from gptforge.storage.faults import OutputError
from gptforge.storage.lock import FolderLock, Held


class RunDirectoryGone(OutputError):
    """The run directory this run holds was deleted, moved or replaced while it trained (exit 2, one line)."""

LOCK_NAME = ".gptforge.lock"
PREPARE_LOCK_NAME = SHARD_LOCK_NAME  # (the name tests and older callers know; the shard folder's own lock)


class RunLock:
    """An exclusive, non-blocking lock on a run directory (created if missing; if this lock created
    it and the run wrote nothing else there, it is removed again at release). The flock itself is
    :class:`gptforge.storage.lock.FolderLock`'s, the one mechanism of every hold."""

    def __init__(self, run_dir: str | os.PathLike, holder: str = "run", name: str = LOCK_NAME):
        self.run_dir = Path(run_dir)
        self.holder = holder  # what holds the folder, for the messages: "run"
        self.hold = FolderLock(self.run_dir, name)  # a shard folder's is not LOCK_NAME, which marks a run directory
        self.path = self.hold.path
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder locked
        self.unsupported: str | None = None  # why the filesystem refused to lock (then the run holds no lock)

    @property
    def fd(self) -> int | None:
        return self.hold.fd

    def acquire(self) -> RunLock:
        try:
            self.hold.acquire()
        except Held as e:
            from gptforge.config import ConfigError  # here: nothing light that takes this lock may import torch

            raise ConfigError(
                f"{self.run_dir} is in use by another {self.holder} ({e.holders}); wait for it to finish or stop it, "
                f"or give this {self.holder} another --out"
            ) from None
        if self.hold.unsupported:  # the filesystem cannot lock (ENOLCK, EOPNOTSUPP: some NFS and FUSE mounts)
            self.unsupported = (f"{self.path}: {self.hold.unsupported}; the {self.holder} goes on without the lock, "
                                f"so nothing stops a second {self.holder} on this --out from writing here too: start "
                                "only one (or put it on a local disk)")
        st = os.stat(self.run_dir)
        self.identity = (st.st_dev, st.st_ino)
        return self

    def check(self, what: str) -> None:
        """Raise :class:`RunDirectoryGone` (one line: where the run went and how to continue) unless
        ``run_dir`` is still the folder this lock was taken in; ``what`` is the write about to be made."""
        if self.fd is None or self.identity is None:
            return
        try:
            st = os.stat(self.run_dir)
            if (st.st_dev, st.st_ino) == self.identity:
                return
            there = f"{self.run_dir} is now another folder"
        except OSError:
            there = f"{self.run_dir} is gone"
        now = _where_now(self.fd)
        if now is None and _unlinked(self.fd):  # its files are gone from this disk: rm, or mv to another disk
            raise RunDirectoryGone(
                f"cannot write {what}: the run directory was deleted, or moved to another disk, while the run trained "
                f"({there}; a move across disks copies, then deletes, so the two look the same from here); stopping "
                "rather than start a new run there. If you moved it, continue with --out NEWPLACE --resume; else "
                "restore the folder and continue with --resume, or start the run again")
        if now is None:
            raise RunDirectoryGone(
                f"cannot write {what}: the run directory was moved while the run trained ({there}; this platform "
                "cannot say where); stopping rather than start a new run there. Continue with --out NEWPLACE --resume")
        raise RunDirectoryGone(
            f"cannot write {what}: the run directory was moved to {now} while the run trained ({there}); stopping "
            f"rather than start a new run at {self.run_dir}. Its checkpoints are there: continue with --out {now} "
            "--resume")

    def release(self) -> None:
        self.hold.release()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _where_now(fd: int) -> str | None:
    """The folder the locked file is in now (Linux: /proc/self/fd), or None when it was deleted (or this
    platform cannot say)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if target.endswith(" (deleted)") or not target.startswith("/"):
        return None
    return str(Path(target).parent)


def _unlinked(fd: int) -> bool:
    """Whether the open file ``fd`` has no name left on its disk (deleted; or copied elsewhere and deleted,
    which is what a move to another disk does). True where that cannot be asked."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True
