"""Issue 56 class 7: the allocator's re-execution at its edges. A user's own ``LD_PRELOAD`` entries are kept
(tcmalloc put in front of them, not over them, and never twice), and the command is started again at most
once, also where tcmalloc does not take (the guard): counted in a subprocess that stops itself past a few
starts, under a timeout, so a lost guard fails here instead of looping forever.

The library preloaded is a copy of the C math library (harmless to preload, and no tcmalloc: so
``tcmalloc_loaded`` stays False after the re-exec, the case that would loop). Independent expectation:
the starts counted by the child itself, and ``LD_PRELOAD`` split by hand.

Plants tried (each fails here): the guard's check dropped from ``setup`` (the child counts a third start
and stops); the guard never set in the re-executed environment; the user's entries dropped (``LD_PRELOAD = lib``); the entry put twice when the user's list
already held it (the dedup this test added to ``_reexec_with``).
"""

from __future__ import annotations

import ctypes.util
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gptforge import allocator

_RUNS = itertools.count()
CHILD = """
import os, sys
from pathlib import Path
count = Path(sys.argv[1])
n = len(count.read_text()) + 1 if count.exists() else 1
count.write_text("x" * n)
if n > 4:  # a lost guard: stop the loop here, the test reads the count
    print("LOOPING"); sys.exit(3)
from gptforge import allocator
allocator.find_tcmalloc = lambda: sys.argv[2]  # the library gptforge preloads (not tcmalloc: it never 'takes')
print(allocator.setup()); print(os.environ.get("LD_PRELOAD", ""))
"""


def _libm() -> str:
    name = ctypes.util.find_library("m")
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64"):
        if name and Path(d, name).is_file():
            return str(Path(d, name))
    pytest.skip("no libm shared library found to preload")


@pytest.fixture
def libs(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("LD_PRELOAD is the Linux loader's")
    ours = tmp_path / "libours.so"
    user = tmp_path / "libuser.so"
    shutil.copyfile(_libm(), ours)
    shutil.copyfile(_libm(), user)
    return str(ours), str(user)


def _start(tmp_path, lib: str, preload: str | None, mode: str = "auto") -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator._REEXEC_GUARD)}
    env[allocator.ENV] = mode
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this checkout's gptforge in the child
    if preload is not None:
        env["LD_PRELOAD"] = preload
    count = tmp_path / f"count-{next(_RUNS)}"
    r = subprocess.run([sys.executable, "-c", CHILD, str(count), lib], capture_output=True, text=True, env=env,
                       timeout=120)  # generous: the CI machine is shared; a child that loops stops itself at 5
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])
    starts = len(count.read_text())
    said, final = r.stdout.strip().split("\n")[-2:]
    return starts, [e for e in final.replace(" ", ":").split(":") if e], said


@pytest.mark.parametrize("mode", ["auto", "tcmalloc"])
def test_the_users_own_preload_is_kept_and_the_command_starts_again_once(libs, tmp_path, mode):
    ours, user = libs
    starts, preload, said = _start(tmp_path, ours, f"{user}", mode)
    assert starts == 2, said  # the first start and one re-exec, though the library never 'took'
    assert preload == [ours, user]  # ours in front, the user's kept


def test_an_entry_the_user_already_preloads_is_not_added_twice(libs, tmp_path):
    ours, user = libs
    starts, preload, _ = _start(tmp_path, ours, f"{user}:{ours}")
    assert starts == 2 and preload.count(ours) == 1 and user in preload, preload
    starts, preload, _ = _start(tmp_path, ours, f"{ours} {user}")  # the loader also splits on spaces
    assert starts == 2 and preload.count(ours) == 1 and user in preload, preload


def test_without_a_user_preload_only_ours_and_system_never_restarts(libs, tmp_path):
    ours, user = libs
    assert _start(tmp_path, ours, None)[:2] == (2, [ours])
    starts, preload, said = _start(tmp_path, ours, user, mode="system")
    assert (starts, preload) == (1, [user]) and said.startswith("system malloc")
