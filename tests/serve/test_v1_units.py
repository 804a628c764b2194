"""The /v1 module's helpers called directly, against OpenAI's documented shapes written out by hand here
(issue 36: lane v1's mutants of these helpers survived where the route tests never looked):

- the stream's chunks (``_ChunkWriter``): every field of every chunk, the role chunk that opens each chat
  choice, the finish chunk, ``usage: null`` on each chunk and the usage chunk before ``[DONE]`` when
  ``stream_options.include_usage``, the error event;
- log-probabilities in both endpoints' shapes (``_completion_logprobs``, ``_chat_logprobs``), on a token
  whose bytes are half a UTF-8 character (it prints as U+FFFD; its ``bytes`` stay the raw ones);
- the request parser's refusals (``parse``, ``_loc``): the field path without pydantic's union-member names,
  at most four errors, every body that is not a JSON object;
- ``_prompts``, ``_card``, ``model_id``, ``finish_reason``, OpenAI's error object, ``ChatRequest.conversation``,
  and ``_collect`` (rows gathered, a hang-up stops it, the generator is closed either way).
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from gptforge.generation import TextEvent  # noqa: E402
from gptforge.serve import openai_api  # noqa: E402
from gptforge.serve.openai_api import (  # noqa: E402
    _card,
    _chat_logprobs,
    _ChunkWriter,
    _completion_logprobs,
    _piece,
    _prompts,
    model_id,
)
from gptforge.serve.openai_schema import (  # noqa: E402
    ChatRequest,
    CompletionRequest,
    OpenAIError,
    error_body,
    finish_reason,
    parse,
)
from gptforge.serve.sse import collect_rows as _collect  # noqa: E402

HALF = 447  # GPT-2's id whose bytes are E2 80: the first two bytes of a three-byte UTF-8 character
HELLO, BANG = 15496, 0  # "Hello", "!"


def _events(sse: str) -> list:
    """An SSE string -> its data payloads (JSON decoded, "[DONE]" kept as is), checking the framing."""
    assert sse.endswith("\n\n"), sse
    out = []
    for block in sse[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(openai_api.time, "time", lambda: 1700000000.75)
    return 1700000000


@pytest.mark.parametrize("usage", [False, True])
def test_completion_stream_chunks(clock, usage):
    w = _ChunkWriter("text", "cmpl-7", "tiny", 3, usage)

    def chunk(choices):
        return {"id": "cmpl-7", "object": "text_completion", "created": clock, "model": "tiny", "choices": choices,
                **({"usage": None} if usage else {})}

    assert _events(w.event(TextEvent(0, "Hi", tokens=(5, 6)))) == [
        chunk([{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}])]
    assert _events(w.event(TextEvent(1, "", finished=True, reason="eot", tokens=(50256,)))) == [
        chunk([{"index": 1, "text": "", "logprobs": None, "finish_reason": "stop"}])]
    assert _events(w.event(TextEvent(0, "!", finished=True, reason="length", tokens=(0,)))) == [
        chunk([{"index": 0, "text": "!", "logprobs": None, "finish_reason": "length"}])]
    tail = [{"id": "cmpl-7", "object": "text_completion", "created": clock, "model": "tiny", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}] if usage else []
    assert _events(w.end()) == tail + ["[DONE]"]


@pytest.mark.parametrize("usage", [False, True])
def test_chat_stream_chunks(clock, usage):
    w = _ChunkWriter("chat", "chatcmpl-9", "tiny", 5, usage)

    def chunk(row, delta, reason=None):
        return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": clock, "model": "tiny",
                "choices": [{"index": row, "delta": delta, "logprobs": None, "finish_reason": reason}],
                **({"usage": None} if usage else {})}

    opens = chunk(0, {"role": "assistant", "content": ""})
    assert _events(w.event(TextEvent(0, "He", tokens=(1,)))) == [opens, chunk(0, {"content": "He"})]
    assert _events(w.event(TextEvent(0, "y", tokens=(2,)))) == [chunk(0, {"content": "y"})]  # no second role chunk
    # a row that ends before printing anything: its role chunk and its finish chunk, no empty content chunk
    assert _events(w.event(TextEvent(1, "", finished=True, reason="stop", tokens=(3, 4)))) == [
        chunk(1, {"role": "assistant", "content": ""}), chunk(1, {}, "stop")]
    assert _events(w.event(TextEvent(0, "!", finished=True, reason="length", tokens=(5,)))) == [
        chunk(0, {"content": "!"}), chunk(0, {}, "length")]
    tail = [{"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": clock, "model": "tiny",
             "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}] if usage else []
    assert _events(w.end()) == tail + ["[DONE]"]


def test_a_failed_stream_ends_with_openais_error_object():
    assert _events(_ChunkWriter("chat", "c", "m", 1, True).error(RuntimeError("out of memory"))) == [
        {"error": {"message": "generation failed: out of memory", "type": "server_error", "param": None,
                   "code": None}}]


def test_pieces_of_half_a_character_print_as_the_replacement_character(tokenizer):
    assert tokenizer.token_bytes(HALF) == b"\xe2\x80" and tokenizer.token_bytes(HELLO) == b"Hello"
    assert _piece(tokenizer, HALF) == "\ufffd" and _piece(tokenizer, BANG) == "!"


def test_chat_logprobs_shape(tokenizer):
    rows = [(HALF, -0.5, [(HALF, -0.5), (BANG, -1.25)]), (BANG, -2.0, [])]
    assert _chat_logprobs(rows, tokenizer) == {"content": [
        {"token": "\ufffd", "logprob": -0.5, "bytes": [0xE2, 0x80],
         "top_logprobs": [{"token": "\ufffd", "logprob": -0.5, "bytes": [0xE2, 0x80]},
                          {"token": "!", "logprob": -1.25, "bytes": [33]}]},
        {"token": "!", "logprob": -2.0, "bytes": [33], "top_logprobs": []}]}


def test_completion_logprobs_shape(tokenizer):
    # an echoed first prompt token has no log-probability; offsets count characters of the printed pieces
    rows = [(HELLO, None, None), (HALF, -0.5, [(HALF, -0.5), (BANG, -1.0)]), (BANG, -2.0, [(BANG, -2.0)])]
    assert _completion_logprobs(rows, tokenizer, 2) == {
        "tokens": ["Hello", "\ufffd", "!"], "token_logprobs": [None, -0.5, -2.0],
        "top_logprobs": [None, {"\ufffd": -0.5, "!": -1.0}, {"!": -2.0}], "text_offset": [0, 5, 6]}
    assert _completion_logprobs(rows[1:], tokenizer, 0) == {
        "tokens": ["\ufffd", "!"], "token_logprobs": [-0.5, -2.0], "top_logprobs": None, "text_offset": [0, 1]}


def test_prompts_one_or_many_text_or_ids():
    assert _prompts("hi") == ["hi"] and _prompts("") == [""]
    assert _prompts([5, 6]) == [[5, 6]] and _prompts([0]) == [[0]]  # one prompt as ids (id 0 is an id)
    assert _prompts(["a", "b"]) == ["a", "b"] and _prompts([[1], [2, 3]]) == [[1], [2, 3]]
    for empty in ([], None):
        with pytest.raises(OpenAIError) as e:
            _prompts(empty)
        assert (e.value.status, e.value.message, e.value.param) == (400, "prompt: must not be empty", "prompt")


def test_model_card_and_name():
    assert _card("run7", 123, 1024) == {"id": "run7", "object": "model", "created": 123, "owned_by": "gptforge",
                                        "max_model_len": 1024}
    assert model_id(None) == model_id({}) == "gptforge"
    assert model_id({"run_dir": "/x/runs/shakespeare", "path": "/y/w.pt"}) == "shakespeare"
    assert model_id({"path": "/y/weights.pt"}) == "weights.pt"
    assert model_id({"run_dir": "/", "source": "checkpoint"}) == "gptforge"  # a path with no name
    assert model_id({"run_dir": "/x/runs/r", "source": "random"}) == "gptforge"


def test_finish_reasons_in_openais_words():
    assert [finish_reason(r) for r in ("length", "eot", "stop", None)] == ["length", "stop", "stop", "stop"]


@pytest.mark.parametrize("status,kind", [(400, "invalid_request_error"), (401, "authentication_error"),
                                         (404, "not_found_error"), (413, "invalid_request_error"),
                                         (429, "rate_limit_error"), (499, "invalid_request_error"),
                                         (500, "server_error"), (503, "server_error")])
def test_openais_error_object(status, kind):
    e = OpenAIError(status, "words", "field", "code_x")
    assert str(e) == "words"
    assert e.body() == {"error": {"message": "words", "type": kind, "param": "field", "code": "code_x"}}
    r = e.response()
    assert r.status_code == status and json.loads(r.body) == e.body()
    assert error_body(status, "no field") == {"error": {"message": "no field", "type": kind, "param": None,
                                                        "code": None}}


def _refused(model, body) -> tuple[int, str, str | None]:
    with pytest.raises(OpenAIError) as e:
        parse(model, body if isinstance(body, bytes) else json.dumps(body).encode())
    return e.value.status, e.value.message, e.value.param


def test_parse_names_the_field_without_pydantics_union_members():
    lists = "; ".join(["prompt: Input should be a valid list (got 5)"] * 3)
    assert _refused(CompletionRequest, {"prompt": 5}) == (
        400, f"prompt: Input should be a valid string (got 5); {lists}", "prompt")
    assert _refused(CompletionRequest, {"prompt": [1, "a"]}) == (
        400, "prompt: Input should be a valid string (got [1, 'a']); prompt.0: Input should be a valid string (got 1); "
             "prompt.1: Input should be a valid integer (got 'a'); "
             "prompt.0: Input should be a valid list (got 1)", "prompt")
    assert _refused(ChatRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}) == (
        400, "messages.0.content: Input should be a valid string (got [{'type': 'text', 'text': 3}]); "
             "messages.0.content.0.text: Input should be a valid string (got 3)", "messages.0.content")
    # at most four errors; the first one's field is the param
    assert _refused(CompletionRequest, {"prompt": "a", "max_tokens": "x", "n": 0, "seed": 1.5, "top_p": 0,
                                        "temperature": 3}) == (
        400, "max_tokens: Input should be a valid integer (got 'x'); "
             "temperature: Input should be less than or equal to 2 (got 3); top_p: Input should be greater than 0 "
             "(got 0); n: Input should be greater than or equal to 1 (got 0)", "max_tokens")
    # a missing field shows the object it is missing from
    assert _refused(ChatRequest, {}) == (400, "messages: Field required (got {})", "messages")


def test_parse_refuses_every_body_that_is_not_a_json_object():
    for body in (b"", b"null", b"[1]", b'"text"', b"3"):
        assert _refused(CompletionRequest, body) == (400, "the body must be a JSON object", None), body
    status, message, param = _refused(CompletionRequest, b'{"prompt": ')
    assert (status, param) == (400, None) and message.startswith("malformed JSON body: Expecting value")
    status, message, _ = _refused(CompletionRequest, b'{"prompt": "\xff"}')
    assert status == 400 and message.startswith("malformed JSON body: 'utf-8' codec can't decode byte 0xff")
    assert _refused(CompletionRequest, b"[" * 100_000 + b"]" * 100_000) == (
        400, "malformed JSON body: nested too deeply", None)
    assert _refused(CompletionRequest, b'{"prompt": "a\\ud800"}') == (
        400, "the body holds an unpaired surrogate (\\ud800), which is not text: send UTF-8 text", None)
    req = parse(CompletionRequest, b'{"prompt": "a", "max_tokens": 2, "unknown_field": 1}')
    assert (req.prompt, req.max_tokens) == ("a", 2)


def test_conversation_in_the_templates_words():
    req = parse(ChatRequest, json.dumps({"messages": [
        {"role": "developer", "content": "be brief"}, {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "he"}, {"type": "text", "text": "llo"}]},
        {"role": "assistant", "content": "hi"}]}).encode())
    assert req.conversation() == [{"role": "system", "content": "be brief"}, {"role": "system", "content": "s"},
                                  {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    cases = [({"role": "tool", "content": "x"}, "messages.1.role: 'tool' is not supported (system, developer, user, "
                                                "assistant)", "messages.1.role"),
             ({"role": "user"}, "messages.1.content: a message needs text content", "messages.1.content"),
             ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
              "messages.1.content.1: only text parts are supported (got 'image_url')", "messages.1.content"),
             ({"role": "user", "content": [{"type": "text"}]},
              "messages.1.content.0: a text part needs its text (\"text\": \"...\")", "messages.1.content")]
    for bad, message, param in cases:
        req = parse(ChatRequest, json.dumps({"messages": [{"role": "user", "content": "a"}, bad]}).encode())
        with pytest.raises(OpenAIError) as e:
            req.conversation()
        assert (e.value.status, e.value.message, e.value.param) == (400, message, param)


class _Gen:
    """A generator of events that records whether it was closed."""

    def __init__(self, events):
        self.events, self.closed = iter(events), False

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.events)

    def close(self):
        self.closed = True


def test_collect_gathers_each_row_and_closes_the_generator():
    evs = [TextEvent(0, "a", tokens=(1,)), TextEvent(1, "x", tokens=(7, 8)), TextEvent(0, "b", tokens=(2,)),
           TextEvent(1, "", finished=True, reason="eot", tokens=(50256,)),
           TextEvent(0, "c", finished=True, reason="length", tokens=(3,))]
    gen = _Gen(evs)
    gone = asyncio.Event()
    got = asyncio.run(_collect(gen, 3, gone))
    assert got == (["abc", "x", ""], ["length", "eot", None], [[1, 2, 3], [7, 8, 50256], []]) and gen.closed

    async def hung_up():
        g = asyncio.Event()
        g.set()
        return await _collect(gen2, 2, g)

    gen2 = _Gen(evs)
    assert asyncio.run(hung_up()) == (["", ""], [None, None], [[], []]) and gen2.closed
    assert next(gen2.events) is evs[0]  # nothing was read after the hang-up


USER = [{"role": "user", "content": "a"}]


@pytest.mark.parametrize(("model", "body", "message", "param"), [
    (CompletionRequest, {"presence_penalty": 0.5},
     "presence_penalty: not supported by this server (use 0; repetition_penalty is the penalty gptforge has)",
     "presence_penalty"),
    (ChatRequest, {"frequency_penalty": -1}, "frequency_penalty: not supported by this server (use 0; "
                                             "repetition_penalty is the penalty gptforge has)", "frequency_penalty"),
    (ChatRequest, {"logit_bias": {"5": 1}}, "logit_bias: not supported by this server", "logit_bias"),
    (CompletionRequest, {"echo": True, "stream": True}, "echo: not available with stream=true on this server", "echo"),
    (CompletionRequest, {"max_tokens": 0}, "max_tokens: 0 generates nothing; it needs echo: true (to score the prompt)",
     "max_tokens"),
    (CompletionRequest, {"suffix": "x"}, "suffix: not supported by this server (no fill-in-the-middle)", "suffix"),
    (CompletionRequest, {"best_of": 3, "n": 2}, "best_of=3: only best_of = n is supported", "best_of"),
    (ChatRequest, {"tools": [{"type": "function"}]}, "tools: tool calling is not supported by this server", "tools"),
    (ChatRequest, {"response_format": {"type": "json_object"}}, 'response_format: only {"type": "text"} is supported',
     "response_format"),
    (ChatRequest, {"top_logprobs": 2}, "top_logprobs: needs logprobs: true", "top_logprobs"),
])
def test_what_the_server_cannot_honour_is_refused_word_for_word(model, body, message, param):
    base = {"prompt": "a"} if model is CompletionRequest else {"messages": USER}
    assert _refused(model, {**base, **body}) == (400, message, param)


def test_the_neutral_values_of_those_options_are_accepted():
    parse(CompletionRequest, json.dumps({"prompt": "a", "presence_penalty": 0, "frequency_penalty": 0.0,
                                         "logit_bias": {}, "suffix": "", "best_of": 1, "echo": True,
                                         "max_tokens": 0}).encode())
    # a response_format without a type is text, as OpenAI's default is
    for fmt in ({}, {"name": "x"}, {"type": "text"}, None):
        parse(ChatRequest, json.dumps({"messages": USER, "response_format": fmt, "tools": [], "top_logprobs": 0,
                                       "logprobs": False}).encode())
    parse(ChatRequest, json.dumps({"messages": USER, "top_logprobs": 3, "logprobs": True}).encode())


def test_a_chunked_body_over_the_limit_is_openais_413(tokenizer):
    """No Content-Length: the limit is met while the route reads the body (``_body``), and the 413 is still
    OpenAI's error object, not /api's ``{"error": "..."}``."""
    import torch
    from fastapi.testclient import TestClient

    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.serve.app import ServeSettings, create_app

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)).eval()
    with TestClient(create_app(model, tokenizer, ServeSettings(max_body_bytes=40))) as c:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = c.post(path, content=iter([b'{"prompt": "', b"x" * 30, b'"}']),
                       headers={"content-type": "application/json"})
            assert "content-length" not in r.request.headers
            assert (r.status_code, r.json()) == (413, {"error": {
                # the test transport hands the app the 44 bytes in one piece
                "message": "request body is over the limit of 40 bytes (stopped reading at 44; chunked bodies are "
                           "counted too)", "type": "invalid_request_error", "param": None, "code": None}}), path


def test_a_validators_recursion_limit_is_a_400(monkeypatch):
    """Where pydantic's validation gives up on nesting the decoder took (a field typed Any, such as tools, takes
    any depth), the client still gets a 400."""

    def deep(*a, **k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(ChatRequest, "model_validate", classmethod(deep))
    assert _refused(ChatRequest, b'{"messages": [], "tools": [[[1]]]}') == (
        400, "malformed JSON body: nested too deeply", None)
