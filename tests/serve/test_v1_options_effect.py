"""Every request option of /v1/completions, /v1/chat/completions, /api/generate, /api/stream and /api/chat
tested through to its effect (issue 36), not only its refusal.

The reference for greedy replies (temperature 0, top_p that rounds to the top token, top_k 1, the
repetition penalty, stop strings, lengths, log-probabilities) is written out here: a forward pass over
the whole sequence per row and step (no KV cache, no padding) with the penalty and filters applied by
hand in float64. Sampled replies are compared with ``generation.complete`` called directly with the
options given by hand and the same seed. Each effect is also checked to be an effect: the option's
reply differs from the reply without it.

``EFFECTS`` maps every field of every request model to the test that shows its effect (or its refusal
when the server refuses all but the default); ``test_every_accepted_option_has_an_effect_test`` walks the
pydantic models, so an option added without an effect test fails.

Planted bugs these catch: ``stop`` checked but not passed to sampling; ``top_p`` or ``top_k`` dropped;
``max_completion_tokens`` ignored (or losing to ``max_tokens``); ``seed`` or ``temperature`` not passed;
``n`` replies not independent draws; ``stop_at_eot`` ignored; logprobs of the wrong position.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.data.chat import ChatTemplate  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve import chat as chat_mod  # noqa: E402
from gptforge.serve import openai_schema  # noqa: E402
from gptforge.serve.app import GenerateRequest, ServeSettings, create_app  # noqa: E402

T = ChatTemplate.gpt2()
EOT = 50256
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
PROMPT = "ROMEO: shall I"


def _model(eot_first: bool = False) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=T.vocab_size)).eval()
    with torch.no_grad():
        m.transformer.wte.weight.mul_(5)  # sharper than at init, still wide: every knob changes the draws
        if eot_first:  # ln_f's output is its bias alone, and <|endoftext|> points along it: greedy picks it
            m.transformer.ln_f.weight.zero_()
            m.transformer.ln_f.bias.copy_(torch.randn(32))
            m.transformer.wte.weight[EOT] = m.transformer.ln_f.bias * 10
    return m


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture  # per test, not per module: mutmut maps a test to the functions its own setup calls, and the
def client(model, tokenizer):  # routes are closures made in add_openai_routes when the app is built
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=32, max_batch=4), chat_template=T.to_dict())
    with TestClient(app) as c:
        yield c


# ---------------------------------------------------------------- the reference, written out here
@torch.no_grad()
def ref_sample(model, rows, n_new, temperature=0, top_k=None, top_p=None, rep=1.0, seed=0, stop_token=None):
    """Greedy, per row: the generated ids (up to and without ``stop_token``) and the finish reason."""
    assert temperature == 0
    seqs = [list(r) for r in rows]
    out, reasons = [[] for _ in rows], [None] * len(rows)
    for _ in range(n_new):
        for b, seq in enumerate(seqs):
            logits, _ = model(torch.tensor([seq]))
            z = logits[0, -1].double().clone()
            if rep != 1.0:  # CTRL's rule: seen tokens' logits divided by the penalty (multiplied when negative)
                for t in set(seq):
                    z[t] = z[t] * rep if z[t] < 0 else z[t] / rep
            nxt = int(z.argmax())
            seq.append(nxt)
            if reasons[b] is None:
                if nxt == stop_token:
                    reasons[b] = "eot"
                else:
                    out[b].append(nxt)
    return [(o, r or "length") for o, r in zip(out, reasons, strict=True)]


def text_of(tok, ids) -> str:
    from gptforge.data.chat import ChatTokenizer

    enc = ChatTokenizer(tok, T)
    return b"".join(enc.decode_single_token_bytes(t) for t in ids).decode("utf-8", "replace")


def ref_texts(model, tok, rows, **kw) -> list[tuple[str, str]]:
    """Greedy replies from the hand-written sampler; sampled ones from ``generation.complete`` called directly
    with the same seed (a float64 draw over 50k near-flat probabilities would round differently from the
    library's float32 CDF, so for draws the reference is the library's sampler, given the options by hand)."""
    if kw.get("temperature", 1.0) == 0:
        return [(text_of(tok, ids), reason) for ids, reason in ref_sample(model, rows, **kw)]
    from gptforge.data.chat import ChatTokenizer
    from gptforge.generation import SamplingParams, complete

    p = SamplingParams(max_new_tokens=kw["n_new"], temperature=kw.get("temperature", 1.0), top_k=kw.get("top_k"),
                       top_p=kw.get("top_p"), repetition_penalty=kw.get("rep", 1.0), seed=kw.get("seed", 0),
                       stop_token=kw.get("stop_token"))
    return [(c["text"], c["finish_reason"]) for c in complete(model, ChatTokenizer(tok, T), rows, p)]


def v1_reason(r: str) -> str:
    return "length" if r == "length" else "stop"


# ---------------------------------------------------------------- the routes, as one call each
def v1_text(client, body) -> list[tuple[str, str]]:
    r = client.post("/v1/completions", json={"prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    return [(c["text"], c["finish_reason"]) for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def v1_chat(client, body) -> list[tuple[str, str]]:
    r = client.post("/v1/chat/completions", json={"messages": MSGS, **body})
    assert r.status_code == 200, r.text
    return [(c["message"]["content"], c["finish_reason"]) for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def api_generate(client, body) -> list[tuple[str, str]]:
    r = client.post("/api/generate", json={"prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    return [(c["text"], c["finish_reason"]) for c in r.json()["completions"]]


def _sse_rows(text: str) -> list[tuple[str, str]]:
    rows: dict[int, list] = {}
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: {}":
            ev = json.loads(line[6:])
            r = rows.setdefault(ev.get("row", 0), ["", None])
            r[0] += ev.get("text", "")
            if ev.get("finished"):
                r[1] = ev["reason"]
    return [tuple(rows[i]) for i in sorted(rows)]


def api_stream(client, body) -> list[tuple[str, str]]:
    r = client.post("/api/stream", json={"prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    return _sse_rows(r.text)


def api_chat(client, body) -> list[tuple[str, str]]:
    r = client.post("/api/chat", json={"messages": MSGS, **body})
    assert r.status_code == 200, r.text
    return _sse_rows(r.text)


def prompt_ids(tok, route):
    return T.render_for_generation(MSGS, tok) if route in ("v1_chat", "api_chat") else tok.encode(PROMPT)


ROUTES = {"v1_text": v1_text, "v1_chat": v1_chat, "api_generate": api_generate, "api_stream": api_stream,
          "api_chat": api_chat}
# each route's defaults and its end token, in the reference's words
DEFAULTS = {"v1_text": dict(temperature=1.0, top_k=None, stop_token=EOT),
            "v1_chat": dict(temperature=1.0, top_k=None, stop_token=T.end),
            "api_generate": dict(temperature=1.0, top_k=50, stop_token=EOT),
            "api_stream": dict(temperature=1.0, top_k=50, stop_token=EOT),
            "api_chat": dict(temperature=0.7, top_k=50, stop_token=T.end)}
LEN = {"v1_text": "max_tokens", "v1_chat": "max_completion_tokens", "api_generate": "max_new_tokens",
       "api_stream": "max_new_tokens", "api_chat": "max_new_tokens"}


def check(client, model, tok, route, body, n_new, rows=1, **ref_kw):
    """The route's reply to ``body`` equals the reference sampler with the route's defaults + ``ref_kw``."""
    got = ROUTES[route](client, {LEN[route]: n_new, **body})
    want = ref_texts(model, tok, [prompt_ids(tok, route)] * rows, n_new=n_new, **{**DEFAULTS[route], **ref_kw})
    if route.startswith("v1"):
        want = [(t, v1_reason(r)) for t, r in want]
    assert got == want, (route, body)
    return got


# ---------------------------------------------------------------- effects shared by every route
@pytest.mark.parametrize("route", list(ROUTES))
def test_temperature_and_seed(client, model, tokenizer, route):
    greedy = check(client, model, tokenizer, route, {"temperature": 0}, 6, temperature=0)
    hot = check(client, model, tokenizer, route, {"temperature": 1.3, "seed": 3}, 6, temperature=1.3, seed=3)
    cool = check(client, model, tokenizer, route, {"temperature": 0.9, "seed": 3}, 6, temperature=0.9, seed=3)
    other = check(client, model, tokenizer, route, {"temperature": 1.3, "seed": 4}, 6, temperature=1.3, seed=4)
    assert len({greedy[0], hot[0], cool[0], other[0]}) == 4  # each knob changed the reply


@pytest.mark.parametrize("route", list(ROUTES))
def test_top_p(client, model, tokenizer, route):
    # a nucleus that rounds to the top token is greedy, whatever the seed
    tiny = check(client, model, tokenizer, route, {"top_p": 1e-6, "temperature": 1.0, "seed": 5}, 6,
                 temperature=1.0, top_p=1e-6, seed=5)
    assert tiny == check(client, model, tokenizer, route, {"temperature": 0}, 6, temperature=0)
    half = check(client, model, tokenizer, route, {"top_p": 0.5, "temperature": 1.5, "seed": 5}, 6,
                 temperature=1.5, top_p=0.5, seed=5)
    off = ref_texts(model, tokenizer, [prompt_ids(tokenizer, route)], n_new=6,
                    **{**DEFAULTS[route], "temperature": 1.5, "seed": 5})
    assert half[0][0] != off[0][0]


@pytest.mark.parametrize("route", list(ROUTES))
def test_top_k(client, model, tokenizer, route):
    k3 = check(client, model, tokenizer, route, {"top_k": 3, "temperature": 1.5, "seed": 2}, 6,
               temperature=1.5, top_k=3, seed=2)
    k1 = check(client, model, tokenizer, route, {"top_k": 1, "temperature": 1.5, "seed": 2}, 6,
               temperature=1.5, top_k=1, seed=2)
    assert k1 == check(client, model, tokenizer, route, {"temperature": 0}, 6, temperature=0)
    assert k3 != k1


@pytest.mark.parametrize("route", list(ROUTES))
def test_repetition_penalty(client, model, tokenizer, route):
    pen = check(client, model, tokenizer, route, {"repetition_penalty": 3.0, "temperature": 0}, 10,
                temperature=0, rep=3.0)
    assert pen != ref_texts(model, tokenizer, [prompt_ids(tokenizer, route)], n_new=10,
                            **{**DEFAULTS[route], "temperature": 0})


@pytest.mark.parametrize("route", list(ROUTES))
def test_length(client, model, tokenizer, route):
    """max_tokens / max_completion_tokens / max_new_tokens: exactly that many tokens (none ends early here)."""
    for n in (1, 7):
        (text, reason), = check(client, model, tokenizer, route, {"temperature": 0}, n, temperature=0)
        assert reason == "length"


# ---------------------------------------------------------------- /v1 only
def test_v1_max_tokens_usage_and_chat_precedence(client, model, tokenizer):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 5
    assert r["usage"]["prompt_tokens"] == len(tokenizer.encode(PROMPT))
    # chat: max_completion_tokens (OpenAI's newer name) wins over max_tokens; max_tokens alone is honoured
    ids = prompt_ids(tokenizer, "v1_chat")
    for body, n in (({"max_tokens": 4}, 4), ({"max_completion_tokens": 3, "max_tokens": 9}, 3)):
        r = client.post("/v1/chat/completions", json={"messages": MSGS, "temperature": 0, **body}).json()
        assert r["usage"]["completion_tokens"] == n
        want = ref_texts(model, tokenizer, [ids], n_new=n, temperature=0, stop_token=T.end)[0][0]
        assert r["choices"][0]["message"]["content"] == want


@pytest.mark.parametrize("route", ["v1_text", "v1_chat", "api_generate", "api_stream"])
def test_stop_ends_the_reply_before_the_stop_string(client, model, tokenizer, route):
    ids = prompt_ids(tokenizer, route)
    (full, _), = ref_texts(model, tokenizer, [ids], n_new=12, **{**DEFAULTS[route], "temperature": 0})
    stop = full[5:8]
    assert stop and full.index(stop) >= 1
    want = full[: full.index(stop)]
    for value in ([stop], [stop, "zzqq"]) + ((stop,) if route.startswith("v1") else ()):
        got = ROUTES[route](client, {LEN[route]: 12, "temperature": 0, "stop": value})
        assert got == [(want, "stop")], (value, got, full)


@pytest.mark.parametrize("route", ["v1_text", "v1_chat"])
def test_n_replies_are_the_rows_of_one_batch(client, model, tokenizer, route):
    got = check(client, model, tokenizer, route, {"n": 3, "temperature": 1.2, "seed": 9}, 6, rows=3,
                temperature=1.2, seed=9)
    assert len(got) == 3 and len(set(got)) == 3


def test_v1_completions_best_of_equal_to_n_and_model_are_no_ops(client, model, tokenizer):
    base = v1_text(client, {"max_tokens": 5, "temperature": 1.0, "seed": 1, "n": 2})
    assert v1_text(client, {"max_tokens": 5, "temperature": 1.0, "seed": 1, "n": 2, "best_of": 2,
                            "model": "anything"}) == base
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "best_of": 3, "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_v1_prompt_forms(client, model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    want = v1_text(client, {"max_tokens": 5, "temperature": 0})
    assert v1_text(client, {"prompt": ids, "max_tokens": 5, "temperature": 0}) == want
    r = client.post("/v1/completions", json={"prompt": [PROMPT, "Hello"], "max_tokens": 5, "temperature": 0}).json()
    other = ref_texts(model, tokenizer, [tokenizer.encode("Hello")], n_new=5, temperature=0, stop_token=EOT)
    assert [c["text"] for c in r["choices"]] == [want[0][0], other[0][0]]


def _lp_ref(model, ids, gen):
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids + gen]))
    return torch.log_softmax(logits[0].double(), -1)  # row j predicts token j + 1


def test_v1_completions_logprobs_and_echo(client, model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                             "logprobs": 2}).json()["choices"][0]
    (gen, _), = ref_sample(model, [ids], 4, temperature=0, stop_token=EOT)
    lp = _lp_ref(model, ids, gen)
    want = [lp[len(ids) - 1 + j, t].item() for j, t in enumerate(gen)]
    assert r["logprobs"]["token_logprobs"] == pytest.approx(want, abs=1e-4)
    for j in range(4):  # the two best alternatives at each position
        top = lp[len(ids) - 1 + j].topk(2)
        assert sorted(r["logprobs"]["top_logprobs"][j].values()) == pytest.approx(sorted(top.values.tolist()), abs=1e-4)
    # echo: the prompt comes back in front, and with logprobs its tokens are scored (the first has no prefix)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True,
                                             "logprobs": 0}).json()["choices"][0]
    assert r["text"] == PROMPT + text_of(tokenizer, gen)
    scored = r["logprobs"]["token_logprobs"]
    assert scored[0] is None
    seq = ids + gen
    assert scored[1:] == pytest.approx([lp[j - 1, seq[j]].item() for j in range(1, len(seq))], abs=1e-4)
    assert r["logprobs"]["top_logprobs"] is None
    # max_tokens 0 with echo: the prompt scored, nothing generated
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 0}).json()
    assert r["choices"][0]["text"] == PROMPT and r["usage"]["completion_tokens"] == 0


def test_v1_chat_logprobs(client, model, tokenizer):
    ids = prompt_ids(tokenizer, "v1_chat")
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "max_completion_tokens": 3, "temperature": 0,
                                                  "logprobs": True, "top_logprobs": 2}).json()["choices"][0]
    (gen, _), = ref_sample(model, [ids], 3, temperature=0, stop_token=T.end)
    lp = _lp_ref(model, ids, gen)
    content = r["logprobs"]["content"]
    assert [c["logprob"] for c in content] == pytest.approx([lp[len(ids) - 1 + j, t].item()
                                                             for j, t in enumerate(gen)], abs=1e-4)
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    no = client.post("/v1/chat/completions", json={"messages": MSGS, "max_completion_tokens": 3,
                                                   "temperature": 0}).json()["choices"][0]
    assert no["logprobs"] is None


@pytest.mark.parametrize("route", ["v1_text", "v1_chat"])
def test_v1_stream_and_include_usage(client, model, tokenizer, route):
    path, base = ("/v1/completions", {"prompt": PROMPT}) if route == "v1_text" else \
        ("/v1/chat/completions", {"messages": MSGS})
    body = {**base, "max_tokens": 6, "temperature": 1.0, "seed": 8}
    whole = ROUTES[route](client, {k: v for k, v in body.items() if k not in base})
    for include in (False, True):
        r = client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": include}})
        chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        text = "".join((c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "")
                       for c in chunks if c["choices"])
        assert text == whole[0][0]
        usage = [c for c in chunks if c.get("usage")]
        assert (len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 6) if include else not usage


def test_v1_chat_roles_and_content_parts(client):
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             MSGS[1]]
    a = client.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 5, "temperature": 0}).json()
    b = v1_chat(client, {"max_tokens": 5, "temperature": 0})
    assert a["choices"][0]["message"]["content"] == b[0][0]
    c = v1_chat(client, {"max_tokens": 5, "temperature": 0, "response_format": {"type": "text"}})
    assert c == b


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": -1}, "frequency_penalty"),
    ("/v1/completions", {"logit_bias": {"1": 5}}, "logit_bias"),
    ("/v1/completions", {"suffix": "x"}, "suffix"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ("/v1/chat/completions", {"function_call": {"name": "f"}}, "function_call"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("/v1/chat/completions", {"web_search_options": {}}, "web_search_options"),
])
def test_options_the_server_cannot_honour_are_refused_not_dropped(client, path, body, param):
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MSGS}
    r = client.post(path, json={**base, "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    # the default value of each is accepted and changes nothing
    zero = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "suffix": "", "tools": [],
            "response_format": {"type": "text"}, "top_logprobs": 0, "functions": [], "function_call": "none",
            "tool_choice": "auto", "modalities": ["text"], "audio": None, "web_search_options": None}[param]
    a = client.post(path, json={**base, "max_tokens": 3, "temperature": 0, param: zero}).json()
    b = client.post(path, json={**base, "max_tokens": 3, "temperature": 0}).json()
    assert a["choices"] == b["choices"]


# ---------------------------------------------------------------- /api only
def test_api_generate_batch_of_prompts(client, model, tokenizer):
    r = client.post("/api/generate", json={"prompts": [PROMPT, "Hello there"], "max_new_tokens": 5,
                                           "temperature": 0}).json()["completions"]
    for c, p in zip(r, [PROMPT, "Hello there"], strict=True):
        (want, _), = ref_texts(model, tokenizer, [tokenizer.encode(p)], n_new=5, temperature=0, stop_token=EOT)
        assert c["text"] == want


def test_stop_at_eot(tokenizer):
    """A model whose greedy choice is <|endoftext|>: the reply ends there unless stop_at_eot is false."""
    model = _model(eot_first=True)
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=8))
    with TestClient(app) as c:
        assert api_generate(c, {"max_new_tokens": 3, "temperature": 0}) == [("", "eot")]
        assert api_generate(c, {"max_new_tokens": 3, "temperature": 0, "stop_at_eot": False}) == \
            [("<|endoftext|>" * 3, "length")]
        assert api_stream(c, {"max_new_tokens": 3, "temperature": 0, "stop_at_eot": False}) == \
            [("<|endoftext|>" * 3, "length")]
        # /v1 always ends at the end-of-text token (OpenAI's behaviour)
        assert v1_text(c, {"max_tokens": 3, "temperature": 0}) == [("", "stop")]


# ---------------------------------------------------------------- the registry, walked
EFFECTS = {
    (openai_schema.CompletionRequest, "prompt"): "test_v1_prompt_forms",
    (openai_schema.CompletionRequest, "model"): "test_v1_completions_best_of_equal_to_n_and_model_are_no_ops",
    (openai_schema.CompletionRequest, "max_tokens"): "test_length",
    (openai_schema.CompletionRequest, "temperature"): "test_temperature_and_seed",
    (openai_schema.CompletionRequest, "top_p"): "test_top_p",
    (openai_schema.CompletionRequest, "n"): "test_n_replies_are_the_rows_of_one_batch",
    (openai_schema.CompletionRequest, "stop"): "test_stop_ends_the_reply_before_the_stop_string",
    (openai_schema.CompletionRequest, "seed"): "test_temperature_and_seed",
    (openai_schema.CompletionRequest, "stream"): "test_v1_stream_and_include_usage",
    (openai_schema.CompletionRequest, "stream_options"): "test_v1_stream_and_include_usage",
    (openai_schema.CompletionRequest, "presence_penalty"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.CompletionRequest, "frequency_penalty"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.CompletionRequest, "logit_bias"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.CompletionRequest, "top_k"): "test_top_k",
    (openai_schema.CompletionRequest, "repetition_penalty"): "test_repetition_penalty",
    (openai_schema.CompletionRequest, "logprobs"): "test_v1_completions_logprobs_and_echo",
    (openai_schema.CompletionRequest, "echo"): "test_v1_completions_logprobs_and_echo",
    (openai_schema.CompletionRequest, "suffix"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.CompletionRequest, "best_of"): "test_v1_completions_best_of_equal_to_n_and_model_are_no_ops",
    (openai_schema.ChatRequest, "messages"): "test_v1_chat_roles_and_content_parts",
    (openai_schema.ChatRequest, "model"): "test_v1_completions_best_of_equal_to_n_and_model_are_no_ops",
    (openai_schema.ChatRequest, "max_tokens"): "test_v1_max_tokens_usage_and_chat_precedence",
    (openai_schema.ChatRequest, "max_completion_tokens"): "test_v1_max_tokens_usage_and_chat_precedence",
    (openai_schema.ChatRequest, "temperature"): "test_temperature_and_seed",
    (openai_schema.ChatRequest, "top_p"): "test_top_p",
    (openai_schema.ChatRequest, "n"): "test_n_replies_are_the_rows_of_one_batch",
    (openai_schema.ChatRequest, "stop"): "test_stop_ends_the_reply_before_the_stop_string",
    (openai_schema.ChatRequest, "seed"): "test_temperature_and_seed",
    (openai_schema.ChatRequest, "stream"): "test_v1_stream_and_include_usage",
    (openai_schema.ChatRequest, "stream_options"): "test_v1_stream_and_include_usage",
    (openai_schema.ChatRequest, "presence_penalty"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "frequency_penalty"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "logit_bias"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "top_k"): "test_top_k",
    (openai_schema.ChatRequest, "repetition_penalty"): "test_repetition_penalty",
    (openai_schema.ChatRequest, "logprobs"): "test_v1_chat_logprobs",
    (openai_schema.ChatRequest, "top_logprobs"): "test_v1_chat_logprobs",
    (openai_schema.ChatRequest, "tools"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "functions"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "function_call"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "tool_choice"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "modalities"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "audio"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "web_search_options"): "test_options_the_server_cannot_honour_are_refused_not_dropped",
    (openai_schema.ChatRequest, "response_format"): "test_v1_chat_roles_and_content_parts",
    (GenerateRequest, "prompt"): "test_temperature_and_seed",
    (GenerateRequest, "prompts"): "test_api_generate_batch_of_prompts",
    (GenerateRequest, "max_new_tokens"): "test_length",
    (GenerateRequest, "temperature"): "test_temperature_and_seed",
    (GenerateRequest, "top_k"): "test_top_k",
    (GenerateRequest, "top_p"): "test_top_p",
    (GenerateRequest, "repetition_penalty"): "test_repetition_penalty",
    (GenerateRequest, "seed"): "test_temperature_and_seed",
    (GenerateRequest, "stop"): "test_stop_ends_the_reply_before_the_stop_string",
    (GenerateRequest, "stop_at_eot"): "test_stop_at_eot",
    (chat_mod.ChatRequest, "messages"): "test_temperature_and_seed",
    (chat_mod.ChatRequest, "max_new_tokens"): "test_length",
    (chat_mod.ChatRequest, "temperature"): "test_temperature_and_seed",
    (chat_mod.ChatRequest, "top_k"): "test_top_k",
    (chat_mod.ChatRequest, "top_p"): "test_top_p",
    (chat_mod.ChatRequest, "repetition_penalty"): "test_repetition_penalty",
    (chat_mod.ChatRequest, "seed"): "test_temperature_and_seed",
}
# the nested models' fields, each reached through its parent's effect test
NESTED = {(openai_schema.StreamOptions, "include_usage"): "test_v1_stream_and_include_usage",
          (openai_schema.ChatMessage, "role"): "test_v1_chat_roles_and_content_parts",
          (openai_schema.ChatMessage, "content"): "test_v1_chat_roles_and_content_parts",
          (openai_schema.ContentPart, "type"): "test_v1_chat_roles_and_content_parts",
          (openai_schema.ContentPart, "text"): "test_v1_chat_roles_and_content_parts",
          (chat_mod.Message, "role"): "test_temperature_and_seed",
          (chat_mod.Message, "content"): "test_temperature_and_seed"}


def test_every_accepted_option_has_an_effect_test():
    """Walk every request model the routes parse: a field without an entry here fails (add its effect test),
    and every entry names a test in this module."""
    import typing

    from pydantic import BaseModel

    models = [openai_schema.CompletionRequest, openai_schema.ChatRequest, GenerateRequest, chat_mod.ChatRequest]
    todo, missing, seen = list(models), [], set()
    registry = {**EFFECTS, **NESTED}
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        # a model's fields, or a TypedDict's keys (a message's content parts: plain dicts, cheaper to validate)
        fields = ({k: f.annotation for k, f in cls.model_fields.items()} if issubclass(cls, BaseModel)
                  else typing.get_type_hints(cls))
        for name, annotation in fields.items():
            if (cls, name) not in registry:
                missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
            for arg in _types(annotation):  # nested request models (messages, stream_options ...)
                if isinstance(arg, type) and (issubclass(arg, BaseModel) or hasattr(arg, "__required_keys__")):
                    todo.append(arg)
    assert not missing, f"options accepted with no effect test (add one and an EFFECTS entry): {missing}"
    assert {c for c, _ in registry} <= seen
    for test in registry.values():
        assert callable(globals().get(test)), test


def _types(ann):
    import typing

    yield ann
    for a in typing.get_args(ann):
        yield from _types(a)


# ---------------------------------------------------------------- refusals: status, the field named, the code
@pytest.mark.parametrize("path,body,param,code", [
    ("/v1/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop", None),
    ("/v1/completions", {"stop": ["a", ""]}, "stop", None),
    ("/v1/chat/completions", {"stop": [""]}, "stop", None),
    ("/v1/completions", {"n": 5}, "n", None),  # over the batch limit of 4
    ("/v1/completions", {"prompt": [PROMPT, PROMPT], "n": 3}, "n", None),
    ("/v1/completions", {"max_tokens": 33}, "max_tokens", None),  # over the cap of 32
    ("/v1/completions", {"max_tokens": 20, "prompt": "word " * 50}, "max_tokens", "context_length_exceeded"),
    ("/v1/completions", {"prompt": "word " * 70}, "prompt", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 70}]}, "messages",
     "context_length_exceeded"),
    ("/v1/chat/completions", {"max_completion_tokens": 33}, "max_completion_tokens", None),
    ("/v1/completions", {"temperature": 2.5}, "temperature", None),
    ("/v1/completions", {"top_p": 0}, "top_p", None),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens", None),  # 0 needs echo
    ("/v1/completions", {"echo": True, "stream": True}, "echo", None),
    ("/v1/completions", {"logprobs": 1, "stream": True}, "logprobs", None),
    ("/v1/chat/completions", {"logprobs": True, "stream": True}, "logprobs", None),
    ("/v1/completions", {"prompt": [[1, 2], [99999]]}, "prompt", None),
    ("/v1/completions", {"prompt": []}, "prompt", None),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", None),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages.0.content", None),
])
def test_v1_refusals_name_the_field(client, path, body, param, code):
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MSGS}
    r = client.post(path, json={**base, **body})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and err["code"] == code, r.text
    assert err["type"] == "invalid_request_error" and err["message"]


def test_v1_limits_accept_what_fits(client):
    """The edges: four stop sequences, n at the batch limit, max_tokens at the cap and at the context's room."""
    assert v1_text(client, {"max_tokens": 2, "stop": ["a", "b", "c", "d"], "temperature": 0})
    assert len(v1_text(client, {"max_tokens": 2, "n": 4, "temperature": 0})) == 4
    assert v1_text(client, {"max_tokens": 32, "temperature": 0})
    r = client.post("/v1/completions", json={"prompt": [1] * 60, "max_tokens": 4, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 4  # 60 + 4 = the 64-token context exactly


def test_v1_chat_without_a_template_is_refused(tokenizer):
    app = create_app(_model(), tokenizer, ServeSettings(max_new_tokens_cap=8))
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"
        assert c.get("/v1/models").json()["data"][0]["id"] == "gptforge"


def test_v1_models_names_the_served_run(model, tokenizer):
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=8), chat_template=T.to_dict(),
                     served={"source": "ckpt", "run_dir": "/runs/my-run"})
    with TestClient(app) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["my-run"]
        assert c.get("/v1/models/my-run").json()["max_model_len"] == 64
        assert c.get("/v1/models/other").status_code == 404
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}).json()["model"] == "my-run"


