"""/api/chat in-process: the streamed reply equals direct generation on the rendered conversation;
bad requests (no chat template, unknown role, too long, over the cap) are refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.data.chat import ChatTemplate, ChatTokenizer  # noqa: E402
from gptforge.generation import SamplingParams, complete  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402

T = ChatTemplate.gpt2()


def _model(vocab: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=vocab)).eval()


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: {}"]


def test_chat_stream_matches_direct_generation(tokenizer):
    model = _model(T.vocab_size)
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=16), chat_template=T.to_dict())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    with TestClient(app) as c:
        assert c.get("/api/chat/info").json()["available"] is True
        r = c.post("/api/chat", json={"messages": msgs, "max_new_tokens": 8, "temperature": 0})
        assert r.status_code == 200
        evs = _events(r.text)
        ref = complete(model, ChatTokenizer(tokenizer, T), [T.render_for_generation(msgs, tokenizer)],
                       SamplingParams(max_new_tokens=8, temperature=0, top_k=50, stop_token=T.end))[0]
        assert "".join(e["text"] for e in evs) == ref["text"] and evs[-1]["reason"] == ref["finish_reason"]
        bad = c.post("/api/chat", json={"messages": [{"role": "bot", "content": "x"}]})
        assert bad.status_code == 422 and "role" in bad.text
        long = c.post("/api/chat", json={"messages": [{"role": "user", "content": "word " * 80}]})
        assert long.status_code == 400 and "context of 64" in long.json()["error"]
        cap = c.post("/api/chat", json={"messages": msgs, "max_new_tokens": 17})
        assert cap.status_code == 400 and "cap of 16" in cap.json()["error"]


def test_chat_refused_without_template(tokenizer):
    with TestClient(create_app(_model(50257), tokenizer)) as c:
        assert c.get("/api/chat/info").json()["available"] is False
        r = c.post("/api/chat", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "no chat template" in r.json()["error"]


def test_plain_stream_on_a_chat_model_decodes_chat_tokens(tokenizer):
    model = _model(T.vocab_size)
    with torch.no_grad():
        model.transformer.wte.weight[T.end] *= 20  # make the model emit <|end|>
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=16), chat_template=T.to_dict())
    with TestClient(app) as c:
        r = c.post("/api/stream", json={"prompt": "Hi", "max_new_tokens": 12, "temperature": 0})
        assert r.status_code == 200
        text = "".join(e.get("text", "") for e in _events(r.text))
    assert "<|end|>" in text
