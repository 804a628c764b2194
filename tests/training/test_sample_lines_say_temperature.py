"""The samples a run prints while it trains say how they were drawn (issue 55: a chat model's in-loop
sample "The larger number is 13" at an unstated temperature looked broken while the greedy eval scored 95%).
The line must state the temperature and top-k the sampler was actually called with (caught here at the
sampler), and the metrics record carries them too."""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch

from gptforge import generation
from gptforge.training import evaluate as ev


class _Metrics:
    def __init__(self):
        self.rows = []

    def write(self, kind, step, **kw):
        self.rows.append({"kind": kind, "step": step, **kw})


def _cfg(vocab: int):
    return SimpleNamespace(train=SimpleNamespace(sample_tokens=3, seed=0), model=SimpleNamespace(block_size=32,
                                                                                                   vocab_size=vocab))


def _said(lines: list[str]) -> list[tuple[float, int]]:
    heads = [ln.splitlines()[0] for ln in lines]
    got = [re.fullmatch(r"--- sample \d \(step 7; sampled at temperature ([\d.]+), top-k (\d+)\)", h) for h in heads]
    assert all(got), heads
    return [(float(m.group(1)), int(m.group(2))) for m in got]


def test_a_base_runs_samples_state_the_sampler_settings(monkeypatch, tokenizer):
    from gptforge.models.gpt2 import GPT, GPTConfig

    seen, real = [], generation.generate

    def spy(model, idx, **kw):
        seen.append((kw["temperature"], kw["top_k"]))
        return real(model, idx, **kw)

    monkeypatch.setattr(generation, "generate", spy)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)).eval()
    lines, metrics = [], _Metrics()
    ev.print_samples(model, _cfg(50257), SimpleNamespace(device=torch.device("cpu")), 7, metrics, lines.append,
                     enc=tokenizer)
    assert len(seen) == 1 and _said(lines) == [seen[0]] * len(lines) and len(lines) == 2
    assert all((r["temperature"], r["top_k"]) == seen[0] for r in metrics.rows)


def test_a_chat_runs_samples_state_the_sampler_settings(monkeypatch, tokenizer):
    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT, GPTConfig

    seen, real = [], generation.complete

    def spy(model, enc, prompts, params):
        seen.append((params.temperature, params.top_k))
        return real(model, enc, prompts, params)

    monkeypatch.setattr(generation, "complete", spy)
    t = ChatTemplate.gpt2()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=t.vocab_size)).eval()
    prompt = t.render_for_generation([{"role": "user", "content": "Which is larger, 13 or 31?"}], tokenizer)
    lines, metrics = [], _Metrics()
    ev.print_chat_samples(model, _cfg(t.vocab_size), SimpleNamespace(device=torch.device("cpu")), 7, metrics,
                          lines.append, t, [prompt, prompt], enc=tokenizer)
    assert len(seen) == 2 and _said(lines) == seen
    assert [(r["temperature"], r["top_k"]) for r in metrics.rows] == seen
