"""/api/generate and /api/stream's request handling (``create_app``'s ``prepare``) against hand-written
expectations (issue 36): the default length (64, or the server's cap when lower, or the room the context
leaves), the edges of the cap, the batch and the prompt limits, the empty prompt, <|endoftext|> typed in a
prompt, ``stop_at_eot`` both ways, and every refusal word for word.

The model answers one known token greedily whatever the prompt (ln_f's output is its bias alone, and that
token's row of the tied embedding points along it), so a reply of n tokens is that token's text n times."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402

BANG, EOT = 0, 50256  # GPT-2's ids of "!" and <|endoftext|>


def _model(block: int, answer: int = BANG) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=block, vocab_size=50257)).eval()
    with torch.no_grad():
        m.transformer.ln_f.weight.zero_()
        m.transformer.ln_f.bias.copy_(torch.randn(32))
        m.transformer.wte.weight[answer] = m.transformer.ln_f.bias * 10
    return m


def _client(tokenizer, block: int = 32, answer: int = BANG, **settings):
    s = ServeSettings(**{"max_new_tokens_cap": 16, "max_batch": 4, "max_prompt_chars": 10, **settings})
    return TestClient(create_app(_model(block, answer), tokenizer, s))


def _generate(c, **body) -> list[tuple[str, str]]:
    r = c.post("/api/generate", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return [(x["text"], x["finish_reason"]) for x in r.json()["completions"]]


def _stream(c, **body) -> list[tuple[str, str]]:
    r = c.post("/api/stream", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    rows: dict[int, list] = {}
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: {}":
            ev = json.loads(line[6:])
            row = rows.setdefault(ev["row"], ["", None])
            row[0] += ev.get("text", "")
            row[1] = ev.get("reason", row[1])
    return [tuple(rows[i]) for i in sorted(rows)]


def _refusal(c, status: int = 400, **body) -> str:
    errors = set()
    for route in ("/api/generate", "/api/stream"):
        r = c.post(route, json={"temperature": 0, **body})
        assert r.status_code == status, (route, r.text)
        errors.add(r.json()["error"])
    (error,) = errors
    return error


@pytest.mark.parametrize("send", [_generate, _stream])
def test_default_length_and_the_caps_edge(tokenizer, send):
    with _client(tokenizer, block=128, max_new_tokens_cap=100) as c:
        assert send(c, prompt="hi") == [("!" * 64, "length")]
    with _client(tokenizer, block=128, max_new_tokens_cap=16) as c:
        assert send(c, prompt="hi") == [("!" * 16, "length")]
        assert send(c, prompt="hi", max_new_tokens=16) == [("!" * 16, "length")]
        assert send(c, prompt="hi", max_new_tokens=2) == [("!" * 2, "length")]
        assert _refusal(c, prompt="hi", max_new_tokens=17) == "max_new_tokens=17 is over this server's cap of 16"


@pytest.mark.parametrize("send", [_generate, _stream])
def test_default_length_shrinks_to_the_room_an_explicit_one_must_fit(tokenizer, send):
    assert tokenizer.encode_ordinary("hi") == [5303]  # one token
    with _client(tokenizer, block=32, max_new_tokens_cap=60, max_prompt_chars=100) as c:
        assert send(c, prompt="hi") == [("!" * 31, "length")]
        assert send(c, prompt="hi", max_new_tokens=31) == [("!" * 31, "length")]
        assert _refusal(c, prompt="hi", max_new_tokens=32) == (
            "prompt (1 tokens) + max_new_tokens 32 exceeds the model's context of 32 tokens; ask for at most 31")
        # an empty prompt is <|endoftext|> (one token); typed in a prompt, <|endoftext|> is that one token too
        assert send(c, prompt="") == [("!" * 31, "length")]
        assert send(c, prompt="<|endoftext|>") == [("!" * 31, "length")]
        assert send(c, prompts=["hi", "", "<|endoftext|>"], max_new_tokens=2) == [("!!", "length")] * 3
    with _client(tokenizer, block=1, max_new_tokens_cap=60) as c:
        assert _refusal(c, prompt="hi") == ("the prompt is 1 tokens; the model's context of 1 leaves no room to "
                                            "generate (shorten it)")


@pytest.mark.parametrize("send", [_generate, _stream])
def test_the_batch_and_prompt_limits_are_inclusive(tokenizer, send):
    with _client(tokenizer) as c:
        assert send(c, prompts=["a", "b", "c", "d"], max_new_tokens=1) == [("!", "length")] * 4
        assert send(c, prompt="y" * 10, max_new_tokens=1) == [("!", "length")]
        assert _refusal(c, prompts=["a"] * 5) == "prompts: 5 prompts; this server takes at most 4"
        assert _refusal(c, prompts=["ok", "y" * 11]) == "prompts.1 has 11 characters; the limit is 10"
        assert _refusal(c, prompt="y" * 11) == "prompt has 11 characters; the limit is 10"


def test_the_other_refusals_word_for_word(tokenizer):
    with _client(tokenizer) as c:
        one = "give exactly one of prompt (a string) or prompts (a list of strings)"
        assert _refusal(c) == one and _refusal(c, prompt="a", prompts=["b"]) == one
        assert _refusal(c, prompt="a", stop=["x", ""]) == "stop: stop sequences must be non-empty strings"


@pytest.mark.parametrize("send", [_generate, _stream])
def test_stop_at_eot_both_ways(tokenizer, send):
    with _client(tokenizer, answer=EOT) as c:
        assert send(c, prompt="hi", max_new_tokens=3) == [("", "eot")]
        assert send(c, prompt="hi", max_new_tokens=3, stop_at_eot=True) == [("", "eot")]
        assert send(c, prompt="hi", max_new_tokens=3, stop_at_eot=False) == [("<|endoftext|>" * 3, "length")]


def test_validation_errors_word_for_word(tokenizer):
    """``bodies.validation_message``: each error as ``field.path: pydantic's message (got the input)``, joined by
    "; "; a body that is not an object is /v1's 400; malformed JSON is a 400 with the json module's own reason."""
    raw_bad = '{"prompt": "hi", '
    try:
        json.loads(raw_bad)
    except json.JSONDecodeError as e:
        reason = e.msg
    cases = [
        ('{"prompt": "hi", "max_new_tokens": 0}', 422,
         "max_new_tokens: Input should be greater than or equal to 1 (got 0)"),
        ('{"prompt": 5, "seed": -1}', 422,
         "prompt: Input should be a valid string (got 5); seed: Input should be greater than or equal to 0 (got -1)"),
        ('{"prompts": ["a", 3]}', 422, "prompts.1: Input should be a valid string (got 3)"),
        ('{"prompt": "hi", "temprature": 1}', 422, "temprature: Extra inputs are not permitted (got 1)"),
        ("[1, 2]", 400, "the body must be a JSON object"),
        (raw_bad, 400, f"malformed JSON body: {reason}"),
    ]
    with _client(tokenizer) as c:
        for raw, status, words in cases:
            for route in ("/api/generate", "/api/stream"):
                r = c.post(route, content=raw, headers={"content-type": "application/json"})
                assert (r.status_code, r.json()) == (status, {"error": words}), (route, raw)


def test_the_app_around_the_request_handlers():
    """``create_app``'s own settings: GPT-2's BPE when no tokenizer is given ("hi" is its id 5303, one token of
    the 32), the API key required on /api when given, and the API's published name."""
    with TestClient(create_app(_model(32), None, ServeSettings(max_new_tokens_cap=60))) as c:
        assert _generate(c, prompt="hi") == [("!" * 31, "length")]
        info = c.get("/openapi.json").json()["info"]
        assert (info["title"], info["description"]) == ("gptforge", "Talk to a gptforge model.")
    with TestClient(create_app(_model(32), None, ServeSettings(max_new_tokens_cap=60), api_key="k3y")) as c:
        r = c.post("/api/generate", json={"prompt": "hi", "max_new_tokens": 1, "temperature": 0})
        assert r.status_code == 401 and r.json() == {"error": "missing or wrong API key: send the header "
                                                              "'Authorization: Bearer <key>' with the key this server "
                                                              "was started with (--api-key)"}
        r = c.post("/api/generate", json={"prompt": "hi", "max_new_tokens": 2, "temperature": 0},
                   headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 200 and r.json()["completions"] == [{"text": "!!", "finish_reason": "length"}]


def test_a_chat_template_past_the_models_vocabulary_is_refused_when_the_app_is_built(tokenizer):
    """``create_app`` checks the checkpoint's chat template against the model it serves: GPT-2's chat ids
    (50,257-50,260) on a model of GPT-2's 50,257 rows would index past the embedding."""
    from gptforge.data.chat import ChatTemplate
    from gptforge.errors import ChatFormatError

    with pytest.raises(ChatFormatError) as e:
        create_app(_model(32), tokenizer, ServeSettings(), chat_template=ChatTemplate.gpt2().to_dict())
    assert str(e.value) == ("chat_template: chat_template.end=50260: expected a token id, an integer >= 0 and below "
                            "model.vocab_size=50257; the checkpoint's template is damaged (re-run sft to write a good "
                            "one)")
