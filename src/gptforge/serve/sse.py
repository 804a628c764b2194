"""A generation stream driven from the event loop: as server-sent events, shared by ``/api/stream`` and
``/api/chat`` (and /v1's streams), or collected whole (:func:`collect_rows`, /api/generate and /v1's answers).

Generation runs in its own task that always releases the request's slot (``gate``), even if the
response body is never iterated (a client gone before the first byte); the response only reads the
task's queue, and a client that leaves stops the generation at its next token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool


def native_events() -> Callable[[Any], str]:
    """The native format, for one response: ``data: {"row", "text"}``, and at a row's end also
    ``"finished", "reason"`` and ``"tokens"``, the tokens the row generated (its stop token included)."""
    counts: dict[int, int] = {}

    def event(ev: Any) -> str:
        counts[ev.row] = counts.get(ev.row, 0) + len(ev.tokens)
        body: dict[str, Any] = {"row": ev.row, "text": ev.text}
        if ev.finished:
            body.update(finished=True, reason=ev.reason, tokens=counts[ev.row])
        return f"data: {json.dumps(body)}\n\n"

    return event


def native_error(e: Exception) -> str:
    return f"event: error\ndata: {json.dumps({'error': f'generation failed: {e}'})}\n\n"


def sse_response(it: Iterator, gate: Any, producers: set[asyncio.Task], event: Callable[[Any], str] | None = None,
                 error: Callable[[Exception], str] = native_error,
                 end: Callable[[], str] = lambda: "event: done\ndata: {}\n\n") -> StreamingResponse:
    """Stream ``it``'s generation events (``row``, ``text``, ``finished``, ``reason``) as SSE.
    ``gate`` is the acquired slot, released when generation ends; ``producers`` keeps strong
    references to running tasks so they are not collected. ``event``/``error``/``end`` write the
    wire format (native by default; ``serve/openai_api.py`` passes OpenAI's chunks)."""
    event = event or native_events()
    pieces: asyncio.Queue = asyncio.Queue()  # at most batch x max_new_tokens events: bounded
    client_gone = asyncio.Event()
    task = asyncio.create_task(_produce(it, pieces, client_gone, gate))
    producers.add(task)
    task.add_done_callback(producers.discard)

    async def events() -> AsyncIterator[str]:
        try:
            while (ev := await pieces.get()) is not None:
                if isinstance(ev, Exception):
                    yield error(ev)
                    continue
                if text := event(ev):
                    yield text
            yield end()
        finally:
            client_gone.set()  # stops the producer at its next step

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _Steps:
    """``it`` stepped one event at a time in a worker thread. :meth:`close` closes it unless a step is still
    running in its thread: a task cancelled mid-step (the server shutting down on Ctrl-C cancels what is left)
    stops awaiting while the thread goes on, and a generator cannot be closed while it executes (``it.close()``
    raised "generator already executing", which skipped the rest of the cleanup and printed as an unhandled
    exception at shutdown). Such a generator is left to end with its step."""

    def __init__(self, it: Iterator):
        self.it, self.running = it, False

    async def next(self, default: Any) -> Any:
        self.running = True
        ev = await run_in_threadpool(next, self.it, default)
        self.running = False  # not reached when cancelled mid-step; an exception from next has ended ``it``
        return ev

    def close(self) -> None:
        if not self.running:
            self.it.close()


async def _produce(it: Iterator, pieces: asyncio.Queue, client_gone: asyncio.Event, gate: Any) -> None:
    done, steps = object(), _Steps(it)
    try:
        while not client_gone.is_set() and (ev := await steps.next(done)) is not done:
            pieces.put_nowait(ev)
    except Exception as e:  # e.g. out of memory: tell the client, keep serving
        pieces.put_nowait(e)
    finally:
        steps.close()
        gate.release()
        pieces.put_nowait(None)


async def collect_rows(it: Iterator, n_rows: int, gone: asyncio.Event) -> tuple[list[str], list[str | None],
                                                                                 list[list[int]]]:
    """Every row's text, finish reason and generated ids: ``it`` stepped one token at a time in a worker thread,
    checking between steps whether the client hung up (``gone``); ``it`` is closed however this ends."""
    texts, reasons, tokens = [""] * n_rows, [None] * n_rows, [[] for _ in range(n_rows)]
    done, steps = object(), _Steps(it)
    try:
        while not gone.is_set() and (ev := await steps.next(done)) is not done:
            texts[ev.row] += ev.text
            tokens[ev.row] += ev.tokens
            if ev.finished:
                reasons[ev.row] = ev.reason
    finally:
        steps.close()
    return texts, reasons, tokens
