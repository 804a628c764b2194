"""/api/chat's request handling against hand-written expectations (issue 36): the default length (128, or
the server's cap when lower, or the room the context leaves), the cap's and the context's edges, the
template's end token as the stop, /api/chat/info's template, and every refusal word for word.

The model answers one known token greedily whatever the prompt (ln_f's output is its bias alone, and that
token's row of the tied embedding points along it), so a reply of n tokens is that token's text n times
and its length is read off the text. The prompt's ids are written out here from the template's layout."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.answering import CHATML, T, answering_model, chatml_bpe  # noqa: E402

MSGS = [{"role": "user", "content": "What is 2 + 3?"}]


def _prompt_len(tokenizer) -> int:
    # <|endoftext|> <|user|> What is 2 + 3? <|end|> <|assistant|>, the question in GPT-2's 6 tokens
    assert tokenizer.encode_ordinary("What is 2 + 3?") == [2061, 318, 362, 1343, 513, 30]
    return 1 + 1 + 6 + 1 + 1


def _client(model, tokenizer, cap: int, template=T.to_dict()):
    return TestClient(create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=cap), chat_template=template))


def _reply(c, **body) -> tuple[str, str]:
    r = c.post("/api/chat", json={"messages": MSGS, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    text, reason = "", None
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: {}":
            ev = json.loads(line[6:])
            text += ev.get("text", "")
            reason = ev.get("reason", reason)
    return text, reason


def _refusal(c, **body) -> str:
    r = c.post("/api/chat", json={"messages": MSGS, "temperature": 0, **body})
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_default_length_is_the_cap_when_below_128_and_the_cap_is_inclusive(tokenizer):
    with _client(answering_model(64), tokenizer, cap=16) as c:
        assert _reply(c) == ("!" * 16, "length")
        assert _reply(c, max_new_tokens=16) == ("!" * 16, "length")
        assert _reply(c, max_new_tokens=3) == ("!" * 3, "length")
        assert _refusal(c, max_new_tokens=17) == "max_new_tokens=17 is over this server's cap of 16"


def test_default_length_is_128_under_a_larger_cap(tokenizer):
    with _client(answering_model(256), tokenizer, cap=200) as c:
        assert _reply(c) == ("!" * 128, "length")
        assert _reply(c, max_new_tokens=129) == ("!" * 129, "length")


def test_default_length_shrinks_to_the_room_an_explicit_one_must_fit(tokenizer):
    n = _prompt_len(tokenizer)
    with _client(answering_model(64), tokenizer, cap=60) as c:
        assert _reply(c) == ("!" * (64 - n), "length")
        assert _reply(c, max_new_tokens=64 - n) == ("!" * (64 - n), "length")
        assert _refusal(c, max_new_tokens=65 - n) == (
            f"prompt ({n} tokens) + max_new_tokens {65 - n} exceeds the model's context of 64 tokens; "
            f"ask for at most {64 - n}")
    with _client(answering_model(n), tokenizer, cap=60) as c:  # the prompt fills the context
        assert _refusal(c) == (f"the prompt is {n} tokens; the model's context of {n} leaves no room to generate "
                               "(shorten the message, or start a new conversation)")


def test_reply_stops_at_the_templates_end_token(tokenizer):
    with _client(answering_model(64, answer=T.end), tokenizer, cap=16) as c:
        assert _reply(c) == ("", "eot")
    with _client(answering_model(64, answer=T.roles["user"]), tokenizer, cap=16) as c:  # another chat token is not a stop
        assert _reply(c, max_new_tokens=2) == ("<|user|>" * 2, "length")


def test_info_and_the_refusal_without_a_template(tokenizer):
    with _client(answering_model(64), tokenizer, cap=16) as c:
        assert c.get("/api/chat/info").json() == {
            "available": True,
            "template": {"bos": 50256, "roles": {"system": 50257, "user": 50258, "assistant": 50259}, "end": 50260,
                         "name": "gptforge-gpt2-chat-v1"}}
    with _client(answering_model(64, vocab=50257), tokenizer, cap=16, template=None) as c:
        assert c.get("/api/chat/info").json() == {"available": False, "template": None}
        assert _refusal(c) == ("this model has no chat template (fine-tune it with `gptforge sft`); "
                               "use /api/stream to continue text")


def test_a_jinja_template_on_the_models_own_tokenizer():
    """The template is read with the served tokenizer: ChatML's <|im_end|> is a special token of this one
    (not of GPT-2's), and it ends the reply."""
    t, tok = chatml_bpe()
    chatml = CHATML
    five = t.token_to_id("5")
    for answer, want in ((t.token_to_id("<|im_end|>"), ("", "eot")), (five, ("555", "length"))):
        with _client(answering_model(64, answer=answer, vocab=tok.n_vocab), tok, cap=16, template=chatml) as c:
            assert c.get("/api/chat/info").json() == {"available": True, "template": chatml}
            assert _reply(c, max_new_tokens=3) == want


def test_the_conversation_is_encoded_with_the_served_tokenizer(tokenizer):
    """gptforge's template around another tokenizer's text: the prompt is <|endoftext|> <|user|>, the
    message in the served tokenizer's ids, <|end|> <|assistant|>; the default length is the room left."""
    t, tok = chatml_bpe()
    text = "Is a zebra 2 + 3?"  # "zebra" is not in the small BPE's merges: its bytes, one token each
    n = 4 + len(tok.encode_ordinary(text))
    assert n - 4 > len(tokenizer.encode_ordinary(text))  # GPT-2's BPE takes fewer: the two tell apart
    with _client(answering_model(64, answer=t.token_to_id("5")), tok, cap=60) as c:
        assert _reply(c, messages=[{"role": "user", "content": text}]) == ("5" * (64 - n), "length")
