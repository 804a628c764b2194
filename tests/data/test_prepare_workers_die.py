"""Issue 21 class 6 (processes): `prepare`'s tokenizer workers die with their parent, however it dies.
SIGKILL of the main process, at any moment (here: while the workers are still starting up, the
window a getppid() watchdog alone misses), leaves no worker and no resource tracker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> set[int]:
    out = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.add(int(p.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("when", ["starting"])  # "working" (after start-up) is covered too; one launch budgeted
def test_sigkill_of_prepare_takes_its_workers_and_tracker_with_it(tmp_path, when):
    text = tmp_path / "corpus.jsonl"  # many documents: the workers are busy for a while
    row = "the quick brown fox jumps " * 40
    text.write_text("".join(f'{{"text": "document {i} {row}"}}\n' for i in range(60_000)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "gptforge", "prepare", "files", str(text), "--out",
                             str(tmp_path / "out"), "--workers", "2", "--no-progress", "--shard-tokens", "100000",
                             "--val-tokens", "10000"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: set[int] = set()
    try:
        deadline = time.time() + 60
        want = 3 if when == "working" else 1  # the tracker plus two workers / the first child seen
        while time.time() < deadline and len(kids) < want and proc.poll() is None:
            kids = _children(proc.pid)
            time.sleep(0.01)
        if when == "working":
            time.sleep(1.5)  # the workers have loaded the tokenizer and are tokenizing
            kids |= _children(proc.pid)
        assert kids and proc.poll() is None, "prepare ended before it could be killed"
        time.sleep(0.2 if when == "starting" else 0)
        kids |= _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.1)
        left = [k for k in kids if _alive(k)]
        assert not left, f"still alive after their parent was killed: {left}"
    finally:  # never leave a process behind, whatever the outcome
        for k in kids | _children(proc.pid):
            if _alive(k):
                os.kill(k, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
