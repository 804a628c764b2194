"""FineWeb / FineWeb-Edu into llm.c token shards, streamed from Hugging Face.

    gptforge prepare fineweb --sample 10BT --out data/fineweb10B           # ~10B tokens, 100 shards
    gptforge prepare fineweb --edu --sample 10BT --out data/edu_fineweb10B

Streams ``HuggingFaceFW/fineweb`` (or ``fineweb-edu``), config ``sample-10BT|100BT|350BT``, with
``datasets`` (``streaming=True``: nothing is downloaded whole or held in RAM) through the same
pipeline as ``prepare files`` (:mod:`gptforge.data.prepare.pipeline`). Shard names follow llm.c's
``dev/data/fineweb.py``: ``fineweb_val_000000.bin``, ``fineweb_train_000001.bin``, ... (``edu_fineweb_``
for the Edu set). ``--data-files`` streams local copies of the parquet files through the same
``datasets`` code instead (offline use, and how this path is tested).
"""

from __future__ import annotations

import os

from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import PrepareSettings
from gptforge.data.prepare.sources import HFStreamSource, SourceError, expand_paths, source_kind
from gptforge.extras import require

SAMPLES = {"10BT": 10_000_000_000, "100BT": 100_000_000_000, "350BT": 350_000_000_000}  # GPT-2 tokens, roughly


def fineweb_source(edu: bool = False, sample: str = "10BT", data_files: list[str] | None = None) -> HFStreamSource:
    if sample not in SAMPLES:
        raise ValueError(f"--sample {sample!r}: choose one of {', '.join(SAMPLES)}")
    if data_files:  # the same checks as `prepare files` (no device, pipe or dangling link; no file twice)
        files = expand_paths(data_files)
        other = next((f for f in files if source_kind(f) != ".parquet"), None)
        if other is not None:
            raise SourceError(f"--data-files {other}: not a .parquet file (FineWeb's format); `gptforge prepare "
                              "files` reads .txt and .jsonl")
        return HFStreamSource("parquet", data_files=[str(f) for f in files])
    repo = "HuggingFaceFW/fineweb-edu" if edu else "HuggingFaceFW/fineweb"
    return HFStreamSource(repo, name=f"sample-{sample}", split="train")


def default_out(edu: bool = False, sample: str = "10BT") -> str:
    """Where ``prepare fineweb`` writes without --out: data/fineweb10B, data/edu_fineweb100B, ..."""
    return f"data/{'edu_fineweb' if edu else 'fineweb'}{sample.removesuffix('T')}"


def prepare_fineweb(out: str | os.PathLike | None = None, edu: bool = False, sample: str = "10BT",
                    settings: PrepareSettings | None = None, data_files: list[str] | None = None,
                    force: bool = False, progress: bool = True) -> dict:
    """Stream, tokenize and shard FineWeb(-Edu); resumes an interrupted run in ``out``."""
    name = "edu_fineweb" if edu else "fineweb"
    settings = settings or PrepareSettings()
    settings.name = name
    if settings.val_tokens is None:  # llm.c's fineweb.py: the first shard is the val split (capped at 10%)
        settings.val_tokens = settings.shard_tokens
    out = out or default_out(edu, sample)
    require("datasets", extra="data", for_what="gptforge prepare fineweb")  # before anything is started
    source = fineweb_source(edu, sample, data_files)
    return prepare(source, out, settings, force=force, progress=progress,
                   expected_tokens=None if data_files else SAMPLES[sample])
