"""What the OpenAI-compatible endpoints accept and how they refuse: request models for
``/v1/completions`` and ``/v1/chat/completions`` and OpenAI's error object.

    OpenAIError(400, "max_tokens: Input should be greater than or equal to 1", param="max_tokens").response()

Every request model here (and the native API's in app.py and chat.py) is strict, as OpenAI's server is:
a value of the wrong JSON type is a 400 naming the field, never coerced (``"10"``, ``true`` or ``2.0``
where an integer goes, ``"yes"`` where a boolean goes, ``[true]`` as token ids); an integer is a number.
Fields OpenAI defines are checked against OpenAI's ranges (a value out of range is a 400 whose
``param`` names the field); fields nobody defines are ignored, as OpenAI's server ignores them.
Fields that OpenAI defines but gptforge cannot honour (``presence_penalty`` other than 0, a
``logit_bias``, ``tools`` or the older ``functions``, a ``tool_choice`` that asks for a call, audio
``modalities``, ``web_search_options``, ``suffix`` ...) are refused by name rather than silently
dropped; each one's neutral value (0, empty, ``"none"``/``"auto"``, ``["text"]``) is accepted.
``top_k`` and ``repetition_penalty`` are accepted as the extensions vLLM also takes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, FailFast, Field, ValidationError
from typing_extensions import NotRequired, TypedDict

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               429: "rate_limit_error", 499: "invalid_request_error"}


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers  # e.g. a 429's Retry-After

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error object for a message that names no field (middleware: 401, 413)."""
    return OpenAIError(status, message).body()


class _FailFast(FailFast):
    """pydantic's FailFast made hashable, so it can mark a member of a union (typing dedupes members by hash)."""

    def __hash__(self) -> int:
        return hash(type(self))


# A list's or a dict's validation stops at its first bad item. Without it pydantic reports every bad item (and, in a
# union of list types, every item again for each member): 1,000,000 integers as /api's prompts took 19 s to
# validate, a /v1 prompt of 2,000,000 token ids with one string at the end 70 s, 300,000 bad logit_bias values 3 s,
# each holding the GIL in the gate's worker thread. Every list and dict of a request whose items can be refused
# carries it, but the messages, which are counted first (limits.bounded_messages).
FIRST_BAD = _FailFast()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    """What both endpoints share. ``None`` = the OpenAI default."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    n: int = Field(1, ge=1, le=128)
    stop: str | Annotated[list[str], FIRST_BAD] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    logit_bias: Annotated[dict[str, float], FIRST_BAD] | None = None
    # extensions (vLLM's names): 0 or -1 = off, 1 = off
    top_k: int | None = Field(None, ge=-1)
    repetition_penalty: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise OpenAIError(400, f"stop: at most 4 stop sequences (got {len(stops)})", "stop")
        if any(not s for s in stops):
            raise OpenAIError(400, "stop: stop sequences must be non-empty strings", "stop")
        return stops

    def refuse_unsupported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise OpenAIError(400, f"{name}: not supported by this server (use 0; repetition_penalty is "
                                       "the penalty gptforge has)", name)
        if self.logit_bias:
            raise OpenAIError(400, "logit_bias: not supported by this server", "logit_bias")


class CompletionRequest(_Sampling):
    prompt: (str | Annotated[list[str], FIRST_BAD] | Annotated[list[int], FIRST_BAD]
             | Annotated[list[Annotated[list[int], FIRST_BAD]], FIRST_BAD])
    max_tokens: int | None = Field(None, ge=0)  # 0 with echo: score the prompt only (evaluation harnesses)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo and self.stream:
            raise OpenAIError(400, "echo: not available with stream=true on this server", "echo")
        if self.max_tokens == 0 and not self.echo:
            raise OpenAIError(400, "max_tokens: 0 generates nothing; it needs echo: true (to score the prompt)",
                              "max_tokens")
        if self.suffix:
            raise OpenAIError(400, "suffix: not supported by this server (no fill-in-the-middle)", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise OpenAIError(400, f"best_of={self.best_of}: only best_of = n is supported", "best_of")


class ContentPart(TypedDict):
    """One part of a message's content list: a plain dict, validated in pydantic's core without a model instance a
    part. As a BaseModel, 500,000 empty text parts in one message (15 MB, under a 128k-context model's body limit:
    no count of parts can be refused, an empty part adds no text) took 3.7 s to validate in the gate's worker
    thread, holding the GIL from every stream; as a dict, ~0.3 s."""

    __pydantic_config__ = ConfigDict(extra="ignore", strict=True)  # type: ignore[misc]
    type: str
    text: NotRequired[str | None]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: str
    content: str | Annotated[list[ContentPart], FIRST_BAD] | None = None

    def text(self, i: int) -> str:
        if self.content is None:
            raise OpenAIError(400, f"messages.{i}.content: a message needs text content", f"messages.{i}.content")
        if isinstance(self.content, str):
            return self.content
        parts = []
        for j, part in enumerate(self.content):
            if part["type"] == "text" and part.get("text") is None:
                raise OpenAIError(400, f"messages.{i}.content.{j}: a text part needs its text (\"text\": \"...\")",
                                  f"messages.{i}.content")
            if part["type"] != "text":
                raise OpenAIError(400, f"messages.{i}.content.{j}: only text parts are supported (got "
                                       f"{part['type']!r})", f"messages.{i}.content")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    # what a client asks for beyond text, each refused unless at its neutral value (ignored, the client would get
    # plain text where it waits for a call, audio or searched answers): the legacy form of tools, the choice of
    # a tool, and output OpenAI's audio and search models give
    functions: list[Any] | None = None
    function_call: Any = None
    tool_choice: Any = None
    modalities: list[Any] | None = None
    audio: Any = None
    web_search_options: Any = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools:
            raise OpenAIError(400, "tools: tool calling is not supported by this server", "tools")
        if self.functions:
            raise OpenAIError(400, "functions: function calling is not supported by this server", "functions")
        for name in ("function_call", "tool_choice"):
            if getattr(self, name) not in (None, "none", "auto"):
                raise OpenAIError(400, f"{name}: {getattr(self, name)!r} asks for a call; this server has no tool "
                                       "calling (only \"none\" or \"auto\")", name)
        if self.modalities and set(self.modalities) != {"text"}:
            raise OpenAIError(400, f"modalities: only [\"text\"] is supported (got {self.modalities!r})", "modalities")
        for name in ("audio", "web_search_options"):
            if getattr(self, name) is not None:
                raise OpenAIError(400, f"{name}: not supported by this server (text in, text out)", name)
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise OpenAIError(400, "response_format: only {\"type\": \"text\"} is supported", "response_format")
        if self.top_logprobs and not self.logprobs:
            raise OpenAIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")

    def conversation(self) -> list[dict[str, str]]:
        """HF-style messages for the chat template; OpenAI's ``developer`` role is a system message."""
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            if role not in ("system", "user", "assistant"):
                raise OpenAIError(400, f"messages.{i}.role: {m.role!r} is not supported (system, developer, "
                                       "user, assistant)", f"messages.{i}.role")
            out.append({"role": role, "content": m.text(i)})
        return out


