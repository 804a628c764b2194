"""SIGTERM in a command that is not a training loop (bench, export, prepare, eval ...) is met as Ctrl-C is:
the command unwinds, so its ``with`` blocks remove their temporary folders and half-written outputs, and it
ends in one line, exit 130. Before, SIGTERM's default ended the process where it stood: a `bench` left its
synthetic shard folder in the temporary directory (a scheduler's or `timeout`'s SIGTERM, every time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def test_sigterm_unwinds_a_command_and_leaves_no_temporary_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "gptforge", "bench", "--preset", "tiny", "--steps", "100000", "--warmup", "1",
           "--train.device", "cpu", "--out", str(tmp_path / "run")]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def made() -> list[str]:  # bench's own temporary folders (torch may keep an inductor cache there too)
        return [q.name for q in tmp.iterdir() if not q.name.startswith("torchinductor")]

    deadline = time.monotonic() + 120
    while not made() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the synthetic shard's temporary folder: the command is inside its `with` block
    assert p.poll() is None, p.communicate()
    assert made(), "bench made no temporary folder within 120 s"
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == ("gptforge bench: interrupted (SIGTERM); no output was finished past "
                                            "what it printed"), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert made() == []  # the with block ran: nothing left behind


def test_the_handler_is_the_commands_only(tmp_path):
    """In-process calls (the tests', a notebook's) get SIGTERM's handler back when the command returns, and a
    handler someone else installed is left as it is."""
    from gptforge.cli import main

    before = signal.getsignal(signal.SIGTERM)
    assert main(["presets"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before

    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["presets"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
