"""The memory this process may still allocate: the one reader every size-before-work check asks.

Linux's ``MemAvailable`` is the machine's; in a container (Docker, Kubernetes, a systemd slice) the cgroup's
limit ends the process first, by the OOM killer, while ``MemAvailable`` still reports the host. So the free
memory is the smaller of ``MemAvailable`` and the headroom of every memory cgroup the process is in, from its
own up to the root (limits nest: the smallest ``limit - in use`` applies). cgroup v2: ``/proc/self/cgroup``'s
``0::/path`` and ``/sys/fs/cgroup/<path>/memory.max`` ("max": no limit) and ``memory.current``; cgroup v1: the
``memory`` controller's ``/sys/fs/cgroup/memory/<path>/memory.limit_in_bytes`` (a huge value: no limit) and
``memory.usage_in_bytes``. In use is the working set as the kubelet counts it: usage less the inactive page cache
(``memory.stat``'s ``inactive_file``, v1 ``total_inactive_file``), which the kernel reclaims before it kills. A
file that cannot be read is no bound: the check then falls back to what it can read, silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages)


@dataclass(frozen=True)
class FreeMemory:
    """``bytes`` free now, and the ``limit`` and ``in_use`` of the cgroup that bounds it (None: the machine's
    MemAvailable is the bound); ``knob``: the cgroup file the limit was read from."""

    bytes: int
    limit: int | None = None
    in_use: int | None = None
    knob: str = ""

    def __str__(self) -> str:
        """The bound as a refusal says it: 'this machine has 5.0 GiB free', or 'the container's memory limit
        (cgroup memory.max 4.0 GiB, 3.1 GiB in use) leaves 0.9 GiB free'."""
        if self.limit is None:
            return f"this machine has {_gib(self.bytes)} free"
        return (f"the container's memory limit (cgroup {self.knob} {_gib(self.limit)}, {_gib(self.in_use or 0)} in "
                f"use) leaves {_gib(self.bytes)} free")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def free_memory(root: str = "/") -> FreeMemory | None:
    """The memory free to new allocations now (the smaller of MemAvailable and every enclosing cgroup's headroom),
    or None where neither is known (not Linux). ``root``: where /proc and /sys are (tests give a fake tree)."""
    machine = _mem_available(root)
    bounds = [FreeMemory(machine)] if machine is not None else []
    bounds += _cgroup_bounds(root)
    return min(bounds, key=lambda b: b.bytes) if bounds else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _mem_available(root: str) -> int | None:
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return int(line.split()[1]) * 1024
            except (ValueError, IndexError):
                return None
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _stat(folder: str, key: str) -> int:
    for line in (_read(os.path.join(folder, "memory.stat")) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value) or 0
    return 0


def _cgroup_bounds(root: str) -> list[FreeMemory]:
    """A FreeMemory for each limited memory cgroup from the process's own up to its hierarchy's root."""
    out = []
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":  # v2, the unified hierarchy
            mount, knob, used, inactive = "sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):  # v1, the memory controller's hierarchy
            mount, knob, used, inactive = ("sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                           "total_inactive_file")
        else:
            continue
        top = os.path.join(root, mount)
        parts = [p for p in path.strip().split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):  # a nested cgroup's limit and each above it apply alike
            folder = os.path.join(top, *parts[:depth])
            limit = _int(_read(os.path.join(folder, knob)))  # v2 "max" reads as None: no limit
            current = _int(_read(os.path.join(folder, used)))
            if limit is None or current is None or limit >= NO_LIMIT:
                continue
            in_use = max(0, current - _stat(folder, inactive))
            out.append(FreeMemory(max(0, limit - in_use), limit, in_use, knob))
    return out
