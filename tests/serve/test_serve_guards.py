"""The server's guards against its clients, each driven at the ASGI level with a tiny inner app instead of a
model (serve/limits.py, serve/sse.py): the body limit at its boundary (a body of exactly the limit passes,
one byte more is 413, declared or counted), what the 413 and 401 answers carry (status, the JSON body and
its length, ``Connection: close``, ``WWW-Authenticate``), which paths the key guards, the native SSE
events' token counts per row and the stream's headers, and the queue slot a client gives up when it leaves.

The reference is the HTTP contract written out by hand here, not another run of the same code; these are
the tests of mutation lane ``serve-guards`` (pyproject.toml), written where its first run would look."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from fastapi import HTTPException  # noqa: E402

from gptforge.serve.gate import ModelGate  # noqa: E402
from gptforge.serve.limits import BearerAuth, BodyLimit, BodyTooLarge, acquire_unless_gone, watch_disconnect  # noqa: E402
from gptforge.serve.sse import native_error, native_events, sse_response  # noqa: E402


def _scope(path: str = "/api/generate", headers: list | None = None, kind: str = "http") -> dict:
    return {"type": kind, "path": path, "method": "POST", "headers": headers or []}


class _Echo:
    """An inner app that reads the whole body and answers 200 with the byte count, keep-alive."""

    def __init__(self, start_first: bool = False):
        self.calls = 0
        self.read = 0
        self.start_first = start_first

    async def __call__(self, scope, receive, send):
        self.calls += 1
        if scope["type"] != "http":
            return
        if self.start_first:  # a streaming route: the response starts before the body is read
            await send({"type": "http.response.start", "status": 200, "headers": []})
        while True:
            m = await receive()
            self.read += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        body = str(self.read).encode()
        if not self.start_first:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode()), (b"Connection", b"keep-alive")]})
        await send({"type": "http.response.body", "body": body})


def _call(app, scope: dict, chunks: list[bytes]) -> tuple[int, dict, bytes, list]:
    """Run one request; the body in ``chunks`` (the last without more_body). Returns status, headers (lower-
    cased, every value of a repeated header joined by ','), body, and the raw header list."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(m):
        sent.append(m)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = list(start.get("headers", []))
    heads: dict[str, str] = {}
    for k, v in raw:
        k = k.decode().lower()
        heads[k] = heads[k] + "," + v.decode() if k in heads else v.decode()
    return start["status"], heads, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), raw


# --- the body limit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size, ok", [(0, True), (99, True), (100, True), (101, False), (10_000, False)])
def test_declared_length_at_the_boundary(size, ok):
    inner = _Echo()
    status, heads, body, _ = _call(BodyLimit(inner, max_bytes=100),
                                   _scope(headers=[(b"content-length", str(size).encode())]), [b"x" * min(size, 100)])
    if ok:
        assert (status, body, inner.calls) == (200, str(size).encode(), 1)
        return
    assert status == 413 and inner.calls == 0  # refused before the app (or a byte of the body) is touched
    assert json.loads(body) == {"error": f"request body of {size} bytes is over the limit of 100"}
    assert heads["content-type"] == "application/json" and heads["content-length"] == str(len(body))
    assert heads["connection"] == "close"


@pytest.mark.parametrize("declared", [b"-1", b"1e3", b"12a", b"", b" 5"])
def test_a_declared_length_that_is_not_a_number_is_413(declared):
    inner = _Echo()
    status, _, body, _ = _call(BodyLimit(inner, max_bytes=100), _scope(headers=[(b"content-length", declared)]), [b"x"])
    assert status == 413 and inner.calls == 0 and "over the limit of 100" in json.loads(body)["error"]


@pytest.mark.parametrize("chunks, ok", [([b"x" * 50, b"x" * 50], True), ([b"x" * 100], True), ([b""] * 3, True),
                                        ([b"x" * 50, b"x" * 51], False), ([b"x" * 101], False)])
