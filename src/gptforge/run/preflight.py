"""Checks on the operator's choices that must fail before any compute, each with one line naming the
flag: today the run directory (``--out`` / ``train.out_dir``).

    >>> check_run_dir("runs/exp1")   # raises ConfigError if it is a file or cannot be written
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gptforge.config import ConfigError


def check_run_dir(path: str | os.PathLike) -> None:
    """``train.out_dir`` must be a directory, or creatable, on a writable filesystem. Probes with a
    temporary file in the directory (or its nearest existing parent) and creates nothing that stays,
    so a run refused later for another reason leaves no empty run directory behind."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == path else f"cannot be created: {probe} is a file"
        raise ConfigError(f"train.out_dir={str(path)!r} {what}; give --out (--train.out_dir) a directory")
    try:
        with tempfile.TemporaryFile(dir=probe, prefix=".gptforge-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"train.out_dir={str(path)!r} cannot be written ({probe}: {e.strerror or e}); "
            "give --out (--train.out_dir) a directory on a writable filesystem"
        ) from None
