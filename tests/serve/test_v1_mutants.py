"""What the serve lanes' mutants showed the tests did not pin (issue 36), through the HTTP API of every route
that can reach it, against expectations written here:

- the default reply length under a server cap below every route's default (OpenAI's 16 on /v1/completions,
  64 on /api/generate, 128 on /api/chat, the cap on /v1/chat): the cap wins, on every route, whole and
  streamed, and one more than the cap is refused on every route;
- a prompt id at the model's vocabulary edge (the tokenizer larger than the model: GPT-2's BPE on a model
  of 31,373 ids, where "hello" is id 31,373): a 400 naming the field on every route, never a reply made
  from a row past the vocabulary; one id more of vocabulary and the same prompt is answered;
- ids the model has but its tokenizer does not (a model with more rows than its tokenizer: llm.c's 50,304
  for GPT-2's 50,257): they print as ``<|id|>`` on every route, as gptforge's tokenizers print an unused
  padded row, instead of failing the request (they were a 500, or an error event in a stream).

The model answers one chosen id greedily whatever the prompt (ln_f's output is its bias alone, and that
id's row of the tied embedding points along it), so a reply of n tokens is that id's text n times.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.answering import BANG, CHATML, T, answering_model, chatml_bpe  # noqa: E402

HELLO = 31373  # GPT-2's id of "hello" (checked below)
USER = [{"role": "user", "content": "hello"}]


def _client(model, tokenizer, template=T.to_dict(), **settings) -> TestClient:
    return TestClient(create_app(model, tokenizer, ServeSettings(**settings), chat_template=template),
                      raise_server_exceptions=False)


def _events(text: str) -> list:
    """An SSE body's ``data:`` payloads in order (JSON decoded; ``[DONE]`` and ``{}`` left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line not in ("data: [DONE]", "data: {}"):
            out.append(json.loads(line[6:]))
    return out


def _hi(path: str) -> dict:
    """The prompt "hi" in the body of /v1/completions or /v1/chat/completions."""
    return {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}


def _reply(c, path: str, body: dict) -> tuple[str, int | None]:
    """The text of one request's reply on any route, whole or streamed, and its completion-token count
    where the route reports one."""
    r = c.post(path, json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    if path in ("/api/stream", "/api/chat"):
        evs = _events(r.text)
        assert all("error" not in e for e in evs), r.text
        return "".join(e.get("text", "") for e in evs), None
    if body.get("stream"):
        evs = _events(r.text)
        assert all("error" not in e for e in evs), r.text
        pieces = [ch.get("text", ch.get("delta", {}).get("content", "")) for e in evs for ch in e["choices"]]
        usage = [e["usage"] for e in evs if e.get("usage")]
        return "".join(pieces), usage[0]["completion_tokens"] if usage else None
    out = r.json()
    if path == "/api/generate":
        return out["completions"][0]["text"], None
    ch = out["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"], out["usage"]["completion_tokens"]


# every route and how it asks for a length
ROUTES = [("/v1/completions", {"prompt": "hi"}, "max_tokens"),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "max_completion_tokens"),
          ("/api/generate", {"prompt": "hi"}, "max_new_tokens"),
          ("/api/stream", {"prompt": "hi"}, "max_new_tokens"),
          ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, "max_new_tokens")]


# ---------------------------------------------------------------- the cap below every route's default
@pytest.mark.parametrize("path,body,field", ROUTES)
def test_a_cap_below_the_routes_default_length_bounds_the_default(tokenizer, path, body, field):
    """Cap 8: OpenAI's default of 16 on /v1/completions, /api/generate's 64 and /api/chat's 128 all give 8
    tokens; 8 asked for is 8, 9 is refused naming the cap, in the route family's words."""
    with _client(answering_model(), tokenizer, max_new_tokens_cap=8) as c:
        assert _reply(c, path, body) in (("!" * 8, 8), ("!" * 8, None))
        assert _reply(c, path, {**body, field: 8}) in (("!" * 8, 8), ("!" * 8, None))
        if path.startswith("/v1"):
            assert _reply(c, path, {**body, "stream": True, "stream_options": {"include_usage": True}}) == ("!" * 8, 8)
        r = c.post(path, json={**body, field: 9})
        assert r.status_code == 400
        if path.startswith("/v1"):
            assert r.json() == {"error": {"message": f"{field}=9 is over this server's cap of 8",  # the field sent
                                          "type": "invalid_request_error", "param": field, "code": None}}
        else:
            assert r.json() == {"error": "max_new_tokens=9 is over this server's cap of 8"}


def test_v1_completions_default_is_openais_16_under_a_larger_cap_and_shrinks_to_the_room(tokenizer):
    with _client(answering_model(block=64), tokenizer, max_new_tokens_cap=40) as c:
        assert _reply(c, "/v1/completions", {"prompt": "hi"}) == ("!" * 16, 16)
    with _client(answering_model(block=12), tokenizer, max_new_tokens_cap=40) as c:  # "hi" is 1 token: room for 11
        assert _reply(c, "/v1/completions", {"prompt": "hi"}) == ("!" * 11, 11)
        assert _reply(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}) == (
            "!" * 7, 7)  # <|endoftext|> <|user|> hi <|end|> <|assistant|>: 5 of 12