def test_counted_body_at_the_boundary(chunks, ok):
    """No Content-Length (chunked): the bytes received are counted; the limit itself is allowed."""
    status, heads, body, raw = _call(BodyLimit(_Echo(), max_bytes=100), _scope(), chunks)
    if ok:
        assert (status, body) == (200, str(sum(map(len, chunks))).encode())
        assert heads["connection"] == "keep-alive"  # nothing unread: the connection may be reused
        return
    assert status == 413
    assert json.loads(body) == {"error": f"request body is over the limit of 100 bytes (stopped reading at "
                                         f"{sum(map(len, chunks))}; chunked bodies are counted too)"}


def test_a_counted_body_over_the_limit_closes_the_connection_once():
    """The app answered (its exception handler turned BodyTooLarge into 413) with its own keep-alive header:
    the guard replaces it with one ``Connection: close``, since the rest of the body stays unread."""

    async def app(scope, receive, send):
        try:
            await receive()
        except BodyTooLarge as e:
            await send({"type": "http.response.start", "status": e.status_code,
                        "headers": [(b"connection", b"keep-alive"), (b"x-kept", b"1")]})
            await send({"type": "http.response.body", "body": b"{}"})

    status, heads, _, raw = _call(BodyLimit(app, max_bytes=10), _scope(), [b"x" * 11, b"y"])
    assert status == 413 and heads["connection"] == "close" and heads["x-kept"] == "1"
    assert [k for k, _ in raw if k.lower() == b"connection"] == [b"connection"]


def test_an_answer_without_a_headers_key_still_gets_connection_close():
    """ASGI makes ``headers`` optional in ``http.response.start`` (default: none); an app that answers the
    over-limit body that way still gets the one ``Connection: close`` and nothing else."""

    async def app(scope, receive, send):
        try:
            await receive()
        except BodyTooLarge as e:
            await send({"type": "http.response.start", "status": e.status_code})
            await send({"type": "http.response.body", "body": b""})

    status, _, _, raw = _call(BodyLimit(app, max_bytes=3), _scope(), [b"abcd"])
    assert status == 413 and raw == [(b"connection", b"close")]


@pytest.mark.parametrize("guard, path, headers, chunks", [
    (lambda app: BodyLimit(app, max_bytes=2), "/api/generate", [(b"content-length", b"3")], [b"abc"]),  # declared
    (lambda app: BodyLimit(app, max_bytes=2), "/v1/completions", [], [b"ab", b"c"]),  # counted, raised past the app
    (lambda app: BearerAuth(app, key="k"), "/api/generate", [], [b""]),
    (lambda app: BearerAuth(app, key="k"), "/v1/models", [(b"authorization", b"Bearer x")], [b""])])
def test_the_guards_own_answers_name_their_headers_in_lower_case(guard, path, headers, chunks):
    """ASGI: "header names must be lowercased" in a response start; an HTTP/2 server (hypercorn) refuses the
    response otherwise, and HTTP/1.1 clients that match names exactly miss it."""

    async def app(scope, receive, send):  # lets BodyTooLarge escape, as a route outside FastAPI's handling would
        while (await receive()).get("more_body"):
            pass

    status, _, _, raw = _call(guard(app), _scope(path, headers), chunks)
    assert status in (401, 413) and raw
    assert [k for k, _ in raw] == [k.lower() for k, _ in raw]
    assert {k for k, _ in raw} >= {b"content-type", b"content-length", b"connection"}


def test_a_message_without_a_body_key_counts_zero():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "more_body": False}

    sent = []

    async def send(m):
        sent.append(m)

    asyncio.run(BodyLimit(app, max_bytes=0)(_scope(), receive, send))
    assert sent[0]["status"] == 204


def test_over_the_limit_after_the_response_started_is_raised_not_answered_twice():
    with pytest.raises(BodyTooLarge):
        _call(BodyLimit(_Echo(start_first=True), max_bytes=10), _scope(), [b"x" * 6, b"x" * 6])


