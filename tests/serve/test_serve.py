"""The JSON API behind `gptforge serve`: answers match the generation library, every bad input is a
4xx with a message that names the problem, and a crowd of requests is queued or turned away (429)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from gptforge.generation import SamplingParams, complete  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app, read_loss_curve  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)).eval()


@pytest.fixture
def client(model, tokenizer, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    recs = [{"kind": "start", "step": 0}] + [{"kind": "train", "step": s, "loss": 10 - s / 10} for s in range(1, 50)]
    recs += [{"kind": "val", "step": 25, "val_loss": 7.5}, {"kind": "val", "step": 49, "val_loss": 6.0}]
    metrics.write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"kind\": \"tra")  # a line still being written
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=32, max_batch=4, max_queue=2,
                                                     max_prompt_chars=500, max_body_bytes=20_000), metrics)
    with TestClient(app) as c:
        yield c


def _sse(text: str) -> list[dict]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            out.append(json.loads(block[6:]))
    return out


def test_info_and_page(client):
    info = client.get("/api/info").json()
    assert info["model"]["block_size"] == 64 and info["limits"]["max_new_tokens_cap"] == 32
    page = client.get("/")
    assert page.status_code == 200 and "<textarea id=\"prompt\"" in page.text and "/api/stream" in page.text


def test_generate_matches_library(client, model, tokenizer):
    body = {"prompts": ["ROMEO:", "Hello, I'm a"], "max_new_tokens": 12, "temperature": 0.9, "top_k": 40, "seed": 3,
            "stop_at_eot": False}
    r = client.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    ref = complete(model, tokenizer, body["prompts"], SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40,
                                                                     top_p=1.0, seed=3))
    assert r.json()["completions"] == ref
    assert client.post("/api/generate", json=body).json() == r.json()  # seeded: reproducible


def test_stream_gives_pieces_then_done(client):
    body = {"prompt": "ROMEO:", "max_new_tokens": 16, "temperature": 0, "stop_at_eot": False}
    r = client.post("/api/stream", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _sse(r.text)
    assert len([e for e in events if e.get("text")]) > 3  # many pieces, not one blob
    assert events[-1] == {"row": 0, "text": events[-1]["text"], "finished": True, "reason": "length", "tokens": 16}
    assert r.text.rstrip().endswith("event: done\ndata: {}")
    whole = client.post("/api/generate", json=body).json()["completions"][0]["text"]
    assert "".join(e["text"] for e in events) == whole


def test_generation_stops_before_a_stop_sequence(client):
    r = client.post("/api/generate", json={"prompt": "a", "max_new_tokens": 20, "temperature": 0, "stop_at_eot": False})
    full = r.json()["completions"][0]["text"]
    stop = full[5:8]
    r = client.post("/api/generate", json={"prompt": "a", "max_new_tokens": 20, "temperature": 0, "stop": [stop],
                                           "stop_at_eot": False})
    c = r.json()["completions"][0]
    assert c["finish_reason"] == "stop" and c["text"] == full[: full.find(stop)]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"prompt": " x" * 70, "max_new_tokens": 8}, 400, "context of 64"),  # 70 tokens > context
        ({"prompt": "hi", "max_new_tokens": 60}, 400, "cap of 32"),
        ({"prompt": "hi", "max_new_tokens": 0}, 422, "max_new_tokens"),
        ({"prompt": "hi", "temperature": -0.5}, 422, "temperature"),
        ({"prompt": "hi", "top_p": 0}, 422, "top_p"),
        ({"prompt": "hi", "top_p": 1.5}, 422, "top_p"),
        ({"prompt": "hi", "top_k": -3}, 422, "top_k"),
        ({"prompt": "hi", "repetition_penalty": 0}, 422, "repetition_penalty"),
        ({"prompt": "hi", "seed": -1}, 422, "seed"),
        ({"prompt": "hi", "max_new_tokens": "many"}, 422, "max_new_tokens"),
        ({"prompt": "hi", "temprature": 1}, 422, "temprature"),
        ({"prompt": "hi", "prompts": ["a"]}, 400, "exactly one of prompt"),
        ({}, 400, "exactly one of prompt"),
        ({"prompts": []}, 422, "prompts"),
        ({"prompts": ["a"] * 5}, 400, "at most 4"),
        ({"prompt": "hi", "stop": [""]}, 400, "non-empty"),
        ({"prompt": "y" * 600}, 400, "600 characters"),
        ({"prompt": 5}, 422, "prompt"),
    ],
)
@pytest.mark.parametrize("endpoint", ["/api/generate", "/api/stream"])
def test_bad_input_is_4xx_with_message(client, endpoint, body, status, words):
    r = client.post(endpoint, json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]


def test_nan_malformed_json_and_huge_body(client):
    for raw in ('{"prompt": "hi", "temperature": NaN}', '{"prompt": "hi", "top_p": Infinity}'):
        r = client.post("/api/generate", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and ("temperature" in r.json()["error"] or "top_p" in r.json()["error"])
    r = client.post("/api/generate", content='{"prompt": "hi", ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    r = client.post("/api/generate", content="[1, 2", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = client.post("/api/generate", content=json.dumps({"prompt": "z" * 30_000}),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]


def test_many_concurrent_requests_queue_or_429(model, tokenizer):
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=48, max_queue=2))
    body = {"prompt": "ROMEO:", "max_new_tokens": 48, "temperature": 0}

    async def crowd():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            rs = await asyncio.gather(*[c.post(p, json=body) for p in ["/api/generate", "/api/stream"] * 6])
            after = await c.post("/api/generate", json=body)  # the gate is free again afterwards
            return rs, after

    rs, after = asyncio.run(crowd())
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 429}, codes
    assert 1 <= codes.count(200) <= 3 and codes.count(429) >= 9  # 1 running + max_queue 2 waiting
    assert all("busy" in r.json()["error"] for r in rs if r.status_code == 429)
    assert after.status_code == 200
    texts = {r.json()["completions"][0]["text"] for r in rs if r.status_code == 200 and "json" in r.headers["content-type"]}
    assert len(texts) <= 1  # greedy: every served request got the same answer


def test_the_page_reads_the_loss_curve_from_metrics_jsonl(client, tmp_path):
    m = client.get("/api/metrics").json()
    assert m["available"] and m["train"][0] == [1, 9.9] and len(m["train"]) == 49
    assert m["val"] == [[25, 7.5], [49, 6.0]]
    assert read_loss_curve(tmp_path / "nope.jsonl") == {"available": False, "train": [], "val": []}
    assert len(read_loss_curve(tmp_path / "metrics.jsonl", max_points=10)["train"]) <= 10
    assert m["reward"] == [] and m["held_out"] == []  # a pretraining run: task evals are not held-out RL


def test_metrics_curve_of_an_rl_run(tmp_path):
    recs = [{"kind": "start", "step": 0, "recipe": "grpo"}, {"kind": "eval", "step": 0, "task": "compare", "acc": 0.5},
            {"kind": "rl", "step": 1, "loss": 0.2, "reward": 0.25}, {"kind": "rl", "step": 2, "loss": 0.1, "reward": 0.75},
            {"kind": "eval", "step": 2, "task": "compare", "acc": 0.625}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    m = read_loss_curve(tmp_path / "metrics.jsonl")
    assert m["train"] == [] and m["reward"] == [[1, 0.25], [2, 0.75]] and m["held_out"] == [[0, 0.5], [2, 0.625]]


def test_serve_cli_defaults_to_localhost():
    from gptforge.cli import build_parser

    args = build_parser().parse_args(["serve", "--ckpt", "x"])
    assert args.host == "127.0.0.1"


def test_client_leaving_mid_stream_frees_the_model(model, tokenizer, monkeypatch):
    """A real server: read one streamed event, hang up; the model is free again long before the
    60 slowed-down steps would have finished (with max_queue=0 a busy model answers 429)."""
    import time

    from gptforge import generation

    pick, steps = generation._pick, []
    # 0.2 s a token: the 60 take >= 12 s, so a stream that was stopped is told from one run to its end by its
    # count of steps, with seconds of room for a loaded machine to see the hang-up (no wall-clock bound)
    monkeypatch.setattr(generation, "_pick", lambda *a: (steps.append(1), time.sleep(0.2), pick(*a))[2])

    pytest.importorskip("uvicorn")
    from tests.serve.browser import serve_in_thread

    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=60, max_queue=0))
    with serve_in_thread(app) as url:
        body = {"prompt": "ROMEO:", "max_new_tokens": 60, "temperature": 0, "stop_at_eot": False}
        with httpx.Client(base_url=url, timeout=30) as c:
            with c.stream("POST", "/api/stream", json=body) as r:
                assert r.status_code == 200
                first = next(r.iter_lines())
                assert first.startswith("data: ")
            # the connection is closed; the producer stops at its next step and releases the gate
            deadline = time.time() + 30
            while (code := c.post("/api/generate", json={**body, "max_new_tokens": 2}).status_code) == 429:
                assert time.time() < deadline, "model still busy after the client left"
                time.sleep(0.1)
            assert code == 200
            assert len(steps) - 2 < 45  # the stream's steps (less the 2 of this answer): stopped, not run to 60
