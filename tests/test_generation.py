"""Generation: the KV cache against full recomputation, batches against single prompts, and the
sampling knobs and greedy decoding against Hugging Face transformers as the independent reference."""

from __future__ import annotations

import pytest
import torch

from gptforge import generation as g
from gptforge.generation import SamplingParams, filter_logits, generate, stream_text, stream_tokens
from gptforge.interop.hf import load_hf
from gptforge.models.gpt2 import GPT, GPTConfig


def _model(flash: bool = True, vocab: int = 512, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=vocab, flash=flash))
    with torch.no_grad():  # sharper distributions, so argmax never hinges on rounding
        m.transformer.wte.weight.mul_(20)
    return m.eval()


PROMPTS = [[5, 17, 99, 3, 250, 7, 7, 1], [42], [300, 12, 0, 9]]


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize(
    "knobs",
    [dict(temperature=0.0), dict(temperature=1.0, top_k=50, seed=3), dict(temperature=0.8, top_p=0.9, seed=4),
     dict(temperature=1.2, top_k=0, repetition_penalty=1.3, seed=5)],
    ids=["greedy", "topk", "topp", "penalty"],
)
def test_kv_cache_matches_recompute(flash, knobs):
    model = _model(flash)
    p = SamplingParams(max_new_tokens=20, **knobs)
    for prompts in ([PROMPTS[0], PROMPTS[0]], PROMPTS):  # equal lengths (no mask) and left-padded
        cached = torch.stack(list(stream_tokens(model, prompts, p, use_cache=True)), 1)
        full = torch.stack(list(stream_tokens(model, prompts, p, use_cache=False)), 1)
        assert torch.equal(cached, full)


def test_batch_rows_equal_single_prompts():
    """Left padding + per-row positions: each row of a mixed-length batch is what it would be alone."""
    model = _model()
    p = SamplingParams(max_new_tokens=16, temperature=0.0)
    batch = torch.stack(list(stream_tokens(model, PROMPTS, p)), 1)
    for b, prompt in enumerate(PROMPTS):
        alone = torch.stack(list(stream_tokens(model, [prompt], p)), 1)[0]
        assert torch.equal(batch[b], alone), b
    # logits too, not just argmax: the padded row's last-position logits equal the unpadded ones
    ids, pads = g._left_pad(PROMPTS, "cpu")
    pos, mask = g._positions_and_mask(pads, 0, ids.size(1))
    with torch.no_grad():
        logits, _ = model(ids, pos=pos, attn_mask=mask)
        for b, prompt in enumerate(PROMPTS):
            ref, _ = model(torch.tensor([prompt]))
            assert torch.allclose(logits[b, -1], ref[0, -1], atol=1e-4)


def test_seed_reproducible_and_global_rng_untouched():
    model = _model()
    idx = torch.tensor([PROMPTS[0]] * 3)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = generate(model, idx, 24, temperature=1.0, top_k=0, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = generate(model, idx, 24, temperature=1.0, top_k=0, seed=7)
    c = generate(model, idx, 24, temperature=1.0, top_k=0, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (3, len(PROMPTS[0]) + 24)


def test_invalid_params_and_context():
    model = _model()
    bad = [dict(max_new_tokens=0), dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=-2),
           dict(top_p=0.0), dict(top_p=1.5), dict(repetition_penalty=0.0), dict(stop=("",))]
    for kw in bad:
        field = next(iter(kw))
        with pytest.raises(ValueError, match=field):
            list(stream_tokens(model, [[1, 2]], SamplingParams(**kw)))
    with pytest.raises(ValueError, match="context of 64"):
        list(stream_tokens(model, [[1] * 60], SamplingParams(max_new_tokens=5)))
    with pytest.raises(ValueError, match="at least one token"):
        list(stream_tokens(model, [[1], []], SamplingParams()))


transformers = pytest.importorskip("transformers")


def test_filters_match_transformers_warpers():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=gen) * 3
    ids = torch.randint(0, 1000, (4, 30), generator=gen)
    for k in (1, 5, 50):
        ref = TopKLogitsWarper(top_k=k)(ids, logits.clone())
        assert torch.equal(torch.isinf(filter_logits(logits, k, None)), torch.isinf(ref))
    for p in (0.1, 0.5, 0.9, 0.99):
        ref = TopPLogitsWarper(top_p=p)(ids, logits.clone())
        assert torch.equal(torch.isinf(filter_logits(logits, None, p)), torch.isinf(ref)), p
    seen = torch.zeros(4, 1000, dtype=torch.bool).scatter_(1, ids, True)
    ref = RepetitionPenaltyLogitsProcessor(penalty=1.7)(ids, logits.clone())
    assert torch.allclose(g.apply_repetition_penalty(logits, seen, 1.7), ref)


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_greedy_matches_transformers_generate(tmp_path, penalty):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=512,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(20)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(str(tmp_path / "hf"))
    idx = torch.tensor([PROMPTS[0]])
    ref = hf.generate(idx, max_new_tokens=24, do_sample=False, repetition_penalty=penalty, pad_token_id=0,
                      attention_mask=torch.ones_like(idx))
    got = generate(ours, idx, 24, temperature=0.0, repetition_penalty=penalty)
    assert torch.equal(got, ref)


# --- text layer: streaming, stop sequences, UTF-8, end of text --------------------------------------


