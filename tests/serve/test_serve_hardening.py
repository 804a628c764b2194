"""Issue 11 item 5, the web API under hostile clients: a body limit on the bytes actually read (chunked
bodies too), extreme sampling knobs that never give a 500 or crash `gptforge sample`, and a client
that hangs up on /api/generate freeing its queue slot and stopping its generation."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from fastapi.testclient import TestClient  # noqa: E402

from gptforge.generation import SamplingParams, complete  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)).eval()


# --- the body limit counts bytes read -------------------------------------------------------------

def test_chunked_body_over_the_limit_is_413_without_reading_it_whole(model, tokenizer):
    """An ASGI call with no Content-Length and a 64 MB body offered in 64 KiB chunks."""
    app = create_app(model, tokenizer, ServeSettings(max_body_bytes=100_000))
    chunk, total = 65_536, 1024
    pulled = 0

    async def receive():
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b" " * chunk, "more_body": pulled < total}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/api/generate", "raw_path": b"/api/generate", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 413, body
    assert "limit of 100000 bytes" in json.loads(body)["error"]
    assert pulled <= 100_000 // chunk + 1  # stopped at the limit, not after 64 MB


def test_chunked_body_through_the_client(model, tokenizer):
    app = create_app(model, tokenizer, ServeSettings(max_body_bytes=20_000))

    def body():  # a generator body: httpx sends it chunked, without Content-Length
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"z" * 5_000
        yield b'"}'

    with TestClient(app) as c:
        r = c.post("/api/generate", content=body(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit of 20000" in r.json()["error"]
        small = c.post("/api/generate", content=iter([b'{"prompt": "hi", ', b'"max_new_tokens": 2}']),
                       headers={"content-type": "application/json"})
        assert small.status_code == 200, small.text


# --- extreme sampling knobs: numerically safe, one range check for the CLI and the API ---------------

def test_tiny_temperature_is_greedy_not_nan():
    from gptforge.generation import apply_temperature

    logits = torch.tensor([[1.0, 3.0, -2.0, 3.0 - 1e-6]])
    for t in (1e-300, 5e-324, 1e-40, 1e-3):
        scaled = apply_temperature(logits, t)
        assert not torch.isnan(scaled).any() and scaled[0, 1] == 0
        assert torch.softmax(scaled, -1)[0, 1] > 0.99 or t == 1e-3
    ref = torch.softmax(logits.double() / 0.7, -1)  # an ordinary temperature: the float64 reference
    assert torch.allclose(torch.softmax(apply_temperature(logits, 0.7), -1).double(), ref, atol=1e-6)


@pytest.mark.parametrize("knob", [{"temperature": 1e-300}, {"top_p": 1e-300}, {"temperature": 1e-300, "top_p": 1e-300},
                                  {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300},
                                  {"temperature": 1e300}])
def test_extreme_knobs_never_500(model, tokenizer, knob):
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=32))
    body = {"prompts": ["ROMEO:", "Hello"], "max_new_tokens": 8, "seed": 1, "stop_at_eot": False, **knob}
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/api/generate", json=body)
        assert r.status_code == 200, r.text
        s = c.post("/api/stream", json=body)
        assert s.status_code == 200 and "event: error" not in s.text, s.text
    if set(knob) <= {"temperature", "top_p"} and knob.get("temperature", 1e-300) == 1e-300:
        # the limit temperature -> 0 (or a nucleus of one token) is greedy decoding
        greedy = complete(model, tokenizer, body["prompts"], SamplingParams(max_new_tokens=8, temperature=0))
        assert r.json()["completions"] == greedy


@pytest.mark.parametrize("body, words", [({"temperature": -1e-300}, "temperature"), ({"top_p": 1.0000001}, "top_p"),
                                         ({"repetition_penalty": -1}, "repetition_penalty"),
                                         ({"temperature": 1e400}, "temperature")])
def test_out_of_range_knobs_are_422_from_the_shared_check(model, tokenizer, body, words):
    app = create_app(model, tokenizer)
    with TestClient(app) as c:
        r = c.post("/api/generate", content=json.dumps({"prompt": "hi", "max_new_tokens": 4, **body}).replace("Infinity", "1e400"),
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and words in r.json()["error"]
    with pytest.raises(ValueError, match=words):  # the same check the CLI uses
        SamplingParams(**{k: float(v) for k, v in body.items()}).check()


@pytest.mark.parametrize("extra", [["--temperature", "1e-300"], ["--top-p", "1e-300"],
                                   ["--repetition-penalty", "1e-300"]])
def test_cli_sample_extreme_knobs(tmp_path, capsys, extra):
    from gptforge.cli import main
    from gptforge.config import Config
    from gptforge.run.checkpoint import save_checkpoint

    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32))
    where = save_checkpoint(tmp_path / "run", 1, m, None, {"config": Config(model=m.config).to_dict()})
    assert main(["sample", "--ckpt", str(where), "--max-new-tokens", "4", "--seed", "1", *extra]) == 0
    assert "--- sample 0" in capsys.readouterr().out


# --- a client that hangs up on /api/generate ----------------------------------------------------------

class _Server:
    def __init__(self, app):
        # the listening socket is made here and handed to uvicorn: a port found free and closed again could be
        # taken by another process (an xdist worker, a client's ephemeral port) before uvicorn binds it
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.srv.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.srv.started:
            assert time.time() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.srv.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


# Each sampled token's sleep in the tests below: 60 tokens then take >= 12 s, so a generation that was not
# stopped is told from one that was by its count of steps (45 or more), with seconds of room for a loaded
# machine to notice the hang-up, and no wall-clock bound of the test's own.
STEP_S = 0.2


@pytest.fixture
def slow_steps(monkeypatch):
    """Each sampled token takes >= ``calls["sleep"]`` (STEP_S), and the steps are counted. ``calls["hold"]``,
    while clear, keeps every step after the first waiting for it (a request that holds the model until the
    test lets it go)."""
    from gptforge import generation

    pick = generation._pick
    hold = threading.Event()
    hold.set()
    calls = {"n": 0, "hold": hold, "sleep": STEP_S}

    def slow(*a):
        if calls["n"] >= 1:
            assert hold.wait(60), "the test never let the held request go on"
        calls["n"] += 1
        time.sleep(calls["sleep"])
        return pick(*a)

    monkeypatch.setattr(generation, "_pick", slow)
    return calls


def _post_and_hang_up(url: str, body: dict, after: float, endpoint: str = "/api/generate") -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + endpoint, json=body, timeout=httpx.Timeout(30, read=after))


def test_generate_client_leaving_stops_its_generation(model, tokenizer, slow_steps):
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=60, max_queue=0))
    body = {"prompt": "ROMEO:", "max_new_tokens": 60, "temperature": 0, "stop_at_eot": False}
    with _Server(app) as url:
        _post_and_hang_up(url, body, after=0.5)  # 60 steps would take >= 12 s
        left = time.time()
        with httpx.Client(base_url=url, timeout=30) as c:
            while (code := c.post("/api/generate", json={**body, "max_new_tokens": 1}).status_code) == 429:
                assert time.time() - left < 30, "model still busy after the client left"
                time.sleep(0.05)
        assert code == 200
        # the abandoned generation stopped, it did not run to the end: counted in steps, not timed (a hang-up
        # seen within a few steps here; 45 steps leave ~9 s for a loaded machine to see it)
        assert slow_steps["n"] < 45


@pytest.mark.parametrize("endpoint", ["/api/generate", "/api/stream"])
def test_client_leaving_the_queue_frees_its_slot(model, tokenizer, slow_steps, endpoint):
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=60, max_queue=1))
    body = {"prompt": "ROMEO:", "max_new_tokens": 60, "temperature": 0, "stop_at_eot": False}
    slow_steps["hold"].clear()  # the first request holds the model after its first step, until let go below
    slow_steps["sleep"] = 0.0  # the hold, not a time, keeps it on the model
    with _Server(app) as url:
        running = threading.Thread(target=lambda: httpx.post(url + "/api/generate", json=body, timeout=60))
        running.start()
        try:
            with httpx.Client(base_url=url, timeout=30) as c:
                while c.get("/api/info").json()["queue"]["waiting"] != 0 or slow_steps["n"] == 0:
                    time.sleep(0.02)  # the first request holds the model
                _post_and_hang_up(url, body, after=0.3, endpoint=endpoint)  # waits in the queue, then leaves
                left = time.time()
                while c.get("/api/info").json()["queue"]["waiting"] != 0:
                    # the first request cannot finish while held, so the slot can only be freed by the leaving
                    assert time.time() - left < 30, "the departed client still holds its queue slot"
                    time.sleep(0.02)
                assert slow_steps["n"] == 1  # the first request is still on its first step, held
        finally:
            slow_steps["hold"].set()
        running.join()
        assert slow_steps["n"] == 60  # and the departed one never generated
