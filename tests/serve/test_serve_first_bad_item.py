"""A list or dict in a request stops validating at its first bad item (``openai_schema.FIRST_BAD``): pydantic
reported every bad item, and in a union of list types every item again for each member, in the gate's worker
thread holding the GIL (1,000,000 integers as /api's ``prompts``: 19 s; a /v1 ``prompt`` of 2,000,000 token ids
ending in a string: 70 s; 300,000 bad ``logit_bias`` values: 3 s). Here: each such field with 20,000 bad items
gets a handful of errors, the first bad item named; and a walk of the request models finds every list or dict
whose items can be refused marked, but the messages, which are counted first."""

from __future__ import annotations

import typing

import pytest

pytest.importorskip("fastapi")

from pydantic import BaseModel, ValidationError  # noqa: E402

from gptforge.serve import chat as chat_mod  # noqa: E402
from gptforge.serve import openai_schema  # noqa: E402
from gptforge.serve.app import GenerateRequest  # noqa: E402
from gptforge.serve.openai_schema import ChatRequest, CompletionRequest  # noqa: E402

N = 20_000
MSG = {"role": "user", "content": "hi"}
CASES = [  # (model, body, the first bad item's field path)
    (GenerateRequest, {"prompts": [1] * N}, "prompts.0"),
    (GenerateRequest, {"prompts": ["a", *[1] * N]}, "prompts.1"),
    (GenerateRequest, {"prompt": "a", "stop": ["a", *[1] * N]}, "stop"),
    (CompletionRequest, {"prompt": [1] * N + ["x"]}, f"prompt.{N}"),
    (CompletionRequest, {"prompt": [[1]] * N + [["x"]]}, f"prompt.{N}.0"),
    (CompletionRequest, {"prompt": "a", "stop": ["a", *[1] * N]}, "stop.1"),
    (CompletionRequest, {"prompt": "a", "logit_bias": {f"{i}": "x" for i in range(N)}}, "logit_bias.0"),
    (ChatRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}] * N}]},
     "messages.0.content.0.text"),
]


@pytest.mark.parametrize("model, body, first", CASES)
def test_a_field_of_many_bad_items_is_refused_at_its_first(model, body, first):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    errs = e.value.errors()
    assert len(errs) <= 4, (first, len(errs))  # at most one a member of the field's union
    paths = [".".join(str(x) for x in err["loc"] if not (isinstance(x, str) and "[" in x)) for err in errs]
    assert first in paths or first == "stop", (first, paths)  # /api's stop: its length (8 at most) refuses it


def _unmarked(annotation, marked: bool = False) -> list:
    """The list and dict types in ``annotation`` whose items can be refused and that FIRST_BAD does not mark."""
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *meta = typing.get_args(annotation)
        return _unmarked(inner, any(m is openai_schema.FIRST_BAD for m in meta))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    found = []
    if origin in (list, dict) and args[-1] is not typing.Any and not marked:
        found.append(annotation)
    for a in args:
        found += _unmarked(a)
    return found


def test_every_list_and_dict_of_a_request_is_marked():
    models = [CompletionRequest, ChatRequest, GenerateRequest, chat_mod.ChatRequest, openai_schema.ChatMessage,
              openai_schema.StreamOptions, chat_mod.Message]
    bare = []
    for m in models:
        for name, f in m.model_fields.items():
            annotation = f.rebuild_annotation() if hasattr(f, "rebuild_annotation") else f.annotation
            if name != "messages" and (found := _unmarked(annotation)):
                bare.append(f"{m.__name__}.{name}: {found}")
    assert not bare, bare
    assert issubclass(ChatRequest, BaseModel)


@pytest.fixture(scope="module")
def api(tokenizer):
    from fastapi.testclient import TestClient

    from gptforge.serve.app import ServeSettings, create_app
    from tests.serve.answering import T, answering_model

    app = create_app(answering_model(64), tokenizer, ServeSettings(max_new_tokens_cap=4), chat_template=T.to_dict())
    with TestClient(app) as c:
        yield c


def test_an_api_answer_lists_at_most_four_errors(api):
    """/v1 listed four errors, /api every one: 1,000,000 unknown keys in a 14 MB body made a 49 MB answer."""
    bad = [{"role": "x", "content": "a"}] * 10
    r = api.post("/api/chat", json={"messages": bad})
    want = [f"messages.{i}.role: Input should be 'system', 'user' or 'assistant' (got 'x')" for i in range(4)]
    assert (r.status_code, r.json()["error"]) == (422, "; ".join([*want, "and 6 more"])), r.text
    r = api.post("/api/chat", json={"messages": bad[:5]})
    assert r.json()["error"] == "; ".join([*want, "and 1 more"]), r.text
    r = api.post("/api/chat", json={"messages": bad[:4]})  # four: all listed
    assert r.json()["error"] == "; ".join(want), r.text


def test_more_unknown_keys_than_an_answer_lists_are_one_error(api):
    """Each unknown key was an error pydantic and FastAPI made on the event loop (1,000,000: 15 s); past four
    they are refused at once, counted, the first four named."""
    r = api.post("/api/generate", json={"prompt": "a", **{f"k{i}": 1 for i in range(50)}})
    assert (r.status_code, r.json()["error"]) == (
        422, "body: 50 keys this request does not take ('k0', 'k1', 'k2', 'k3', ...)"), r.text
    r = api.post("/api/chat", json={"messages": [{"role": "user", "content": "a", **{f"k{i}": 1 for i in range(5)}}]})
    assert r.json()["error"].startswith("messages.0: 5 keys this request does not take ('k0', 'k1', 'k2', 'k3', "
                                        "...)"), r.text
    r = api.post("/api/generate", json={"prompt": "a", **{f"k{i}": 1 for i in range(5)}})
    assert r.json()["error"] == "body: 5 keys this request does not take ('k0', 'k1', 'k2', 'k3', ...)", r.text
    r = api.post("/api/generate", json={"prompt": "a", **{f"k{i}": 1 for i in range(4)}})  # four: each by name
    assert r.json()["error"] == "; ".join(f"k{i}: Extra inputs are not permitted (got 1)" for i in range(4)), r.text
