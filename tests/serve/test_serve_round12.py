"""Hardening round twelve of the server, against a real uvicorn on a tiny model: careless and hostile clients
beyond round eleven's.

- ``POST /v1/chat/completions/`` (a trailing slash) got Starlette's empty 307 redirect: curl without ``-L`` and
  clients that do not re-POST after a redirect saw an empty answer, and behind a TLS proxy the absolute
  ``Location`` names ``http://`` (a client that follows it drops its Authorization header on the scheme change).
  A trailing slash is now routed as the path without it.
- ``OPTIONS`` (a browser's CORS preflight) got a 405 that said only "Method Not Allowed", and with ``--api-key`` a
  401 "wrong API key" (a preflight never carries the key), which sent whoever met it after the key. It now says
  that the server answers no CORS by design, whatever the key, with ``Allow`` naming what the path takes (HEAD
  beside GET: round eleven answers it). ``Authorization: bearer KEY`` (the scheme in lower case, which HTTP allows
  and some clients and proxies send) was a 401.
- A batch over the server's limit was refused as ``n: 5 prompt(s) x n=1 replies``, ``param: "n"``, when the client
  sent five prompts and no ``n``; it now names the field that asked (``prompt``, ``n``, or both), and is counted
  before the prompts are tokenized. A prompt over the length limit sent in ``/api``'s ``prompts`` was "prompt 1";
  it is ``prompts.1`` (``prompt.1`` in a /v1 list, ``prompt`` for one).
- /api/chat appended "(start a new conversation)" to whatever the context check said, which carries its own
  advice: "(shorten it) (start a new conversation)", "ask for at most 9 (start a new conversation)". The check
  now takes the chat's advice (``fit_new_tokens(shorten=...)``) and says it once.
- Every route read, validated, rendered and tokenized its request on the event loop, before waiting for the model:
  a 12 MB body of 400,000 empty messages (under the 16 MB a 128k-context model's body limit lets in) stopped every
  stream and every other request for 8 s. That work, /api's JSON reading included, now runs in the gate's worker
  threads, at most ``PREPARING`` at once (unbounded, the threads would hold many such bodies parsed together,
  ~300 MB each, where the loop held one).
- /api/chat (the page's chat) refused a conversation of more than 200 messages ("List should have at most 200
  items") however short they were and however long the model's context, where /v1/chat/completions takes what
  fits; both now hold a conversation to the same two limits, its characters and the context.
- A value of the wrong type came back whole in the error: ``{"prompt": [1] * 100000}`` (a list where a string goes)
  was a 300 kB error message, which the page shows in its status line. Every route now repeats at most
  ``SHOWN_CHARS`` of it, with its size.
- /api/chat's messages are bounded by the context's positions (each message takes at least what its template spends): FastAPI validates
  the body on the event loop, and 400,000 empty messages (12 MB, under a 128k-context model's body limit) took 4 s
  there once the old count of 200 was gone; the bound is checked before the messages are validated.
- A body that is not a JSON object (empty, ``null``, a list, a number) was /v1's 400 "the body must be a JSON
  object" but /api's 422 "body: Input should be a valid dictionary or object to extract fields from" (an empty
  one "body: Field required"); both say /v1's words now. An integer of 5,000 digits was "malformed JSON body:
  Exceeds the limit (4300 digits) ...; use sys.set_int_max_str_digits() to increase the limit", advice for the
  server's code; it now says what the body holds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from gptforge.serve.openai_schema import NOT_AN_OBJECT, SHOWN_CHARS  # noqa: E402
from gptforge.serve.routing import NO_CORS  # noqa: E402
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


def test_the_key_check_leaves_options_alone_and_takes_the_scheme_in_any_case(tokenizer):
    from fastapi.testclient import TestClient

    app = create_app(answering_model(64), tokenizer, SETTINGS, chat_template=T.to_dict(), api_key="sk-k")
    with TestClient(app) as c:
        for path, body in (("/v1/chat/completions", POST_BODIES["/v1/chat/completions"]),
                           ("/api/generate", POST_BODIES["/api/generate"])):
            r = c.options(path)
            assert r.status_code == 405 and NO_CORS in r.text, (path, r.status_code, r.text)
            assert c.post(path, json=body).status_code == 401  # the routes themselves still need the key
            # "bearer" is "Bearer": HTTP's auth schemes are case-insensitive (some clients and proxies lower it)
            for header, status in (("Bearer sk-k", 200), ("bearer sk-k", 200), ("BEARER sk-k", 200),
                                   ("bearer sk-K", 401), ("Basic sk-k", 401), ("sk-k", 401), ("bearersk-k", 401)):
                r = c.post(path, json=body, headers={"authorization": header})
                assert r.status_code == status, (path, header, r.text)


def _openai_error(r) -> tuple[int, str, str | None]:
    err = r.json()["error"]
    return r.status_code, err["message"], err["param"]


def test_a_batch_refusal_names_the_field_that_asked_for_the_replies(url):
    over = "is over this server's batch limit of 4"
    with httpx.Client(base_url=url, timeout=30) as c:
        for extra in ({"max_tokens": 1}, {"max_tokens": 0, "echo": True}):  # generating, or scoring the prompts
            cases = (({"prompt": ["a"] * 5}, f"prompt: 5 prompts {over} (send them in several requests)", "prompt"),
                     ({"prompt": [[1]] * 5}, f"prompt: 5 prompts {over} (send them in several requests)", "prompt"),
                     ({"prompt": "a", "n": 5}, f"n: 5 replies {over}", "n"),
                     ({"prompt": ["a", "b"], "n": 3}, f"prompt and n: 2 prompts x n=3 = 6 replies {over}", "n"))
            for body, message, param in cases:
                r = c.post("/v1/completions", json={**body, **extra})
                assert _openai_error(r) == (400, message, param), (body, extra)
        r = c.post("/v1/chat/completions", json={"messages": USER, "n": 5, "max_tokens": 1})
        assert _openai_error(r) == (400, f"n: 5 replies {over}", "n")
        # counted before any prompt is tokenized: five prompts over the length limit are refused as five prompts
        r = c.post("/v1/completions", json={"prompt": ["y" * 30_000] * 5, "max_tokens": 1})
        assert _openai_error(r)[2] == "prompt" and "5 prompts" in _openai_error(r)[1]
        # at the limit each is answered
        assert c.post("/v1/completions", json={"prompt": ["a"] * 2, "n": 2, "max_tokens": 1}).status_code == 200


def test_a_prompt_over_the_length_limit_is_named_as_it_was_sent(url):
    limit = SETTINGS.for_model(64).max_prompt_chars
    long = "y" * (limit + 1)
    with httpx.Client(base_url=url, timeout=30) as c:
        for body, field in (({"prompt": long}, "prompt"), ({"prompts": ["a", long]}, "prompts.1")):
            r = c.post("/api/generate", json={**body, "max_new_tokens": 1})
            assert (r.status_code, r.json()) == (400, {"error": f"{field} has {limit + 1} characters; the limit is "
                                                                f"{limit}"})
        for prompt, field in ((long, "prompt"), (["a", long], "prompt.1")):
            r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            assert _openai_error(r) == (400, f"{field} has {limit + 1} characters; the limit is {limit}", "prompt")


def test_a_chat_too_long_for_the_context_is_given_one_piece_of_advice(url, tokenizer):
    from gptforge.serve.chat import SHORTEN_CHAT

    def refusal(content: str, **knobs) -> str:
        r = httpx.post(url + "/api/chat", json={"messages": [{"role": "user", "content": content}], **knobs},
                       timeout=30)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    n = len(T.render_for_generation([{"role": "user", "content": "a " * 50}], tokenizer))
    assert 64 - 16 < n < 64  # room for a reply, and max_new_tokens past it within the server's cap of 16
    got = {refusal("hello " * 70), refusal("a " * 50, max_new_tokens=64 - n + 1)}
    full = len(T.render_for_generation([{"role": "user", "content": "hello " * 70}], tokenizer))
    assert got == {f"the prompt is {full} tokens; the model's context of 64 leaves no room to generate ({SHORTEN_CHAT})",
                   f"prompt ({n} tokens) + max_new_tokens {64 - n + 1} exceeds the model's context of 64 tokens; "
                   f"ask for at most {64 - n}"}


def test_a_request_being_tokenized_does_not_hold_up_the_server(url, tokenizer, monkeypatch):
    """Each route's preparation (its prompt tokenized, its messages rendered) is held inside the tokenizer until
    let go; meanwhile the server answers another request. On the event loop it stalled everything: a 12 MB body
    of 400,000 empty messages (under the 16 MB a 128k-context model's body limit lets in) held every stream for
    8 s."""
    import threading

    inside, let_go = threading.Event(), threading.Event()

    def held(encode):
        def held_encode(self, text, *a, **k):
            if "HOLD" in text:
                inside.set()
                assert let_go.wait(30), "the test never let the tokenizer go on"
            return encode(self, text, *a, **k)

        return held_encode

    for name in ("encode", "encode_ordinary"):  # prompts, and the chat template's message contents
        monkeypatch.setattr(type(tokenizer), name, held(getattr(type(tokenizer), name)))
    msgs = [{"role": "user", "content": "HOLD"}]
    for path, body in (("/api/generate", {"prompt": "HOLD", "max_new_tokens": 1}),
                       ("/api/stream", {"prompt": "HOLD", "max_new_tokens": 1}),
                       ("/api/chat", {"messages": msgs, "max_new_tokens": 1}),
                       ("/v1/completions", {"prompt": "HOLD", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})):
        inside.clear()
        let_go.clear()
        answers = []
        asking = threading.Thread(target=lambda p=path, b=body, a=answers: a.append(httpx.post(url + p, json=b, timeout=60)))
        asking.start()
        try:
            assert inside.wait(30), path
            # 10 s: the other answer takes milliseconds; a loop held by the tokenizer never gives it
            assert httpx.get(url + "/api/info", timeout=10).status_code == 200, path
            assert not answers  # the held request was still being tokenized
        finally:
            let_go.set()
            asking.join()
        assert answers[0].status_code == 200 and "!" in answers[0].text, (path, answers[0].text)


def _message(r) -> str:
    err = r.json()["error"]
    return err["message"] if r.request.url.path.startswith("/v1") else err  # each family's error shape


def test_a_body_that_is_not_an_object_or_holds_a_huge_integer_is_one_400_on_every_route(url):
    import sys

    digits = sys.get_int_max_str_digits()
    with httpx.Client(base_url=url, timeout=30) as c:
        for path in POST_BODIES:
            for raw in (b"", b"null", b"[]", b"[1, 2]", b'"prompt"', b"1", b"true"):
                r = c.post(path, content=raw, headers={"content-type": "application/json"})
                assert (r.status_code, _message(r)) == (400, NOT_AN_OBJECT), (path, raw, r.text)
            huge = b'{"seed": 1' + b"0" * digits + b"}"
            r = c.post(path, content=huge, headers={"content-type": "application/json"})
            assert (r.status_code, _message(r)) == (400, f"malformed JSON body: a number of more than {digits} "
                                                         "digits, which no field takes"), (path, r.text)


def test_what_careless_clients_send_that_was_already_answered_well_stays_so(url):
    """Probed this round and found right; pinned here where no earlier test asked it of every route."""
    with httpx.Client(base_url=url, timeout=30) as c:
        deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # 10^5 levels, 200 kB
        for path in POST_BODIES:
            r = c.post(path, content=deep, headers={"content-type": "application/json"})
            assert (r.status_code, _message(r)) == (400, "malformed JSON body: nested too deeply"), path
        # numbers JSON has not (NaN, Infinity: Python's json reads them) or that Python reads as inf: the field refuses
        for literal in ("1e999", "NaN", "-Infinity"):
            for field in ("temperature", "top_p"):
                r = c.post("/v1/completions", content=f'{{"prompt": "a", "max_tokens": 1, "{field}": {literal}}}')
                assert (r.status_code, r.json()["error"]["param"]) == (400, field), (literal, r.text)
                r = c.post("/api/generate", content=f'{{"prompt": "a", "max_new_tokens": 1, "{field}": {literal}}}')
                assert r.status_code == 422 and r.json()["error"].startswith(f"{field}="), (literal, r.text)
            r = c.post("/v1/completions", content=f'{{"prompt": "a", "max_tokens": {literal}}}')
            assert (r.status_code, r.json()["error"]["param"]) == (400, "max_tokens"), (literal, r.text)
        # -0 is a temperature of 0 (greedy) and a seed of 0
        r = c.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": 2, "temperature": -0.0, "seed": -0}')
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "!!"
        # what OpenAI's clients send that changes nothing here: accepted, the reply the same
        for extra in ({"user": "u-1"}, {"metadata": {"k": "v"}}, {"store": True}, {"service_tier": "auto"},
                      {"parallel_tool_calls": False}, {"stream_options": None}):
            r = c.post("/v1/chat/completions", json={**POST_BODIES["/v1/chat/completions"], **extra})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "!", (extra, r.text)
        # an unknown model's card is OpenAI's 404; a trailing slash on the served one's is the card
        r = c.get("/v1/models/gpt-4o")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
        assert c.get("/v1/models/gptforge/").json()["id"] == "gptforge"


def test_requests_are_read_off_the_event_loop_a_bounded_number_at_once(url, monkeypatch):
    """Every route's JSON is read in the gate's worker threads, at most PREPARING at once: the rest wait their
    turn without a thread (a thread each would hold every large body parsed together, ~300 MB apiece), and the
    server answers meanwhile."""
    import threading
    import time

    from gptforge.serve import openai_schema
    from gptforge.serve.gate import PREPARING

    inside, let_go, count = [], threading.Event(), threading.Lock()
    loads = openai_schema.loads_body

    def held_loads(raw):
        if b"HOLD" in raw:
            with count:
                inside.append(raw)
            assert let_go.wait(30), "the test never let the reading go on"
        return loads(raw)

    monkeypatch.setattr(openai_schema, "loads_body", held_loads)
    held = {"/api/generate": {"prompt": "HOLD", "max_new_tokens": 1},
            "/api/chat": {"messages": [{"role": "user", "content": "HOLD"}], "max_new_tokens": 1},
            "/v1/completions": {"prompt": "HOLD", "max_tokens": 1},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": "HOLD"}], "max_tokens": 1}}
    assert len(held) > PREPARING
    answers = []
    asking = [threading.Thread(target=lambda p=p, b=b: answers.append(httpx.post(url + p, json=b, timeout=60)))
              for p, b in held.items()]
    for t in asking:
        t.start()
    try:
        deadline = time.time() + 30
        while len(inside) < PREPARING:
            assert time.time() < deadline, f"{len(inside)} requests reached their reading"
            time.sleep(0.01)
        time.sleep(1.0)  # room for the others to come in, were they let in
        assert len(inside) == PREPARING
        assert httpx.get(url + "/api/info", timeout=10).status_code == 200  # the loop is free
    finally:
        let_go.set()
        for t in asking:
            t.join()
    assert len(inside) == len(held)
    # let go together they meet the model's gate: one on the model, max_queue (2) waiting, one more may be told busy
    assert sorted(r.status_code for r in answers) in ([200] * 4, [200] * 3 + [429]), answers
    assert all("!" in r.text for r in answers if r.status_code == 200)


def test_a_long_chat_of_short_messages_is_held_to_the_context_not_to_a_count(tokenizer):
    from fastapi.testclient import TestClient

    app = create_app(answering_model(1024), tokenizer, SETTINGS, chat_template=T.to_dict())
    talk = [{"role": ("user", "assistant")[i % 2], "content": "ok"} for i in range(301)]  # ~3 tokens each
    assert len(T.render_for_generation(talk, tokenizer)) < 1024 - 1  # it fits, with room for a reply
    with TestClient(app) as c:
        r = c.post("/api/chat", json={"messages": talk, "max_new_tokens": 1})
        assert r.status_code == 200 and '"text": "!"' in r.text, r.text
        r = c.post("/v1/chat/completions", json={"messages": talk, "max_tokens": 1})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "!", r.text


def test_a_refused_value_is_repeated_in_part_with_its_length(url):
    big = [1] * 100_000  # its repr is 300,000 characters
    with httpx.Client(base_url=url, timeout=30) as c:
        for path, body in (("/api/generate", {"prompt": big}), ("/api/chat", {"messages": [{"role": "user", "content": big}]}),
                           ("/v1/completions", {"prompt": {"ids": big}}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}]})):
            message = _message(c.post(path, json=body))
            got = message[message.index("(got ") + 5:]
            assert got.startswith(("[1, 1, 1, 1, 1, 1, 1, 1, ...] (100,000 items)",
                                   "{'ids': [1, 1, 1, 1, 1, 1, 1, 1, ...]} (1 item)")), (path, got[:200])
            assert len(message) < 8 * SHOWN_CHARS, (path, len(message))  # a few fields' worth, not the value
        # a short value is repeated whole, as before: up to SHOWN_CHARS of its repr (a string's quotes are 2 of them)
        text = "a" * (SHOWN_CHARS - 2)
        got = _message(c.post("/api/generate", json={"prompts": text}))
        assert got == f"prompts: Input should be a valid list (got {text!r})", got
        got = _message(c.post("/api/generate", json={"prompts": text + "b"}))  # one more: its ends and its length
        assert got.startswith("prompts: Input should be a valid list (got 'aaa") and "..." in got, got
        assert got.endswith(f"ab' ({SHOWN_CHARS - 1} characters))") and len(got) < 2 * SHOWN_CHARS, got
        # a list of a few items whose repr is SHOWN_CHARS long is whole; one character more is cut
        for ids, whole in (([10**7] * 8, True), ([10**7] * 7 + [10**8], False)):
            assert len(repr(ids)) == SHOWN_CHARS + (not whole)
            got = _message(c.post("/api/generate", json={"prompt": ids}))
            assert (f"(got {ids!r})" in got) == whole and ("... (8 items))" in got) != whole, got
        # a dict is shown in the order it was sent
        got = _message(c.post("/api/generate", json={"prompt": {"b": 1, "a": 2}}))
        assert got.endswith("(got {'b': 1, 'a': 2})"), got


def test_a_chat_of_more_messages_than_the_context_has_positions_is_refused_by_their_count(url):
    """The count is checked before the messages are validated (limits.bounded_messages; round 13 has /v1 too)."""
    from gptforge.serve.limits import MESSAGES_OVER_CONTEXT

    for n in (31, 30_000):  # one more than fit the 64 positions (two a message, two around them); 1 MB's worth
        r = httpx.post(url + "/api/chat", json={"messages": [{"role": "user", "content": ""}] * n}, timeout=30)
        error = r.json()["error"]
        assert (r.status_code, error[:error.index(" (got ")]) == (
            422, "messages: " + MESSAGES_OVER_CONTEXT.format(max_length=30, positions=64, cost=2)), r.text[:300]
        assert error.endswith(f"... ({n:,} items))"), error  # the messages are not repeated
