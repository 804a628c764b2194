"""The web page and JSON API for talking to a model: FastAPI app, validated requests, a bounded queue.

    gptforge serve --ckpt runs/shakespeare-cpu            # http://127.0.0.1:8000
    curl -s localhost:8000/api/generate -H 'content-type: application/json' \\
         -d '{"prompt": "ROMEO:", "max_new_tokens": 32, "temperature": 0.8, "seed": 1}'

Endpoints: ``GET /`` the page (plain HTML/JS in ``static/index.html``, no build step);
``GET /api/info`` model and limits; ``POST /api/generate`` whole completions; ``POST /api/stream``
the same request answered as server-sent events (``data: {"row", "text"}`` per piece, a final
``{"row", "finished": true, "reason"}`` per row, then ``event: done``); ``GET /api/metrics`` the
run's loss curve from its ``metrics.jsonl``. OpenAI's ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` share the queue and limits (``serve/openai_api.py``). With ``api_key`` every
``/api`` and ``/v1`` request needs ``Authorization: Bearer KEY`` (401 otherwise).

Bad input never reaches the model: malformed JSON -> 400, a value out of range -> 422 naming the
field (sampling ranges from the same ``SamplingParams.check`` the CLI uses), a prompt that does not
fit the context or a ``max_new_tokens`` over the cap -> 400, a body over the size limit -> 413 (counted
on the bytes read, so a chunked body is cut off too), a compressed body -> 415, more waiting requests than
``max_queue`` -> 429 with ``Retry-After``.
One request runs on the model at a time (a lock); the rest wait in a bounded queue, each request read, checked and
tokenized off the event loop first (``serve/gate.py``). A client that hangs up leaves the queue, or stops its
generation at the next token (``serve/limits.py``). How /api reads a body: ``serve/bodies.py``; a trailing slash,
an unknown path, a wrong method and an OPTIONS: ``serve/routing.py``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptforge.run.metrics import finite_number, iter_metrics, whole_step
from gptforge.serve.bodies import ApiModel, BodyRoute, validation_message
from gptforge.serve.gate import ModelGate
from gptforge.serve.limits import BearerAuth, BodyLimit, acquire_unless_gone, prompt_over_limit, watch_disconnect
from gptforge.serve.openai_schema import FIRST_BAD
from gptforge.serve.routing import TrailingSlash, route_miss
from gptforge.serve.sse import collect_rows, sse_response

if TYPE_CHECKING:
    import torch

STATIC = Path(__file__).parent / "static"


@dataclass
class ServeSettings:
    max_new_tokens_cap: int = 512  # per request; bounds time and KV-cache memory
    max_batch: int = 8  # prompts per request
    max_queue: int = 8  # requests waiting for the model before 429
    max_prompt_chars: int = 0  # before tokenizing (the context check comes after); 0: from the context (for_model)
    max_body_bytes: int = 0  # a request's bytes; 0: from max_prompt_chars (for_model)

    def check(self) -> None:
        for k, v in asdict(self).items():
            low = 1 if k in ("max_new_tokens_cap", "max_batch") else 0  # 0: none waiting / derived (for_model)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"--{k.replace('_', '-')} {v}: must be an integer >= {low}")

    def for_model(self, context: int) -> ServeSettings:
        """These settings with the derived limits filled in for a model of ``context`` positions: a prompt or a
        conversation of at most 16 characters a position (a BPE token is ~4: room for any text that can fit,
        while a flood is refused before it is tokenized), at least 20,000; a body of 8 bytes a character (JSON's
        \\uXXXX escapes), at least 1,000,000. A fixed 20,000 refused a long chat with a 128k-context model at
        ~5,000 tokens."""
        chars = self.max_prompt_chars or max(20_000, 16 * context)
        return replace(self, max_prompt_chars=chars, max_body_bytes=self.max_body_bytes or max(1_000_000, 8 * chars))


class GenerateRequest(ApiModel):
    """One prompt (``prompt``) or a batch (``prompts``) and the sampling knobs."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as sent: no "10" -> 10, true -> 1
    prompt: str | None = Field(None, description="the text to continue")
    prompts: Annotated[list[str], FIRST_BAD] | None = Field(None, min_length=1,
                                                           description="several prompts, generated as one batch")
    max_new_tokens: int | None = Field(None, ge=1, description="default: 64 or the server's cap if lower")
    # ranges are checked in one place for the API and the CLI: SamplingParams.check (422 naming the field)
    temperature: float = Field(1.0, description="0 = greedy; finite, >= 0")
    top_k: int = Field(50, description="0 = off; >= 0")
    top_p: float = Field(1.0, description="1 = off; in (0, 1]")
    repetition_penalty: float = Field(1.0, description="1 = off; finite, > 0")
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: Annotated[list[str], FIRST_BAD] = Field(default_factory=list, max_length=8, description="stop sequences")
    stop_at_eot: bool = True


