"""The bodies of the /api and /v1 routes and error handlers against expectations written here (issue 36):
``create_app``'s ``describe`` (/api/info), ``http_error``, ``unrenderable``, ``crash``, ``run_generate`` and
``run_stream`` (the 499 on a hang-up, the 429 of a full queue, the queue count), and ``add_openai_routes``'
``model_card``, ``complete_text`` and ``complete_chat`` (every refusal word for word, with its field and
code; the edges of the limits; echo).

A client that hangs up cannot read its 499, so the hang-ups are driven through the ASGI interface itself:
the request's body, then ``http.disconnect`` when the test says, and the answer the app sent, read back.
Generation is held step by step (``stream_text`` wrapped to wait for the test), so "the model is busy",
"one request waiting" and "left after one token" are states the test sets up, not timing guesses.

The model answers "!" (GPT-2's id 0) greedily whatever the prompt (ln_f's output is its bias alone, and
that token's row of the tied embedding points along it), so a reply of n tokens is "!" n times."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge import generation  # noqa: E402
from gptforge.data.tokenizer import TokenizerError  # noqa: E402
from gptforge.errors import ChatFormatError  # noqa: E402
from gptforge.models.gpt2 import GPT  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402

CLOSED = "client closed the request"
BUSY = "server busy: 1 requests already queued; retry shortly"


def _model(**kw) -> GPT:
    return answering_model(32, **kw)


def _settings(**kw) -> ServeSettings:
    return ServeSettings(**{"max_new_tokens_cap": 16, "max_batch": 4, "max_queue": 1, "max_prompt_chars": 10,
                            "max_body_bytes": 5000, **kw})


def _client(tokenizer, model=None, chat: bool = True, **settings) -> TestClient:
    return TestClient(create_app(model if model is not None else _model(), tokenizer, _settings(**settings),
                                 chat_template=T.to_dict() if chat else None))


def _oa(status_type: str, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": status_type, "param": param, "code": code}}


# ---------------------------------------------------------------- /api/info (describe)
def test_api_info_written_out(tokenizer):
    m = _model()
    # GPT-2 with biases: wte (tied with the head; the 50,261 ids padded to 50,304 rows) + wpe + per layer
    # 12 d^2 + 13 d + ln_f's 2 d
    d, n_params = 32, 50304 * 32 + 32 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32
    assert sum(p.numel() for p in m.parameters()) == n_params
    limits = {"max_new_tokens_cap": 16, "max_batch": 4, "max_queue": 1, "max_prompt_chars": 10,
              "max_body_bytes": 5000}
    with TestClient(create_app(m, tokenizer, _settings())) as c:
        info = c.get("/api/info").json()
    # the model's bos_token (an unused 50256 under causal attention) is left out; the tokenizer's own ids are in
    model = {k: v for k, v in m.config.to_dict().items() if k != "bos_token"}
    model.update(fused_ce=False, auto=["fused_ce"])  # auto decides the training loss: a served forward's is plain
    gpt2 = {"name": "gpt2", "n_vocab": 50257, "eot": 50256, "bos": None, "eos": 50256}  # GPT-2's BPE: no bos
    assert info == {"model": model, "tokenizer": gpt2, "parameters": n_params, "limits": limits, "queue": {"waiting": 0},
                    "served": {"source": "memory", "path": None, "run_dir": None, "step": None, "tokens_trained": None,
                               "family": "gpt2", "parameters": n_params, "layers": 1, "heads": 2, "width": d,
                               "context": 32, "vocab_size": 50261}}
    assert (info["model"]["block_size"], info["model"]["n_layer"], info["model"]["n_embd"]) == (32, 1, 32)
    served = {"source": "ckpt", "run_dir": "/runs/my-run", "step": 7}
    with TestClient(create_app(m, tokenizer, _settings(), served=served)) as c:
        assert c.get("/api/info").json()["served"] == served  # what the CLI described, as given


# ---------------------------------------------------------------- the error handlers' bodies
class _Poisoned:
    """GPT-2's BPE, except that it refuses a text holding POISON (a TokenizerError), cannot render one holding
    BADCHAT (a ChatFormatError) and crashes on one holding CRASH (a bug: RuntimeError)."""

    def __init__(self, enc):
        self.enc = enc

    def __getattr__(self, name):
        return getattr(self.enc, name)

    def _check(self, text: str) -> None:
        if "POISON" in text:
            raise TokenizerError("poisoned.json: this tokenizer refuses POISON")
        if "BADCHAT" in text:
            raise ChatFormatError("message 0: cannot render BADCHAT")
        if "CRASH" in text:
            raise RuntimeError("boom")

    def encode(self, text, **kw):
        self._check(text)
        return self.enc.encode(text, **kw)

    def encode_ordinary(self, text):
        self._check(text)
        return self.enc.encode_ordinary(text)


def test_input_the_tokenizer_or_template_cannot_take_is_a_400_in_each_familys_shape(tokenizer):
    said = "the model's chat template or tokenizer cannot take this input: "
    app = create_app(_model(), _Poisoned(tokenizer), _settings(), chat_template=T.to_dict())
    with TestClient(app) as c:
        for route in ("/api/generate", "/api/stream"):
            r = c.post(route, json={"prompt": "a POISON", "max_new_tokens": 1})
            assert (r.status_code, r.json()) == (400, {"error": said + "poisoned.json: this tokenizer refuses POISON"})
            r = c.post(route, json={"prompt": "BADCHAT", "max_new_tokens": 1})
            assert (r.status_code, r.json()) == (400, {"error": said + "message 0: cannot render BADCHAT"})
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "POISON"}]})
        assert (r.status_code, r.json()) == (400, _oa("invalid_request_error", said + "poisoned.json: this tokenizer "
                                                      "refuses POISON", "messages"))
        r = c.post("/v1/completions", json={"prompt": "BADCHAT"})  # the field named is the one the text came in
        assert (r.status_code, r.json()) == (400, _oa("invalid_request_error", said + "message 0: cannot render "
                                                      "BADCHAT", "prompt"))
        # and the plain HTTP errors keep their status and words (http_error)
        r = c.post("/api/generate", json={"prompt": "hi", "max_new_tokens": 17})
        assert (r.status_code, r.json()) == (400, {"error": "max_new_tokens=17 is over this server's cap of 16"})


def test_a_crash_is_a_500_whose_id_is_in_the_server_log(tokenizer, caplog):
    app = create_app(_model(), _Poisoned(tokenizer), _settings(), chat_template=T.to_dict())
    with TestClient(app, raise_server_exceptions=False) as c, caplog.at_level(logging.ERROR, "gptforge.serve"):
        answers = {"/api/generate": c.post("/api/generate", json={"prompt": "CRASH", "max_new_tokens": 1}),
                   "/v1/completions": c.post("/v1/completions", json={"prompt": "CRASH"})}
    logged = [r for r in caplog.records if r.name == "gptforge.serve"]
    assert [r.levelno for r in logged] == [logging.ERROR, logging.ERROR]
    for (path, r), rec in zip(answers.items(), logged, strict=True):
        assert r.status_code == 500
        body = r.json()
        message = body["error"] if path.startswith("/api") else body["error"]["message"]
        m = re.fullmatch(r"internal error ([0-9a-f]{12}) \(the server log has its traceback\)", message)
        assert m, message
        if path.startswith("/v1"):
            assert body == _oa("server_error", message)
        assert rec.getMessage() == f"error {m[1]} on POST {path}: RuntimeError('boom')"
    assert logged[0].getMessage() != logged[1].getMessage()  # one id per error


# ---------------------------------------------------------------- hang-ups and the queue, through ASGI
async def _call(app, method: str, path: str, body=None, leave: asyncio.Event | None = None) -> tuple[int, object]:
    """One request: its body, then (when ``leave`` is set) the client's hang-up. The status and the body sent."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"" if body is None else json.dumps(body).encode(),
                    "more_body": False}
        await (leave or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    status, chunks = None, []

    async def send(msg):
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"t"), (b"content-type", b"application/json")], "server": ("t", 80),
             "client": ("c", 1)}
    await app(scope, receive, send)
    raw = b"".join(chunks)
    return status, (json.loads(raw) if raw.startswith(b"{") else raw.decode())


