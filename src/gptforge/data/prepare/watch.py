"""The per-document deadline of ``prepare``'s worker pool, watched from the main process: chunk results in
submission order (``ordered``), and while it waits for one, each worker's heartbeat read (``Watch``): a
document still tokenizing after 2 s gets a word (then 4 s, 8 s, ...), and one past its deadline
(``workers.doc_deadline``) kills the pool and stops the run in one line naming it. The workers write the
heartbeats (``workers._encode_watched``)."""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

from gptforge.data.prepare.sources import SourceError, numbered
from gptforge.data.prepare.workers import (
    BEAT_FIELDS,
    DOC_BUDGET_S_PER_CHAR,
    DOC_DEADLINE_ENV,
    SLOW_FIX,
    doc_deadline,
    tokenize,
)

WATCH_POLL_S = 0.25  # how often the main process reads the heartbeats while it waits for a chunk
ANNOUNCE_S = 2.0  # a document still tokenizing after this long gets a word, then again at 2x, 4x, ...


class Watch:
    """The heartbeat board of a worker pool: per worker (slot), the item number of the document it is
    tokenizing, its characters and since when (``time.monotonic``, 0 = none). The main process reads it
    while it waits; the workers write it (``workers._encode_watched``)."""

    def __init__(self, ctx, workers: int, floor: float, say=None):
        self.board = ctx.RawArray("d", BEAT_FIELDS * workers)
        self.slots = ctx.Value("i", 0)
        self.workers, self.floor = workers, floor
        self.say = say
        self.told: dict[int, tuple[float, float]] = {}  # slot -> (start of its document, next word at)

    def check(self, pool: ProcessPoolExecutor, pending) -> None:
        now = time.monotonic()
        for slot in range(self.workers):
            b = slot * BEAT_FIELDS
            start = self.board[b + 2]
            item, chars = int(self.board[b]), int(self.board[b + 1])
            if not start or self.board[b + 2] != start:  # idle, or it moved on while being read
                continue
            ran = now - start
            limit = doc_deadline(chars, self.floor)
            where = _where(pending, item)
            if ran > limit:
                _kill(pool)
                raise SourceError(
                    f"{where}: this document ({chars:,} characters) has been tokenizing for {_secs(ran)}, past its "
                    f"deadline of {_secs(limit)} (the larger of {self.floor:g} s and {DOC_BUDGET_S_PER_CHAR * 1e6:g} us "
                    "a character): the tokenizer's split pattern is likely super-linear on it. Stopped; the shards "
                    f"in manifest.json are kept. {SLOW_FIX}; or, if it is only slow, set {DOC_DEADLINE_ENV} to more "
                    "seconds and run the same command again (it resumes)")
            start0, at = self.told.get(slot, (0.0, 0.0))
            if start0 != start:
                start0, at = start, ANNOUNCE_S
            if ran >= at:
                line = (f"prepare: {where} ({chars:,} characters) still tokenizing after {_secs(ran)} "
                        f"(stopped at {_secs(limit)})")
                (self.say or _stderr)(line)
                at *= 2
            self.told[slot] = (start0, at)


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:,.0f} s"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _where(pending, item: int) -> str:
    """``item``'s file:row (a dataset's name:row) from the chunks in flight, or its number."""
    for first, items, _ in pending:
        for n, it in numbered(first, items):
            if n == item:
                return it.where or f"document {item}"
    return f"document {item}"


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers: one is stuck in a C call that nothing else ends; the others' chunks are
    dropped (the manifest's resume point is before them)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            p.kill()


def ordered(pool: ProcessPoolExecutor, chunks, window: int, watch: Watch | None = None):
    """Results in submission order with at most ``window`` chunks in flight (``Pool.imap`` and
    ``Executor.map`` read their whole input eagerly: memory would grow with the corpus). While it waits,
    ``watch`` checks the workers' heartbeats (every WATCH_POLL_S)."""
    pending: collections.deque = collections.deque()

    def result(fut):
        while True:
            try:
                return fut.result(timeout=WATCH_POLL_S if watch is not None else None)
            except FuturesTimeout:
                pass
            watch.check(pool, pending)  # outside the except: a refusal carries no TimeoutError context

    for first, items in chunks:
        texts = [i for i in items if i.text]
        pending.append((first, items, pool.submit(tokenize, [i.text for i in texts], [i.where for i in texts],
                                                  [n for n, i in numbered(first, items) if i.text],
                                                  [not i.cont for i in texts])))
        if len(pending) >= window:
            first0, items0, fut = pending[0]
            out = result(fut)
            pending.popleft()
            yield first0, items0, out
    while pending:
        first0, items0, fut = pending[0]
        out = result(fut)
        pending.popleft()
        yield first0, items0, out