def test_v1_context_edges_and_the_overflow_message(client):
    """A 63-token prompt leaves room for one token: the default takes it, two are refused naming max_tokens
    with OpenAI's numbers; a 64-token prompt leaves none and names the prompt."""
    r = client.post("/v1/completions", json={"prompt": [1] * 63, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 1
    err = client.post("/v1/completions", json={"prompt": [1] * 63, "max_tokens": 2}).json()["error"]
    assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert err["message"] == ("This model's maximum context length is 64 tokens. However, you requested 65 tokens "
                              "(63 in the prompt, 2 in the completion). Please reduce the prompt or the completion "
                              "length.")
    err = client.post("/v1/completions", json={"prompt": [1] * 64}).json()["error"]
    assert err["param"] == "prompt" and "requested 65 tokens (64 in the prompt, 1 in the completion)" in err["message"]
    err = client.post("/v1/completions", json={"prompt": PROMPT, "stop": [""]}).json()["error"]
    assert err["message"] == "stop: stop sequences must be non-empty strings"


def test_v1_defaults_are_openais(client, model, tokenizer):
    """Left out: max_tokens is 16 on /v1/completions (OpenAI's default), temperature 1; top_k -1 and 0 are off."""
    r = client.post("/v1/completions", json={"prompt": PROMPT, "seed": 4}).json()
    assert r["usage"]["completion_tokens"] == 16 or r["choices"][0]["finish_reason"] == "stop"
    want = v1_text(client, {"max_tokens": 16, "temperature": 1.0, "seed": 4})
    assert [(c["text"], c["finish_reason"]) for c in r["choices"]] == want
    for k in (-1, 0):
        assert v1_text(client, {"max_tokens": 6, "seed": 4, "top_k": k}) == v1_text(client, {"max_tokens": 6, "seed": 4})
