"""Tokens/s streamed through OpenAI's /v1/chat/completions vs the native /api/chat (the same greedy
reply) and /api/stream (plain-text continuation of the same length), same model and server, rounds
interleaved (issue 24's goal: within 10%).

    OMP_NUM_THREADS=2 python scripts/bench_openai_stream.py --size d4 --tokens 200 --rounds 5

Starts ``gptforge serve`` on a random-weight chat checkpoint it saves in a temporary folder, then
per round times each endpoint streaming the same reply (the client reads every event as it comes).
Prints one JSON line per endpoint: median tokens/s and the ratio to /api/chat.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.models.registry import build_model, size_config
from gptforge.run.checkpoint import save_checkpoint

MSGS = [{"role": "user", "content": "Tell me a long story about a ship and the sea."}]


def _stream(c: httpx.Client, path: str, body: dict) -> tuple[float, str]:
    """Seconds from request to the end of the stream, and the streamed text."""
    text = []
    t0 = time.perf_counter()
    with c.stream("POST", path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line in ("data: [DONE]", "data: {}"):
                continue
            ev = json.loads(line[6:])
            if "choices" in ev:
                text += [ch.get("delta", {}).get("content") or ch.get("text") or "" for ch in ev["choices"]]
            else:
                text.append(ev.get("text", ""))
    return time.perf_counter() - t0, "".join(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="d4")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    t = ChatTemplate.gpt2()
    torch.manual_seed(0)
    cfg = size_config(args.size, vocab_size=t.vocab_size)
    model = build_model(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        ck = save_checkpoint(Path(tmp) / "run", 0, model, None,
                             {"config": Config(model=cfg).to_dict(), "chat_template": t.to_dict()})
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = subprocess.Popen([sys.executable, "-m", "gptforge", "serve", "--ckpt", str(ck), "--port", str(port),
                                "--device", "cpu", "--max-new-tokens-cap", str(args.tokens)], env=os.environ)
        try:
            url = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=url, timeout=600) as c:
                for _ in range(600):
                    try:
                        if c.get("/api/info").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.2)
                n = args.tokens
                bodies = {
                    "/v1/chat/completions": {"model": "run", "messages": MSGS, "max_tokens": n, "temperature": 0,
                                             "stream": True, "stream_options": {"include_usage": True}},
                    "/api/chat": {"messages": MSGS, "max_new_tokens": n, "temperature": 0},
                    # text continuation: a prompt of plain text, exactly n tokens (no stop)
                    "/api/stream": {"prompt": MSGS[0]["content"], "max_new_tokens": n, "temperature": 0,
                                    "stop_at_eot": False},
                }
                r = c.post("/v1/chat/completions", json={**bodies["/v1/chat/completions"], "stream": False}).json()
                n_tok = r["usage"]["completion_tokens"]
                ref = r["choices"][0]["message"]["content"]
                times: dict[str, list[float]] = {k: [] for k in bodies}
                for path, body in bodies.items():  # warm-up
                    _stream(c, path, body)
                for _ in range(args.rounds):
                    for path, body in bodies.items():
                        sec, text = _stream(c, path, body)
                        assert text == ref or path == "/api/stream", f"{path} streamed another reply"
                        times[path].append(sec)
        finally:
            srv.terminate()
            srv.wait(timeout=30)
    counts = {"/v1/chat/completions": n_tok, "/api/chat": n_tok, "/api/stream": args.tokens}
    base = n_tok / statistics.median(times["/api/chat"])
    for path, secs in times.items():
        tps = counts[path] / statistics.median(secs)
        print(json.dumps({"endpoint": path, "size": args.size, "tokens": counts[path], "rounds": args.rounds,
                          "median_s": round(statistics.median(secs), 3), "tokens_per_s": round(tps, 1),
                          "vs_api_chat": round(tps / base, 3), "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
