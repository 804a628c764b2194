"""One line per request on stderr, as uvicorn's access log writes it, plus how long it took:

    127.0.0.1:53412 - "POST /api/generate HTTP/1.1" 200 812 ms

``gptforge serve`` runs uvicorn at log level warning (its startup chatter is not the user's business), which
turns uvicorn's own access log off; this middleware is the one it keeps. The path is logged without its
query string, and no header is (an API key travels in one)."""

from __future__ import annotations

import sys
import time
from typing import Any


def access_line(scope: dict, status: int, ms: float) -> str:
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    return f'{who} - "{scope.get("method", "?")} {scope.get("path", "")} HTTP/{scope.get("http_version", "1.1")}" ' \
           f"{status} {ms:.0f} ms"


class AccessLog:
    """Pure ASGI middleware: after each HTTP response has been sent in full (a streamed one at its last
    chunk), one :func:`access_line` on stderr; a request whose handler raised is logged as 500."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), 500

        async def noted_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noted_send)
        finally:
            print(access_line(scope, status, 1000 * (time.perf_counter() - t0)), file=sys.stderr, flush=True)
