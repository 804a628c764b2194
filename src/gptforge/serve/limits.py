"""What protects the server from its clients: a request-body limit on the bytes actually received,
an optional API key, a conversation's length (its characters; its messages, counted before any is
read, against the least the chat template spends on each), and a client that hangs up freeing its place
in the queue and stopping its generation.

    app.add_middleware(BodyLimit, max_bytes=1_000_000)
    app.add_middleware(BearerAuth, key="sk-...")  # /api and /v1 need "Authorization: Bearer sk-..."
    gone = watch_disconnect(request)             # an asyncio.Event set when the client leaves
    if await acquire_unless_gone(gate, gone): ...

Content-Length alone is not a limit: a chunked body has none and would be read whole. BodyLimit
counts the body as it arrives and answers 413 as soon as the count passes the limit, without reading
the rest; the 413 carries ``Connection: close``, so the server (uvicorn) closes the connection then
instead of draining the unread body to reuse it (1 GB of a chunked body took 8 s).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import HTTPException, Request
from pydantic import BaseModel, BeforeValidator, Field, create_model
from pydantic_core import PydanticCustomError


class BodyTooLarge(HTTPException):
    """Raised from the body stream once it passes the limit; FastAPI answers it as an HTTP 413."""

    def __init__(self, detail: str):
        super().__init__(413, detail)


class BodyLimit:
    """Pure ASGI middleware: 413 for a declared Content-Length over ``max_bytes``, and for a body
    (chunked or lying about its length) whose received bytes pass it; 415 for a body sent compressed (a
    ``Content-Encoding`` other than ``identity``), which no route reads: each read the gzip bytes as JSON, a 400
    "'utf-8' codec can't decode byte 0x8b" that named neither the header nor the fix, and inflating it would
    leave the limit counting compressed bytes (a 1 MB gzip body can inflate to 1 GB)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        encodings = [e.strip().lower() for k, v in scope.get("headers") or () if k.lower() == b"content-encoding"
                     for e in v.split(b",")]
        if any(e not in (b"", b"identity") for e in encodings):
            sent = b", ".join(e for e in encodings if e).decode("latin-1")
            await _json(send, 415, f"Content-Encoding: {sent}: this server reads a request body as sent (JSON, not "
                                   "compressed); send it without a Content-Encoding header", scope)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _json(send, 413, f"request body of {declared.decode('latin-1')} bytes is over the limit of {limit}",
                        scope)
            return
        received = 0
        started = over = False

        async def counted_receive() -> dict:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge(f"request body is over the limit of {limit} bytes (stopped reading at "
                                       f"{received}; chunked bodies are counted too)")
            return message

        async def tracked_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # the rest of the body stays unread: the server must not keep the connection
                    message = {**message, "headers": [*_without_connection(message.get("headers", ())),
                                                      (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge as e:  # raised outside a route's exception handling (normally handled inside)
            if started:
                raise
            await _json(send, 413, str(e.detail), scope)


def _without_connection(headers: Any) -> list:
    return [(k, v) for k, v in headers if k.lower() != b"connection"]


class BearerAuth:
    """Pure ASGI middleware: requests under ``/api`` and ``/v1`` need ``Authorization: Bearer <key>`` (the key
    compared in constant time; ``bearer`` in any case, as HTTP's schemes are); 401 otherwise. The page itself and
    the schema stay readable, and so does an OPTIONS request: no route takes it (a browser's CORS preflight, which
    never carries the key, is told the server answers no CORS rather than that its key is wrong)."""

    def __init__(self, app: Any, key: str):
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and (path.startswith("/api")
                                                                             or path.startswith("/v1")):
            got = dict(scope.get("headers") or ()).get(b"authorization", b"")
            scheme, _, token = got.partition(b" ")  # the scheme in any case: HTTP's are case-insensitive (RFC 9110)
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token, self.expected):
                await _json(send, 401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
                                       "with the key this server was started with (--api-key)", scope,
                            [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


async def _json(send: Any, status: int, msg: str, scope: dict | None = None, extra: list | None = None) -> None:
    """A JSON error answered by middleware: OpenAI's error object under /v1, the native one elsewhere."""
    if scope is not None and scope.get("path", "").startswith("/v1"):
        from gptforge.serve.openai_schema import error_body

        payload: dict = error_body(status, msg)
    else:
        payload = {"error": msg}
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def messages_over_limit(contents: list[str], limit: int) -> str | None:
    """The refusal of a conversation longer than ``ServeSettings.max_prompt_chars`` (all its messages' text together, checked
    before the template renders it), or None: one rule and one message for /api/chat and /v1/chat/completions."""
    if sum(len(c) for c in contents) > limit:
        return f"messages: over the limit of {limit} characters"
    return None


# what a conversation of more messages than can fit is told (after "messages: ")
MESSAGES_OVER_CONTEXT = ("at most {max_length} messages fit this model's context of {positions} positions with one left "
                         "for the reply (the chat template spends at least {cost} tokens on each message)")

_PROBES = ("", "a")  # the contents a message's cost is measured with: none, and one character
_PREFIXES = ([{"role": "user", "content": "a"}],
             [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a"}])  # where a later message goes


@dataclass(frozen=True)
class MessageBound:
    """The most messages a conversation can hold and still fit a model's context (``positions``), one position left
    for the reply: a first message renders to at least ``first`` of the template's own tokens, every later one adds at
    least ``cost``. A lower bound on the rendered length, so a conversation refused by it can never fit."""

    positions: int
    first: int
    cost: int

    @property
    def most(self) -> int:
        return max(0, (self.positions - 1 - self.first) // self.cost + 1)


def message_bound(template: Any, enc: Any, positions: int) -> MessageBound | None:
    """The bound of conversations rendered by ``template`` (a chat template of either kind; ``enc``: the plain
    tokenizer) for a context of ``positions``, or None where no count can be bounded (a template that can render a
    later message as none of its tokens, or refuses every probe). Without a template, one position a message: the
    chat routes refuse the request anyway, and need not validate 400,000 messages first.

    Counted on what no message's text can shrink: the template's own control tokens (its special ids: roles, turn
    markers, the bos, the generation prompt), which a message's text never produces (special text typed in a
    message is encoded as text) and BPE never merges with text; and one token for each stretch of text between
    them, which is text whatever a message adds to it. A stretch's own count is not a bound: where a template's
    text meets a message's, BPE merges across the seam. The probes are ``""`` and ``"a"`` in every role, first
    and after one and two messages (a template may render a first message, or an empty one, differently).
    gptforge's own template spends exactly two a message (its role id and ``<|end|>``) and two around them (the
    bos, the assistant's role id); ChatML at least four (``<|im_start|>``, the role's line, ``<|im_end|>``, its
    newline), of five."""
    if template is None:
        return MessageBound(positions, 0, 1)
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.errors import ChatFormatError

    controls = set(template.names)

    def rendered(messages: list[dict[str, str]]) -> int | None:
        try:
            ids = template.render_for_generation(messages, enc)
        except (ChatFormatError, TokenizerError):  # refused (roles out of turn, as the routes refuse it): not measured
            return None
        spent, in_text = 0, False
        for t in ids:  # each control id, and each run of text ids between them once
            spent += t in controls or not in_text
            in_text = t not in controls
        return spent

    probes = [{"role": r, "content": c} for r in ("system", "user", "assistant") for c in _PROBES]
    firsts = [n for m in probes if (n := rendered([m])) is not None]
    costs = [after - before for prefix in _PREFIXES if (before := rendered(prefix)) is not None
             for m in probes if (after := rendered([*prefix, m])) is not None]
    if not firsts or not costs or min(costs) < 1:
        return None
    return MessageBound(positions, min(firsts), min(costs))


def bounded_messages(request: type[BaseModel], message: type[BaseModel], bound: MessageBound | None) -> type[BaseModel]:
    """``request`` (a chat request model: /api/chat's, /v1/chat/completions') with its ``messages`` a non-empty list
    of ``message`` holding at most ``bound.most`` (:func:`message_bound`; None: ``request`` itself): more can never
    fit the context. The count is checked on the list as sent, before any message is validated, and refused as
    a validation error of ``messages`` (each route's own shape: /api's 422, /v1's 400 ``param: "messages"``). Both
    chat routes validate their requests holding the GIL, in a worker thread or on the event loop: a 12 MB body of
    400,000 empty messages (under the 16 MB a 128k-context model's body limit lets in) validated and rendered
    whole stalled every other client's stream for seconds."""
    if bound is None:
        return request
    most = bound.most

    def count(value: Any) -> Any:
        if isinstance(value, list) and len(value) > most:  # anything else: the list's own validation refuses it
            raise PydanticCustomError("too_long", MESSAGES_OVER_CONTEXT,
                                      {"max_length": most, "actual_length": len(value), "positions": bound.positions,
                                       "cost": bound.cost})
        return value

    field = Annotated[list[message], BeforeValidator(count)]
    return create_model(request.__name__, __base__=request, messages=(field, Field(min_length=1)))


def prompt_over_limit(field: str, text: str, limit: int) -> str | None:
    """The refusal of a prompt longer than ``ServeSettings.max_prompt_chars`` (checked before it is tokenized), or
    None: one message for /api and /v1, naming the field as the client sent it (``prompt``; ``prompts.1``, the
    second of a list)."""
    if len(text) > limit:
        return f"{field} has {len(text)} characters; the limit is {limit}"
    return None


def watch_disconnect(request: Request) -> tuple[asyncio.Event, asyncio.Task]:
    """An event set when the client disconnects (after its body was read), and the watching task to
    cancel when the response is done."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    return gone, asyncio.create_task(watch())


class Gate(Protocol):
    async def acquire(self) -> None: ...

    def release(self) -> None: ...


async def acquire_unless_gone(gate: Gate, gone: asyncio.Event) -> bool:
    """Wait for the model; False (holding nothing, out of the queue) if the client left first.
    A full queue still raises the gate's 429 at once."""
    acquiring = asyncio.ensure_future(gate.acquire())
    leaving = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({acquiring, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
    if not acquiring.done():
        acquiring.cancel()
        try:
            await acquiring
        except asyncio.CancelledError:
            return False  # left the queue without the lock
    acquiring.result()  # re-raises a 429
    if gone.is_set():
        gate.release()
        return False
    return True
