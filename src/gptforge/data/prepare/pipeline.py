"""Documents -> llm.c token shards: parallel, resumable, deterministic, memory-bounded.

    gptforge prepare files corpus/ --out data/corpus --shard-tokens 100000000 --workers 8

The one pipeline behind ``prepare files`` and ``prepare fineweb``:

* **Order.** A source yields items (documents or bad rows) in a fixed order, numbered 0, 1, ...
  (:mod:`gptforge.data.prepare.sources`). The main process cuts them into chunks, worker processes
  tokenize chunks (``<|endoftext|>`` then the text, llm.c's convention) and the results are taken
  back in submission order, so the token stream does not depend on the number of workers.
* **Shards.** Shard 0 is validation (``{name}_val_000000.bin``), the rest train
  (``{name}_train_000001.bin``, ...), as in llm.c's ``fineweb.py``. The val shard is sized on its
  own: the first ``val_tokens`` tokens of the stream, but at most ``val_max_fraction`` (10%) of the
  corpus and never all of it, so a small corpus still gets a train split. Train shards hold exactly
  ``shard_tokens`` tokens. A document that does not fit is split: its head ends this shard, its tail
  starts the next (llm.c does the same). The last shard holds the remainder.
* **Val size.** Deciding the cap needs to know whether the corpus holds more than
  ``val_tokens / val_max_fraction`` tokens. Until it is known, tokenized chunks are spilled to
  ``{name}.head.tmp`` in ``out`` (disk, not memory), then replayed through the writer; a source
  whose size is known to be larger (FineWeb's samples) decides at once. The decision is recorded
  in the manifest (``val_tokens``) and depends only on the token stream, so the bytes stay the same
  for any ``workers``.
* **Resume.** After each shard is written (temporary name, fsync, rename) ``manifest.json`` is
  rewritten atomically with the shard's sha256 and the resume point: the next item and how many
  tokens of it the shards already hold. A restart verifies the listed shards, deletes anything
  else it finds (``*.tmp`` and unlisted shards: a kill between rename and manifest), re-reads the
  source from the resume point and drops the tokens already written. A listed shard is never
  rewritten, and the bytes are the same however often the run was interrupted.
* **Memory bound.** The main process holds one shard buffer (``shard_tokens`` x 2 or 4 bytes)
  plus at most ``2 x workers + 2`` chunks in flight (each at most ``chunk_docs`` documents or about
  ``chunk_chars`` characters, plus 4 bytes per token), plus one parquet batch; each worker holds the
  tokenizer and one chunk. None of it grows with the corpus. A .txt file (one document) is read in
  pieces of about 1 MiB (:mod:`gptforge.data.prepare.sources`), cut only where its tokens are those of the
  whole text, so a 10 GB text file costs what a 1 MB one does; a JSONL row or parquet value is held whole.
* **Bad rows** stop the run with the file and row named, or with ``skip_bad`` are skipped and
  counted (with the first 100 locations) in the manifest.
* **A document too slow to tokenize** stops the run, in one line naming it (file:row), its length, how
  long it ran and what to do. A tokenizer read from a file is probed at load (``split_bounds``), but a
  split pattern slow only after a prefix no probe holds passes that probe, and a regex engine's C call
  cannot be interrupted from its own thread. So documents are tokenized in worker processes (one even
  with ``workers`` 1, when the tokenizer is a file), each posting on a shared board which document it is
  on since when; the main process watches the board, says a word when a document runs over 2 s, and past
  the document's deadline (``workers.doc_deadline``: 30 s, or 100 us a character where more;
  ``GPTFORGE_DOC_DEADLINE_S`` replaces the 30 s) kills the workers and stops. The shards already
  listed in the manifest are whole (written and renamed before they are listed), so nothing partial is
  trusted by a later run. A built-in tokenizer (GPT-2's and tiktoken's own patterns) is linear and
  runs in the main process with ``workers`` 1, unwatched.
* **Empty documents** (an empty text, a zero-byte .txt) are not bad rows: real corpora have them.
  They are skipped (no tokens, not even the separator) and counted as ``empty_documents``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from gptforge.assets import sha256_file
from gptforge.data.prepare.manifest import open_manifest, write_json_atomic
from gptforge.data.prepare.settings import PrepareSettings, check_settings
from gptforge.data.prepare.sources import Item, SourceError, safe_cut
from gptforge.data.prepare.watch import Watch, ordered
from gptforge.data.prepare.workers import (
    deadline_floor,
    init_worker,
    load_tokenizer,
    peak_rss_mb,
    tokenize,
)
from gptforge.data.shards import FORMATS, MANIFEST, magic_for, write_shard, writing
from gptforge.data.tokenizer import save_tokenizer
from gptforge.storage.faults import DiskFullError, disk_full_message, is_disk_full, output_error

MAX_SKIP_EXAMPLES = 100


# --- main side ----------------------------------------------------------------------------------------

def _chunks(items: Iterator[Item], start: int, docs: int, chars: int) -> Iterator[tuple[int, list[Item]]]:
    """(number of the first item, items) in groups bounded by document count and characters. The pieces of one
    document (a .txt read in pieces) share its number: a group may start or end inside a document."""
    buf: list[Item] = []
    size = 0
    first = start
    for item in items:
        buf.append(item)
        size += len(item.text) if item.text else 0
        if len(buf) >= docs or size >= chars:
            yield first, buf
            first += sum(not it.more for it in buf)
            buf, size = [], 0
    if buf:
        yield first, buf


class _Writer:
    """Fills shards in order and keeps the manifest (the resume state) in step with them.

    Until the val shard's size is decided (``val_size`` is None) chunks are held in a spill file;
    :meth:`_decide` fixes the size and replays them, so what follows is the same as if it had been
    known from the start.
    """

    def __init__(self, out: Path, manifest: dict, settings: PrepareSettings, magic: int,
                 expected_tokens: int | None = None):
        self.out, self.m, self.settings, self.magic = out, manifest, settings, magic
        st = manifest["state"]
        st.setdefault("empty_documents", 0)  # manifests written before empty documents were counted
        self.item, self.offset = st["next_item"], st["doc_offset"]  # offset: tokens of this item already in shards
        self.skip = self.offset  # of them, those a resumed run has still to drop (read again, written before)
        self.fill = 0
        self.dtype = np.dtype(FORMATS[magic][1])
        val = settings.resolved_val_tokens()
        frac = settings.val_max_fraction
        # above this many tokens the cap no longer bites: the val shard is exactly val_tokens
        self.head_limit = int(np.ceil(val / frac)) if val else 0
        self.val_size: int | None = st.get("val_tokens")
        if self.val_size is None and (val == 0 or (expected_tokens or 0) > self.head_limit):
            self._record_val_size(val)
        self.buf = np.empty(0, dtype=self.dtype)
        self.spill_path = out / f"{settings.name}.head.tmp"
        self.spill = None
        self.held: list[tuple[int, list, np.ndarray]] = []  # (first item, kinds, lengths) of spilled chunks
        self.held_tokens = self.held_items = 0
        if self.val_size is not None:
            self._alloc()

    def progress(self) -> dict[str, str | int]:
        """The bar's figures as they happen: documents read (held ones included) and shards written;
        while the val shard's size is not known yet (the first val_tokens / val_max_fraction tokens, or
        the end of a smaller corpus) the tokens held for it, since no shard can be written before."""
        out: dict[str, str | int] = {"docs": self.item + self.held_items, "shards": len(self.m["shards"])}
        if self.val_size is None:
            out["held_for_val_split"] = f"{self.held_tokens:,} tok"
        return out

    @property
    def tokens_seen(self) -> int:
        return self.m["tokens"] + self.fill + self.held_tokens

    def _record_val_size(self, v: int) -> None:
        self.val_size = v
        self.m["state"]["val_tokens"] = v
        write_json_atomic(self.out / MANIFEST, self.m)

    def _alloc(self) -> None:
        n = max(self.settings.shard_tokens, self.val_size)
        try:
            self.buf = np.empty(n, dtype=self.dtype)
        except MemoryError:  # a shard is built in memory: one too big for it is the flag's fault, said so
            flag = "--shard-tokens" if n == self.settings.shard_tokens else "--val-tokens"
            raise SourceError(f"{flag} {n:,}: a shard of {n * self.dtype.itemsize / 2**30:,.1f} GiB is built in memory "
                              f"and this machine cannot hold it; lower {flag} (llm.c's shards are 1e8 tokens)") from None

    def _index(self) -> int:
        return len(self.m["shards"]) + (1 if self.val_size == 0 else 0)  # no val split: train starts at 1

    def _capacity(self) -> int:
        return self.val_size if self._index() == 0 else self.settings.shard_tokens

    def add_chunk(self, first: int, items: list[Item], flat: np.ndarray, lengths: np.ndarray) -> None:
        # None: a document (or a piece of one) with tokens, "": an empty document, an Item: a bad row; True: a
        # piece that is not a document's last (the document goes on in the next item)
        kinds = [(True if it.more else None) if it.text else ("" if it.text == "" else it) for it in items]
        if self.val_size is None:
            if not self.settings.skip_bad:  # a bad row stops the run now, not when the held chunks replay
                for kind in kinds:
                    if isinstance(kind, Item):
                        self._bad(kind)
            self._hold(first, kinds, flat, lengths)
        else:
            self._consume(first, kinds, flat, lengths)

    def _hold(self, first: int, kinds: list, flat: np.ndarray, lengths: np.ndarray) -> None:
        if self.spill is None:
            self.spill = open(self.spill_path, "wb")
        try:
            flat.astype(self.dtype, copy=False).tofile(self.spill)
        except OSError as e:  # numpy says a short write, no errno and no file: named here, by the one judge
            err = output_error(e, self.spill_path, "prepare's spill file (tokens held until the val shard is decided)",
                               flat.nbytes, written_at=self.spill_path)
            if err is None:
                raise
            raise err from e
        self.held.append((first, kinds, lengths))
        self.held_tokens += len(flat)
        self.held_items += sum(k is not True for k in kinds)
        if self.held_tokens > self.head_limit:  # more than val_tokens / fraction: the full val_tokens
            self._decide(self.settings.resolved_val_tokens())

    def _decide(self, v: int) -> None:
        """Fix the val shard's size, then replay the held chunks through the writer."""
        self._record_val_size(v)
        self._alloc()
        if self.spill is None:
            return
        self.spill.close()
        self.spill = None
        held, self.held, self.held_tokens, self.held_items = self.held, [], 0, 0
        data = np.memmap(self.spill_path, dtype=self.dtype, mode="r") if self.spill_path.stat().st_size else None
        p = 0
        for first, kinds, lengths in held:
            n = int(lengths.sum())
            self._consume(first, kinds, np.asarray(data[p : p + n]) if n else np.empty(0, self.dtype), lengths)
            p += n
        del data
        self.spill_path.unlink()

    def _consume(self, first: int, kinds: list, flat: np.ndarray, lengths: np.ndarray) -> None:
        assert first == self.item, (first, self.item)
        p = k = 0
        for kind in kinds:
            if kind is None or kind is True:
                toks = flat[p : p + lengths[k]]
                p += int(lengths[k])
                k += 1
                self._document(toks, last=kind is None)
                if kind is True:
                    continue  # the document, and its item, go on in the next piece
            elif kind == "":
                self.m["state"]["empty_documents"] += 1
            else:
                self._bad(kind)
            self.item += 1

    def _bad(self, item: Item) -> None:
        if not self.settings.skip_bad:
            raise SourceError(f"{item.where}: {item.reason}. Fix or remove it, or pass --skip-bad to skip "
                              "such rows (they are counted in manifest.json)")
        if self.offset:  # its head is in the shards (a run without --skip-bad stopped at its bad byte): not skippable
            raise SourceError(f"{item.where}: {item.reason}; its first {self.offset:,} tokens are already in the "
                              "shards (a run without --skip-bad stopped there), so it cannot be skipped whole: fix "
                              "or remove it and pass --force to prepare again")
        st = self.m["state"]
        st["skipped"] += 1
        if len(st["skipped_examples"]) < MAX_SKIP_EXAMPLES:
            st["skipped_examples"].append({"item": self.item, "where": item.where, "reason": item.reason})

    def _document(self, toks: np.ndarray, last: bool = True) -> None:
        """A document's tokens, or (``last`` False) a piece of them that more follow."""
        drop = min(self.skip, len(toks))  # non-zero only in the document a resumed run starts inside
        toks, self.skip = toks[drop:], self.skip - drop
        while len(toks):
            cap = self._capacity()
            take = min(len(toks), cap - self.fill)
            self.buf[self.fill : self.fill + take] = toks[:take]
            self.fill += take
            self.offset += take
            toks = toks[take:]
            if self.fill == cap:
                if len(toks) or not last:  # the document straddles the boundary: its tail starts the next shard
                    self.flush(self.item, self.offset)
                else:
                    self.m["state"]["documents"] += 1
                    self.offset = 0
                    self.flush(self.item + 1, 0)
                    return
        if last:
            self.m["state"]["documents"] += 1
            self.offset = 0

    def finish(self) -> None:
        """End of the source: decide the val size if the corpus was too small to (10% of it, at least
        one token, never all of it), then write the remainder as the last, shorter shard."""
        if self.val_size is None:
            total = self.held_tokens
            v = min(self.settings.resolved_val_tokens(), int(total * self.settings.val_max_fraction))
            v = max(v, 1) if total >= 2 else 0
            self._decide(min(v, max(total - 1, 0)))
        self.flush(self.item, 0)

    def close(self) -> None:
        """Interrupted: drop the spill file (a restart re-reads the source from the resume point)."""
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.spill_path.unlink(missing_ok=True)

    def flush(self, next_item: int, doc_offset: int) -> None:
        """Write the buffered shard, then record it and the resume point in the manifest."""
        if self.fill == 0:
            return
        index = self._index()
        split = "val" if index == 0 else "train"
        path = self.out / f"{self.settings.name}_{split}_{index:06d}.bin"
        needed = 1024 + self.fill * self.buf.itemsize  # header + tokens
        try:
            write_shard(path, self.buf[: self.fill], magic=self.magic)  # removes its partial file on failure
        except OSError as e:
            if is_disk_full(e, self.out, needed):
                raise DiskFullError(disk_full_message(f"shard {path.name}", needed, self.out)
                                    + " (finished shards are kept: the same command resumes)") from e
            raise
        self.m["shards"].append({"file": path.name, "split": split, "tokens": self.fill, "sha256": sha256_file(path)})
        self.m["state"].update(next_item=next_item, doc_offset=doc_offset)
        self.m["tokens"] = sum(s["tokens"] for s in self.m["shards"])
        try:
            write_json_atomic(self.out / MANIFEST, self.m)
        except OSError as e:  # the shard is written but not listed: the next run removes and redoes it
            if is_disk_full(e, self.out, 1 << 16):
                raise DiskFullError(disk_full_message(f"{MANIFEST} after shard {path.name}", needed, self.out)
                                    + " (earlier shards are kept: the same command resumes)") from e
            raise
        self.fill = 0


