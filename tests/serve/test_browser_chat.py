"""Chat mode of the served page in a real browser (headless Debian Chromium via Playwright, as
tests/serve/test_browser.py): a system prompt, two turns streamed into bubbles, the history sent back
with the second turn, and the reply equal to the same conversation generated directly."""

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

from gptforge.data.chat import ChatTemplate, ChatTokenizer  # noqa: E402
from gptforge.generation import SamplingParams, complete  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402

T = ChatTemplate.gpt2()


@pytest.fixture
def chat_server(tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=128, vocab_size=T.vocab_size)).eval()
    model.register_forward_hook(lambda *_: time.sleep(0.06))  # observable streaming (see test_browser.py)
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=64), None, chat_template=T.to_dict())
    with serve_in_thread(app) as url:
        yield url, model


def test_chat_mode_streams_turns_with_history(chat_server, tokenizer, tmp_path):
    url, model = chat_server
    sent: list[dict] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, env=ENV)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/api/chat") else None)
            page.goto(url + "/")
            page.wait_for_selector("#chat-box:not([hidden])")  # a chat model opens in chat mode
            assert page.is_hidden("#prompt") and page.is_hidden("#stop")  # no stop sequences: <|end|> ends a reply
            page.evaluate("""() => {
                window.__updates = [];
                new MutationObserver(() => {
                    const b = document.querySelectorAll('#chat-log .assistant');
                    if (b.length) window.__updates.push(b[b.length - 1].textContent.length);
                }).observe(document.getElementById('chat-log'), {childList: true, subtree: true, characterData: true});
            }""")
            page.fill("#system", "Be brief.")
            page.fill("#max_new_tokens", "30")
            page.fill("#temperature", "0")
            for n, text in enumerate(["What is 2 + 3?", "And 1 + 1?"], 1):
                page.fill("#chat-input", text)
                page.press("#chat-input", "Enter")
                page.wait_for_function(f"document.querySelectorAll('#chat-log .assistant').length === {n} && "
                                       "document.getElementById('status').textContent.startsWith('done')",
                                       timeout=60_000)
            replies = page.eval_on_selector_all("#chat-log .assistant", "els => els.map(e => e.textContent)")
            users = page.eval_on_selector_all("#chat-log .user", "els => els.map(e => e.textContent)")
            updates = page.evaluate("window.__updates")
            page.screenshot(path=str(os.environ.get("GPTFORGE_CHAT_SCREENSHOT", tmp_path / "chat.png")), full_page=True)
        finally:
            browser.close()
    assert users == ["What is 2 + 3?", "And 1 + 1?"]
    assert len(set(u for u in updates if u > 0)) > 3, updates  # the reply grew in several steps
    # the second request carried the whole conversation
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert sent[1]["messages"][2]["content"] == replies[0].strip()
    # and the replies are what the model generates for those conversations
    params = SamplingParams(max_new_tokens=30, temperature=0, top_k=50, stop_token=T.end)
    enc = ChatTokenizer(tokenizer, T)
    for req, shown in zip(sent, replies, strict=True):
        ids = T.render_for_generation(req["messages"], tokenizer)
        assert complete(model, enc, [ids], params)[0]["text"] == shown
