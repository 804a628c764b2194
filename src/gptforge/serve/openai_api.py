"""OpenAI-compatible endpoints of ``gptforge serve``, on the same queue and limits as the native API.

    gptforge serve --ckpt runs/chat-sft        # then, with the official client:
    python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='-');
               print(c.chat.completions.create(model='x', messages=[{'role': 'user', 'content': 'Hi'}]))"

``GET /v1/models``; ``POST /v1/completions`` (text continuation, any model); ``POST
/v1/chat/completions`` (the checkpoint's chat template; a base model without one gets a 400). Both
take ``max_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``, ``stream`` (OpenAI's chunks,
``stream_options.include_usage``, then ``data: [DONE]``) and answer ``usage`` counts. ``logprobs``
(not streamed) are the model's own log-probabilities of the chosen tokens, before temperature and
top-p, as vLLM reports them by default: one extra forward pass per reply, while the request still
holds the model. Completions take ``echo`` (the prompt comes back in front of the text, and with
``logprobs`` the prompt's tokens are scored too; ``max_tokens: 0`` scores without generating), which
is how evaluation harnesses (lm-evaluation-harness's ``local-completions``) ask for log-likelihoods. ``model`` is not checked: the server serves one model (``/v1/models`` names it).

A ``max_tokens`` left out is clamped to what fits the context (and the server's cap); an explicit one
that cannot fit is a 400 ``context_length_exceeded``. Errors are OpenAI's error object.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from gptforge.serve.limits import (
    acquire_unless_gone,
    bounded_messages,
    message_bound,
    messages_over_limit,
    prompt_over_limit,
    watch_disconnect,
)
from gptforge.serve.openai_schema import ChatMessage, ChatRequest, CompletionRequest, OpenAIError, finish_reason, parse
from gptforge.serve.sse import collect_rows, sse_response


def model_id(served: dict | None) -> str:
    """The name ``/v1/models`` lists: the run directory's (or weights') name, else ``gptforge``."""
    served = served or {}
    where = served.get("run_dir") or served.get("path")
    if where and served.get("source") != "random":
        return Path(str(where)).name or "gptforge"
    return "gptforge"


def add_openai_routes(app: FastAPI, model: Any, enc: Any, chat: Any, settings: Any, gate: Any,
                      served: dict | None = None) -> None:
    """Register ``/v1/...`` on ``app`` (``enc``: the plain tokenizer; ``chat``: the template create_app read and
    checked, or None; ``gate``: the app's ModelGate; ``settings``: its ServeSettings)."""
    from gptforge.data.chat import ChatTokenizer
    from gptforge.generation import SamplingParams, stream_text

    chat_enc = ChatTokenizer(enc, chat) if chat else None
    block, vocab = model.config.block_size, model.config.vocab_size
    name, created = model_id(served), int(time.time())
    producers: set = set()
    # the chat request as this model takes it: at most as many messages as the template can fit in its context,
    # counted before any message is validated, as /api/chat counts them
    chat_request = bounded_messages(ChatRequest, ChatMessage, message_bound(chat, enc, block))

    @app.exception_handler(OpenAIError)
    async def on_openai_error(request: Request, exc: OpenAIError):
        return exc.response()

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_card(name, created, block)]}

    def model_card(model_name: str) -> dict[str, Any]:
        if model_name != name:
            raise OpenAIError(404, f"The model `{model_name}` does not exist (this server serves `{name}`)",
                              "model", "model_not_found")
        return _card(name, created, block)

    @app.get("/v1/models/{model_name:path}")
    async def get_model(model_name: str):
        return model_card(model_name)

    def sampling(req: Any, prompt_ids: list[list[int]], max_tokens: int | None, stop_token: int,
                 default_new: int, length_field: str = "max_tokens") -> SamplingParams:
        """The request's knobs checked against the server's limits and the model's context, and every
        prompt id against its vocabulary. ``length_field``: the field ``max_tokens`` came in (a chat request's
        ``max_completion_tokens``), which a refusal of the length names."""
        in_vocab(req, prompt_ids)
        check_batch(req, len(prompt_ids))
        longest = max(len(r) for r in prompt_ids)
        if max_tokens is not None and max_tokens > settings.max_new_tokens_cap:
            raise OpenAIError(400, f"{length_field}={max_tokens} is over this server's cap of "
                                   f"{settings.max_new_tokens_cap}", length_field)
        room = block - longest
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = max_tokens if max_tokens is not None else 1
            raise OpenAIError(400, f"This model's maximum context length is {block} tokens. However, you requested "
                                   f"{longest + asked} tokens ({longest} in the prompt, {asked} in the completion). "
                                   "Please reduce the prompt or the completion length.",
                              length_field if room >= 1 else ("messages" if chat_route(req) else "prompt"),
                              "context_length_exceeded")
        n_new = max_tokens if max_tokens is not None else min(default_new, settings.max_new_tokens_cap, room)
        top_k = req.top_k if req.top_k is not None and req.top_k > 0 else None
        p = SamplingParams(max_new_tokens=n_new, temperature=1.0 if req.temperature is None else req.temperature,
                           top_k=top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty or 1.0,
                           seed=req.seed, stop=tuple(req.stops()), stop_token=stop_token)
        try:
            p.check()
        except ValueError as e:  # ranges the schema did not already cover
            raise OpenAIError(400, str(e), str(e).split("=")[0].split(":")[0]) from e
        return p

    def check_batch(req: Any, n_prompts: int) -> None:
        """The refusal of more replies than the server's batch limit (prompts x ``n``), naming the field the client
        sent that asked for them: ``n`` for one prompt, ``prompt`` for a list of prompts with one reply each, both
        for both (param ``n``, which the client can lower without changing its prompts)."""
        if n_prompts * req.n <= settings.max_batch:
            return
        over = f"is over this server's batch limit of {settings.max_batch}"
        if req.n == 1:
            raise OpenAIError(400, f"prompt: {n_prompts} prompts {over} (send them in several requests)", "prompt")
        if n_prompts == 1:
            raise OpenAIError(400, f"n: {req.n} replies {over}", "n")
        raise OpenAIError(400, f"prompt and n: {n_prompts} prompts x n={req.n} = {n_prompts * req.n} replies {over}",
                          "n")

    def in_vocab(req: Any, prompt_ids: list[list[int]]) -> None:
        """A text prompt's ids too: a model smaller than the tokenizer (weights of unknown origin served
        with GPT-2's BPE) would otherwise index past its embedding."""
        for i, row in enumerate(prompt_ids):
            if (bad := max(row, default=0)) >= vocab:
                field = "messages" if chat_route(req) else "prompt"
                raise OpenAIError(400, f"{field}: prompt {i} tokenizes to id {bad}, outside this model's vocabulary "
                                       f"of {vocab} (the text is not in the model's tokenizer)", field)

    def chat_route(req: Any) -> bool:
        return isinstance(req, ChatRequest)

    async def run(request: Request, kind: str, req: Any, prompt_ids: list[list[int]], params: SamplingParams | None,
                  tok: Any, logprobs: int | None, echo: list[str] | None = None):
        rows = [ids for ids in prompt_ids for _ in range(req.n)]
        usage_prompt = sum(len(r) for r in prompt_ids)
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        gone, watcher = watch_disconnect(request)  # a client that hangs up leaves the queue / stops generating
        try:
            try:
                ok = await acquire_unless_gone(gate, gone)
            except HTTPException as e:  # the gate's 429
                raise OpenAIError(e.status_code, str(e.detail), None, "server_busy", e.headers) from e
            if not ok:
                raise OpenAIError(499, "client closed the request")
            it = stream_text(model, tok, rows, params) if params is not None else (e for e in ())  # max_tokens 0
            if req.stream:  # the response watches the client from here on
                fmt = _ChunkWriter(kind, rid, name, usage_prompt,
                                   bool(req.stream_options and req.stream_options.include_usage))
                return sse_response(it, gate, producers, event=fmt.event, error=fmt.error, end=fmt.end)
            return await finish(it, kind, rid, rows, params, tok, logprobs, usage_prompt, gone, echo)
        finally:
            watcher.cancel()

    async def finish(it: Any, kind: str, rid: str, rows: list[list[int]], params: SamplingParams | None, tok: Any,
                     logprobs: int | None, usage_prompt: int, gone: Any, echo: list[str] | None) -> dict[str, Any]:
        """A whole (non-streamed) answer; releases the gate. ``echo``: each prompt's text, put back in
        front of its replies (and its tokens scored when ``logprobs``)."""
        try:
            texts, reasons, tokens = await collect_rows(it, len(rows), gone)
            if gone.is_set():
                raise OpenAIError(499, "client closed the request")
            lps = None
            if logprobs is not None:
                stop = params.stop_token if params is not None else None
                gen = [[t for t in ts if t != stop] for ts in tokens]
                lps = await run_in_threadpool(token_logprobs, model, rows, gen, logprobs, echo is not None)
        except OpenAIError:
            raise
        except Exception as e:  # e.g. out of memory: tell the client, keep serving
            raise OpenAIError(500, f"generation failed: {e}") from e
        finally:
            gate.release()
        choices = []
        n_per = len(rows) // max(1, len(echo or rows))
        for i, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            c: dict[str, Any] = {"index": i, "finish_reason": finish_reason(reason or "length"), "logprobs": None}
            if echo is not None:
                text = echo[i // n_per] + text
            if kind == "chat":
                c["message"] = {"role": "assistant", "content": text}
                if lps is not None:
                    c["logprobs"] = _chat_logprobs(lps[i], tok)
            else:
                c["text"] = text
                if lps is not None:
                    c["logprobs"] = _completion_logprobs(lps[i], tok, logprobs)
            choices.append(c)
        n_out = sum(len(t) for t in tokens)
        return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()), "model": name, "choices": choices,
                "usage": {"prompt_tokens": usage_prompt, "completion_tokens": n_out,
                          "total_tokens": usage_prompt + n_out}}

    # The route bodies are plain closures and the decorated routes one-line calls of them: mutmut
    # (scripts/mutation.sh) skips decorated functions, so a body under a decorator is never mutation-tested.
    # What a request costs before it waits for the model (its JSON read and validated, its messages rendered, its
    # prompts tokenized: seconds for the 16 MB a 128k-context model's body limit lets in) is the gate's to run
    # (prepare_text, prepare_chat in ModelGate.prepare): off the event loop, a bounded number at once.
    def prepare_text(raw: bytes) -> tuple[CompletionRequest, list[list[int]], SamplingParams | None, Any,
                                          list[str] | None]:
        req: CompletionRequest = parse(CompletionRequest, raw)
        prompts = _prompts(req.prompt)
        check_batch(req, len(prompts))  # before any prompt is tokenized
        ids = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if over := prompt_over_limit("prompt" if isinstance(req.prompt, str) else f"prompt.{i}", p,
                                             settings.max_prompt_chars):
                    raise OpenAIError(400, over, "prompt")
                ids.append(enc.encode(p, allowed_special={"<|endoftext|>"}) or [enc.eot_token])
            else:
                if not p or any(not 0 <= t < vocab for t in p):
                    raise OpenAIError(400, f"prompt {i}: token ids must be a non-empty list in [0, {vocab})", "prompt")
                ids.append(list(p))
        if req.stream and req.logprobs is not None:
            raise OpenAIError(400, "logprobs: not available with stream=true on this server", "logprobs")
        tok = chat_enc or enc
        echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts] if req.echo else None
        if req.max_tokens == 0:  # echo only: score the prompts, generate nothing
            in_vocab(req, ids)
            if (longest := max(len(r) for r in ids)) > block:
                raise OpenAIError(400, f"This model's maximum context length is {block} tokens. However, you "
                                       f"requested {longest} tokens in the prompt.", "prompt", "context_length_exceeded")
            return req, ids, None, tok, echo
        params = sampling(req, ids, req.max_tokens, enc.eot_token, default_new=16)  # OpenAI's default: 16
        return req, ids, params, tok, echo

    async def complete_text(request: Request):
        req, ids, params, tok, echo = await gate.prepare(prepare_text, await _body(request))
        return await run(request, "text", req, ids, params, tok, req.logprobs, echo)

    def prepare_chat(raw: bytes) -> tuple[ChatRequest, list[list[int]], SamplingParams]:
        req: ChatRequest = parse(chat_request, raw)
        if chat is None:
            raise OpenAIError(400, "this model has no chat template (it is a base model; fine-tune it with "
                                   "`gptforge sft`); use /v1/completions to continue text", "messages",
                              "no_chat_template")
        conv = req.conversation()
        if over := messages_over_limit([m["content"] for m in conv], settings.max_prompt_chars):
            raise OpenAIError(400, over, "messages")
        if req.stream and req.logprobs:
            raise OpenAIError(400, "logprobs: not available with stream=true on this server", "logprobs")
        ids = [chat.render_for_generation(conv, enc)]
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"  # it wins
        params = sampling(req, ids, getattr(req, field), chat.end, default_new=settings.max_new_tokens_cap,
                          length_field=field)
        return req, ids, params

    async def complete_chat(request: Request):
        req, ids, params = await gate.prepare(prepare_chat, await _body(request))
        return await run(request, "chat", req, ids, params, chat_enc, (req.top_logprobs or 0) if req.logprobs else None)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete_text(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete_chat(request)


async def _body(request: Request) -> bytes:
    try:
        return await request.body()
    except HTTPException as e:  # the body limit, counted while reading
        raise OpenAIError(e.status_code, str(e.detail)) from e


def _prompts(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        return [prompt]  # one prompt as token ids
    if not prompt:
        raise OpenAIError(400, "prompt: must not be empty", "prompt")
    return list(prompt)


def _card(name: str, created: int, block: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "gptforge", "max_model_len": block}




@torch.no_grad()
def token_logprobs(model: Any, prompts: list[list[int]], gen: list[list[int]], top: int,
                   echo: bool = False) -> list[list[tuple]]:
    """Per row, per generated token (and per prompt token with ``echo``): (id, log p(id | prefix),
    [(id, log p)] top alternatives), from one forward pass over prompt + reply (the raw model
    distribution). With ``echo`` the first prompt token has no prefix: (id, None, None)."""
    device = model.lm_head.weight.device
    out = []
    for p, g in zip(prompts, gen, strict=True):
        scored = (p[1:] + g) if echo else g  # the tokens that get a log-probability
        if not scored:
            out.append([(p[0], None, None)] if echo else [])
            continue
        ids = torch.tensor([(p + g)[:-1]], device=device)
        logits, _ = model(ids, logits_to_keep=len(scored))
        lp = torch.log_softmax(logits[0].float(), dim=-1)  # (len(scored), V)
        chosen = lp.gather(1, torch.tensor(scored, device=device)[:, None])[:, 0].tolist()
        tops = lp.topk(top, dim=-1) if top else None
        row = [(t, c, list(zip(tops.indices[j].tolist(), tops.values[j].tolist(), strict=True)) if tops else [])
               for j, (t, c) in enumerate(zip(scored, chosen, strict=True))]
        out.append(([(p[0], None, None)] if echo else []) + row)
    return out


def _piece(tok: Any, i: int) -> str:  # every id the model can emit prints (an unused padded row as <|id|>)
    return tok.token_bytes(i).decode("utf-8", "replace")


def _completion_logprobs(rows: list[tuple], tok: Any, top: int) -> dict[str, Any]:
    texts = [_piece(tok, t) for t, _, _ in rows]
    offsets, at = [], 0
    for s in texts:
        offsets.append(at)
        at += len(s)
    return {"tokens": texts, "token_logprobs": [c for _, c, _ in rows],
            "top_logprobs": [None if alts is None else {_piece(tok, i): v for i, v in alts} for _, _, alts in rows]
            if top else None, "text_offset": offsets}


def _chat_logprobs(rows: list[tuple], tok: Any) -> dict[str, Any]:
    def entry(i: int, v: float) -> dict[str, Any]:
        return {"token": _piece(tok, i), "logprob": v, "bytes": list(tok.token_bytes(i))}

    return {"content": [{**entry(t, c), "top_logprobs": [entry(i, v) for i, v in alts]} for t, c, alts in rows]}


class _ChunkWriter:
    """Generation events -> OpenAI's SSE chunks (``chat.completion.chunk`` or ``text_completion``)."""

    def __init__(self, kind: str, rid: str, model: str, prompt_tokens: int, include_usage: bool):
        self.kind, self.rid, self.model = kind, rid, model
        self.prompt_tokens, self.include_usage = prompt_tokens, include_usage
        self.created = int(time.time())
        self.started: set[int] = set()
        self.n_out = 0

    def _chunk(self, choices: list[dict]) -> str:
        body: dict[str, Any] = {"id": self.rid, "object": "chat.completion.chunk" if self.kind == "chat"
                                else "text_completion", "created": self.created, "model": self.model,
                                "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    def event(self, ev: Any) -> str:
        self.n_out += len(ev.tokens)
        reason = finish_reason(ev.reason) if ev.finished else None
        if self.kind != "chat":
            return self._chunk([{"index": ev.row, "text": ev.text, "logprobs": None, "finish_reason": reason}])
        out = []
        if ev.row not in self.started:  # the first chunk of a choice carries the role
            self.started.add(ev.row)
            out.append(self._chunk([_delta(ev.row, {"role": "assistant", "content": ""}, None)]))
        if ev.text:
            out.append(self._chunk([_delta(ev.row, {"content": ev.text}, None)]))
        if reason:
            out.append(self._chunk([_delta(ev.row, {}, reason)]))
        return "".join(out)

    def error(self, e: Exception) -> str:
        return f"data: {json.dumps(OpenAIError(500, f'generation failed: {e}').body())}\n\n"

    def end(self) -> str:
        tail = ""
        if self.include_usage:
            usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.n_out,
                     "total_tokens": self.prompt_tokens + self.n_out}
            body = {"id": self.rid, "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
                    "created": self.created, "model": self.model, "choices": [], "usage": usage}
            tail = f"data: {json.dumps(body)}\n\n"
        return tail + "data: [DONE]\n\n"


def _delta(i: int, delta: dict, reason: str | None) -> dict[str, Any]:
    return {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason}

