"""Hardening round thirteen of the server, on a tiny chat model (64 positions) in-process.

- /api/chat bounded its message count by the model's context positions (each message takes at least what its
  template spends: ``limits.message_bound``), but /v1/chat/completions did not: a 12 MB body of 400,000 empty messages (under the 16 MB a
  128k-context model's body limit lets in) was validated, turned into a conversation and rendered whole, holding the
  GIL in its worker thread, and stalled every other client's stream. Both chat routes now take their request model
  from one place (``limits.bounded_messages``), which counts the messages as sent, before any is validated, and
  refuses a count past the context as a validation error of ``messages`` in each route's shape.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

pytest.importorskip("fastapi")

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator  # noqa: E402

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from gptforge.serve.limits import MESSAGES_OVER_CONTEXT, MessageBound, bounded_messages  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402

BLOCK = 64
MOST = (BLOCK - 3) // 2  # gptforge's template: two ids a message, two around them, one position left for the reply
REFUSAL = "messages: " + MESSAGES_OVER_CONTEXT.format(max_length=MOST, positions=BLOCK, cost=2)
EMPTY = {"role": "user", "content": ""}


@pytest.fixture(scope="module")
def client(tokenizer):
    from fastapi.testclient import TestClient

    app = create_app(answering_model(BLOCK), tokenizer, ServeSettings(max_new_tokens_cap=16),
                     chat_template=T.to_dict())
    with TestClient(app) as c:
        yield c


def _post(client, path: str, messages: list) -> tuple[int, str, str | None]:
    """(status, message, param) of a refusal, in either family's shape (/api: a string; /v1: OpenAI's object)."""
    knob = {"max_tokens": 1} if path.startswith("/v1") else {"max_new_tokens": 1}
    r = client.post(path, json={"messages": messages, **knob})
    err = r.json()["error"]
    return (r.status_code, err["message"], err["param"]) if path.startswith("/v1") else (r.status_code, err, None)


@pytest.mark.parametrize("path, status, param", [("/v1/chat/completions", 400, "messages"), ("/api/chat", 422, None)])
def test_more_messages_than_the_context_has_positions_are_refused_by_their_count_on_both_chat_routes(
        client, tokenizer, path, status, param):
    for n in (MOST + 1, 30_000):  # one past the bound; ~1 MB of empty messages (the body limit of this model)
        got, message, named = _post(client, path, [EMPTY] * n)
        assert (got, message[:len(REFUSAL)], named) == (status, REFUSAL, param), (n, message[:300])
        assert message.endswith(f"... ({n:,} items))"), message  # the messages are not repeated
    # at the bound the count is accepted, and the conversation fits (test_serve_message_bound has the edge's proof)
    knob = {"max_tokens": 1} if path.startswith("/v1") else {"max_new_tokens": 1}
    assert client.post(path, json={"messages": [EMPTY] * MOST, **knob}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_the_count_is_refused_before_any_message_is_read(client, path):
    """Messages past the first that no route would take (a role of the wrong type, a number where a message goes):
    over the bound, the refusal is the count alone; within it, the messages' own errors."""
    bad = ([EMPTY] + [{"role": 5, "content": ""}, 1] * MOST)[:MOST + 1]
    _, message, _ = _post(client, path, bad)
    assert message.startswith(REFUSAL) and "messages.1" not in message, message[:300]
    _, message, _ = _post(client, path, bad[:MOST])
    assert message.startswith("messages.1.role"), message[:300]


class _Counted(BaseModel):
    """A message that counts its validations."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seen: ClassVar[list[int]] = []  # a class-wide tally, read by the test
    text: str

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data):
        cls.seen.append(1)
        return data


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    messages: list[_Counted]
    n: int = 1


def test_the_bound_counts_the_list_as_sent_and_validates_no_message_past_it():
    """pydantic's own ``max_length`` validates every message up to the bound before it counts past it: 131,072 of
    them for a 128k-context model. The bound here validates none of a list that is too long."""
    bounded = bounded_messages(_Request, _Counted, MessageBound(positions=8, first=2, cost=2))  # 2 + 2 * 2 + 1 <= 8
    assert issubclass(bounded, _Request) and bounded.model_config == _Request.model_config  # strict, extra forbidden
    _Counted.seen.clear()
    assert len(bounded.model_validate({"messages": [{"text": "a"}] * 3}).messages) == 3  # at the bound: taken
    assert len(_Counted.seen) == 3
    _Counted.seen.clear()
    with pytest.raises(ValidationError) as e:
        bounded.model_validate({"messages": [{"text": "a"}] * 4, "n": "x"})
    assert _Counted.seen == []  # not one message validated
    errs = {x["loc"]: x for x in e.value.errors()}
    assert errs[("messages",)]["msg"] == MESSAGES_OVER_CONTEXT.format(max_length=3, positions=8, cost=2)
    assert errs[("messages",)]["ctx"] == {"max_length": 3, "actual_length": 4, "positions": 8, "cost": 2}
    assert ("n",) in errs  # the other fields are still checked
    for empty_or_not_a_list in ([], "a", None):  # the list's own refusals are unchanged
        with pytest.raises(ValidationError) as e:
            bounded.model_validate({"messages": empty_or_not_a_list})
        assert e.value.errors()[0]["type"] in ("too_short", "list_type"), e.value.errors()