def _error(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status)


def read_loss_curve(path: str | Path | None, max_points: int = 2000) -> dict[str, Any]:
    """{"train": [[step, loss]...], "val": [[step, val_loss]...], "reward": [[step, reward]...] (RL
    steps), "held_out": [[step, acc]...] (RL held-out evaluations)} from metrics.jsonl, thinned to
    max_points."""
    if path is None or not Path(path).exists():
        return {"available": False, "train": [], "val": []}
    # streamed twice (the one metrics reader; a line being appended right now is skipped quietly): once to
    # count each curve's points, once to keep every stride-th, so a million-line file is never held whole
    # a point is a whole step and a finite number, as `gptforge plot` draws them (a hand-edited line's "x" step
    # or 1e999 loss is left off, not a 500)
    curve_of = {"train": ("train", "loss"), "val": ("val", "val_loss"), "rl": ("reward", "reward")}

    def points():
        recipe = None
        for rec in iter_metrics(path, warn=lambda _msg: None):
            kind, step = rec.get("kind"), rec.get("step")
            if kind == "start":
                recipe = rec.get("recipe")
                continue
            if kind == "eval" and recipe == "grpo":
                curve, key = "held_out", "acc"
            elif kind in curve_of:
                curve, key = curve_of[kind]
            else:
                continue
            if whole_step(step) is not None and key in rec:
                yield curve, [step, finite_number(rec[key])]

    counts = dict.fromkeys(("train", "val", "reward", "held_out"), 0)
    for curve, _ in points():
        counts[curve] += 1
    stride = {k: max(1, math.ceil(n / max_points)) for k, n in counts.items()}
    curves: dict[str, list] = {k: [] for k in counts}
    seen = dict.fromkeys(counts, 0)
    for curve, point in points():
        if seen[curve] % stride[curve] == 0 and len(curves[curve]) < max_points and point[1] is not None:
            curves[curve].append(point)
        seen[curve] += 1
    from gptforge.serve.describe import readable

    return {"available": True, "path": readable(str(path)), **curves}


