"""The one reader that hashes a file: its sha256, read in blocks, so a model of many GB is never held whole.

    from gptforge.storage.digest import sha256_file
    sha256_file(path)                                     # hex digest of the file's bytes
    sha256_file(path, on_block=lambda n: bar.update(n))   # told the size of each block as it is read

Every checksum gptforge takes of a file goes through here: a checkpoint's files (recorded in meta.json,
verified on read), a model's weights identity (``gptforge.run.resume.files_digest``, whose callback drives
the progress bar of a long hash), shards and downloaded assets (``gptforge.assets``).
No torch import (prepare's workers load this package).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

BLOCK = 4 << 20  # bytes a read: large enough that the per-call cost vanishes, small enough to bound memory


def sha256_file(path: str | Path, on_block: Callable[[int], object] | None = None, block: int = BLOCK) -> str:
    """The sha256 of ``path``'s bytes (hex), read ``block`` bytes at a time; ``on_block(n)`` after each block
    of ``n`` bytes (a progress bar's update), never for an empty file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(block):
            h.update(data)
            if on_block is not None:
                on_block(len(data))
    return h.hexdigest()
