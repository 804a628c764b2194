"""One writer per run directory: an advisory ``flock`` on ``RUN/.gptforge.lock``, held for the whole run.

    with RunLock("runs/exp1"):   # a second run on runs/exp1 fails at once, naming this process
        ...

Two runs on the same ``--out`` would interleave ``metrics.jsonl`` and prune each other's checkpoints.
The lock is taken by :class:`gptforge.run.session.RunSession` on rank 0 before anything in the
directory is read or written, and released at teardown. The kernel drops a ``flock`` when its
process dies, however it dies, so a lock left by a killed run never blocks the next one. The file
holds the holder's pid and command line (for the message); it is left in place (unlinking a locked
file lets a third process lock a new inode while a second still holds the old one).
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from gptforge.config import ConfigError

LOCK_NAME = ".gptforge.lock"


class RunLock:
    """An exclusive, non-blocking lock on a run directory (created if missing; if this lock created
    it and the run wrote nothing else there, it is removed again at release)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> RunLock:
        self.created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ConfigError(
                f"{self.run_dir} is in use by another run ({holder}); wait for it to finish or stop it, "
                "or give this run another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {' '.join(sys.argv)}\n".encode(errors="replace"))
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        if self.created and {p.name for p in self.run_dir.iterdir()} == {LOCK_NAME}:
            self.path.unlink(missing_ok=True)  # refused before writing anything: leave no empty run dir
            try:
                self.run_dir.rmdir()
            except OSError:
                pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """What the holder wrote ("pid N: command line"), or a plain description if it has not yet."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text[:300] if text else "another process, which has not yet written its pid"
