"""The allocator every command sets up first (issue 35): big CPU blocks are kept across steps, so the
kernel stops mapping and zero-filling them each time, and the numbers do not change."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys

import pytest

from gptforge import allocator

GLIBC = allocator._glibc() is not None
TCMALLOC = allocator.find_tcmalloc() is not None

def torch_eps32() -> float:
    return 2.0**-23  # float32's machine epsilon (torch.finfo(torch.float32).eps), without importing torch here


FAULTS_PER_STEP = """
import resource
from gptforge import allocator
print(allocator.setup())
import torch
import torch.nn.functional as F

torch.manual_seed(0)
head = torch.nn.Linear(64, 50304, bias=False)  # a GPT-2 head: 256 x 50,304 logits = 51 MB, and their gradient
opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
x, y = torch.randn(256, 64), torch.randint(0, 50304, (256,))
faults, losses = [], []
for _ in range(10):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = F.cross_entropy(head(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    losses.append(loss.item())
print(sum(faults[-4:]))  # after warm-up
print(repr(losses))
"""


def _run(code: str, mode: str) -> list[str]:
    env = {**os.environ, allocator.ENV: mode}
    env.pop("LD_PRELOAD", None)
    env.pop("GLIBC_TUNABLES", None)
    env.pop("GPTFORGE_ALLOCATOR_REEXECED", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)  # generous: CI shares 2 cores
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")


@functools.cache
def _system_run() -> tuple[str, str, str]:
    """The system allocator's run, once for both modes below (a subprocess of ~8 s on the 2-core machine)."""
    said, faults, losses = _run(FAULTS_PER_STEP, "system")[:3]
    return said, faults, losses


@pytest.mark.skipif(not GLIBC, reason="glibc only")
@pytest.mark.parametrize("mode", ["glibc", "auto"])
def test_big_blocks_are_reused_not_faulted_in_every_step_and_the_numbers_do_not_change(mode):
    said, faults, losses = _run(FAULTS_PER_STEP, mode)[:3]
    assert said.startswith("tcmalloc-minimal" if mode == "auto" and TCMALLOC else "glibc malloc, large blocks kept")
    said, system_faults, system_losses = _system_run()
    assert said == "system malloc (GPTFORGE_ALLOCATOR=system)"
    # what the fix removes (if this fails, the default has changed): the default maps, zero-fills and unmaps
    # the logits and their gradient, 150,925-207,533 faults in 4 steps measured on the 2-core machine (glibc's
    # dynamic mmap threshold makes it vary; 4 x 40,000 failed once under the suite's load)
    assert int(system_faults) > 2 * 40_000
    # the fix keeps them: 0 measured idle, but the kernel may reclaim idle pages between steps (50,304 seen
    # once in a full CI run on the shared container), so the bound is against the default's own count, measured
    # beside it: a fix that stopped working would fault as often as the default
    assert int(faults) < int(system_faults) / 2, f"{faults} page faults in 4 steps, the default {system_faults}"
    # the same numbers, not the same bits: a block's address decides where oneDNN's and MKL's vector loops
    # start and end, so the sums are reordered from run to run (2 runs in 8 differed in the last bits on an
    # unchanged tree). The bound, derived: each loss is a mean of 256 cross-entropies whose 64-term logit dots
    # and 50,304-term log-sum-exp reorder (~64 + 16 float32 eps of relative error each), carried through at most
    # 9 Adam steps, whose normalised updates pass a relative gradient difference on unamplified: 9 x 80 eps
    # ~ 1e-4 relative. Memory handed out dirty or too small (the bugs this guards against) moves a loss by O(1).
    got, want = ast.literal_eval(losses), ast.literal_eval(system_losses)  # the repr of a list of floats
    assert len(got) == len(want) == 10
    assert got == pytest.approx(want, rel=720 * torch_eps32(), abs=0)


def test_an_unknown_choice_is_named_and_falls_back(monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV, "jemallocc")
    assert allocator.choice() == "auto"
    assert "GPTFORGE_ALLOCATOR='jemallocc' is not one of auto, tcmalloc, glibc, system" in capsys.readouterr().err


def test_tcmalloc_where_missing_says_so_and_uses_glibc(monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV, "tcmalloc")
    monkeypatch.setattr(allocator, "tcmalloc_loaded", lambda: False)
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    monkeypatch.setattr(allocator, "_active", None)
    monkeypatch.setattr(allocator, "keep_large_blocks", lambda: "glibc stand-in")
    assert allocator.setup() == "glibc stand-in"
    assert "tcmalloc-minimal is not installed" in capsys.readouterr().err


def test_a_call_from_python_changes_nothing(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # scripts/test.sh preloads tcmalloc into the test run
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("GPTFORGE_ALLOCATOR", raising=False)  # the default choice, whatever the caller's shell says
    monkeypatch.setattr(allocator, "tcmalloc_loaded", lambda: False)
    monkeypatch.setattr(allocator, "_active", None)
    monkeypatch.setattr(allocator, "keep_large_blocks", lambda: pytest.fail("mallopt from an in-process call"))
    monkeypatch.setattr(allocator, "_reexec_with", lambda lib: pytest.fail("re-exec from an in-process call"))
    assert allocator.setup(reexec=False) == "system malloc (in-process call)"


@pytest.mark.skipif(not TCMALLOC, reason="tcmalloc-minimal is not installed (scripts/system_deps.sh installs it)")
def test_auto_reexecs_once_under_tcmalloc():
    code = ("import os; from gptforge import allocator; print(allocator.setup()); "
            "print(any('tcmalloc' in l for l in open('/proc/self/maps')), os.environ['LD_PRELOAD'])")
    said, loaded = _run(code, "auto")[:2]
    assert said == "tcmalloc-minimal (LD_PRELOAD, set by gptforge)" and loaded.startswith("True /")


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_training_losses_are_bit_identical_with_and_without_and_the_run_says_which(tmp_path, shard_dir):
    """Where blocks live must not change a single bit of the arithmetic. The full 50,304-wide vocabulary,
    so the logits and their gradient are the big blocks the default allocator maps and unmaps."""
    runs = {}
    for mode in ("system", "auto"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "gptforge", "train", "--preset", "tiny", "--data.dir", str(shard_dir),
               "--out", str(out), "--train.max_steps", "6", "--train.val_every", "0", "--train.ckpt_every", "0",
               "--train.device", "cpu", "--train.threads", "1"]
        env = {**os.environ, allocator.ENV: mode}
        env.pop("LD_PRELOAD", None)
        env.pop("GLIBC_TUNABLES", None)
        env.pop("GPTFORGE_ALLOCATOR_REEXECED", None)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses = [(r["loss"], r["grad_norm"]) for r in records if r["kind"] == "train"]
        runs[mode] = (losses, json.loads((out / "env.json").read_text())["allocator"], r.stdout + r.stderr)
    assert len(runs["system"][0]) == 6
    assert runs["system"][0] == runs["auto"][0]  # JSON floats round-trip: equal is bit for bit
    assert runs["system"][1] == "system malloc (GPTFORGE_ALLOCATOR=system)" and "| system malloc |" in runs["system"][2]
    want = "tcmalloc-minimal" if TCMALLOC else "glibc malloc, large blocks kept"
    assert runs["auto"][1].startswith(want) and f"| {want} |" in runs["auto"][2]
