"""Hardening round twelve of the server, against a real uvicorn on a tiny model: careless and hostile clients
beyond round eleven's.

- ``POST /v1/chat/completions/`` (a trailing slash) got Starlette's empty 307 redirect: curl without ``-L`` and
  clients that do not re-POST after a redirect saw an empty answer, and behind a TLS proxy the absolute
  ``Location`` names ``http://`` (a client that follows it drops its Authorization header on the scheme change).
  A trailing slash is now routed as the path without it.
- ``OPTIONS`` (a browser's CORS preflight) got a 405 that said only "Method Not Allowed", and with ``--api-key`` a
  401 "wrong API key" (a preflight never carries the key), which sent whoever met it after the key. It now says
  that the server answers no CORS by design, whatever the key, with ``Allow`` naming what the path takes (HEAD
  beside GET: round eleven answers it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from gptforge.serve.app import NO_CORS, ServeSettings, create_app  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402
from tests.serve.browser import serve_in_thread  # noqa: E402

USER = [{"role": "user", "content": "Hi"}]
POST_BODIES = {"/api/generate": {"prompt": "a", "max_new_tokens": 1},
               "/api/stream": {"prompt": "a", "max_new_tokens": 1},
               "/api/chat": {"messages": USER, "max_new_tokens": 1},
               "/v1/completions": {"prompt": "a", "max_tokens": 1},
               "/v1/chat/completions": {"messages": USER, "max_tokens": 1}}
SETTINGS = ServeSettings(max_new_tokens_cap=16, max_queue=2, max_batch=4)


@pytest.fixture(scope="module")
def app(tokenizer):
    """A chat model that answers "!" to anything (64 positions), a batch of at most 4."""
    return create_app(answering_model(64), tokenizer, SETTINGS, chat_template=T.to_dict())


@pytest.fixture(scope="module")
def url(app):
    with serve_in_thread(app) as u:
        yield u


def _paths(app, method: str) -> list[str]:
    return [r.path.replace("{model_name:path}", "gptforge") for r in app.routes
            if method in (getattr(r, "methods", None) or ())]


def test_a_trailing_slash_is_the_route_not_a_redirect(app, url):
    assert set(_paths(app, "POST")) == set(POST_BODIES)
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as c:
        for path, body in POST_BODIES.items():
            want = c.post(path, json=body)
            for slashed in (path + "/", path + "//"):
                r = c.post(slashed, json=body)
                assert (r.status_code, r.headers["content-type"]) == (200, want.headers["content-type"]), (slashed, r)
                assert "!" in r.text, (slashed, r.text)  # the model answered it
        for path in _paths(app, "GET"):
            if path != "/":
                r, want = c.get(path + "/"), c.get(path)
                assert (r.status_code, r.headers["content-type"]) == (200, want.headers["content-type"]), path
        assert c.get("/v1/models/").json()["data"][0]["id"] == "gptforge"  # the list, not model "" unknown
        # a path of slashes alone is still no route's, and an unknown path with a slash is a 404, not a redirect
        assert httpx.get(url + "//").status_code == 404
        assert c.post("/v1/nothing/", json={}).status_code == 404


def test_options_says_the_server_answers_no_cors_with_the_methods_the_path_takes(app, url):
    with httpx.Client(base_url=url, timeout=30) as c:
        for path in _paths(app, "POST") + _paths(app, "GET"):
            r = c.options(path, headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"})
            allow = "POST" if path in POST_BODIES else "GET, HEAD"
            assert (r.status_code, r.headers["allow"]) == (405, allow), (path, r.headers)
            assert not any(k.startswith("access-control-") for k in r.headers), r.headers
            err = r.json()["error"]
            message = err["message"] if path.startswith("/v1") else err  # each family's error shape
            assert message == (f"Method Not Allowed: OPTIONS {path} (allowed: {allow}); {NO_CORS}; "
                               "the routes are listed at /docs"), message
        # another wrong method is not told about CORS; its Allow has HEAD beside GET too
        r = c.put("/api/info")
        assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD") and "CORS" not in r.text


def test_options_is_answered_the_same_without_the_api_key(tokenizer):
    from fastapi.testclient import TestClient

    app = create_app(answering_model(64), tokenizer, SETTINGS, chat_template=T.to_dict(), api_key="sk-k")
    with TestClient(app) as c:
        for path in ("/v1/chat/completions", "/api/generate"):
            r = c.options(path)
            assert r.status_code == 405 and NO_CORS in r.text, (path, r.status_code, r.text)
            assert c.post(path, json={}).status_code == 401  # the routes themselves still need the key
