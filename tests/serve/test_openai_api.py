"""The OpenAI-compatible endpoints, spoken to by the official ``openai`` client over a live server:
completions and chat, streamed and not, equal ``gptforge sample`` / the generation library with the
same seed; usage and logprobs are right; bad requests get OpenAI's error object with the field named."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from gptforge.cli import main  # noqa: E402
from gptforge.config import Config  # noqa: E402
from gptforge.data.chat import ChatTemplate, ChatTokenizer  # noqa: E402
from gptforge.generation import SamplingParams, complete  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.run.checkpoint import save_checkpoint  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.browser import serve_in_thread  # noqa: E402

T = ChatTemplate.gpt2()
KEY = "sk-test-key"
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    """A tiny random chat model saved as a checkpoint (for `gptforge sample`) and served live."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=T.vocab_size)).eval()
    ck = save_checkpoint(tmp_path_factory.mktemp("oa") / "run", 3, model, None,
                         {"config": Config(model=model.config).to_dict(), "chat_template": T.to_dict()})
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=48, max_batch=4), chat_template=T.to_dict(),
                     api_key=KEY, served={"source": "ckpt", "run_dir": str(ck.parent.parent)})
    with serve_in_thread(app) as url:
        yield model, str(ck), url


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[2] + "/v1", api_key=KEY, max_retries=0)


def _sample_cli(capsys, ck: str, *args: str) -> list[str]:
    assert main(["sample", "--ckpt", ck, "--device", "cpu", *args]) == 0
    out = capsys.readouterr().out
    return [block.split("\n", 1)[1].rstrip("\n") for block in out.split("--- sample ")[1:]]


def test_models_lists_the_served_run(client):
    (card,) = client.models.list().data
    assert card.id == "run" and card.owned_by == "gptforge"
    assert client.models.retrieve("run").id == "run"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_completions_equal_gptforge_sample(client, served, capsys, tokenizer):
    _, ck, _ = served
    # greedy, and seeded sampling with n=2 (gptforge sample batches its --num-samples the same way)
    r = client.completions.create(model="run", prompt="Hello, I'm a", max_tokens=12, temperature=0)
    (ref,) = _sample_cli(capsys, ck, "--prompt", "Hello, I'm a", "--num-samples", "1", "--max-new-tokens", "12",
                         "--temperature", "0", "--stop-at-eot")
    assert "Hello, I'm a" + r.choices[0].text == ref
    n_prompt = len(tokenizer.encode("Hello, I'm a"))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 12, n_prompt + 12)
    r = client.completions.create(model="run", prompt="ROMEO:", max_tokens=10, temperature=0.9, seed=7, n=2)
    refs = _sample_cli(capsys, ck, "--prompt", "ROMEO:", "--num-samples", "2", "--max-new-tokens", "10",
                       "--temperature", "0.9", "--top-k", "0", "--seed", "7", "--stop-at-eot")
    assert ["ROMEO:" + c.text for c in sorted(r.choices, key=lambda c: c.index)] == refs
    assert refs[0] != refs[1]  # really sampled
    # streamed: the same text in OpenAI's chunks, ending with the finish reason
    chunks = list(client.completions.create(model="run", prompt="ROMEO:", max_tokens=10, temperature=0.9, seed=7,
                                            n=2, stream=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert "ROMEO:" + "".join(c.text for c in mine) == refs[i]
        assert mine[-1].finish_reason == "length" and all(c.finish_reason is None for c in mine[:-1])


def test_chat_completions_equal_generation(client, served, tokenizer):
    model = served[0]
    ids = T.render_for_generation(MSGS, tokenizer)
    ref = complete(model, ChatTokenizer(tokenizer, T), [ids],
                   SamplingParams(max_new_tokens=10, temperature=0, stop_token=T.end))[0]
    r = client.chat.completions.create(model="run", messages=MSGS, max_tokens=10, temperature=0)
    msg = r.choices[0]
    assert msg.message.role == "assistant" and msg.message.content == ref["text"]
    assert msg.finish_reason == "length" and r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 10
    stream = client.chat.completions.create(model="run", messages=MSGS, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    # content as a list of text parts, and the developer role, render the same conversation
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             MSGS[1]]
    assert client.chat.completions.create(model="run", messages=parts, max_tokens=10,
                                          temperature=0).choices[0].message.content == ref["text"]


def test_default_max_tokens_fits_the_context(client, tokenizer):
    # no max_tokens: chat defaults to the cap (48), clamped to what is left of the 64-token context
    r = client.chat.completions.create(model="run", messages=[{"role": "user", "content": "word " * 20}],
                                       temperature=0, extra_body={"stop_token_ids": [1]})  # unknown: ignored
    prompt = r.usage.prompt_tokens
    assert r.usage.completion_tokens == min(48, 64 - prompt) or r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens <= 64


def test_logprobs_are_the_models(client, served, tokenizer):
    model = served[0]
    r = client.completions.create(model="run", prompt="ROMEO:", max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    ids = tokenizer.encode("ROMEO:")
    gen = [int(x) for x in ref_tokens(model, ids, 5)]
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids + gen[:-1]]))
    ref = torch.log_softmax(logits[0, len(ids) - 1:].double(), dim=-1)
    assert lp.tokens == [tokenizer.decode([t]) for t in gen]
    for j, t in enumerate(gen):
        assert abs(lp.token_logprobs[j] - ref[j, t].item()) < 1e-4
        assert max(lp.top_logprobs[j].values()) == pytest.approx(lp.token_logprobs[j])  # greedy = the top token
    c = client.chat.completions.create(model="run", messages=MSGS, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(x.top_logprobs) == 2 and x.logprob <= 0 for x in content)


