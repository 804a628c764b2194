"""Hardening round eleven of the server, against a real uvicorn on a tiny model: what careless and hostile
clients do that earlier rounds did not try.

- A busy server's 429 (the queue full) said "retry shortly" but sent no ``Retry-After``, so a client could not
  tell how long; under /v1 the header is also what OpenAI's client reads to time its retry.
- ``HEAD`` on the page, ``/api/info`` or ``/v1/models`` (``curl -I``, an uptime check) was a 405: FastAPI's
  routes answer only the methods they were declared with, where HTTP asks HEAD of every GET.
- OpenAI's older function calling (``functions``, ``function_call``), a ``tool_choice`` that asks for a call,
  audio ``modalities``/``audio`` and ``web_search_options`` were dropped without a word: the client got plain
  text where it waited for a call, audio or a searched answer. Each is now refused by name, its neutral value
  accepted (the rest of the refusals are test_v1_options_effect's parametrized test).
- ``curl -d '{"prompt": ...}' .../api/generate`` without ``-H 'content-type: application/json'`` (curl then says
  ``application/x-www-form-urlencoded``) was a 422 "body: Input should be a valid dictionary" on every /api
  route, naming neither the header nor the fix, while /v1 read the same body as JSON. Both read JSON now.
- Ctrl-C on ``gptforge serve`` with a stream in flight printed "unhandled exception during asyncio.run()
  shutdown ... ValueError: generator already executing": the shutdown cancels the stream's producer while a worker
  thread is inside the generation's step, and its cleanup's ``it.close()`` raised there, skipping the gate's
  release. The same held for a whole answer's collection (``collect_rows``).
- An OpenAI client given ``base_url="http://host:8000"`` (no ``/v1``, the commonest slip) got "404 Not Found:
  POST /chat/completions" in the native shape, which the client shows as a bare dict. An unknown path that is a
  route's path under a missing or extra prefix (or in other case) now says which route it was meant as, in that
  route's family's shape.
- ``ServeSettings.max_prompt_chars`` (20,000 under ``gptforge serve``) bounded /v1/chat/completions' conversation
  but not /api/chat's, whose messages were each held to a hard-coded 20,000 characters (a 422) and together to
  nothing but the body limit (50 such messages were tokenized); an app built with a lower limit took more on
  /api/chat, one with a higher limit refused a long message there. Both routes now apply the setting to the
  conversation, in one helper (``limits.messages_over_limit``) with one message.
- A chat request's ``max_completion_tokens`` (what OpenAI's current clients send) over the server's cap or the
  context was refused as ``max_tokens=N`` with ``param: "max_tokens"``, a field the client never sent.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from gptforge.serve.gate import RETRY_AFTER_S  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402
from tests.serve.browser import serve_in_thread  # noqa: E402

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def held():
    """Every sampled token waits while ``hold`` is clear; ``stepping`` is set once a generation reached a token
    (the model is taken). Module-wide: the server below is one for the module."""
    from gptforge import generation

    pick = generation._pick
    hold, stepping = threading.Event(), threading.Event()
    hold.set()

    def waiting_pick(*a):
        stepping.set()
        assert hold.wait(30), "the test never let the held request go on"
        return pick(*a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(generation, "_pick", waiting_pick)
        yield hold, stepping


@pytest.fixture(scope="module")
def app(tokenizer):
    """A chat model that answers "!" to anything, with no queue: one request on the model, the next a 429."""
    return create_app(answering_model(64), tokenizer, ServeSettings(max_new_tokens_cap=16, max_queue=0),
                      chat_template=T.to_dict())


@pytest.fixture(scope="module")
def url(held, app):
    with serve_in_thread(app) as u:
        yield u


def test_a_busy_servers_429_says_when_to_retry_in_both_families(url, held):
    hold, stepping = held
    hold.clear()
    stepping.clear()
    first = threading.Thread(target=lambda: httpx.post(url + "/api/generate", json={"prompt": "a", "max_new_tokens": 2},
                                                       timeout=60))
    first.start()
    try:
        assert stepping.wait(30), "the first request never reached the model"
        busy = [httpx.post(url + "/api/generate", json={"prompt": "a", "max_new_tokens": 1}, timeout=30),
                httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=30),
                httpx.post(url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 1}, timeout=30)]
    finally:
        hold.set()
        first.join()
    for r in busy:
        assert r.status_code == 429, r.text
        assert r.headers.get("retry-after") == str(RETRY_AFTER_S), (r.request.url, r.headers)
    assert busy[1].json()["error"]["code"] == "server_busy"


def test_every_get_route_answers_head_with_its_headers_and_no_body(app, url):
    gets = [r.path for r in app.routes if "GET" in (getattr(r, "methods", None) or ())]
    assert {"/", "/api/info", "/v1/models", "/docs"} <= set(gets)  # the walk sees the app's routes
    with httpx.Client(base_url=url, timeout=30) as c:
        for path in gets:
            path = path.replace("{model_name:path}", "gptforge")  # the one model this server serves
            head, get = c.head(path), c.get(path)
            assert (head.status_code, head.content) == (200, b""), (path, head.status_code, head.text)
            assert head.headers["content-type"] == get.headers["content-type"], path
        # a route without GET still refuses HEAD, naming what it takes
        r = c.head("/api/generate")
        assert (r.status_code, r.headers["allow"]) == (405, "POST")
        # HEAD is taken without being declared: /docs' schema lists one operation per route, as before
        assert {m for ops in c.get("/openapi.json").json()["paths"].values() for m in ops} == {"get", "post"}


def test_what_a_client_asks_beyond_text_is_refused_by_name_and_its_neutral_value_accepted(url):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
    # the openai package still sends the legacy function calling as it was given
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=USER, max_tokens=1,
                                  functions=[{"name": "add", "parameters": {"type": "object", "properties": {}}}])
    assert e.value.body == {"message": "functions: function calling is not supported by this server",
                            "type": "invalid_request_error", "param": "functions", "code": None}
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="x", messages=USER, max_tokens=1, tool_choice=choice)
        assert e.value.body["param"] == "tool_choice" and repr(choice) in e.value.body["message"]
    # the neutral values: no call, text only; the reply is the plain one
    plain = c.chat.completions.create(model="x", messages=USER, max_tokens=2).choices[0].message.content
    for neutral in ({"tool_choice": "none", "function_call": "auto"}, {"tool_choice": "auto", "function_call": "none"},
                    {"functions": [], "modalities": ["text"], "audio": None, "web_search_options": None}):
        r = c.chat.completions.create(model="x", messages=USER, max_tokens=2, **neutral)
        assert r.choices[0].message.content == plain == "!!", neutral


POST_BODIES = {"/api/generate": {"prompt": "a", "max_new_tokens": 1},
               "/api/stream": {"prompt": "a", "max_new_tokens": 1},
               "/api/chat": {"messages": USER, "max_new_tokens": 1},
               "/v1/completions": {"prompt": "a", "max_tokens": 1},
               "/v1/chat/completions": {"messages": USER, "max_tokens": 1}}


def test_every_post_route_reads_its_json_body_whatever_the_content_type_says(app, url):
    import json

    assert {r.path for r in app.routes if "POST" in (getattr(r, "methods", None) or ())} == set(POST_BODIES)
    with httpx.Client(base_url=url, timeout=30) as c:
        for path, body in POST_BODIES.items():
            want = c.post(path, json=body)
            assert want.status_code == 200, (path, want.text)
            for ctype in (None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
                r = c.post(path, content=json.dumps(body).encode(), headers={"content-type": ctype} if ctype else {})
                assert r.status_code == 200, (path, ctype, r.text)
                assert r.headers["content-type"] == want.headers["content-type"], (path, ctype)
                assert "!" in r.text, (path, ctype, r.text)  # the model's one answer came back
        # a body that is not JSON (a real form) is still the malformed-JSON 400, not the model's business
        r = c.post("/api/generate", content=b"prompt=hi", headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON body"), r.text


@pytest.mark.parametrize("consumer", ["stream", "collect"])
def test_a_task_cancelled_mid_step_cleans_up_without_closing_the_running_generator(consumer):
    """What the server's shutdown does to a generation in flight, done here by hand: cancel the task awaiting a
    step that is still running in its worker thread."""
    import asyncio

    from gptforge.serve import sse

    inside, let_go, closed = threading.Event(), threading.Event(), []

    def generation():
        try:
            inside.set()
            assert let_go.wait(30)
            yield "never consumed"
        finally:
            closed.append(True)

    class Gate:
        released = 0

        def release(self):
            self.released += 1

    async def main():
        gate, pieces, it = Gate(), asyncio.Queue(), generation()
        work = (sse._produce(it, pieces, asyncio.Event(), gate) if consumer == "stream"
                else sse.collect_rows(it, 1, asyncio.Event()))
        task = asyncio.create_task(work)
        while not inside.is_set():  # the step is running in its worker thread
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # not "ValueError: generator already executing"
            await task
        if consumer == "stream":  # the rest of the cleanup ran: the model is free, the response told it ended
            assert gate.released == 1 and pieces.get_nowait() is None
        let_go.set()  # the step ends in its thread; the generator is left to end there, not closed mid-step

    asyncio.run(main())


def test_a_path_one_prefix_off_a_route_is_told_which_route_it_meant(url):
    openai = pytest.importorskip("openai")
    tail = "; the routes are listed at /docs"
    hint = " (an OpenAI client's base_url ends in /v1)"
    calls = ((lambda o: o.chat.completions.create(model="x", messages=USER, max_tokens=1), "POST /chat/completions",
              "/v1/chat/completions"),
             (lambda o: o.completions.create(model="x", prompt="a", max_tokens=1), "POST /completions",
              "/v1/completions"),
             (lambda o: o.models.list(), "GET /models", "/v1/models"))
    for base in (url, url + "/v1/v1"):  # the /v1 left off, or given twice
        oa = openai.OpenAI(base_url=base, api_key="-", max_retries=0)
        for call, route, meant in calls:
            with pytest.raises(openai.NotFoundError) as e:
                call(oa)
            prefix = base.removeprefix(url)
            assert e.value.body == {"message": f"Not Found: {route.replace(' ', ' ' + prefix)}; did you mean {meant}?"
                                               f"{hint}{tail}", "type": "not_found_error", "param": None, "code": None}
    with httpx.Client(base_url=url, timeout=30) as c:
        # a native route meant: the native shape, no OpenAI hint; case and a trailing slash do not hide it
        r = c.post("/Generate", json={"prompt": "a"})
        assert (r.status_code, r.json()) == (404, {"error": f"Not Found: POST /Generate; did you mean /api/generate?"
                                                            f"{tail}"})
        # nothing like a route: the plain message
        assert c.get("/nothing/here").json() == {"error": f"Not Found: GET /nothing/here{tail}"}
        # a path of slashes alone is near no route (every path ends with the empty one)
        assert httpx.get(url + "//").json() == {"error": f"Not Found: GET //{tail}"}


def test_both_chat_routes_hold_the_conversation_to_max_prompt_chars(tokenizer):
    from fastapi.testclient import TestClient

    def answers(limit: int, contents: list[str]) -> list[tuple[int, str]]:
        msgs = [{"role": "user", "content": t} for t in contents]
        app = create_app(answering_model(64), tokenizer, ServeSettings(max_prompt_chars=limit), chat_template=T.to_dict())
        with TestClient(app) as c:
            a = c.post("/api/chat", json={"messages": msgs, "max_new_tokens": 1})
            v = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1})
            return [(a.status_code, a.text if a.status_code == 200 else a.json()["error"]),
                    (v.status_code, v.text if v.status_code == 200 else v.json()["error"]["message"])]

    for status, _ in answers(10, ["12345", "67890"]):  # at the limit, counted over all messages
        assert status == 200
    assert answers(10, ["12345", "678901"]) == [(400, "messages: over the limit of 10 characters")] * 2
    # a limit above the old hard-coded 20,000 a message: a longer message reaches the model's context check
    for status, error in answers(30_000, ["a " * 12_500]):
        assert status == 400 and "context" in error, error


def test_a_refused_length_names_the_field_it_came_in(url):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
    long = [{"role": "user", "content": "a " * 55}]  # 60 tokens of the 64-token context
    for kwargs, field, words in (({"max_completion_tokens": 17}, "max_completion_tokens",
                                  "max_completion_tokens=17 is over this server's cap of 16"),
                                 ({"max_tokens": 17}, "max_tokens", "max_tokens=17 is over this server's cap of 16"),
                                 ({"max_tokens": 1, "max_completion_tokens": 17}, "max_completion_tokens",
                                  "max_completion_tokens=17 is over"),  # the one that wins is the one named
                                 ({"max_completion_tokens": 16, "messages": long}, "max_completion_tokens",
                                  "you requested 76 tokens (60 in the prompt, 16 in the completion)")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="x", **{"messages": USER, **kwargs})
        assert e.value.body["param"] == field and words in e.value.body["message"], e.value.body
