"""Issue 21 class 6 (server): after answering 413 to a chunked body over the limit, a real server
(uvicorn) closes the connection instead of reading the rest of the body, however long it is."""

from __future__ import annotations

import socket
import time

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.browser import serve_in_thread  # noqa: E402


def test_a_chunked_body_over_the_limit_gets_413_and_the_connection_closed(tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    app = create_app(model, tokenizer, ServeSettings(max_body_bytes=10_000))
    chunk = b"z" * 65_536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    offered = 256 * 1024 * 1024  # 256 MB a server that drains the body would read to the end
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        sent, closed_at, start = 0, None, time.time()
        try:
            while sent < offered and time.time() - start < 20:
                s.sendall(frame)
                sent += len(chunk)
        except OSError:  # BrokenPipe / ConnectionReset: the server hung up on us
            closed_at = sent
        s.settimeout(5)
        reply = b""
        try:
            while True:
                data = s.recv(65_536)
                if not data:
                    break
                reply += data
        except OSError:
            pass
        s.close()
    assert b" 413 " in reply.split(b"\r\n")[0], reply[:200]
    assert closed_at is not None and closed_at < 64 * 1024 * 1024, (closed_at, sent)