def ref_tokens(model, ids, n):
    from gptforge.generation import stream_tokens

    return [t.item() for t in stream_tokens(model, [ids], SamplingParams(max_new_tokens=n, temperature=0))]


@pytest.mark.parametrize("kw, param", [
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 49}, "max_tokens"),  # over the server's cap
    ({"max_tokens": 40, "prompt": "word " * 40}, "max_tokens"),  # cannot fit the 64-token context
    ({"n": 5}, "n"),  # over the batch limit of 4
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"extra_body": {"presence_penalty": 1.0}}, "presence_penalty"),
    ({"prompt": [[1, 2], [99999]]}, "prompt"),
])
def test_bad_completions_are_openai_errors(client, kw, param):
    kw = {"model": "run", "prompt": "Hi", "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**kw)
    err = e.value.body
    assert e.value.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["message"]


def test_context_overflow_code_and_other_errors(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="run", prompt="word " * 40, max_tokens=40)
    assert e.value.body["code"] == "context_length_exceeded" and "maximum context length is 64" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="run", messages=[{"role": "tool", "content": "x"}], max_tokens=2)
    assert e.value.body["param"] == "messages.0.role"
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=served[2] + "/v1", api_key="wrong", max_retries=0).models.list()
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    assert httpx.get(served[2] + "/api/info").status_code == 401  # the native API is behind the key too
    r = httpx.post(served[2] + "/v1/completions", content=b"{not json", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(served[2] + "/v1/completions", content=b" " * 1_100_000, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and "over the limit" in r.json()["error"]["message"]  # the body limit, OpenAI-shaped


def test_base_model_chat_is_refused(tokenizer):
    from fastapi.testclient import TestClient

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    with TestClient(create_app(model, tokenizer)) as c:
        r = c.post("/v1/chat/completions", json={"model": "x", "messages": MSGS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"
        assert "/v1/completions" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"model": "x", "prompt": "Hi", "max_tokens": 3, "temperature": 0,
                                            "user": "someone", "metadata": {"a": 1}})  # unknown fields: ignored
        assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_serve_refuses_a_public_host_without_a_key(capsys, monkeypatch):
    monkeypatch.delenv("GPTFORGE_API_KEY", raising=False)
    assert main(["serve", "--random", "d2", "--host", "0.0.0.0"]) == 2
    assert "--api-key" in capsys.readouterr().err


def test_busy_server_is_a_rate_limit_error(tokenizer, monkeypatch):
    """The /v1 routes share the native gate: with the model busy and no queue, OpenAI's 429."""
    import time

    from gptforge import generation

    pick = generation._pick
    # 0.2 s a token: the streamed 40 hold the model >= 8 s, time for the second request to find it busy on a loaded
    # machine (at 0.05 s the 2 s could pass before it came)
    monkeypatch.setattr(generation, "_pick", lambda *a: (time.sleep(0.2), pick(*a))[1])
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    with serve_in_thread(create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=40, max_queue=0))) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        stream = c.completions.create(model="x", prompt="Hi", max_tokens=40, temperature=0, stream=True)
        next(iter(stream))  # generating now, for about 8 s
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="x", prompt="Hi", max_tokens=2)
        assert e.value.body["type"] == "rate_limit_error" and "busy" in e.value.body["message"]
        stream.close()


