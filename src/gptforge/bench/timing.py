"""The one timing helper every benchmark uses: CUDA-synchronised wall time, warm-up, repeats,
their median (or best), and a JSON report with the machine it ran on.

    >>> t = timed(lambda: model(x), device, repeats=5, warmup=1)
    >>> t.median, t.best, t.times
    >>> u0 = resource.getrusage(resource.RUSAGE_SELF); ...; cpu_usage(u0, resource.getrusage(...), steps)
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def sync(device: torch.device | str | None) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (a no-op off CUDA)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    times: list[float] = field(default_factory=list)  # seconds per repeat
    result: Any = None  # what the last call returned

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)


def time_once(fn: Callable[[], Any], device: torch.device | str | None) -> tuple[float, Any]:
    """Seconds one call of ``fn`` takes, synchronised before and after, and what it returned."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def timed(fn: Callable[[], Any], device: torch.device | str | None, repeats: int = 3, warmup: int = 0) -> Timing:
    """``warmup`` untimed calls, then ``repeats`` timed ones."""
    for _ in range(warmup):
        fn()
    t = Timing()
    for _ in range(repeats):
        dt, t.result = time_once(fn, device)
        t.times.append(dt)
    return t


def timed_pair(fa: Callable[[], Any], fb: Callable[[], Any], device, repeats: int = 3,
               warmup: int = 1) -> tuple[Timing, Timing]:
    """Two contenders timed alternately (a then b, ``repeats`` times), so drift in the machine's
    speed (a shared CPU, GPU clocks) falls on both alike."""
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = Timing(), Timing()
    for _ in range(repeats):
        for t, f in ((ta, fa), (tb, fb)):
            dt, t.result = time_once(f, device)
            t.times.append(dt)
    return ta, tb


def cpu_usage(before, after, steps: int) -> dict[str, float]:
    """Per timed step, from two ``resource.getrusage`` readings: user and system CPU seconds, minor page
    faults, and the kernel's share of the CPU time. On a CPU run a big ``sys`` share means the kernel
    is mapping and zero-filling memory that the allocator gave back (issue 35); on a GPU run they
    measure the host side only."""
    steps = max(steps, 1)
    user = (after.ru_utime - before.ru_utime) / steps
    sys_s = (after.ru_stime - before.ru_stime) / steps
    return {"cpu_user_s_per_step": user, "cpu_sys_s_per_step": sys_s,
            "minor_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
            "sys_frac": sys_s / (user + sys_s) if user + sys_s > 0 else 0.0}


def machine(device: torch.device | str | None = None) -> dict[str, Any]:
    """What a benchmark ran on: date, device name, torch, threads, platform."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_json(path: str | Path | None, report: dict[str, Any]) -> None:
    """Write ``report`` as indented JSON (nothing when ``path`` is None) and say where."""
    if path:
        from gptforge import storage

        storage.write_json(path, report)  # temporary name, fsync, rename
        print(f"[bench] wrote {path}", file=sys.stderr)