def create_app(model: torch.nn.Module, enc: Any = None, settings: ServeSettings | None = None,
               metrics_path: str | Path | None = None, served: dict | None = None,
               chat_template: dict | None = None, api_key: str | None = None, access_log: bool = False) -> FastAPI:
    """The FastAPI app around one loaded model (tests build it directly and call it in-process).
    ``access_log``: a line per request on stderr (``gptforge serve`` turns it on).
    ``served``: what is served, from :func:`gptforge.serve.describe.describe_served`.
    ``chat_template``: the checkpoint's chat template (the page's chat mode, /api/chat, /v1/chat).
    ``api_key``: required as a Bearer token on /api and /v1 when given."""
    from gptforge.generation import PromptError, SamplingParams, fit_new_tokens, stream_text

    if enc is None:  # the model's tokenizer (gptforge serve passes it); GPT-2's when nothing says
        from gptforge.data.tokenizer import gpt2_tokenizer

        enc = gpt2_tokenizer()
    from gptforge.data.chat import ChatTokenizer, plain_tokenizer, template_from_dict

    # the chat template is read once, here, against the model's vocabulary; /api/chat and /v1 get the parsed one
    plain, chat = plain_tokenizer(enc), None
    if chat_template:  # a chat model may emit its role/end ids, which the plain tokenizer cannot decode
        chat = template_from_dict(chat_template, vocab_size=model.config.vocab_size, tok=plain)
        enc = ChatTokenizer(plain, chat)
    from gptforge.serve.describe import readable

    served = readable(served)  # paths shown to clients (/api/info, /v1's model name) as text, whatever their bytes
    settings = settings or ServeSettings()
    settings.check()
    settings = settings.for_model(model.config.block_size)
    gate = ModelGate(settings.max_queue)
    app = FastAPI(title="gptforge", description="Talk to a gptforge model.")
    app.router.route_class = BodyRoute  # the /api routes read their JSON as /v1 does (openai_schema.loads_body)
    app.state.gate = gate  # where BodyRoute's requests find it

    # innermost: the access log, the key check and the body limit see the path sent; the router never sees a
    # trailing slash, so its empty 307 to the path without one is never answered
    app.add_middleware(TrailingSlash)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)  # on the bytes read, chunked too
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)  # outermost: nothing is read before the key is checked
    if access_log:  # outside the key check: a refused request is logged too
        from gptforge.serve.access_log import AccessLog

        app.add_middleware(AccessLog)

    # Route and handler bodies are plain closures, the decorated functions one-line calls of them: mutmut
    # (scripts/mutation.sh) skips decorated functions, so a body under a decorator is never mutation-tested.
    def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Every HTTPException in the family's shape: the routes' own, and the framework's (an unknown path,
        a wrong method, a body FastAPI could not decode), which would otherwise answer ``{"detail": ...}``."""
        message, near, headers = str(exc.detail), None, dict(exc.headers or {})
        if exc.status_code in (404, 405) and not isinstance(exc, HTTPException):
            message, near = route_miss(request.method, request.url.path, exc.status_code, message, headers,
                                       app.routes)
        elif isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "There was an error parsing the body"
            message = f"malformed JSON body: the body is not UTF-8 text ({exc.__cause__})"
        response = family_error(request, exc.status_code, message, v1=bool(near and near.startswith("/v1")) or None)
        response.headers.update(headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        return _error(*validation_message(exc))

    @app.exception_handler(StarletteHTTPException)  # FastAPI's HTTPException is one, and so are the framework's
    async def on_http(request: Request, exc: StarletteHTTPException):
        return http_error(request, exc)

    # The one error boundary of every route (/api, /v1, the page), in each family's shape: what the client
    # sent that the model's template or tokenizer cannot take is a 400; anything else a 500 whose id is in
    # the server log beside the traceback (Starlette re-raises it after the answer is sent).
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.errors import ChatFormatError

    def family_error(request: Request, status: int, message: str, param: str | None = None, v1: bool | None = None):
        """The error in the shape of the request's family (``v1``: OpenAI's whatever the path, for a path that
        was meant as a /v1 route)."""
        if v1 or (v1 is None and request.url.path.startswith("/v1")):
            from gptforge.serve.openai_schema import OpenAIError

            return OpenAIError(status, message, param).response()
        return _error(status, message)

    def unrenderable(request: Request, exc: Exception):
        field = "prompt" if request.url.path.startswith("/v1/completions") else "messages"  # the field it came in
        return family_error(request, 400, f"the model's chat template or tokenizer cannot take this input: {exc}",
                            field)

    def crash(request: Request, exc: Exception):
        import logging
        import uuid

        rid = uuid.uuid4().hex[:12]
        logging.getLogger("gptforge.serve").error("error %s on %s %s: %r", rid, request.method, request.url.path, exc)
        return family_error(request, 500, f"internal error {rid} (the server log has its traceback)")

    @app.exception_handler(ChatFormatError)
    @app.exception_handler(TokenizerError)
    async def on_unrenderable(request: Request, exc: Exception):
        return unrenderable(request, exc)

    @app.exception_handler(Exception)
    async def on_crash(request: Request, exc: Exception):
        return crash(request, exc)

    def prepare(req: GenerateRequest) -> tuple[list[list[int]], SamplingParams]:
        if (req.prompt is None) == (req.prompts is None):
            raise HTTPException(400, "give exactly one of prompt (a string) or prompts (a list of strings)")
        prompts = [req.prompt] if req.prompt is not None else list(req.prompts or [])
        if len(prompts) > settings.max_batch:
            raise HTTPException(400, f"prompts: {len(prompts)} prompts; this server takes at most {settings.max_batch}")
        n_new = req.max_new_tokens if req.max_new_tokens is not None else min(64, settings.max_new_tokens_cap)
        if n_new > settings.max_new_tokens_cap:
            raise HTTPException(400, f"max_new_tokens={n_new} is over this server's cap of {settings.max_new_tokens_cap}")
        for i, p in enumerate(prompts):
            if over := prompt_over_limit("prompt" if req.prompt is not None else f"prompts.{i}", p,
                                         settings.max_prompt_chars):
                raise HTTPException(400, over)
        if any(not s for s in req.stop):
            raise HTTPException(400, "stop: stop sequences must be non-empty strings")
        ids = [enc.encode(p, allowed_special={"<|endoftext|>"}) or [enc.eot_token] for p in prompts]
        try:  # the default shrinks to the room the context leaves; an explicit value must fit
            n_new = fit_new_tokens(ids, model.config, req.max_new_tokens, n_new)
        except PromptError as e:
            raise HTTPException(400, str(e)) from None
        params = SamplingParams(max_new_tokens=n_new, temperature=req.temperature, top_k=req.top_k,
                                top_p=req.top_p, repetition_penalty=req.repetition_penalty, seed=req.seed,
                                stop=tuple(req.stop), stop_token=enc.eot_token if req.stop_at_eot else None)
        try:
            params.check()
        except ValueError as e:
            raise HTTPException(422, str(e)) from e
        return ids, params

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    def describe() -> dict:
        from gptforge.serve.describe import describe_served, model_fields

        return {"model": model_fields(model.config), "parameters": model.num_parameters(),
                "tokenizer": tokenizer_fields(plain), "served": served or describe_served(model),
                "limits": asdict(settings), "queue": {"waiting": gate.waiting}}

    @app.get("/api/info")
    async def info():
        return describe()

    @app.get("/api/metrics")
    async def metrics():
        return await run_in_threadpool(read_loss_curve, metrics_path)

    async def run_generate(req: GenerateRequest, request: Request):
        ids, params = await gate.prepare(prepare, req)  # tokenizing: off the event loop
        # A client that hangs up leaves the queue, or stops its generation at the next token.
        gone, watcher = watch_disconnect(request)
        try:
            if not await acquire_unless_gone(gate, gone):
                return _error(499, "client closed the request")
            try:
                texts, reasons, _ = await collect_rows(stream_text(model, enc, ids, params), len(ids), gone)
            finally:
                gate.release()
        finally:
            watcher.cancel()
        if gone.is_set():
            return _error(499, "client closed the request")  # nobody is there to read it
        return {"completions": [{"text": t, "finish_reason": r} for t, r in zip(texts, reasons, strict=True)]}

    @app.post("/api/generate")
    async def generate(req: GenerateRequest, request: Request):
        return await run_generate(req, request)

    async def run_stream(req: GenerateRequest, request: Request):
        ids, params = await gate.prepare(prepare, req)
        gone, watcher = watch_disconnect(request)  # only while queued: the response watches afterwards
        try:
            if not await acquire_unless_gone(gate, gone):  # before the response starts: a real 429
                return _error(499, "client closed the request")
        finally:
            watcher.cancel()
        return sse_response(stream_text(model, enc, ids, params), gate, producers)

    @app.post("/api/stream")
    async def stream(req: GenerateRequest, request: Request):
        return await run_stream(req, request)

    producers: set[asyncio.Task] = set()  # strong references, so running producers are not collected

    from gptforge.serve.chat import add_chat_routes  # chat mode: /api/chat, /api/chat/info

    add_chat_routes(app, model, plain, chat, settings, gate)
    from gptforge.serve.openai_api import add_openai_routes  # /v1/models, /v1/completions, /v1/chat/completions

    add_openai_routes(app, model, plain, chat, settings, gate, served)
    return app


class PortBusy(OSError):
    """The address ``serve`` was asked to listen on is taken (or not this machine's)."""


def bind_port(host: str, port: int):
    """A listening socket on ``host:port``, bound before the model loads and before the URL is printed, so
    a busy port is one line, not a URL and then uvicorn's ``[Errno 98]``. SO_REUSEADDR as uvicorn sets it
    (a port in TIME_WAIT is free)."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise PortBusy(f"cannot listen on {host}:{port}: {e.strerror or e}; check --host") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        import errno

        if e.errno == errno.EADDRINUSE:
            raise PortBusy(f"port {port} on {host} is already in use (another gptforge serve?): stop that "
                           f"server or pass --port {port + 1} (--port 0: any free port)") from e
        raise PortBusy(f"cannot listen on {host}:{port}: {e.strerror or e}; check --host and --port") from e
    return sock


def tokenizer_fields(tok: Any) -> dict:
    """The served model's own tokenizer for /api/info: name, vocabulary size and its special ids."""
    from gptforge.serve.describe import readable

    return {"name": readable(getattr(tok, "name", None)), "n_vocab": tok.n_vocab, "eot": tok.eot_token,
            "bos": getattr(tok, "bos_token_id", None), "eos": getattr(tok, "eos_token_id", None)}


def run_server(model: torch.nn.Module, settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
               metrics_path: str | Path | None = None, served: dict | None = None,
               chat_template: dict | None = None, api_key: str | None = None, enc: Any = None,
               sock: Any = None) -> None:
    """Serve until Ctrl-C on ``sock`` (from :func:`bind_port`; bound here when not given). The URL printed
    names the port the socket holds (port 0: the free one the system picked)."""
    import uvicorn

    sock = sock if sock is not None else bind_port(host, port)
    port = sock.getsockname()[1]  # the port bound: the system's pick for --port 0
    app = create_app(model, enc, settings=settings, metrics_path=metrics_path, served=served,
                     chat_template=chat_template, api_key=api_key, access_log=True)
    print(f"gptforge serve: http://{host}:{port}/  (JSON API under /api, OpenAI's under /v1, schema at /docs"
          f"{'; Bearer key required: open the page as /#key=KEY' if api_key else ''}; Ctrl-C stops)", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