def _scripted(monkeypatch, rows: list[list[int]]):
    """Make stream_tokens yield fixed tokens, to test the text layer on known input."""

    def fake(model, prompts, params, use_cache=True):
        params.check()
        for step in range(min(params.max_new_tokens, len(rows[0]))):
            yield torch.tensor([r[step] for r in rows])

    monkeypatch.setattr(g, "stream_tokens", fake)


def test_stream_text_stop_sequence_and_utf8(monkeypatch, tokenizer):
    enc = tokenizer
    text = "Hello wor" + "ld.\n\nNext part"
    toks = enc.encode(text)
    e_acute = [enc.encode_single_token(bytes([0xC3])), enc.encode_single_token(bytes([0xA9]))]  # "é" split
    row2 = e_acute + enc.encode(" caf") + e_acute + [enc.eot_token]
    n = max(len(toks), len(row2))
    rows = [toks + [0] * (n - len(toks)), row2 + [0] * (n - len(row2))]
    _scripted(monkeypatch, rows)
    events = list(stream_text(None, enc, ["a", "b"], SamplingParams(max_new_tokens=n, stop=("\n\n",),
                                                                       stop_token=enc.eot_token)))
    out = {0: "", 1: ""}
    for ev in events:
        assert "\ufffd" not in ev.text  # never half a character
        assert "\n" not in ev.text  # never the start of the stop sequence
        out[ev.row] += ev.text
    assert out == {0: "Hello world.", 1: "é café"}
    finals = {ev.row: ev.reason for ev in events if ev.finished}
    assert finals == {0: "stop", 1: "eot"}
    # streamed in pieces, not in one go
    assert sum(1 for ev in events if ev.row == 0 and ev.text) > 2


def test_stream_text_length_and_complete(tokenizer):
    model = _model(vocab=50257)
    p = SamplingParams(max_new_tokens=8, temperature=0.0)
    res = g.complete(model, tokenizer, ["Hello", ""], p)
    assert [r["finish_reason"] for r in res] == ["length", "length"]
    ref = generate(model, torch.tensor([tokenizer.encode("Hello")]), 8, temperature=0.0)
    assert res[0]["text"] == tokenizer.decode(ref[0, 1:].tolist())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_logits_to_keep_is_the_tail_of_the_full_logits(family):
    """Sampling and RL scoring ask the head for the last N positions only; those rows must equal the
    same rows of a full forward, for both families, and a forward with targets refuses the option."""
    from gptforge.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    model = _model() if family == "gpt2" else Llama(LlamaConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32,
                                                                 block_size=64, vocab_size=512)).eval()
    ids = torch.randint(0, 512, (3, 11))
    with torch.no_grad():
        full, _ = model(ids)
        for n in (1, 4, 11):
            tail, _ = model(ids, logits_to_keep=n)
            assert tail.shape == (3, n, 512)
            torch.testing.assert_close(tail, full[:, -n:], rtol=1e-5, atol=1e-5)  # other GEMM shapes round differently
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, targets=ids, logits_to_keep=1)
    with pytest.raises(ValueError, match="must be >= 0"):
        model(ids, logits_to_keep=-1)


def test_sample_from_draws_each_index_with_its_probability():
    """The inverse-CDF sampler against the distribution it samples: frequencies within 5 standard
    errors of the probabilities over 200k draws, zero-probability entries (also first and last) never."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    n = 200_000
    draws = g.sample_from(p.expand(n, -1).contiguous(), gen)
    freq = torch.bincount(draws, minlength=p.numel()).double() / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert freq[p == 0].sum() == 0
    assert ((freq - p.double()).abs() <= 5 * se + 1e-12).all(), freq
    one_hot = torch.zeros(3, 50_000)
    one_hot[0, 0], one_hot[1, 49_999], one_hot[2, 777] = 1.0, 1.0, 1.0
    assert g.sample_from(one_hot, gen).tolist() == [0, 49_999, 777]


def test_stream_text_prints_an_id_past_the_tokenizer(monkeypatch, tokenizer):
    """A model with more rows than its tokenizer (50,304 over GPT-2's 50,257, a padded import) may emit an
    unused id: it prints as <|id|>, as serve and ChatTokenizer print one; `gptforge sample` raised KeyError."""
    head, tail = tokenizer.encode("Hello"), tokenizer.encode(" world")
    _scripted(monkeypatch, [head + [50300] + tail + [50257]])
    events = list(stream_text(None, tokenizer, ["a"], SamplingParams(max_new_tokens=len(head) + len(tail) + 2)))
    expect = tokenizer.decode(head) + "<|50300|>" + tokenizer.decode(tail) + "<|50257|>"
    assert "".join(ev.text for ev in events) == expect == "Hello<|50300|> world<|50257|>"


def test_sample_cli_on_a_model_wider_than_its_tokenizer(tmp_path, capsys):
    from gptforge.cli import main
    from gptforge.config import Config
    from gptforge.run.checkpoint import save_checkpoint

    torch.manual_seed(0)
    cfg = Config(model=GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=50304))
    ck = save_checkpoint(tmp_path / "run", 1, GPT(cfg.model), None, {"config": cfg.to_dict()})
    assert main(["sample", "--ckpt", str(ck), "--max-new-tokens", "56", "--num-samples", "20", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    import re

    padded = [int(m) for m in re.findall(r"<\|(\d+)\|>", out)]
    assert padded and all(50257 <= i < 50304 for i in padded)  # some were drawn (uniform-ish logits), each printed
