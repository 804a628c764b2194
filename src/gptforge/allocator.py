"""The process's memory allocator: chosen once, at the start of every ``gptforge`` command, before
torch is imported (issue 35).

    >>> from gptforge import allocator
    >>> allocator.setup()          # the CLI's main() calls this first; returns what it chose
    'tcmalloc-minimal (LD_PRELOAD, set by gptforge)'
    >>> allocator.describe()       # the same words for the start line, env.json and bench reports

Why: torch allocates CPU tensors with glibc's malloc. glibc serves every block over its mmap
threshold (at most 32 MiB, whatever ``M_MMAP_THRESHOLD`` says) with a fresh ``mmap`` and gives it
back with ``munmap`` on free, so a CPU training step that makes a 200 MB logits tensor and its
gradient (50,304 wide at B 8, T 128) has the kernel map, zero-fill page by page and unmap them on
every step: ~375,000 minor page faults a step, 42% of the run's CPU time in the kernel
(docs/benchmarks.md, "CPU time in the kernel"). Measured there, alternated: tcmalloc-minimal keeps
freed blocks and cuts the kernel's time 27x at a lower peak RSS; glibc told to keep big blocks in
its heap (``mallopt(M_MMAP_MAX, 0)``, ``M_TRIM_THRESHOLD`` 2 GiB) cuts it 13x but its heap
fragments (torch's 64-byte ``posix_memalign`` asks for a little more than the block just freed),
so peak RSS grows ~50%. Neither changes a bit of the arithmetic (tested).

``GPTFORGE_ALLOCATOR`` chooses:
  ``auto`` (default)  tcmalloc-minimal where it is installed (Debian ``libtcmalloc-minimal4``;
                      scripts/system_deps.sh installs it): the command is started again once,
                      before torch loads, with it in ``LD_PRELOAD``; where it is not, glibc keeping
                      big blocks; elsewhere (macOS, musl) the system allocator, unchanged
  ``tcmalloc``        the same, but say so on stderr where tcmalloc is missing
  ``glibc``           glibc keeping big blocks, set in-process (ctypes ``mallopt``), no re-exec
  ``system``          malloc exactly as the platform has it (the opt-out)
Only a process's entry point re-executes (``main()`` with no argv); a call of ``main([...])`` from
Python (tests) leaves that process's allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

ENV = "GPTFORGE_ALLOCATOR"
CHOICES = ("auto", "tcmalloc", "glibc", "system")
_REEXEC_GUARD = "GPTFORGE_ALLOCATOR_REEXECED"  # set in the re-executed process: never re-exec twice
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB, far above one step's largest free

TCMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")

_active: str | None = None


def describe() -> str:
    """What :func:`setup` chose, in words (before it ran: what is loaded, nothing changed)."""
    return _active or setup(reexec=False)


def short() -> str:
    """:func:`describe` without its parenthesis, for the start line ("tcmalloc-minimal")."""
    return describe().split(" (", 1)[0]


def choice() -> str:
    """The ``GPTFORGE_ALLOCATOR`` value, checked (an unknown one is named and treated as ``auto``)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        print(f"gptforge: {ENV}={value!r} is not one of {', '.join(CHOICES)}; using auto", file=sys.stderr)
        os.environ[ENV] = "auto"  # said once: the command re-executed under tcmalloc (and its workers) see auto
        return "auto"
    return value


def tcmalloc_loaded() -> bool:
    """tcmalloc is mapped into this process (Linux: /proc/self/maps), i.e. LD_PRELOAD really took."""
    try:
        with open("/proc/self/maps") as f:
            return any("tcmalloc" in line for line in f)
    except OSError:
        return False


def find_tcmalloc() -> str | None:
    """Path of tcmalloc-minimal's shared library, or None (off Linux: LD_PRELOAD is a Linux loader's)."""
    if not sys.platform.startswith("linux"):
        return None
    for p in TCMALLOC_PATHS:
        if Path(p).is_file():
            return p
    name = ctypes.util.find_library("tcmalloc_minimal")
    return name if name and Path(name).is_absolute() else None


def _glibc():
    """The process's C library when it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt  # noqa: B018 - the lookup is the check
    except (OSError, AttributeError):
        return None
    return libc


def keep_large_blocks() -> str | None:
    """glibc: serve big blocks from the heap and keep freed memory for reuse. Returns the words for
    what was set, or None where the C library is not glibc (nothing is changed)."""
    libc = _glibc()
    if libc is None:
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    return "glibc malloc, large blocks kept (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"


def _reexec_with(lib: str) -> None:
    """Start this command again with ``lib`` preloaded (only before torch is imported, once)."""
    env = dict(os.environ)
    # the user's own entries kept, after ours; ours once (the loader splits the list on colons and spaces)
    theirs = [e for e in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if e and e != lib]
    env["LD_PRELOAD"] = ":".join([lib, *theirs])
    env[_REEXEC_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def setup(reexec: bool = True) -> str:
    """Choose the allocator for this process per ``GPTFORGE_ALLOCATOR`` (see the module docstring)
    and return it in words. ``reexec`` False (a call from Python, not the process's entry point):
    report what is loaded, change nothing. Call first thing, before torch; a second call is free."""
    global _active
    if _active is not None:
        return _active
    want = choice()
    if tcmalloc_loaded():
        _active = "tcmalloc-minimal (LD_PRELOAD" + (", set by gptforge)" if os.environ.get(_REEXEC_GUARD) else ")")
        return _active
    if want == "system" or not reexec:
        why = f"{ENV}=system" if want == "system" else "in-process call"
        extra = [f"{k}={os.environ[k]}" for k in ("LD_PRELOAD", "GLIBC_TUNABLES") if os.environ.get(k)]
        _active = f"system malloc ({', '.join([why, *extra])})"  # a user's own preload or tunables, named
        return _active
    if want in ("auto", "tcmalloc"):
        lib = find_tcmalloc()
        if (lib and not os.environ.get(_REEXEC_GUARD) and "torch" not in sys.modules and sys.executable
                and getattr(sys, "orig_argv", None)):
            _reexec_with(lib)  # does not return
        if want == "tcmalloc":
            why = ("is not installed (Debian: apt-get install libtcmalloc-minimal4)" if not lib
                   else "did not load under LD_PRELOAD")
            print(f"gptforge: {ENV}=tcmalloc but tcmalloc-minimal {why}; using glibc keeping big blocks",
                  file=sys.stderr)
    _active = keep_large_blocks() or "system malloc (not glibc: nothing to tune)"
    return _active
