"""Rows of a data file for the post-training recipes (SFT conversations, preference pairs): one
reader for JSONL files and Hugging Face datasets, and one rule for bad rows.

``source`` is a JSONL file (one JSON object a line; gzipped when named .gz), or a Hugging Face dataset: a ``.parquet`` file,
a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a local dataset
directory of data files, or a dataset name on the Hub (``datasets.load_dataset``, online). Each row
comes back with where it came from (``FILE:LINE`` or ``DATASET[SPLIT] row N``), so a bad one is
named; with ``skip_bad`` it is counted in ``stats["skipped"]`` instead.

    gptforge sft --init-from runs/base --data HuggingFaceH4/no_robots --split train --out runs/sft
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from gptforge.reading import MAX_LINE_BYTES, bounded_lines, jsonl_hint, not_a_file, too_long, utf8

Check = Callable[[dict[str, Any]], Optional[str]]  # a row -> why it is bad, or None


class DataError(ValueError):
    """Bad post-training data; the message names the file (or dataset and split) and row."""


def bad_row(where: str, why: str, skip_bad: bool, stats: dict[str, int] | None,
            error: type[DataError] = DataError) -> None:
    """Refuse a bad row (``error`` naming it), or count it in ``stats["skipped"]`` with ``skip_bad``."""
    if not skip_bad:
        raise error(f"{where}: {why} (fix the row, or pass --skip-bad to count and skip such rows)")
    if stats is not None:
        stats["skipped"] = stats.get("skipped", 0) + 1


def read_rows(source: str, split: str, columns: Sequence[str], check: Check, skip_bad: bool = False,
              stats: dict[str, int] | None = None, error: type[DataError] = DataError,
              jsonl_shape: str = "", what: str = "", optional: Sequence[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) for each usable row of ``source`` (see the module docstring); a row is a dict
    holding at least ``columns``, and those of the ``optional`` columns a dataset has. ``check(row)`` says why a row is bad (or None). ``jsonl_shape``
    is what a JSONL line should look like (for the message when a line is not such an object) and
    ``what`` describes the file for a missing path."""
    path = Path(source)
    if not path.is_file() and not path.is_dir() and (path.exists() or path.is_symlink()):
        # a device, a pipe, a dangling or looping symlink: there, but not a file to read (datasets would call
        # it "no data file found", or wait on the pipe forever)
        raise error(f"--data {source}: {not_a_file(path)} (give {what or 'a JSONL file'} or a HF dataset)")
    if path.is_file() and path.suffix != ".parquet":
        return _some(_read_jsonl(path, columns, check, skip_bad, stats, error, jsonl_shape), source, stats, error,
                     "no rows (the file is empty or holds only blank lines)")
    if not path.exists() and path.suffix in (".jsonl", ".json", ".parquet", ".gz"):
        raise error(f"--data {source}: no such file (give {what} or a HF dataset)")
    ds = load_hf(source, split, error)
    name = f"{source}[{split}]"
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise error(f"--data {name}: the dataset has no {' or '.join(repr(c) for c in missing)} column "
                    f"(columns: {', '.join(ds.column_names)})")
    out: list[tuple[str, dict[str, Any]]] = []
    cols = [*columns, *(c for c in optional if c in ds.column_names)]
    for i, values in enumerate(zip(*(ds[c] for c in cols), strict=True)):
        where, row = f"{name} row {i}", dict(zip(cols, values, strict=True))
        why = check(row)
        if why is not None:
            bad_row(where, why, skip_bad, stats, error)
            continue
        out.append((where, row))
    return _some(out, name, stats, error, "no rows (the split is empty)")


def _some(rows: list, name: str, stats: dict[str, int] | None, error: type[DataError], empty: str) -> list:
    """``rows``, or a refusal naming the file (or dataset and split) when none is left: no row would
    otherwise surface later as an error that names nothing (an empty loader, no held-out rows)."""
    if rows:
        return rows
    skipped = (stats or {}).get("skipped", 0)
    why = f"no usable rows (all {skipped} were bad and skipped: --skip-bad)" if skipped else empty
    raise error(f"{name}: {why}")


MAX_ROW_BYTES = MAX_LINE_BYTES  # a conversation or a preference pair is kilobytes


def _read_jsonl(path: Path, columns: Sequence[str], check: Check, skip_bad: bool, stats: dict[str, int] | None,
                error: type[DataError], shape: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    opener = gzip.open if path.name.lower().endswith(".gz") else open  # .jsonl.gz, as prepare files reads
    n = 0
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(bounded_lines(f, MAX_ROW_BYTES), 1):
                where = f"{path}:{n}"
                if raw is None:
                    bad_row(where, too_long(MAX_ROW_BYTES), skip_bad, stats, error)
                    continue
                try:
                    line = utf8(raw, at_start=n == 1)
                except UnicodeDecodeError as e:
                    bad_row(where, f"not UTF-8 text (byte {e.start}: {e.reason})", skip_bad, stats, error)
                    continue
                if not line.strip():
                    continue
                hint = jsonl_hint(line) if n == 1 else ""
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    bad_row(where, f"not valid JSON ({e.msg}){hint}", skip_bad, stats, error)
                    continue
                except RecursionError:  # [[[[... thousands deep: the parser's stack, not a crash of the run
                    bad_row(where, f"JSON nested too deeply (expected {shape})", skip_bad, stats, error)
                    continue
                if not isinstance(row, dict) or any(c not in row for c in columns):
                    bad_row(where, f"expected {shape}{hint if not isinstance(row, dict) else ''}", skip_bad, stats, error)
                    continue
                why = check(row)
                if why is not None:
                    bad_row(where, why, skip_bad, stats, error)
                    continue
                out.append((where, row))
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or damaged .gz: the rest is unreadable
        bad_row(f"{path}:{n + 1}", f"the compressed file is truncated or corrupt ({type(e).__name__}: {e}); the rest "
                "of it is unreadable", skip_bad, stats, error)
    return out


def load_hf(source: str, split: str, error: type[DataError] = DataError) -> Any:
    """A ``datasets.Dataset``: ``load_from_disk`` for a ``save_to_disk`` directory, else ``load_dataset``
    (a parquet file, a local dataset directory, or a Hub name); failures name the dataset and split."""
    try:
        import datasets
    except ImportError as e:
        raise error(f"--data {source}: not a JSONL file, and reading a Hugging Face dataset needs `datasets` "
                    "(pip install 'gptforge[hf]')") from e
    path = Path(source)
    try:
        if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(str(path))
        elif path.is_file():
            ds = datasets.load_dataset("parquet", data_files={split: str(path)})
        else:
            ds = datasets.load_dataset(source, split=split)
    except Exception as e:  # hub/network/format errors come in many types; keep the cause
        raise error(f"--data {source}: cannot load it as a Hugging Face dataset (split {split!r}): "
                    f"{type(e).__name__}: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise error(f"--data {source}: no split {split!r} (splits: {', '.join(ds)}); pass --split")
        ds = ds[split]
    return ds