NOT_AN_OBJECT = "the body must be a JSON object"  # every route's answer to an empty body, null, a list, a string ...


class BodyError(ValueError):
    """A JSON body every route refuses before its fields are read (:func:`loads_body`); ``param``: the field."""

    def __init__(self, msg: str, param: str | None = None):
        super().__init__(msg)
        self.msg, self.param = msg, param


# a \u escape of a UTF-16 surrogate with no partner: a high one not followed by a low one, or a low one not preceded
# by a high one (the lookbehind, once the low one is taken, sees the pair whole). Read on the text lower-cased (JSON's
# hex digits are either case) with every "\\" escape blanked (_lone_surrogate), so each backslash left starts an
# escape; the literal "\ud" it starts with lets the engine skip every other escape at C speed
_LONE_ESCAPE = re.compile(r"\\ud(?:[89ab][0-9a-f]{2}(?!\\ud[c-f])|[c-f][0-9a-f]{2}(?<!\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}))")


def _lone_surrogate(text: str) -> int | None:
    """The code of the first lone surrogate in ``text``, a JSON document that parsed, or None: one typed raw (a
    body's bytes decode with surrogatepass, as json.loads decodes them) or escaped (``"\\ud800"``), in a key or a
    value. Read on the text, not on the parsed values: re-serialising those took 0.27 s on a 13 MB body of 400,000
    empty messages, where this takes ~15 ms (an ASCII text holds no raw surrogate, one without ``\\u`` no escaped
    one); its cost grows with the escaped surrogates a body holds (~0.1 s for a 13 MB prompt of escaped emoji).
    Outside strings a backslash is a syntax error, so every backslash is in a string, and a run of them pairs up
    from its start: blanking each ``\\\\`` leaves only backslashes that start escapes."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return ord(e.object[e.start])
    if "\\u" not in text:
        return None
    found = _LONE_ESCAPE.search(text.replace("\\\\", "__").lower())
    return int(found.group(0)[2:6], 16) if found else None


def loads_body(raw: bytes | str) -> Any:
    """A request body's JSON, read the same for every route (/api through the app's route class, /v1 through
    :func:`parse`): a key given twice in one object with different values (``{"prompt": "a", "prompt": "b"}``,
    which json.loads settles silently by the last) and a lone surrogate (a ``"\\ud800"`` escape: not text, and
    no UTF-8 answer could echo it) are a BodyError naming them; the same value twice is taken, as on the
    command line."""
    import json

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out and out[k] != v:
                shown = [json.dumps(x, ensure_ascii=True)[:60] for x in (out[k], v)]
                raise BodyError(f"{k!r} is given twice in one object, {shown[0]} and {shown[1]}; give it once", k)
            out[k] = v
        return out

    try:  # bytes decoded as json.loads decodes them (UTF-8, -16 or -32 by their first bytes; surrogates kept)
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
        data = json.loads(text or "null", object_pairs_hook=pairs)
    except BodyError:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BodyError(f"malformed JSON body: {e}") from e
    except ValueError as e:  # Python's own limit on an integer's digits, whose message tells the server's code a fix
        import sys

        raise BodyError(f"malformed JSON body: a number of more than {sys.get_int_max_str_digits()} digits, which "
                        "no field takes") from e
    except RecursionError:  # a body nested ~1000 levels deep: Python's parser gives up, the request is bad
        raise BodyError("malformed JSON body: nested too deeply") from None
    if (code := _lone_surrogate(text)) is not None:
        raise BodyError(f"the body holds an unpaired surrogate (\\u{code:04x}), which is not text: send UTF-8 "
                        "text") from None
    return data


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """The request body -> a validated request; OpenAIError(400) naming the field otherwise."""
    try:
        data = loads_body(raw)
    except BodyError as e:
        raise OpenAIError(400, e.msg, e.param) from e
    if not isinstance(data, dict):
        raise OpenAIError(400, NOT_AN_OBJECT)
    try:
        req = model.model_validate(data)
    except RecursionError:
        raise OpenAIError(400, "malformed JSON body: nested too deeply") from None
    except ValidationError as e:
        errs = e.errors()
        first = errs[0]
        loc = _loc(first)
        msgs = "; ".join(f"{_loc(x)}: {x.get('msg')}" + (f" (got {shown(x['input'])})" if "input" in x and _loc(x) else "")
                         for x in errs[:4])
        raise OpenAIError(400, msgs, loc or None) from e
    req.refuse_unsupported()
    return req


SHOWN_CHARS = 80  # the most of a refused value an error repeats


def shown(value: Any) -> str:
    """A refused value as an error repeats it (every route's validation errors): its repr if that is at most
    ``SHOWN_CHARS``, else its start and its size. Whole, a 3 MB list sent where a string goes came back as a 3 MB
    error message, which the page puts in its status line. The repr is reprlib's, whose work is bounded whatever
    the value's size (the error is written on the event loop)."""
    import reprlib

    short = reprlib.Repr()  # its limits as attributes: Python 3.11's takes no arguments
    short.maxlevel, short.maxdict = 3, 8
    short.maxlist = short.maxtuple = short.maxset = 8
    short.maxstring = short.maxother = SHOWN_CHARS
    text = short.repr(value)
    if "..." not in text and len(text) <= SHOWN_CHARS:  # reprlib's mark of what it left out: none, so it is small
        return repr(value)  # whole, a dict in its own order (reprlib sorts the keys)
    if len(text) > SHOWN_CHARS:
        text = f"{text[:SHOWN_CHARS - 20]}..."
    if isinstance(value, (str, list, dict)):
        n, unit = len(value), "character" if isinstance(value, str) else "item"
        text += f" ({n:,} {unit}{'s' * (n != 1)})"
    return text


def _loc(err: dict) -> str:
    """A pydantic error's field path, without the union-member names pydantic adds (``str``, ``list[int]``)."""
    parts = [str(x) for x in err.get("loc", ()) if not (isinstance(x, str) and ("[" in x or x in ("str", "int")))]
    return ".".join(parts)


FinishReason = Literal["stop", "length"]


def finish_reason(reason: str | None) -> FinishReason:
    """gptforge's reasons (eot, stop, length) in OpenAI's words."""
    return "length" if reason == "length" else "stop"
