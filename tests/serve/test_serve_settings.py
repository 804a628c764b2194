"""``serve``'s limits and its listening socket, word for word (issue 36, lane ``serve``): the CLI runs that
reach ``ServeSettings.check`` and ``bind_port`` are subprocesses mutmut cannot map, and no test read
their messages.

- ``ServeSettings.check``: every limit an integer >= 1, the queue >= 0 (0: no one waits), refused naming
  the flag as the command line spells it;
- ``bind_port``: a listening socket with SO_REUSEADDR (as uvicorn sets it) and a backlog; a port taken is
  one line naming the port and the next one to try; an address that is not this machine's, or a host that
  does not resolve, names the host (a stand-in resolver: no DNS in a test);
- ``run_server``: the app it hands uvicorn (a stand-in server) carries every setting, on the socket given or
  bound, and its one printed line."""

from __future__ import annotations

import dataclasses
import errno
import io
import socket
import sys

import pytest

from gptforge.serve.app import PortBusy, ServeSettings, bind_port

LIMITS = [f.name for f in dataclasses.fields(ServeSettings)]


def test_the_defaults_pass_and_each_limit_is_checked():
    ServeSettings().check()
    assert LIMITS == ["max_new_tokens_cap", "max_batch", "max_queue", "max_prompt_chars", "max_body_bytes"]
    for name in LIMITS:
        low = 1 if name in ("max_new_tokens_cap", "max_batch") else 0  # 0: none waiting / derived from the model
        ServeSettings(**{name: low}).check()  # the smallest allowed
        flag = "--" + name.replace("_", "-")
        for bad in (low - 1, -7, 2.0, "8", None, True):
            with pytest.raises(ValueError) as e:
                ServeSettings(**{name: bad}).check()
            assert str(e.value) == f"{flag} {bad}: must be an integer >= {low}", (name, bad)


def test_bind_port_listens_with_reuseaddr():
    sock = bind_port("127.0.0.1", 0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0 and sock.family == socket.AF_INET
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1  # listening already
        client = socket.create_connection(("127.0.0.1", port), timeout=5)  # a connection waits in the backlog
        client.close()
    finally:
        sock.close()


def test_a_port_in_use_names_the_port_and_the_next(monkeypatch):
    first = bind_port("127.0.0.1", 0)
    port = first.getsockname()[1]
    closed = []
    real_close = socket.socket.close
    monkeypatch.setattr(socket.socket, "close", lambda self: (closed.append(self), real_close(self))[1])
    try:
        with pytest.raises(PortBusy) as e:
            bind_port("127.0.0.1", port)
        assert str(e.value) == (f"port {port} on 127.0.0.1 is already in use (another gptforge serve?): stop that "
                                f"server or pass --port {port + 1} (--port 0: any free port)")
        assert e.value.__cause__.errno == errno.EADDRINUSE
        assert len(closed) == 1  # the socket that could not bind is closed, not leaked
    finally:
        monkeypatch.undo()
        first.close()


def test_an_address_that_is_not_this_machines_names_host_and_port(monkeypatch):
    def bind(self, addr):
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    monkeypatch.setattr(socket.socket, "bind", bind)
    with pytest.raises(PortBusy) as e:
        bind_port("10.254.254.254", 8123)
    assert str(e.value) == "cannot listen on 10.254.254.254:8123: Cannot assign requested address; check --host and --port"


def test_a_host_that_does_not_resolve_names_the_host(monkeypatch):
    def getaddrinfo(host, port, *a, **kw):
        assert (host, port, kw.get("type")) == ("no-such-host", 8123, socket.SOCK_STREAM)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(PortBusy) as e:
        bind_port("no-such-host", 8123)
    assert str(e.value) == "cannot listen on no-such-host:8123: Name or service not known; check --host"


def test_the_address_family_is_the_hosts():
    try:
        sock = bind_port("::1", 0)
    except PortBusy:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"
    finally:
        sock.close()


class _Uvicorn:
    """Stands in for ``uvicorn.Server``: records its config, its sockets and what stdout had passed on (flushed)
    when serving began, instead of serving until Ctrl-C."""

    seen: dict = {}

    def __init__(self, config):
        _Uvicorn.seen = {"config": config}

    def run(self, sockets):
        _Uvicorn.seen.update(sockets=sockets, flushed=sys.stdout.flushed)


class _Stdout(io.StringIO):
    """A pipe's view of stdout: only what was flushed has left the process."""

    def __init__(self):
        super().__init__()
        self.flushed = ""

    def flush(self):
        self.flushed = self.getvalue()


@pytest.mark.parametrize("key", [None, "k3y"])
def test_run_server_serves_the_app_it_was_given_on_the_socket(monkeypatch, tmp_path, tokenizer, key):
    """``run_server``'s wiring: the app around the model with every setting passed on (checked through the
    app's own routes: the limits, what is served, the loss curve, the chat template, the tokenizer), the socket
    given or one bound on host:port, uvicorn's log level, and the line it prints, word for word, flushed before
    serving starts (under a process manager stdout is a pipe, and the URL must not wait for the server to exit)."""
    import json

    import torch
    import uvicorn
    from fastapi.testclient import TestClient

    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.serve.app import run_server

    monkeypatch.setattr(uvicorn, "Server", _Uvicorn)
    torch.manual_seed(0)
    chat = ChatTemplate.gpt2()
    template = chat.to_dict()
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=chat.vocab_size)).eval()
    encoded = []

    class Tok:  # the tokenizer given, noticed when used
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, text, **kw):
            encoded.append(text)
            return tokenizer.encode(text, **kw)

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 3, "loss": 2.5}) + "\n")
    given = bind_port("127.0.0.1", 0)
    port = given.getsockname()[1]
    for sock in (given, None):
        if sock is None:  # bound here, on the port just freed
            given.close()
        monkeypatch.setattr(sys, "stdout", _Stdout())
        run_server(model, ServeSettings(max_batch=3), host="127.0.0.1", port=port,
                   metrics_path=tmp_path / "metrics.jsonl", served={"source": "random", "tag": "x"},
                   chat_template=template, api_key=key, enc=Tok(), sock=sock)
        config, (used,) = _Uvicorn.seen["config"], _Uvicorn.seen["sockets"]
        try:
            assert used.getsockname() == ("127.0.0.1", port) and (used is given) == (sock is given)
            assert config.log_level == "warning"
            with TestClient(config.app) as c:
                auth = {"Authorization": f"Bearer {key}"} if key else {}
                if key:
                    assert c.get("/api/info").status_code == 401
                info = c.get("/api/info", headers=auth).json()
                assert info["limits"]["max_batch"] == 3 and info["served"] == {"source": "random", "tag": "x"}
                assert c.get("/api/metrics", headers=auth).json()["train"] == [[3, 2.5]]
                assert c.get("/api/chat/info", headers=auth).json() == {"available": True, "template": template}
                encoded.clear()
                assert c.post("/api/generate", headers=auth, json={"prompt": "hi", "max_new_tokens": 1,
                                                                    "temperature": 0}).status_code == 200
                assert encoded == ["hi"]
        finally:
            used.close()
        hint = "; Bearer key required: open the page as /#key=KEY" if key else ""
        assert _Uvicorn.seen["flushed"] == (f"gptforge serve: http://127.0.0.1:{port}/  (JSON API under /api, "
                                            f"OpenAI's under /v1, schema at /docs{hint}; Ctrl-C stops)\n")


