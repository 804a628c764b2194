"""The one opener of safetensors files, whatever bytes their path holds: checkpoints, Hugging Face folders, adapters.

    handle = open_safetensors(path)          # safe_open's handle: keys(), get_slice(), get_tensor()
    tensors = load_safetensors(path)         # every tensor

safetensors (Rust) takes a path only as UTF-8 text. A folder whose name is not (``--out $'runs/r\\xff'``, a Latin-1
name from an old system, ``--hf $'/tmp/e\\xff'``) was refused as "Path ... is not valid UTF-8", the file unread.
Such a path is opened here through its file descriptor's own path (``/proc/self/fd/N`` or ``/dev/fd/N``: ASCII,
no copy); where a platform has neither, through a symlink with an ASCII name in a private temporary folder.
safetensors maps the file when it opens it, so the handle outlives the descriptor and the link.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _utf8(path: str | os.PathLike) -> bool:
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _through_fd(path: str | os.PathLike, opener):
    """``opener(text)`` on an ASCII path to the file ``path`` names (see the module docstring)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for where in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}"):
            if os.path.exists(where):
                return opener(where)
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="gptforge-st-")
        try:
            link = os.path.join(folder, "model.safetensors")
            os.symlink(os.path.abspath(os.fsencode(path)), os.fsencode(link))
            return opener(link)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)


def open_safetensors(path: str | os.PathLike) -> Any:
    """safetensors' ``safe_open(path, framework="pt")`` handle for any path (raises what safe_open raises:
    OSError, SafetensorError)."""
    from safetensors import safe_open

    if _utf8(path):
        return safe_open(str(Path(path)), framework="pt")
    return _through_fd(path, lambda p: safe_open(p, framework="pt"))


def load_safetensors(path: str | os.PathLike) -> dict[str, Any]:
    """Every tensor of a safetensors file, {name: torch.Tensor}, for any path."""
    from safetensors.torch import load_file

    if _utf8(path):
        return load_file(str(Path(path)))
    return _through_fd(path, load_file)