def prepare(source, out: str | os.PathLike, settings: PrepareSettings | None = None, *, force: bool = False,
            progress: bool = True, expected_tokens: int | None = None) -> dict:
    """Tokenize ``source`` into shards in ``out``; resumes an interrupted run. Returns a summary dict. ``out`` is
    held for writing from before any work to the end (:func:`gptforge.data.shards.writing`): another prepare, or
    a reader of its shards (a training run), is refused in one line naming it."""
    settings = settings or PrepareSettings()
    workers = check_settings(settings)
    floor = deadline_floor()  # a bad GPTFORGE_DOC_DEADLINE_S is refused before any work
    with writing(out):
        return _prepare(source, Path(out), settings, workers, floor, force, progress, expected_tokens)


def _prepare(source, out: Path, settings: PrepareSettings, workers: int, floor: float, force: bool, progress: bool,
             expected_tokens: int | None) -> dict:
    enc = load_tokenizer(settings.tokenizer)
    magic = magic_for(enc.n_vocab - 1)  # by vocabulary, so every shard of a dataset has one format
    ident = {"source": source.describe(), "settings": {**settings.identity(), "magic": magic,
                                                       "eot": enc.eot_token, "n_vocab": enc.n_vocab,
                                                       "tokenizer_fingerprint": enc.fingerprint}}
    m = open_manifest(out, ident, force)
    save_tokenizer(enc, out)  # the shards' tokenizer beside them: train reads it and checks its model's
    t0 = time.perf_counter()
    if m["complete"]:
        return _summary(m, out, 0, t0, workers, None)
    writer = _Writer(out, m, settings, magic, expected_tokens)
    start = writer.item
    dtype = str(writer.dtype)
    total_items = source.total_items()
    bar = _progress_bar(progress, expected_tokens, m["tokens"])
    new_tokens = 0
    workers_seen: dict[int, dict] = {}  # pid -> latest stats
    cpu0 = time.process_time()
    # a source that reads documents in pieces (a .txt file) cuts them where this tokenizer agrees (sources.safe_cut)
    import inspect

    # (with skip_bad, checked whole first: a bad file is skipped whole, no piece of it written before its bad byte)
    items = source.items(start, cut_ok=safe_cut(enc.encode_ordinary), whole_check=settings.skip_bad) \
        if "cut_ok" in inspect.signature(source.items).parameters else source.items(start)
    chunks = _chunks(items, start, settings.chunk_docs, settings.chunk_chars)
    pool = None
    try:
        if workers == 1 and not _from_file(settings.tokenizer):  # a built-in tokenizer: linear, no watch needed
            init_worker(settings.tokenizer, dtype)
            results = ((first, items, tokenize([i.text for i in items if i.text], [i.where for i in items if i.text],
                                               heads=[not i.cont for i in items if i.text]))
                       for first, items in chunks)
        else:
            # ProcessPoolExecutor, not multiprocessing.Pool: a worker that dies (OOM killer, a failed
            # start) raises BrokenProcessPool here instead of hanging the run forever
            ctx = mp.get_context(settings.start_method)
            watch = Watch(ctx, workers, floor, None if bar is None else bar.write)
            pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                       initargs=(settings.tokenizer, dtype, True, watch.board, watch.slots))
            results = ordered(pool, chunks, window=2 * workers + 2, watch=watch)
        for first, items, (flat, lengths, stats) in results:
            workers_seen[stats["pid"]] = stats
            writer.add_chunk(first, items, flat, lengths)
            new_tokens += len(flat)
            if bar is not None:
                seen = writer.item + writer.held_items
                if total_items and expected_tokens is None and seen:  # ETA from tokens/item so far
                    bar.total = int(writer.tokens_seen / seen * total_items) + 1
                bar.update(len(flat))
                bar.set_postfix(refresh=False, **writer.progress())
        writer.finish()  # the val size if still open, then the remainder: the last, shorter shard
        if not m["shards"]:  # never a folder that says complete and holds nothing to train on
            raise SourceError(_no_tokens(source.describe(), m["state"]))
        m["complete"] = True
        write_json_atomic(out / MANIFEST, m)
    except BrokenProcessPool as e:
        raise SourceError(f"a tokenizer worker process died ({e}); finished shards are kept: re-run the same "
                          "command to resume (with fewer --workers if it was killed for memory)") from e
    finally:
        writer.close()
        if pool is not None:  # on error/interrupt the manifest already describes what is on disk
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    worker_rss = max((w["rss"] for w in workers_seen.values()), default=None) if pool is not None else None
    summary = _summary(m, out, new_tokens, t0, workers, worker_rss)
    ws = workers_seen.values() if pool is not None else []
    summary["cpu_seconds"] = {"main": round(time.process_time() - cpu0, 3),
                              "workers": round(sum(w["cpu"] - w["startup_cpu"] for w in ws), 3),
                              "workers_startup": round(sum(w["startup_cpu"] for w in ws), 3)}
    return summary


