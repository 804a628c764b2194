"""A shard folder's ``manifest.json``: what it was prepared from, which shards it lists (each one's sha256 and
token count) and where an interrupted ``prepare`` resumes; opened, checked against the current source and
settings, and cleared of a killed run's leftovers before a ``prepare`` writes (:mod:`gptforge.data.prepare.pipeline`).

    gptforge prepare files corpus/ --out data/corpus   # writes data/corpus/manifest.json, shard by shard

A manifest that says ``"complete": false`` is a prepare not yet finished: readers refuse it
(:func:`gptforge.data.shards.unfinished_prepare`).
"""

from __future__ import annotations

from pathlib import Path

from gptforge.assets import sha256_file
from gptforge.data.shards import MANIFEST, ShardError, read_header
from gptforge.reading import read_json
from gptforge.storage import is_temporary

MANIFEST_FORMAT = "gptforge-shards/1"


def write_json_atomic(path: Path, obj: dict) -> None:
    from gptforge.storage import write_json

    write_json(path, obj, indent=1)


def as_saved(ident: dict, saved: dict) -> dict:
    """``ident`` as a manifest written before files carried their modification time would hold it (path and
    size only), so such a manifest still resumes; a newer one is compared with the time."""
    files = (saved.get("source") or {}).get("files") if isinstance(saved.get("source"), dict) else None
    if ident["source"].get("kind") != "files" or not isinstance(files, list) or any(
            isinstance(f, dict) and "mtime_ns" in f for f in files):
        return ident
    source = {**ident["source"], "files": [{k: v for k, v in f.items() if k != "mtime_ns"} for f in ident["source"]["files"]]}
    return {**ident, "source": source}


def changed_files(saved: object, now: dict) -> str | None:
    """The first input file whose record differs while the list of paths is the same (None otherwise).
    ``now``: the source as the manifest would record it (:func:`as_saved`)."""
    if not isinstance(saved, dict) or now.get("kind") != "files" or saved.get("text_field") != now.get("text_field"):
        return None
    old = saved.get("files")
    if not isinstance(old, list) or [f.get("path") if isinstance(f, dict) else None for f in old] != [
            f["path"] for f in now["files"]]:
        return None
    return next((b["path"] for a, b in zip(old, now["files"], strict=True) if a != b), None)


def open_manifest(out: Path, ident: dict, force: bool) -> dict:
    """The manifest to continue from (verified), or a fresh one. Removes anything a kill left behind."""
    path = out / MANIFEST
    name = ident["settings"]["name"]
    m = None
    if path.exists():
        m = read_json(path, ShardError, "shard manifest", then=f"delete {out} or pass --force to start over")
        shards = m.get("shards")
        if not isinstance(shards, list) or not all(
                isinstance(s, dict) and isinstance(s.get("file"), str) and "/" not in s["file"] and "\\" not in s["file"]
                and isinstance(s.get("tokens"), int) and isinstance(s.get("sha256"), str) for s in shards):
            raise ShardError(f"{path}: shards: expected a list of {{file, tokens, sha256}} naming files in {out}; the "
                             f"manifest is damaged: delete {out} or pass --force to start over")
        saved = as_saved(ident, m)
        same = m.get("format") == MANIFEST_FORMAT and {k: m.get(k) for k in ident} == saved
        if not same and not force:
            changed = changed_files(m.get("source"), saved["source"])
            if changed:
                raise ShardError(f"{changed}: changed since the shards in {out} were made from it (its size or "
                                 "modification time differs from the manifest's); pass --force to prepare again "
                                 "from the files as they are now, or choose another --out")
            raise ShardError(
                f"{out} holds shards prepared from another source or with other settings "
                f"(see {path}); choose another --out, or pass --force to delete them and start over")
        if force:
            for s in m.get("shards", []):
                (out / s["file"]).unlink(missing_ok=True)
            m = None
    elif not force and any(f.name.startswith(f"{name}_") for f in out.glob("*.bin")):
        # the manifest is written before the first shard, so these are not ours
        raise ShardError(f"{out} already holds {name}_*.bin shards but no {MANIFEST}; choose another --out, "
                         "or pass --force to replace them")
    if m is not None:
        for s in m["shards"]:  # a listed shard must be exactly what was written
            f = out / s["file"]
            n = read_header(f)[2]
            if n != s["tokens"] or sha256_file(f) != s["sha256"]:
                raise ShardError(f"{f}: does not match its sha256/token count in {path}; it changed since it was "
                                 "written. Delete the folder (or pass --force) and prepare again")
    listed = {s["file"] for s in m["shards"]} if m else set()
    for f in out.iterdir():  # leftovers of a killed run are never trusted
        if f.name.endswith(".tmp") or is_temporary(f.name) or (f.name.startswith(f"{name}_") and f.suffix == ".bin" and f.name not in listed):
            f.unlink()
    if m is None:
        m = {"format": MANIFEST_FORMAT, **ident, "shards": [], "tokens": 0, "complete": False,
             "state": {"next_item": 0, "doc_offset": 0, "documents": 0, "skipped": 0, "skipped_examples": []}}
        write_json_atomic(path, m)
    return m
