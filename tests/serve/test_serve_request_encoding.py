"""A request body sent compressed (``Content-Encoding: gzip``, ``br``, ``deflate``, any but ``identity``) is refused
before it is read, 415 naming the header and the fix in each family's shape, on every POST route: each route read
the compressed bytes as JSON (a 400 "'utf-8' codec can't decode byte 0x8b" that named neither), and inflating them
would leave the body limit counting compressed bytes."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]
BODIES = {"/api/generate": {"prompt": "a", "max_new_tokens": 1}, "/api/stream": {"prompt": "a", "max_new_tokens": 1},
          "/api/chat": {"messages": MSGS, "max_new_tokens": 1},
          "/v1/completions": {"prompt": "a", "max_tokens": 1}, "/v1/chat/completions": {"messages": MSGS, "max_tokens": 1}}


@pytest.fixture(scope="module")
def client(tokenizer):
    app = create_app(answering_model(64), tokenizer, ServeSettings(max_new_tokens_cap=4), chat_template=T.to_dict())
    posts = sorted(r.path for r in app.routes if "POST" in getattr(r, "methods", ()))
    assert posts == sorted(BODIES)  # a new POST route needs a body here
    with TestClient(app) as c:
        yield c


def _message(r) -> str:
    err = r.json()["error"]
    return err["message"] if isinstance(err, dict) else err


@pytest.mark.parametrize("path", list(BODIES))
def test_a_compressed_body_is_refused_by_its_header(client, path):
    raw = json.dumps(BODIES[path]).encode()
    for encoding, body in (("gzip", gzip.compress(raw)), ("GZIP", gzip.compress(raw)), ("br", raw),
                           ("identity, deflate", raw)):
        r = client.post(path, content=body, headers={"content-type": "application/json", "content-encoding": encoding})
        assert r.status_code == 415, (path, encoding, r.text)
        assert _message(r) == (f"Content-Encoding: {encoding.lower()}: this server reads a request body as sent (JSON, "
                               "not compressed); send it without a Content-Encoding header"), r.text
        assert r.headers["connection"] == "close"  # the body was never read
        if path.startswith("/v1"):
            assert r.json()["error"]["type"] == "invalid_request_error"
    for encoding in ("identity", "Identity", "", "identity, identity"):  # the body as sent: taken
        r = client.post(path, content=raw, headers={"content-type": "application/json", "content-encoding": encoding})
        assert r.status_code == 200, (path, encoding, r.text)