def _no_tokens(desc: dict, st: dict) -> str:
    """Why a finished source gave no token at all, naming it: every document empty, or every row bad
    (skipped with --skip-bad). Nothing is marked complete, so train never meets an empty shard folder."""
    files = desc.get("files") or []
    if desc.get("kind") == "files" and files:
        name = files[0]["path"] + (f" (and {len(files) - 1} more files)" if len(files) > 1 else "")
    else:
        name = f"dataset {desc.get('path')}"
    found = [f"{st.get('empty_documents', 0)} empty documents"] + (
        [f"{st['skipped']} bad rows skipped (--skip-bad)"] if st.get("skipped") else [])
    return (f"{name}: no text to tokenize ({', '.join(found)}); no shards were written. Give files that hold "
            f"text (and check --text-field {desc.get('text_field', 'text')!r})")


def _from_file(spec: str) -> bool:
    """Whether ``--tokenizer`` names a file or folder (its split patterns are the file's, so watched) rather
    than a built-in name (GPT-2's and tiktoken's own, linear patterns)."""
    try:
        return Path(spec).exists()
    except (OSError, ValueError):
        return False


def _progress_bar(enabled: bool, expected_tokens: int | None, initial: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=expected_tokens, initial=initial, unit="tok", unit_scale=True, dynamic_ncols=True,
                desc="tokens", smoothing=0.1)


def _summary(m: dict, out: Path, new_tokens: int, t0: float, workers: int, worker_rss: float | None) -> dict:
    dt = time.perf_counter() - t0
    st = m["state"]
    return {"out": str(out), "complete": m["complete"], "shards": len(m["shards"]), "tokens": m["tokens"],
            "val_tokens": sum(s["tokens"] for s in m["shards"] if s["split"] == "val"),
            "documents": st["documents"], "empty_documents": st.get("empty_documents", 0),
            "skipped": st["skipped"], "workers": workers,
            "new_tokens": new_tokens, "seconds": round(dt, 3),
            "tokens_per_s": round(new_tokens / dt, 1) if dt > 0 else None,
            "peak_rss_mb": {"main": peak_rss_mb(), "largest_worker": worker_rss}}
