"""A real browser on the served page: headless Debian Chromium driven by Playwright loads the page,
submits a prompt and watches the text arrive in pieces; the loss curve is drawn from metrics.jsonl.

Needs /usr/bin/chromium (CI installs it with scripts/system_deps.sh) and the `playwright` package;
Playwright's own browser download is never used.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tests.serve.browser import ARGS, CHROMIUM, ENV, serve_in_thread

if not os.path.exists(CHROMIUM):
    pytest.skip("no /usr/bin/chromium: run scripts/system_deps.sh (CI does)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")

from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402


@pytest.fixture
def server(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=128)).eval()
    # a tiny model decodes 40 tokens faster than the browser reads the socket, so all of them could
    # arrive in one read and the text would grow once; 60 ms per forward makes streaming observable: the 40 take
    # 2.4 s, so 4 distinct lengths need the browser to read every ~0.5 s, which a loaded machine still lets it
    model.register_forward_hook(lambda *_: time.sleep(0.06))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 10 * 0.97**s}) + "\n" for s in range(60))
                       + json.dumps({"kind": "val", "step": 59, "val_loss": 2.0}) + "\n")
    served = {"source": "ckpt", "path": "/runs/" + "a-very-long-run-directory-name-" * 8 + "x", "step": 12345}
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=64), metrics, served=served)
    with serve_in_thread(app) as url:
        yield url, metrics


def test_page_streams_text_and_draws_curve(server, tmp_path):
    server, metrics = server
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, env=ENV)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(server + "/")
            page.wait_for_selector("#model-info dt")  # /api/info answered
            page.wait_for_selector("#curve path")  # /api/metrics answered and drawn
            assert "train loss" in page.inner_text("#curve-note")
            # numbers read as numbers, and a long run path wraps instead of widening the page
            info = page.inner_text("#model-info")
            assert "12,345" in info and "step 12,345" in page.inner_text("#model-line")
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            # count how often the generated text changes while it streams in
            page.evaluate("""() => {
                window.__updates = [];
                const target = document.getElementById('output');
                new MutationObserver(() => {
                    const g = target.querySelector('.gen');
                    if (g) window.__updates.push(g.textContent.length);
                }).observe(target, {childList: true, subtree: true, characterData: true});
            }""")
            page.fill("#prompt", "ROMEO:")
            page.fill("#max_new_tokens", "40")
            page.fill("#temperature", "0")
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=60_000)
            text = page.inner_text("#output .gen")
            updates = page.evaluate("window.__updates")
            assert len(text) > 20
            assert len(set(u for u in updates if u > 0)) > 3, updates  # grew in several steps: streamed
            assert page.inner_text("#output .prompt") == "ROMEO:"
            assert "40 tokens in" in page.inner_text("#status") and "pieces" not in page.inner_text("#status")
            page.screenshot(path=str(os.environ.get("GPTFORGE_SCREENSHOT", tmp_path / "page.png")), full_page=True)
            # a bad value shows the server's message instead of breaking the page
            page.fill("#max_new_tokens", "500")
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').className === 'error'", timeout=30_000)
            assert "cap of 64" in page.inner_text("#status")
            # an RL run's metrics: the curve is the reward, with the held-out accuracy
            metrics.write_text("".join(json.dumps(r) + "\n" for r in [
                {"kind": "start", "step": 0, "recipe": "grpo"},
                {"kind": "eval", "step": 0, "task": "arithmetic", "acc": 0.1, "n": 50},
                *({"kind": "rl", "step": s, "loss": 0.1, "reward": 0.1 + 0.01 * s} for s in range(1, 31)),
                {"kind": "eval", "step": 30, "task": "arithmetic", "acc": 0.4, "n": 50}]))
            page.reload()
            page.wait_for_function("document.getElementById('curve-title').textContent === 'Reward curve'")
            page.wait_for_selector("#curve circle")
            note = page.inner_text("#curve-note")
            assert "last reward 0.400 at step 30" in note and "held-out accuracy 0.400 at step 30" in note
            assert page.locator("#curve circle").count() == 2  # the two held-out evaluations
        finally:
            browser.close()


def test_page_sends_the_api_key_from_its_fragment(tokenizer):
    """With --api-key the page works when opened as /#key=KEY (its requests carry the Bearer header),
    and its API calls are refused without it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    with serve_in_thread(create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=8), api_key="k3y")) as url:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, env=ENV)
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url + "/")
                assert page.evaluate("fetch('/api/info').then((r) => r.status)") == 401
                # issue 34: opened without the key, the page says how to pass it (no raw JS error)
                page.wait_for_selector("#key-box", state="visible")
                assert "--api-key" in page.inner_text("#model-line") and "#key=" in page.inner_text("#model-line")
                assert "concat" not in page.inner_text("#curve-note") and not errors
                page.fill("#key-input", "k3y")
                page.click("#key-use")  # the box puts the key in the fragment and reloads
                page.wait_for_selector("#model-info dt")  # /api/info answered with the key
                assert page.is_hidden("#key-box")
                page.fill("#prompt", "ROMEO:")
                page.fill("#max_new_tokens", "8")
                page.fill("#temperature", "0")
                page.click("#generate")
                page.wait_for_function("document.getElementById('status').textContent.startsWith('done')",
                                       timeout=30_000)
                assert len(page.inner_text("#output .gen")) > 0
            finally:
                browser.close()
