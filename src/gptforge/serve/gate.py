"""The model's gate: one request on the model at a time, a bounded queue before it, and each request prepared
(its JSON read, its fields checked, its messages rendered, its prompts tokenized) off the event loop first.

    gate = ModelGate(max_queue=8)
    ids, params = await gate.prepare(prepare, req)   # a worker thread, at most PREPARING at once
    await gate.acquire()                             # 429 with Retry-After when max_queue are already waiting
    try: ... finally: gate.release()
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import HTTPException

RETRY_AFTER_S = 1  # a 429's Retry-After: OpenAI's client (and most others) waits this long before its retry


PREPARING = 2  # requests read, checked, rendered and tokenized at once (ModelGate.prepare)


class ModelGate:
    """One request on the model at a time; at most ``max_queue`` waiting, the rest get 429 with a
    ``Retry-After`` header, which /v1's OpenAI error carries too. Before it waits, a request is prepared
    (:meth:`prepare`)."""

    def __init__(self, max_queue: int):
        import anyio

        self.max_queue = max_queue
        self.waiting = 0
        self._lock = asyncio.Lock()
        self._preparing = anyio.CapacityLimiter(PREPARING)

    async def prepare(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, a request's preparation (its JSON read, its fields checked, its messages rendered, its
        prompts tokenized), in a worker thread, at most ``PREPARING`` at once. On the event loop it stalled every
        stream and every other request (a 12 MB body of 400,000 empty messages, under the 16 MB a 128k-context
        model's body limit lets in, held them 8 s); unbounded, the threads would hold many such bodies parsed at
        once (~300 MB each), where the loop held one."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(fn, *args, limiter=self._preparing)

    async def acquire(self) -> None:
        if self._lock.locked() and self.waiting >= self.max_queue:
            raise HTTPException(429, f"server busy: {self.waiting} requests already queued; retry shortly",
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self._lock.release()
