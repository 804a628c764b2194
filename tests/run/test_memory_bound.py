"""The memory bound every size-before-work check asks (gptforge.resources.free_memory) is the container's when
the container's is smaller: in Docker, Kubernetes or a systemd slice MemAvailable reports the host, the guard
passed, and the OOM killer ended the run. Fake /proc and /sys trees stand in for each kind of cgroup."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptforge import resources
from gptforge.resources import FreeMemory, free_memory

GiB = 2**30
HOST = 64 * GiB  # MemAvailable of every fake tree: the host's, far above any container limit below


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str | int], meminfo: bool = True) -> str:
    """A fake root: proc/meminfo (HOST available), proc/self/cgroup = ``cgroup``, and ``files`` under sys/fs/cgroup."""
    (tmp_path / "proc/self").mkdir(parents=True)
    if meminfo:
        (tmp_path / "proc/meminfo").write_text(f"MemTotal: {2 * HOST // 1024} kB\nMemAvailable: {HOST // 1024} kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for rel, text in files.items():
        p = tmp_path / "sys/fs/cgroup" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{text}\n")
    return str(tmp_path)


def test_no_cgroup_limit_is_the_machines_memavailable(tmp_path):
    root = _tree(tmp_path, "0::/user.slice\n", {"user.slice/memory.max": "max", "user.slice/memory.current": GiB})
    assert free_memory(root) == FreeMemory(HOST)
    assert str(free_memory(root)) == "this machine has 64.0 GiB free"


def test_v2_nested_limits_the_smallest_headroom_applies(tmp_path):
    """The process's own cgroup has the larger limit; its parent's headroom (8 - 7 GiB) is the one that binds."""
    root = _tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "kubepods/memory.max": 100 * GiB, "kubepods/memory.current": 10 * GiB,
        "kubepods/pod1/memory.max": 8 * GiB, "kubepods/pod1/memory.current": 7 * GiB,
        "kubepods/pod1/ctr/memory.max": 16 * GiB, "kubepods/pod1/ctr/memory.current": 3 * GiB,
        "kubepods/pod1/ctr/memory.stat": "anon 100\ninactive_file 0\n"})
    assert free_memory(root) == FreeMemory(1 * GiB, 8 * GiB, 7 * GiB, "memory.max")


def test_v2_container_root_limit_and_reclaimable_cache(tmp_path):
    """A container with its own cgroup namespace sees "0::/" and its limit at the mount's top; page cache it may
    reclaim (inactive_file) is not in use: the kernel drops it before it kills."""
    root = _tree(tmp_path, "0::/\n", {"memory.max": 4 * GiB, "memory.current": int(3.5 * GiB),
                                      "memory.stat": f"anon 1\nfile 2\ninactive_file {GiB // 2}\n"})
    free = free_memory(root)
    assert free == FreeMemory(1 * GiB, 4 * GiB, 3 * GiB, "memory.max")
    assert str(free) == "the container's memory limit (cgroup memory.max 4.0 GiB, 3.0 GiB in use) leaves 1.0 GiB free"


def test_v2_max_is_no_limit(tmp_path):
    root = _tree(tmp_path, "0::/a/b\n", {"a/memory.max": "max", "a/memory.current": GiB,
                                         "a/b/memory.max": "max", "a/b/memory.current": GiB})
    assert free_memory(root) == FreeMemory(HOST)


def test_v1_limit(tmp_path):
    root = _tree(tmp_path, "12:pids:/docker/x\n5:cpu,cpuacct:/docker/x\n4:memory:/docker/x\n", {
        "memory/docker/x/memory.limit_in_bytes": 2 * GiB, "memory/docker/x/memory.usage_in_bytes": GiB // 2,
        "memory/docker/x/memory.stat": "cache 10\ntotal_inactive_file 0\n",
        "memory/memory.limit_in_bytes": 9223372036854771712, "memory/memory.usage_in_bytes": 50 * GiB})
    assert free_memory(root) == FreeMemory(int(1.5 * GiB), 2 * GiB, GiB // 2, "memory.limit_in_bytes")


def test_v1_unlimited_is_no_limit(tmp_path):
    """v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages), far past any machine's memory."""
    root = _tree(tmp_path, "4:memory:/\n", {"memory/memory.limit_in_bytes": 9223372036854771712,
                                            "memory/memory.usage_in_bytes": 3 * GiB})
    assert free_memory(root) == FreeMemory(HOST)
    (tmp_path / "proc/meminfo").unlink()
    assert free_memory(root) is None  # no bound known, not an exabyte free


@pytest.mark.parametrize("broken", ["unreadable", "garbage", "missing current", "no cgroup file"])
def test_a_cgroup_file_that_cannot_be_read_falls_back_silently(tmp_path, broken):
    files: dict[str, str | int] = {"memory.max": GiB, "memory.current": GiB // 2}
    if broken == "garbage":
        files["memory.max"] = "\xff lots"
    elif broken == "missing current":
        del files["memory.current"]
    root = _tree(tmp_path, "0::/\n", files)
    if broken == "unreadable":  # a folder where the file should be: open() fails as a permission error would
        (tmp_path / "sys/fs/cgroup/memory.max").unlink()
        (tmp_path / "sys/fs/cgroup/memory.max").mkdir()
    if broken == "no cgroup file":
        (tmp_path / "proc/self/cgroup").unlink()
    assert free_memory(root) == FreeMemory(HOST)


def test_no_meminfo_and_no_cgroup_is_unknown_but_a_cgroup_alone_still_bounds(tmp_path):
    assert free_memory(str(tmp_path)) is None  # not Linux: no check
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemAvailable: lots kB\n")
    assert free_memory(str(tmp_path)) is None  # a line it cannot read is no bound either
    (tmp_path / "proc/meminfo").unlink()
    root = _tree(tmp_path, "0::/\n", {"memory.max": 2 * GiB, "memory.current": GiB}, meminfo=False)
    assert free_memory(root) == FreeMemory(GiB, 2 * GiB, GiB, "memory.max")


def test_the_cpu_step_refusal_names_the_container_limit(tmp_path, monkeypatch):
    """The refusal before the model is built says which bound applied: the container's, not the host's."""
    from gptforge.config import apply_overrides
    from gptforge.errors import ResourceError
    from gptforge.presets import get_preset
    from gptforge.run.faults import check_step_memory

    root = _tree(tmp_path, "0::/\n", {"memory.max": 4 * GiB, "memory.current": int(3.1 * GiB)})
    real = resources.free_memory
    monkeypatch.setattr(resources, "free_memory", lambda: real(root))
    cfg = apply_overrides(get_preset("tiny"), ["--model.vocab_size", "512", "--train.micro_batch", "4096",
                                               "--train.seq_len", "256"])  # 4096 x 256 x 512 float32 logits: 2 GiB
    with pytest.raises(ResourceError, match=r"the container's memory limit \(cgroup memory.max 4.0 GiB, 3.1 GiB in "
                                            r"use\) leaves 0.9 GiB free: lower --train.micro_batch"):
        check_step_memory(cfg, "cpu")
    monkeypatch.setattr(resources, "free_memory", lambda: FreeMemory(HOST))
    check_step_memory(cfg, "cpu")  # the host alone has room: this is the refusal the host's number let through