class _Held:
    """``stream_text`` made to wait for the test before each event it yields."""

    def __init__(self, monkeypatch):
        self.go = threading.Semaphore(0)
        self.arrived = self.yielded = 0
        real = generation.stream_text

        def held(*a, **kw):
            for ev in real(*a, **kw):
                self.arrived += 1
                assert self.go.acquire(timeout=30), "the test never released a step"
                self.yielded += 1
                yield ev

        monkeypatch.setattr(generation, "stream_text", held)  # create_app imports it when it builds the app


async def _until(cond, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("first_route", ["/api/generate", "/v1/completions"])
def test_hang_ups_answer_499_and_the_queue_is_counted(tokenizer, monkeypatch, first_route):
    """One request holds the model (held at its first token); a second waits: /api/info counts it, a third is
    a 429; the waiting one hangs up and gets its 499, in each family's shape, for every route. Then the one
    on the model hangs up after its first token: it stops there (its 499), and the model is free again."""
    held = _Held(monkeypatch)
    app = create_app(_model(), tokenizer, _settings(), chat_template=T.to_dict())
    api = {"prompt": "hi", "max_new_tokens": 8, "temperature": 0}
    v1 = {"prompt": "hi", "max_tokens": 8, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    bodies = {"/api/generate": api, "/api/stream": api, "/v1/completions": v1, "/v1/chat/completions": chat}
    scoring = {"prompt": "hi", "echo": True, "max_tokens": 0, "logprobs": 0}  # echo only: no generation, still queued
    closed = {"api": {"error": CLOSED}, "v1": _oa("invalid_request_error", CLOSED)}
    busy = {"api": {"error": BUSY}, "v1": _oa("rate_limit_error", BUSY, None, "server_busy")}

    async def waiting() -> int:
        status, info = await _call(app, "GET", "/api/info")
        assert status == 200
        return info["queue"]["waiting"]

    async def scenario():
        first_leaves = asyncio.Event()
        first = asyncio.create_task(_call(app, "POST", first_route, bodies[first_route], first_leaves))
        await _until(lambda: _now(held.arrived == 1), "the first request to reach the model")
        assert await waiting() == 0  # on the model, not waiting
        for route, body in [*bodies.items(), ("/v1/completions", scoring)]:
            family = route.split("/")[1]
            leaves = asyncio.Event()
            queued = asyncio.create_task(_call(app, "POST", route, body, leaves))
            await _until(lambda: _is(waiting, 1), f"{route} to queue")
            for other in bodies:  # the queue (max_queue 1) is full
                assert await _call(app, "POST", other, bodies[other]) == (429, busy[other.split("/")[1]]), (route, other)
            leaves.set()
            assert await asyncio.wait_for(queued, 20) == (499, closed[family]), route
            assert await waiting() == 0
        assert held.yielded == 0  # nothing of those ran on the model
        held.go.release()  # the first request's first token
        await _until(lambda: _now(held.arrived == 2), "the first request's second step")
        first_leaves.set()
        await asyncio.sleep(0.2)  # the hang-up is seen before the second step is let through
        held.go.release(20)
        assert await asyncio.wait_for(first, 20) == (499, closed[first_route.split("/")[1]])
        assert held.yielded == 2  # it stopped at the next token, not after its 8
        # the model is free again: a request now gets its whole reply
        status, out = await asyncio.wait_for(_call(app, "POST", "/api/generate", {**api, "max_new_tokens": 2}), 20)
        assert (status, out) == (200, {"completions": [{"text": "!!", "finish_reason": "length"}]})

    asyncio.run(scenario())


async def _is(counter, n: int) -> bool:
    return await counter() == n


async def _now(value: bool) -> bool:
    return value


# ---------------------------------------------------------------- /v1: model_card, complete_text, complete_chat
def _v1(c, path: str, body: dict) -> tuple[int, dict]:
    r = c.post(path, json={"temperature": 0, **body})
    return r.status_code, r.json()


def _bad(message: str, param: str | None, code: str | None = None) -> tuple[int, dict]:
    return 400, _oa("invalid_request_error", message, param, code)


def test_v1_model_card_and_the_unknown_model(tokenizer):
    app = create_app(_model(), tokenizer, _settings(), chat_template=T.to_dict(),
                     served={"source": "ckpt", "run_dir": "/runs/my-run"})
    before = int(time.time())
    with TestClient(app) as c:
        listed = c.get("/v1/models").json()["data"]
        card = c.get("/v1/models/my-run")
        assert card.status_code == 200 and [card.json()] == listed
        assert card.json() == {"id": "my-run", "object": "model", "created": card.json()["created"],
                               "owned_by": "gptforge", "max_model_len": 32}
        assert abs(card.json()["created"] - before) <= 60
        r = c.get("/v1/models/other")
        assert (r.status_code, r.json()) == (404, _oa("not_found_error", "The model `other` does not exist (this "
                                                      "server serves `my-run`)", "model", "model_not_found"))


def test_v1_completions_refusals_word_for_word_and_their_edges(tokenizer):
    with _client(tokenizer) as c:
        p = "/v1/completions"
        assert _v1(c, p, {"prompt": "y" * 10, "max_tokens": 1})[0] == 200
        assert _v1(c, p, {"prompt": "y" * 11}) == _bad("prompt has 11 characters; the limit is 10", "prompt")
        assert _v1(c, p, {"prompt": ["ok", "y" * 11]}) == _bad("prompt.1 has 11 characters; the limit is 10", "prompt")
        ids = "token ids must be a non-empty list in [0, 50261)"  # the model's 50,261 ids, not its padded rows
        assert _v1(c, p, {"prompt": [[5303], [50261]]}) == _bad(f"prompt 1: {ids}", "prompt")
        assert _v1(c, p, {"prompt": [-1]}) == _bad(f"prompt 0: {ids}", "prompt")
        assert _v1(c, p, {"prompt": [[]]}) == _bad(f"prompt 0: {ids}", "prompt")
        status, out = _v1(c, p, {"prompt": [[0], [50260]], "max_tokens": 1})  # both ends of the range
        assert status == 200 and [ch["text"] for ch in out["choices"]] == ["!", "!"]
        for lp in (0, 1):
            assert _v1(c, p, {"prompt": "hi", "logprobs": lp, "stream": True}) == _bad(
                "logprobs: not available with stream=true on this server", "logprobs")
    with _client(tokenizer, max_prompt_chars=100) as c:
        # <|endoftext|> typed in a text prompt is that one token (GPT-2's 50256), as gptforge sample reads it
        status, out = _v1(c, "/v1/completions", {"prompt": "hi<|endoftext|>", "max_tokens": 1})
        assert status == 200 and out["usage"]["prompt_tokens"] == 2


def test_v1_completions_echo(tokenizer):
    """Echo puts the prompt's text in front (token-id prompts decoded, the chat template's ids by name);
    ``max_tokens`` 0 scores the prompt without generating, within the batch limit and the whole context."""
    with _client(tokenizer) as c:
        p = "/v1/completions"
        status, out = _v1(c, p, {"prompt": [[5303], [50258, 5303]], "echo": True, "max_tokens": 2})
        assert status == 200 and [ch["text"] for ch in out["choices"]] == ["hi!!", "<|user|>hi!!"]
        status, out = _v1(c, p, {"prompt": "hi", "echo": True, "max_tokens": 0, "logprobs": 0})
        assert status == 200 and out["usage"] == {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}
        (choice,) = out["choices"]
        assert choice["text"] == "hi" and choice["finish_reason"] == "length"
        assert choice["logprobs"] == {"tokens": ["hi"], "token_logprobs": [None], "top_logprobs": None,
                                      "text_offset": [0]}  # the first token has no prefix to score it by
        status, out = _v1(c, p, {"prompt": ["a", "b"], "n": 2, "echo": True, "max_tokens": 0})
        assert status == 200 and [ch["text"] for ch in out["choices"]] == ["a", "a", "b", "b"]
        assert _v1(c, p, {"prompt": ["a", "b"], "n": 3, "echo": True, "max_tokens": 0}) == _bad(
            "prompt and n: 2 prompts x n=3 = 6 replies is over this server's batch limit of 4", "n")
        status, out = _v1(c, p, {"prompt": [1] * 32, "echo": True, "max_tokens": 0})  # the whole context
        assert status == 200 and out["usage"]["prompt_tokens"] == 32
        assert _v1(c, p, {"prompt": [1] * 33, "echo": True, "max_tokens": 0}) == _bad(
            "This model's maximum context length is 32 tokens. However, you requested 33 tokens in the prompt.",
            "prompt", "context_length_exceeded")
    # a model smaller than the tokenizer: "hi" is GPT-2's id 5303, past a 100-id vocabulary, scored or not
    with _client(tokenizer, model=_model(vocab=100), chat=False) as c:
        outside = _bad("prompt: prompt 0 tokenizes to id 5303, outside this model's vocabulary of 100 (the text is "
                       "not in the model's tokenizer)", "prompt")
        assert _v1(c, "/v1/completions", {"prompt": "hi", "echo": True, "max_tokens": 0, "logprobs": 0}) == outside
        assert _v1(c, "/v1/completions", {"prompt": "hi"}) == outside


def test_v1_chat_refusals_and_defaults(tokenizer):
    p = "/v1/chat/completions"
    with _client(tokenizer, chat=False) as c:  # a base model: text completion only, decoded by its own tokenizer
        status, out = _v1(c, "/v1/completions", {"prompt": [5303], "echo": True, "max_tokens": 2})
        assert status == 200 and out["choices"][0]["text"] == "hi!!"
        assert _v1(c, p, {"messages": [{"role": "user", "content": "hi"}]}) == _bad(
            "this model has no chat template (it is a base model; fine-tune it with `gptforge sft`); use "
            "/v1/completions to continue text", "messages", "no_chat_template")
    # "hi" as the user: <|endoftext|> <|user|> hi <|end|> <|assistant|>, 5 of the 32 tokens: room for 27
    with _client(tokenizer) as c:
        ten = [{"role": "system", "content": "12345"}, {"role": "user", "content": "12345"}]
        assert _v1(c, p, {"messages": ten, "max_tokens": 1})[0] == 200
        eleven = [{"role": "system", "content": "12345"}, {"role": "user", "content": "123456"}]
        assert _v1(c, p, {"messages": eleven}) == _bad("messages: over the limit of 10 characters", "messages")
        assert _v1(c, p, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "stream": True}) == _bad(
            "logprobs: not available with stream=true on this server", "logprobs")
        status, out = _v1(c, p, {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and out["choices"][0]["message"]["content"] == "!" * 16  # the server's cap
        assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
        hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert _v1(c, p, hi)[1]["choices"][0]["logprobs"] is None
        bang = {"token": "!", "bytes": [33]}
        for top in (None, 2):
            (ch,) = _v1(c, p, {**hi, "logprobs": True, "top_logprobs": top})[1]["choices"]
            entries = ch["logprobs"]["content"]
            assert [{k: e[k] for k in bang} for e in entries] == [bang, bang]
            assert all(-1e-3 < e["logprob"] <= 0 for e in entries)  # the model's near-certain answer
            assert [len(e["top_logprobs"]) for e in entries] == [top or 0] * 2
    with _client(tokenizer, max_new_tokens_cap=40) as c:
        status, out = _v1(c, p, {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and out["choices"][0]["message"]["content"] == "!" * 27  # the room the context leaves


# ---------------------------------------------------------------- /v1 answers written out, whole and streamed
def _chunks(text: str) -> list:
    """An SSE body's ``data:`` payloads in order (JSON decoded, ``[DONE]`` kept as the string)."""
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def test_v1_answers_written_out(tokenizer):
    """Every field of a whole answer and of each streamed chunk, for both endpoints: the id's prefix, the
    object, the creation time, the served model's name, the choices and the usage."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    text = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}  # chat: 4 template ids + "hi"
    with _client(tokenizer) as c:
        now = int(time.time())
        out = c.post("/v1/chat/completions", json=chat).json()
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", out.pop("id")) and abs(out.pop("created") - now) <= 60
        assert out == {"object": "chat.completion", "model": "gptforge", "usage": usage, "choices": [
            {"index": 0, "finish_reason": "length", "logprobs": None,
             "message": {"role": "assistant", "content": "!!"}}]}
        out = c.post("/v1/completions", json=text).json()
        assert re.fullmatch(r"cmpl-[0-9a-f]{32}", out.pop("id")) and abs(out.pop("created") - now) <= 60
        assert out == {"object": "text_completion", "model": "gptforge", "choices": [
            {"index": 0, "finish_reason": "length", "logprobs": None, "text": "!!"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}

        def streamed(path, body, prefix):
            chunks = _chunks(c.post(path, json={**body, "stream": True}).text)
            assert chunks[-1] == "[DONE]"
            ids = {ch.pop("id") for ch in chunks[:-1]}
            (rid,) = ids
            assert re.fullmatch(prefix + r"-[0-9a-f]{32}", rid)
            assert all(abs(ch.pop("created") - now) <= 60 and ch.pop("model") == "gptforge" for ch in chunks[:-1])
            return chunks[:-1]

        delta = [{"role": "assistant", "content": ""}, {"content": "!"}, {"content": "!"}, {}]
        assert streamed("/v1/chat/completions", chat, "chatcmpl") == [
            {"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": d, "logprobs": None, "finish_reason": "length" if d == {} else None}]}
            for d in delta]
        assert streamed("/v1/completions", text, "cmpl") == [
            {"object": "text_completion", "choices": [
                {"index": 0, "text": "!", "logprobs": None, "finish_reason": reason}]} for reason in (None, "length")]


def test_a_generation_that_fails_is_told_to_the_client(tokenizer, monkeypatch):
    """The model fails after its first token (out of memory, say): a whole /v1 answer is a 500 naming the
    failure; a stream has already begun, so its failure is an event of the stream's own format, then its end."""
    real = generation.stream_text

    def failing(*a, **kw):
        for ev in real(*a, **kw):
            yield ev
            raise RuntimeError("out of memory")

    monkeypatch.setattr(generation, "stream_text", failing)
    said = "generation failed: out of memory"
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    text = {"prompt": "hi", "max_tokens": 4, "temperature": 0}
    with _client(tokenizer) as c:
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", text)):
            r = c.post(path, json=body)
            assert (r.status_code, r.json()) == (500, _oa("server_error", said)), path
            chunks = _chunks(c.post(path, json={**body, "stream": True}).text)
            assert chunks[-2:] == [_oa("server_error", said), "[DONE]"], path
        r = c.post("/api/stream", json={"prompt": "hi", "max_new_tokens": 4, "temperature": 0})
        assert r.text.endswith(f'event: error\ndata: {json.dumps({"error": said})}\n\nevent: done\ndata: {{}}\n\n')
        # the model was released each time: a request now is answered
        assert c.post("/v1/completions", json=text).status_code == 500  # (still failing, but not stuck)


def test_v1_chat_stops_at_the_templates_end_token(tokenizer):
    """A chat model that answers <|end|> (the template's end, id 50260) first: the reply is empty and stopped."""
    with _client(tokenizer, model=_model(answer=T.end)) as c:
        out = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                   "temperature": 0}).json()
        assert (out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"]) == ("", "stop")
        assert out["usage"]["completion_tokens"] == 1