def test_under_v1_the_413_is_openais_error_object():
    status, _, body, _ = _call(BodyLimit(_Echo(), max_bytes=5), _scope("/v1/completions"), [b"x" * 6])
    err = json.loads(body)["error"]
    assert status == 413 and set(err) >= {"message", "type"} and "over the limit of 5 bytes" in err["message"]
    status, _, body, _ = _call(BodyLimit(_Echo(), max_bytes=5), _scope("/v1x", [(b"content-length", b"9")]), [b""])
    assert status == 413 and isinstance(json.loads(body)["error"], dict)  # the prefix, as the routes have it
    status, _, body, _ = _call(BodyLimit(_Echo(), max_bytes=5), _scope("/api/v1"), [b"x" * 6])
    assert json.loads(body)["error"].startswith("request body is over")  # native, though "/v1" is in the path


def test_other_scopes_pass_through_untouched():
    for guard in (lambda app: BodyLimit(app, max_bytes=0), lambda app: BearerAuth(app, key="k")):
        seen = []

        async def inner(scope, receive, send, seen=seen):
            seen.append(scope["type"])

        asyncio.run(guard(inner)(_scope("/api/x", [(b"content-length", b"999")], kind="lifespan"), None, None))
        assert seen == ["lifespan"]


# --- the API key -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, guarded", [("/api/generate", True), ("/api", True), ("/v1/models", True),
                                           ("/v1", True), ("/", False), ("/docs", False), ("/openapi.json", False),
                                           ("/static/app.js", False), ("/x/api", False)])
@pytest.mark.parametrize("header, right", [(None, False), (b"Bearer k3y", True), (b"Bearer k3", False),
                                           (b"Bearer k3y ", False), (b"k3y", False), (b"Basic k3y", False)])
def test_the_key_guards_api_and_v1_only(path, guarded, header, right):
    inner = _Echo()
    heads_in = [(b"authorization", header)] if header is not None else []
    status, heads, body, _ = _call(BearerAuth(inner, key="k3y"), _scope(path, heads_in), [b"abc"])
    if right or not guarded:
        assert (status, body, inner.calls) == (200, b"3", 1)
        return
    assert status == 401 and inner.calls == 0
    assert heads["www-authenticate"] == "Bearer" and heads["connection"] == "close"
    assert heads["content-length"] == str(len(body))
    msg = ("missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key this server was "
           "started with (--api-key)")
    payload = json.loads(body)
    if path.startswith("/v1"):
        assert payload["error"]["message"] == msg and payload["error"]["type"] == "authentication_error"
    else:
        assert payload == {"error": msg}


# --- native SSE events and the stream ---------------------------------------------------------------------

def _ev(row, text, tokens, finished=False, reason=None):
    return SimpleNamespace(row=row, text=text, tokens=tokens, finished=finished, reason=reason)


def test_native_events_count_each_rows_tokens():
    event = native_events()
    out = [json.loads(event(e)[len("data: "):]) for e in (
        _ev(0, "a", [1]), _ev(1, "b", [2, 3]), _ev(0, "", []), _ev(0, "c", [4, 5], True, "stop"),
        _ev(1, "d", [6], True, "length"))]
    assert out == [{"row": 0, "text": "a"}, {"row": 1, "text": "b"}, {"row": 0, "text": ""},
                   {"row": 0, "text": "c", "finished": True, "reason": "stop", "tokens": 3},
                   {"row": 1, "text": "d", "finished": True, "reason": "length", "tokens": 3}]
    assert event(_ev(0, "x", [9])).endswith("\n\n") and native_events()(_ev(0, "", [], True, "stop")).count("\n") == 2
    assert native_events()(_ev(2, "", [], True, "stop")) == (
        'data: {"row": 2, "text": "", "finished": true, "reason": "stop", "tokens": 0}\n\n')
    assert native_error(RuntimeError("oom")) == 'event: error\ndata: {"error": "generation failed: oom"}\n\n'


