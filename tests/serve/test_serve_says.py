"""``gptforge serve`` tells its user what it does (issue 55): what it loads, before it loads; a line per
request on stderr (uvicorn's access log, which its warning log level turns off); and ``/api/info`` names
the served model's own tokenizer's special ids, not GPT-2's defaults."""

from __future__ import annotations

import re

import pytest

from gptforge.cli import main
from tests.conftest import tiny_chat_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


@pytest.fixture
def served(monkeypatch, tmp_path, capsys):
    """``gptforge serve --ckpt`` of a tiny chat checkpoint, uvicorn's loop replaced: (TestClient of its app,
    the checkpoint, the order of events: stderr lines as printed and the moment the weights were read)."""
    import uvicorn
    from fastapi.testclient import TestClient

    from gptforge import load

    where = tiny_chat_checkpoint(tmp_path / "run")
    events, got = [], {}
    real = load._load_model

    def reading(source):  # the moment the weights are read, among the lines printed so far
        events.extend(("err", x) for x in capsys.readouterr().err.splitlines())
        events.append(("load", None))
        return real(source)

    class Server:
        def __init__(self, config):
            got["app"] = config.app

        def run(self, sockets):
            got["port"] = sockets[0].getsockname()[1]
            sockets[0].close()

    monkeypatch.setattr(load, "_load_model", reading)
    monkeypatch.setattr(uvicorn, "Server", Server)
    # --port 0: the system's free port, named in the URL (a port found free and passed in could be taken between)
    assert main(["serve", "--ckpt", str(where), "--port", "0", "--device", "cpu"]) == 0
    cap = capsys.readouterr()
    events.extend(("err", x) for x in cap.err.splitlines())
    assert got["port"] != 0
    return TestClient(got["app"]), where, events, cap.out, got["port"]


def test_serve_says_what_it_loads_before_it_loads(served):
    _, where, events, out, port = served
    size = (where / "model.safetensors").stat().st_size
    first = events[0]
    assert first[0] == "err" and first[1] == f"loading gptforge checkpoint {where} ({size / 1e6:.1f} MB of weights) ..."
    assert events[1] == ("load", None) and events[2][1].startswith("loaded in "), events
    assert out.startswith(f"gptforge serve: http://127.0.0.1:{port}/ ")


def test_serve_logs_each_request_on_stderr(served, capsys):
    client = served[0]
    capsys.readouterr()
    assert client.get("/api/info").status_code == 200
    assert client.get("/no/such/page?x=secret").status_code == 404
    r = client.post("/api/generate", json={"prompt": "hi", "max_new_tokens": 2, "temperature": 0})
    assert r.status_code == 200
    lines = capsys.readouterr().err.splitlines()
    pat = r'testclient:\d+ - "(\w+) (\S+) HTTP/1\.1" (\d{3}) (\d+) ms'
    assert [re.fullmatch(pat, x).groups()[:3] for x in lines] == [("GET", "/api/info", "200"),
                                                                  ("GET", "/no/such/page", "404"),
                                                                  ("POST", "/api/generate", "200")], lines
    assert "secret" not in "".join(lines)  # the query string is not logged


def test_a_library_app_logs_nothing(capsys, tokenizer):
    """``create_app`` without ``access_log`` (tests, embedding apps) keeps stderr for its caller."""
    from fastapi.testclient import TestClient

    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.serve.app import create_app

    app = create_app(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)).eval(), tokenizer)
    assert TestClient(app).get("/api/info").status_code == 200
    assert capsys.readouterr().err == ""


def _gguf_tokenizer():
    """A byte-level BPE whose bos is <|im_start|> (id 1) and eos <|endoftext|> (id 0), as SmolLM2's are."""
    from tests.interop.test_gguf_tokenizer_keys import START, TOKENS, bpe, read

    return read(*bpe(bos_token_id=TOKENS.index(START), eos_token_id=0))[0], TOKENS


@pytest.mark.parametrize("attention", ["causal", "document"])
def test_api_info_names_the_models_own_tokenizers_ids(attention):
    import torch
    from fastapi.testclient import TestClient

    from gptforge.models.llama import Llama, LlamaConfig
    from gptforge.serve.app import create_app

    tok, tokens = _gguf_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(n_layer=1, n_head=2, n_kv_head=2, n_embd=32, block_size=16, vocab_size=len(tokens),
                      attention=attention, bos_token=1)
    info = TestClient(create_app(Llama(cfg).eval(), tok)).get("/api/info").json()
    assert info["tokenizer"]["n_vocab"] == len(tokens)
    assert (info["tokenizer"]["bos"], info["tokenizer"]["eos"]) == (tokens.index("<|im_start|>"),
                                                                    tokens.index("<|endoftext|>"))
    # the model's bos_token is where documents start under document attention; elsewhere an unused default
    assert ("bos_token" in info["model"]) == (attention == "document")
