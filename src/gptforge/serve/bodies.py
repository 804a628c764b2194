"""How the native /api routes read a request: the JSON body through :func:`gptforge.serve.openai_schema.loads_body`
in the gate's worker threads (as /v1 reads it), whatever its Content-Type, a HEAD as a GET, and a body FastAPI
could not validate told as a 400 (unreadable, not an object) or a 422 naming each field.

    app.router.route_class = BodyRoute   # every route added after this reads its body so
    app.state.gate = gate                # the ModelGate whose prepare reads it
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

# the most validation errors an answer lists, as /v1 lists them (openai_schema.parse): every one of 1,000,000
# unknown keys in a 14 MB body made a 49 MB answer, its 1,000,000 shown inputs written on the event loop (16 s)
SHOWN_ERRORS = 4


class ApiModel(BaseModel):
    """The base of /api's request models: JSON types as sent, unknown keys refused by name; more unknown keys than an
    answer lists (``SHOWN_ERRORS``) are refused in one error, before pydantic and FastAPI make one of each on the
    event loop (1,000,000 of them in a 14 MB body held it 15 s)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > SHOWN_ERRORS:
            unknown = [k for k in data if k not in cls.model_fields]
            if len(unknown) > SHOWN_ERRORS:
                raise PydanticCustomError("extra_forbidden", "{count} keys this request does not take ({first}, ...)",
                                          {"count": f"{len(unknown):,}",
                                           "first": ", ".join(map(repr, unknown[:SHOWN_ERRORS]))})
        return data


def validation_message(exc: RequestValidationError) -> tuple[int, str]:
    """A request FastAPI could not validate: (400, why) for a body that is not JSON or not an object, else (422,
    each of the first ``SHOWN_ERRORS`` errors as ``field.path: pydantic's message (got the input)``, joined by ``; ``,
    then how many more)."""
    from gptforge.serve.openai_schema import NOT_AN_OBJECT, shown

    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        detail = next(e for e in errs if e.get("type") == "json_invalid")
        return 400, f"malformed JSON body: {detail.get('ctx', {}).get('error', detail.get('msg'))}"
    if any(tuple(e.get("loc", ())) == ("body",) and e.get("type") != "extra_forbidden" for e in errs):  # the body
        # itself: empty, null, a list, a number
        return 400, NOT_AN_OBJECT  # as /v1 says it (a 422 "body: Input should be a valid dictionary ...")
    parts = []
    for e in errs[:SHOWN_ERRORS]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg')}" + (f" (got {shown(e['input'])})" if "input" in e and loc != "body" else ""))
    if len(errs) > SHOWN_ERRORS:
        parts.append(f"and {len(errs) - SHOWN_ERRORS:,} more")
    return 422, "; ".join(parts)


class _BodyRequest(Request):
    async def json(self) -> Any:
        import json

        from gptforge.serve.openai_schema import BodyError, loads_body

        if not hasattr(self, "_json"):
            raw = await self.body()
            try:  # the app's gate prepares it: off the event loop, a bounded number at once
                self._json = await self.app.state.gate.prepare(loads_body, raw)
            except BodyError as e:  # FastAPI's own path for an unreadable body: 400 "malformed JSON body: ..."
                if isinstance(e.__cause__, json.JSONDecodeError):
                    raise e.__cause__ from None
                msg = e.msg.removeprefix("malformed JSON body: ")
                raise json.JSONDecodeError(msg, raw.decode("utf-8", "replace"), 0) from None
        return self._json


class BodyRoute(APIRoute):
    """A route whose JSON body is read by :func:`gptforge.serve.openai_schema.loads_body`: a key given twice with
    two values or a lone surrogate is refused (400) in /api as in /v1, where json.loads took the last key and
    tokenized the surrogate. A GET route answers HEAD too, as Starlette's own routes (/docs) do and HTTP asks of
    every GET (FastAPI's answered 405): a HEAD the router found at this path is handled as a GET and the server
    (uvicorn, which knows the request was HEAD) sends the headers without the body; a route without GET refuses
    it as it refuses a GET (405, Allow). HEAD is taken here rather than added to ``methods``, which would put a
    second operation of the same id in /docs.

    The body is read as JSON whatever its Content-Type says, as /v1 reads it: ``curl -d '{...}'`` without ``-H``
    sends ``application/x-www-form-urlencoded``, and FastAPI handed such a body to the model as bytes, a 422
    "body: Input should be a valid dictionary" that named neither the header nor the fix."""

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("method") == "HEAD":
            scope = {**scope, "method": "GET"}
        await super().handle(scope, receive, send)

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request):
            headers = [(k, v) for k, v in request.scope.get("headers", ()) if k.lower() != b"content-type"]
            scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
            return await handler(_BodyRequest(scope, request.receive))

        return route
