"""What the real-browser tests share: Debian's Chromium with the flags this closed network needs,
and a uvicorn server on a free loopback port running in a thread for the test's duration."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Chromium brings its own allocator: it does not inherit the test run's preloaded tcmalloc (scripts/test.sh)
ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@contextlib.contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1 at a free port; yield its base URL; stop it afterwards."""
    import uvicorn

    # the listening socket is made here and handed to uvicorn: a port found free and closed again could be
    # taken by another process (an xdist worker, a client's ephemeral port) before uvicorn binds it
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started:
        assert time.time() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()
