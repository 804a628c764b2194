"""Chat mode of the served page: ``POST /api/chat`` (messages in, the assistant's reply streamed as
server-sent events) and ``GET /api/chat/info`` (whether the model has a chat template).

    curl -sN localhost:8000/api/chat -H 'content-type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "What is 2 + 3?"}], "temperature": 0}'

The stream has the format of ``/api/stream`` with one row: ``data: {"row": 0, "text"}`` pieces, a
final ``{"finished": true, "reason"}``, then ``event: done``. The reply ends at the template's
``<|end|>``. Requests share the app's gate (one on the model at a time, a bounded queue).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from gptforge.data.chat import ChatTokenizer
from gptforge.serve.bodies import ApiModel
from gptforge.serve.limits import (
    acquire_unless_gone,
    bounded_messages,
    message_bound,
    messages_over_limit,
    watch_disconnect,
)
from gptforge.serve.sse import sse_response

# what a conversation that leaves the model no room to reply is told to do: the page keeps the conversation and drops
# the refused message, so a shorter message can fit, or Clear starts a new conversation
SHORTEN_CHAT = "shorten the message, or start a new conversation"


class Message(ApiModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as sent: no "10" -> 10, true -> 1
    role: Literal["system", "user", "assistant"]
    content: str  # the conversation's length: max_prompt_chars (limits.messages_over_limit), as in /v1


class ChatRequest(ApiModel):
    """The conversation so far (the reply continues it as the assistant) and the sampling knobs."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as sent: no "10" -> 10, true -> 1
    # as many as fit: max_prompt_chars, then the context, as in /v1; add_chat_routes bounds the count by what the
    # template spends on each message (limits.message_bound)
    messages: list[Message] = Field(min_length=1)
    max_new_tokens: int | None = Field(None, ge=1, description="default: 128 or the server's cap if lower")
    temperature: float = Field(0.7, ge=0, le=100, allow_inf_nan=False, description="0 = greedy")
    top_k: int = Field(50, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="1 = off")
    repetition_penalty: float = Field(1.0, gt=0, le=100, allow_inf_nan=False, description="1 = off")
    seed: int | None = Field(None, ge=0, lt=2**63)


def add_chat_routes(app: FastAPI, model: Any, enc: Any, chat: Any, settings: Any, gate: Any) -> None:
    """Register the chat endpoints on ``app`` (``enc``: the plain tokenizer; ``chat``: the template create_app
    read and checked, or None; ``gate``: the app's ModelGate)."""
    from gptforge.generation import PromptError, SamplingParams, fit_new_tokens, stream_text

    cenc = ChatTokenizer(enc, chat) if chat else None
    producers: set[asyncio.Task] = set()
    # the request as the route reads it: at most as many messages as the template can fit in the context, counted
    # before any message is validated (FastAPI validates it on the event loop), as /v1/chat/completions counts them
    bounded = bounded_messages(ChatRequest, Message, message_bound(chat, enc, model.config.block_size))

    # the handlers' work sits in plain closures: mutmut (issue 36) does not mutate decorated functions
    def info() -> dict:
        return {"available": chat is not None, "template": chat.to_dict() if chat else None}

    def prepare(req: ChatRequest) -> tuple[list[int], SamplingParams]:
        """The request's prompt ids and sampling parameters, or an HTTPException (400) saying why not."""
        if chat is None:
            raise HTTPException(400, "this model has no chat template (fine-tune it with `gptforge sft`); "
                                     "use /api/stream to continue text")
        n_new = req.max_new_tokens if req.max_new_tokens is not None else min(128, settings.max_new_tokens_cap)
        if n_new > settings.max_new_tokens_cap:
            raise HTTPException(400, f"max_new_tokens={n_new} is over this server's cap of {settings.max_new_tokens_cap}")
        if over := messages_over_limit([m.content for m in req.messages], settings.max_prompt_chars):
            raise HTTPException(400, over)
        ids = chat.render_for_generation([m.model_dump() for m in req.messages], enc)
        try:  # the default shrinks to the room the context leaves; an explicit value must fit
            n_new = fit_new_tokens([ids], model.config, req.max_new_tokens, n_new, shorten=SHORTEN_CHAT)
        except PromptError as e:  # its own advice, in a chat's words: a second appended here doubled it
            raise HTTPException(400, str(e)) from None
        return ids, SamplingParams(max_new_tokens=n_new, temperature=req.temperature, top_k=req.top_k,
                                   top_p=req.top_p, repetition_penalty=req.repetition_penalty, seed=req.seed,
                                   stop_token=chat.end)

    @app.get("/api/chat/info")
    async def chat_info():
        return info()

    async def chat_stream(req: ChatRequest, request: Request):
        ids, params = await gate.prepare(prepare, req)  # rendering: off the event loop
        gone, watcher = watch_disconnect(request)  # a client that hangs up while queued leaves the queue
        try:
            if not await acquire_unless_gone(gate, gone):
                return JSONResponse({"error": "client closed the request"}, status_code=499)
        finally:
            watcher.cancel()
        return sse_response(stream_text(model, cenc, [ids], params), gate, producers)

    chat_stream.__annotations__["req"] = bounded  # the class itself: this module's annotations are strings
    app.post("/api/chat")(chat_stream)