def test_echo_scores_the_prompt_like_an_eval_harness(client, served, tokenizer):
    """lm-evaluation-harness's local-completions asks for log-likelihoods with token ids, echo and
    logprobs (max_tokens 0 or 1): every prompt token after the first gets the model's log-probability."""
    model = served[0]
    ids = tokenizer.encode("The cat sat on the mat")
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids]))[0][0].double(), dim=-1)
    want = [ref[j, ids[j + 1]].item() for j in range(len(ids) - 1)]
    r = client.completions.create(model="run", prompt=[ids], max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "The cat sat on the mat" and lp.tokens == [tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    assert r.usage.completion_tokens == 0 and lp.text_offset[1] == len("The")
    r = client.completions.create(model="run", prompt="The cat sat on the mat", max_tokens=1, echo=True, logprobs=1,
                                  temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and r.choices[0].text.startswith("The cat sat on the mat")
    assert lp.token_logprobs[1:-1] == pytest.approx(want, abs=1e-4)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="run", prompt="Hi", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def test_text_prompts_past_a_small_models_vocabulary_are_400_not_500(tokenizer):
    """A model with fewer rows than its tokenizer's ids (weights of unknown origin served with GPT-2's
    BPE): a text prompt that tokenizes past the vocabulary is OpenAI's 400, on both completion paths."""
    from fastapi.testclient import TestClient

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=300)).eval()
    with TestClient(create_app(model, tokenizer), raise_server_exceptions=False) as c:
        for body in ({"prompt": "hello world", "max_tokens": 2}, {"prompt": "hello world", "max_tokens": 0,
                                                                  "echo": True}):
            r = c.post("/v1/completions", json={"model": "x", **body})
            assert r.status_code == 400, r.text
            assert "outside this model's vocabulary of 300" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"model": "x", "prompt": "!", "max_tokens": 2})  # id 0: in range
        assert r.status_code == 200


def test_hostile_bodies_are_openai_400s_not_500s(served):
    """The class of issue 33's API holes: a body nested a thousand levels deep and a lone surrogate
    (which no UTF-8 reply can echo) are 400 with OpenAI's error object, on every /v1 route."""
    import httpx

    with httpx.Client(base_url=served[2], headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        deep = '{"model": "x", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"
        lone = '{"model": "x", "prompt": "hi \\ud800", "max_tokens": 0, "echo": true}'
        lone_chat = '{"model": "x", "messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 1}'
        for route, body in (("/v1/completions", deep), ("/v1/chat/completions", deep.replace('"prompt"', '"messages"')),
                            ("/v1/completions", lone), ("/v1/chat/completions", lone_chat)):
            r = c.post(route, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (route, body[:40], r.status_code, r.text[:200])
            assert "error" in r.json() and r.json()["error"]["message"]