# ---------------------------------------------------------------- a prompt id at the vocabulary's edge
def _template_in(vocab: int) -> dict:
    """gptforge's template with its chat ids inside a small vocabulary (ids 1-5, under GPT-2's "hello")."""
    return {"name": "edge", "bos": 1, "roles": {"system": 2, "user": 3, "assistant": 4}, "end": 5}


def test_prompt_ids_at_the_models_vocabulary_edge_are_a_400_on_every_route(tokenizer):
    assert tokenizer.encode("hello") == [HELLO] and tokenizer.encode("!hello") == [BANG, HELLO]
    outside = f"tokenizes to id {HELLO}, outside this model's vocabulary of {HELLO} (the text is not in the " \
              "model's tokenizer)"
    native = f"token id {HELLO} is outside this model's vocabulary of {HELLO} ids (it was not trained with " \
             "GPT-2's tokenizer); prompt it with ids it knows"

    def oa(message: str, param: str) -> dict:
        return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}

    m = answering_model(vocab=HELLO)  # 31,373 ids; its padded embedding has a row 31,373 that a miscount would read
    assert m.transformer.wte.weight.shape[0] > HELLO
    with _client(m, tokenizer, template=_template_in(HELLO), max_new_tokens_cap=4, max_prompt_chars=50) as c:
        for body in ({}, {"stream": True}):
            r = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, **body})
            assert (r.status_code, r.json()) == (400, oa(f"messages: prompt 0 {outside}", "messages"))
            r = c.post("/v1/completions", json={"prompt": ["!", "!hello"], "max_tokens": 1, **body})
            assert (r.status_code, r.json()) == (400, oa(f"prompt: prompt 1 {outside}", "prompt"))
        r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 0, "echo": True, "logprobs": 0})
        assert (r.status_code, r.json()) == (400, oa(f"prompt: prompt 0 {outside}", "prompt"))
        r = c.post("/v1/completions", json={"prompt": [[BANG], [BANG, HELLO]], "max_tokens": 1})
        assert (r.status_code, r.json()) == (400, oa(f"prompt 1: token ids must be a non-empty list in [0, {HELLO})",
                                                     "prompt"))
        for path in ("/api/generate", "/api/stream"):
            r = c.post(path, json={"prompts": ["!", "!hello"], "max_new_tokens": 1})
            assert (r.status_code, r.json()) == (400, {"error": f"prompt 1: {native}"})
        r = c.post("/api/chat", json={"messages": USER, "max_new_tokens": 1})
        assert (r.status_code, r.json()) == (400, {"error": f"prompt 0: {native}"})
        # the last id of the vocabulary is in it
        r = c.post("/v1/completions", json={"prompt": [HELLO - 1], "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "!"
    # one id more and the same prompts are answered
    with _client(answering_model(vocab=HELLO + 1), tokenizer, template=_template_in(HELLO + 1), max_new_tokens_cap=4,
                 max_prompt_chars=50) as c:
        assert _reply(c, "/v1/chat/completions", {"messages": USER, "max_tokens": 2}) == ("!!", 2)
        assert _reply(c, "/v1/completions", {"prompt": ["!", "!hello"], "max_tokens": 2}) == ("!!", 4)  # 2 rows
        assert _reply(c, "/v1/completions", {"prompt": [[BANG, HELLO]], "max_tokens": 2}) == ("!!", 2)
        assert _reply(c, "/api/generate", {"prompts": ["!", "!hello"], "max_new_tokens": 2}) == ("!!", None)
        assert _reply(c, "/api/chat", {"messages": USER, "max_new_tokens": 2}) == ("!!", None)


# ---------------------------------------------------------------- ids the model has and its tokenizer lacks
PAST = 50300  # a row of a 50,304-row model (llm.c's padding of GPT-2) that GPT-2's 50,257 ids do not reach


@pytest.mark.parametrize("template", [None, T.to_dict()], ids=["base", "chat"])
def test_ids_past_the_tokenizer_print_as_their_number_on_every_route(tokenizer, template):
    assert tokenizer.n_vocab == 50257
    piece = f"<|{PAST}|>"
    with _client(answering_model(vocab=50304, answer=PAST), tokenizer, template=template, max_new_tokens_cap=8) as c:
        for path, body in [("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                           ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}),
                           ("/api/generate", {"prompt": "hi", "max_new_tokens": 2}),
                           ("/api/stream", {"prompt": "hi", "max_new_tokens": 2})]:
            assert _reply(c, path, body)[0] == piece * 2, path
        # its log-probabilities name it the same way, and an echoed token-id prompt holding it too
        r = c.post("/v1/completions", json={"prompt": [BANG, PAST], "max_tokens": 1, "echo": True, "logprobs": 1,
                                            "temperature": 0})
        assert r.status_code == 200, r.text
        (ch,) = r.json()["choices"]
        assert ch["text"] == "!" + piece + piece
        assert ch["logprobs"]["tokens"] == ["!", piece, piece]
        assert ch["logprobs"]["text_offset"] == [0, 1, 1 + len(piece)]
        assert list(ch["logprobs"]["top_logprobs"][2]) == [piece]


# ---------------------------------------------------------------- refusals of what the server cannot honour
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_penalties_and_logit_bias_are_refused_word_for_word(tokenizer, path):
    body = _hi(path)
    want = {name: f"{name}: not supported by this server (use 0; repetition_penalty is the penalty gptforge has)"
            for name in ("presence_penalty", "frequency_penalty")}
    with _client(answering_model(), tokenizer, max_new_tokens_cap=4) as c:
        for name, value in (("presence_penalty", 0.5), ("frequency_penalty", -1), ("logit_bias", {"5": 1.0})):
            r = c.post(path, json={**body, name: value})
            message = want.get(name, "logit_bias: not supported by this server")
            assert (r.status_code, r.json()) == (400, {"error": {"message": message, "type": "invalid_request_error",
                                                                  "param": name, "code": None}})
        for off in ({"presence_penalty": 0, "frequency_penalty": 0.0}, {"logit_bias": {}}):  # OpenAI's defaults
            assert _reply(c, path, {**body, "max_tokens": 1, **off})[0] == "!"


# ---------------------------------------------------------------- logprobs of a reply ended by its stop token
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_logprobs_leave_out_the_stop_token_that_ended_the_reply(tokenizer, path):
    """A model whose first token is the route's stop token (GPT-2's <|endoftext|> for text, the template's
    <|end|> for chat) answers an empty reply, finish_reason stop, and logprobs over no token: the stop
    token is the end of the reply, not a part of it."""
    chat = path == "/v1/chat/completions"
    stop = T.end if chat else tokenizer.eot_token
    body = ({"messages": USER, "logprobs": True, "top_logprobs": 2} if chat else {"prompt": "hi", "logprobs": 2})
    with _client(answering_model(answer=stop), tokenizer, max_new_tokens_cap=4) as c:
        r = c.post(path, json={**body, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop"
    if chat:
        assert ch["message"]["content"] == "" and ch["logprobs"] == {"content": []}
    else:
        assert ch["text"] == "" and ch["logprobs"] == {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                                       "text_offset": []}


# ---------------------------------------------------------------- SamplingParams.check behind the schema
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("message,field", [("top_p=0.5: must be in (0.6, 1] (a rule the schema lacks)", "top_p"),
                                           ("stop: stop sequences must be non-empty strings", "stop"),
                                           ("repetition_penalty=1.0: must be > 2", "repetition_penalty")])
def test_a_range_only_sampling_params_knows_is_a_400_naming_its_field(tokenizer, monkeypatch, path, message, field):
    """The schema refuses every range SamplingParams.check knows today, so this fallback is reached only when
    check learns a rule first: it must still be a 400 naming the field (the text before '=' or ':'), never
    a 500. The rule is planted by replacing check."""
    from gptforge.generation import SamplingParams

    def check(self):
        raise ValueError(message)
    monkeypatch.setattr(SamplingParams, "check", check)
    body = _hi(path)
    with _client(answering_model(), tokenizer, max_new_tokens_cap=4) as c:
        r = c.post(path, json={**body, "max_tokens": 1, "top_p": 0.5})
    assert (r.status_code, r.json()) == (400, {"error": {"message": message, "type": "invalid_request_error",
                                                          "param": field, "code": None}})


# ---------------------------------------------------------------- a Jinja template on the model's own tokenizer
def test_v1_chat_reads_a_jinja_template_with_the_served_tokenizer():
    """ChatML's <|im_end|> is a special token of the served tokenizer (a BPE trained here), not of GPT-2's:
    the /v1 chat route reads the template with the served tokenizer, renders the prompt in its ids, and its
    end ends the reply."""
    t, tok = chatml_bpe()
    chatml = CHATML
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    # <|im_start|> "user\n" ... <|im_end|> "\n" <|im_start|> "assistant\n", in the small BPE's ids
    n_prompt = len(t.encode("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n").ids)
    for answer, want in ((t.token_to_id("<|im_end|>"), ("", "stop", 1)), (t.token_to_id("5"), ("555", "length", 3))):
        with _client(answering_model(vocab=tok.n_vocab, answer=answer), tok, template=chatml, max_new_tokens_cap=16) as c:
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "temperature": 0})
            assert r.status_code == 200, r.text
            out = r.json()
            assert (out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"],
                    out["usage"]["completion_tokens"]) == want
            assert out["usage"]["prompt_tokens"] == n_prompt