def test_run_server_listens_on_localhost_8000_by_default(monkeypatch, tokenizer):
    """A library caller that names no address gets the CLI's defaults (a stand-in ``bind_port``: 8000 may be
    taken on this machine)."""
    import uvicorn

    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.serve import app as app_module

    asked = []

    def bind(host, port):
        asked.append((host, port))
        return bind_port("127.0.0.1", 0)

    monkeypatch.setattr(app_module, "bind_port", bind)
    monkeypatch.setattr(uvicorn, "Server", _Uvicorn)
    monkeypatch.setattr(sys, "stdout", _Stdout())
    app_module.run_server(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)).eval(), ServeSettings(),
                          enc=tokenizer)
    bound = _Uvicorn.seen["sockets"][0].getsockname()[1]
    _Uvicorn.seen["sockets"][0].close()
    assert asked == [("127.0.0.1", 8000)]
    # the URL names the port the socket holds (the stand-in's free one; a real bind_port: 8000)
    assert _Uvicorn.seen["flushed"].startswith(f"gptforge serve: http://127.0.0.1:{bound}/ ")


@pytest.mark.parametrize("context, chars, body", [(32, 20_000, 1_000_000), (1024, 20_000, 1_000_000),
                                                  (8192, 131_072, 1_048_576), (131_072, 2_097_152, 16_777_216)])
def test_the_prompt_and_body_limits_follow_the_models_context(context, chars, body):
    """A fixed 20,000 characters refused a long chat with a 128k-context model at ~5,000 tokens (the page and
    /v1 hold the whole conversation to it): 0 (the default) is 16 characters a position, at least 20,000, and
    a body of 8 bytes a character, at least 1 MB; a limit given is kept as given."""
    s = ServeSettings().for_model(context)
    assert (s.max_prompt_chars, s.max_body_bytes) == (chars, body)
    given = ServeSettings(max_prompt_chars=500, max_body_bytes=20_000).for_model(context)
    assert (given.max_prompt_chars, given.max_body_bytes) == (500, 20_000)
