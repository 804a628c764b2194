"""Hardening round 6, the server's request doors: (1) a value of the wrong JSON type is refused by name on
every route, never coerced (``"max_tokens": "10"`` or ``true`` read as 10 or 1, ``"stream": "no"`` as false,
``"prompt": [true]`` as token id 1), as OpenAI's server refuses it; every request model in the serve package is
strict, so a new one cannot bring coercion back. (2) What the framework answers itself (an unknown path, a wrong
method, a body that is not UTF-8) comes in each route family's error shape (OpenAI's object under /v1,
``{"error": "..."}`` under /api) naming the path or the cause, not FastAPI's ``{"detail": ...}``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import gptforge.serve  # noqa: E402
from gptforge.data.chat import ChatTemplate  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402

T = ChatTemplate.gpt2()
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=T.vocab_size)).eval()
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=8, max_batch=4), chat_template=T.to_dict())
    with TestClient(app) as c:
        yield c


V1_CHAT, V1_TEXT = {"messages": MSGS, "max_tokens": 2}, {"prompt": "hi", "max_tokens": 2}
API_GEN, API_CHAT = {"prompt": "hi", "max_new_tokens": 2}, {"messages": MSGS, "max_new_tokens": 2}

# (route, valid body, field, a value of the wrong JSON type that lax validation coerced into a valid one)
COERCED = [
    *[("/v1/chat/completions", V1_CHAT, f, v) for f, v in [
        ("max_tokens", "10"), ("max_tokens", True), ("max_tokens", 2.0), ("max_completion_tokens", "2"),
        ("n", "1"), ("n", True), ("temperature", "0.5"), ("temperature", True), ("top_p", "1"), ("seed", "7"),
        ("stream", "yes"), ("stream", "false"), ("stream", 0), ("logprobs", "true"), ("top_k", "5")]],
    *[("/v1/completions", V1_TEXT, f, v) for f, v in [
        ("max_tokens", "10"), ("max_tokens", True), ("prompt", [True, False]), ("prompt", [[True]]),
        ("echo", "no"), ("echo", 1), ("logprobs", True), ("repetition_penalty", "1.1"), ("stream", "off")]],
    *[("/api/generate", API_GEN, f, v) for f, v in [
        ("max_new_tokens", "2"), ("max_new_tokens", True), ("temperature", "0.5"), ("top_k", True),
        ("seed", "7"), ("stop_at_eot", "no"), ("stop_at_eot", 0)]],
    *[("/api/stream", API_GEN, f, v) for f, v in [("max_new_tokens", 2.0), ("top_p", True)]],
    *[("/api/chat", API_CHAT, f, v) for f, v in [
        ("max_new_tokens", "2"), ("temperature", True), ("seed", 7.0), ("repetition_penalty", "1")]],
]


@pytest.mark.parametrize("path, body, field, value", COERCED, ids=[f"{p}-{f}={v!r}" for p, _, f, v in COERCED])
def test_a_value_of_the_wrong_json_type_is_refused_by_name(client, path, body, field, value):
    r = client.post(path, json={**body, field: value})
    err = r.json()["error"]
    if path.startswith("/v1"):
        assert r.status_code == 400, r.text
        assert err["param"].split(".")[0] == field and err["type"] == "invalid_request_error", err
        assert err["message"].startswith(field), err
    else:
        assert r.status_code == 422, r.text
        assert isinstance(err, str) and err.startswith(field), err
    assert client.post(path, json=body).status_code == 200  # the same body with the right type is served


def test_a_message_part_of_the_wrong_type_is_refused_too(client):
    r = client.post("/v1/chat/completions", json={**V1_CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], "stream_options": {"include_usage": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.include_usage", r.text


@pytest.mark.parametrize("parts, words", [([{"type": "text"}], "a text part needs its text"),
                                          ([{"type": "text", "text": None}], "a text part needs its text"),
                                          ([{"type": "text", "text": "a"}, {"type": "image_url"}],
                                           "only text parts are supported (got 'image_url')")])
def test_a_content_part_says_what_is_wrong_with_it(client, parts, words):
    r = client.post("/v1/chat/completions", json={**V1_CHAT, "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages.0.content"


def _serve_models() -> list[type[BaseModel]]:
    found = []
    for info in pkgutil.iter_modules(gptforge.serve.__path__):
        mod = importlib.import_module(f"gptforge.serve.{info.name}")
        found += [obj for _, obj in inspect.getmembers(mod, inspect.isclass)
                  if issubclass(obj, BaseModel) and obj is not BaseModel and obj.__module__ == mod.__name__]
    return found


def _serve_typed_dicts() -> list[type]:
    """The TypedDicts pydantic validates in requests (each with its ``__pydantic_config__``)."""
    found = []
    for info in pkgutil.iter_modules(gptforge.serve.__path__):
        mod = importlib.import_module(f"gptforge.serve.{info.name}")
        found += [obj for _, obj in inspect.getmembers(mod, inspect.isclass)
                  if hasattr(obj, "__required_keys__") and obj.__module__ == mod.__name__]
    return found


def test_every_request_model_of_the_server_is_strict():
    models = _serve_models()
    assert {m.__name__ for m in models} >= {"GenerateRequest", "Message", "ChatRequest", "CompletionRequest",
                                            "ChatMessage", "StreamOptions"}
    lax = [f"{m.__module__}.{m.__name__}" for m in models if not m.model_config.get("strict")]
    assert not lax, f"request models that coerce JSON types: {lax}"
    dicts = _serve_typed_dicts()
    assert {d.__name__ for d in dicts} >= {"ContentPart"}
    lax = [d.__name__ for d in dicts if not getattr(d, "__pydantic_config__", {}).get("strict")]
    assert not lax, f"request dicts that coerce JSON types: {lax}"


def test_no_request_model_validates_a_list_of_models_it_does_not_bound():
    """A model instance an item costs ~5 us to validate, in the gate's worker thread holding the GIL: a list of
    them, 500,000 long in a 15 MB body, held every stream for seconds. Each list of models is bounded before it
    is validated (messages: limits.bounded_messages); every other list holds plain values or dicts."""
    import typing

    unbounded = []
    for m in _serve_models():
        for name, field in m.model_fields.items():
            for arg in typing.get_args(field.annotation) or (field.annotation,):
                inner = typing.get_args(arg)
                if typing.get_origin(arg) is list and inner and inspect.isclass(inner[0]) \
                        and issubclass(inner[0], BaseModel) and name != "messages":
                    unbounded.append(f"{m.__name__}.{name}")
    assert not unbounded, f"lists of models no bound counts first: {unbounded}"


# --- what the framework answers, in the family's shape ------------------------------------------------

@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v1/chat/completions", 405, "GET /v1/chat/completions (allowed: POST)"),
    ("PUT", "/v1/completions", 405, "PUT /v1/completions (allowed: POST)"),
    ("POST", "/v1/chat", 404, "POST /v1/chat"),
    ("GET", "/v1/engines", 404, "GET /v1/engines"),
])
def test_v1_framework_errors_are_openai_error_objects(client, method, path, status, words):
    r = client.request(method, path, json={})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and words in err["message"], err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if status == 405:
        assert r.headers["allow"] == "POST"


@pytest.mark.parametrize("method, path, status", [("GET", "/api/generate", 405), ("GET", "/api/chat", 405),
                                                  ("POST", "/api/nothing", 404), ("GET", "/no/such/page", 404)])
def test_api_framework_errors_are_the_native_error(client, method, path, status):
    r = client.request(method, path)
    assert r.status_code == status and r.json() == {"error": r.json()["error"]}, r.text
    assert f"{method} {path}" in r.json()["error"]


@pytest.mark.parametrize("path", ["/api/generate", "/api/stream", "/api/chat", "/v1/completions",
                                  "/v1/chat/completions"])
def test_a_body_that_is_not_utf8_is_a_malformed_json_400_on_every_route(client, path):
    r = client.post(path, content=b'{"prompt": "\xff", "messages": "\xc3"}', headers={"content-type":
                                                                                       "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    message = err["message"] if path.startswith("/v1") else err
    assert message.startswith("malformed JSON body") and "utf-8" in message.lower(), r.text