class _Gate:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


def _stream(items, event=None, **kw) -> tuple[str, dict, _Gate, list]:
    gate, closed = _Gate(), []

    def gen():
        try:
            for x in items:
                if isinstance(x, Exception):
                    raise x
                yield x
        finally:
            closed.append(True)

    async def run():
        producers: set = set()
        r = sse_response(gen(), gate, producers, event, **kw)
        text = "".join([piece async for piece in r.body_iterator])
        for _ in range(3):
            await asyncio.sleep(0)
        assert not producers  # the finished producer let go of its reference
        return text, dict(r.headers)

    # a producer that died without its end marker would leave the stream waiting forever: fail instead
    text, heads = asyncio.run(asyncio.wait_for(run(), timeout=10))
    return text, heads, gate, closed


def test_the_stream_sends_every_event_then_done_and_releases_the_slot():
    text, heads, gate, closed = _stream([_ev(0, "a", [1]), _ev(0, "b", [2], True, "length")])
    assert text == ('data: {"row": 0, "text": "a"}\n\n'
                    'data: {"row": 0, "text": "b", "finished": true, "reason": "length", "tokens": 2}\n\n'
                    "event: done\ndata: {}\n\n")
    assert heads["cache-control"] == "no-cache" and heads["x-accel-buffering"] == "no"
    assert heads["content-type"].startswith("text/event-stream")
    assert gate.released == 1 and closed == [True]


def test_a_failing_generation_is_an_error_event_and_still_frees_the_slot():
    text, _, gate, closed = _stream([_ev(0, "a", [1]), MemoryError("out of memory")])
    assert text.endswith('event: error\ndata: {"error": "generation failed: out of memory"}\n\nevent: done\ndata: {}\n\n')
    assert gate.released == 1 and closed == [True]


def test_an_empty_event_text_is_not_sent_and_the_format_is_the_callers():
    text, *_ = _stream([_ev(0, "a", [1]), _ev(0, "b", [2])], event=lambda e: "" if e.text == "a" else f"<{e.text}>",
                       error=lambda e: "E", end=lambda: "END")
    assert text == "<b>END"


# --- a client that leaves --------------------------------------------------------------------------------

def test_watch_disconnect_sets_the_event_only_on_disconnect():
    async def run():
        messages = [{"type": "http.request", "body": b""}, {"type": "http.request", "body": b""}]
        request = SimpleNamespace(receive=None)
        hang = asyncio.Event()

        async def receive():
            if messages:
                return messages.pop(0)
            await hang.wait()
            return {"type": "http.disconnect"}

        request.receive = receive
        gone, task = watch_disconnect(request)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not gone.is_set() and not messages  # read past the body, still waiting
        hang.set()
        await task
        return gone.is_set()

    assert asyncio.run(run())


def test_acquire_unless_gone():
    async def run():
        gate = ModelGate(max_queue=1)
        gone = asyncio.Event()
        assert await acquire_unless_gone(gate, gone) is True and gate._lock.locked()  # free: taken

        waiter_gone = asyncio.Event()
        waiting = asyncio.ensure_future(acquire_unless_gone(gate, waiter_gone))
        await asyncio.sleep(0.01)
        assert gate.waiting == 1
        with pytest.raises(HTTPException) as full:  # one queued already: the next is turned away at once
            await acquire_unless_gone(gate, asyncio.Event())
        assert full.value.status_code == 429
        waiter_gone.set()  # the queued client leaves
        assert await waiting is False and gate.waiting == 0
        gate.release()
        assert not gate._lock.locked()  # the one who left holds nothing

        left_first = asyncio.Event()
        left_first.set()  # gone before its turn, though the model is free: it takes nothing
        assert await acquire_unless_gone(gate, left_first) is False and not gate._lock.locked()
        assert gate.waiting == 0

    asyncio.run(run())
