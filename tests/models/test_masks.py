"""Document-causal attention: the mask against a loop-built one, the masked model against running
each document on its own, and FlexAttention against the SDPA path (forward on CPU; backward on GPU)."""

from __future__ import annotations

import pytest
import torch

from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.models import masks
from gptforge.models.gpt2 import GPT, GPTConfig

BOS = 7


def _batch(seed: int = 0, B: int = 3, T: int = 24, V: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(8, V, (B, T), generator=g)
    idx[0, [0, 5, 6, 17]] = BOS  # documents of 5, 1, 11 and 7 tokens
    idx[1, [9]] = BOS  # a tail of an earlier document, then one document
    return idx  # row 2: no BOS, one document (plain causal)


def test_document_mask_matches_a_loop():
    idx = _batch()
    got = masks.document_causal_mask(idx, BOS)
    B, T = idx.shape
    want = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        starts = [t for t in range(T) if idx[b, t] == BOS]
        for t in range(T):
            begin = max([s for s in starts if s <= t], default=0)
            want[b, 0, t, begin : t + 1] = True
    assert torch.equal(got, want)


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, bos_token=BOS, **kw)).eval()


@pytest.mark.parametrize("flash", [True, False])
def test_document_attention_equals_each_document_alone(flash):
    doc_model = _model(attention="document", flash=flash)
    plain = _model(flash=flash).double()
    plain.load_state_dict(doc_model.state_dict())
    idx = _batch()
    with torch.no_grad():
        logits, _ = doc_model(idx)
        for b in range(idx.size(0)):  # reference: each document through a causal float64 model on its own
            cuts = [0, *[t for t in range(1, idx.size(1)) if idx[b, t] == BOS], idx.size(1)]
            for a, e in zip(cuts, cuts[1:], strict=False):
                ref, _ = plain(idx[b : b + 1, a:e], pos=torch.arange(a, e))  # positions stay the row's
                torch.testing.assert_close(logits[b, a:e].double(), ref[0], rtol=1e-4, atol=1e-4)
    causal, _ = _model(flash=flash)(idx)
    assert not torch.allclose(causal[0], logits[0], atol=1e-3)  # the mask matters in row 0
    torch.testing.assert_close(causal[2], logits[2])  # and is plain causal attention without a BOS


def test_flex_attention_gives_the_same_loss_on_cpu():
    idx = _batch(1)
    targets = torch.roll(idx, -1, dims=1)
    sdpa = _model(attention="document")
    flex = _model(attention="document", doc_mask="flex")
    with torch.no_grad():  # torch 2.13 runs FlexAttention's forward on CPU, not its backward
        _, loss_sdpa = sdpa(idx, targets)
        _, loss_flex = flex(idx, targets)
    torch.testing.assert_close(loss_flex, loss_sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_flex_attention_gradients_match_sdpa_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: FlexAttention has no CPU backward")
    idx = _batch(2, B=4, T=32).cuda()
    grads = []
    for backend in ("sdpa", "flex"):
        model = _model(attention="document", doc_mask=backend).cuda().train()
        _, loss = model(idx, torch.roll(idx, -1, dims=1))
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-4)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_flex_refused_without_flexattention(monkeypatch):
    monkeypatch.setattr(masks, "flex_available", lambda: False)
    with pytest.raises(ConfigError, match="model.doc_mask=flex"):
        apply_overrides(Config(), ["--model.attention", "document", "--model.doc_mask", "flex"])
    with pytest.raises(ConfigError, match="model.attention"):
        apply_overrides(Config(), ["--model.attention", "documents"])


def _llama(**kw):
    from gptforge.models.registry import build_model, size_config

    torch.manual_seed(0)
    cfg = size_config("llama-tiny", block_size=32, vocab_size=64, bos_token=BOS, **kw)
    return build_model(cfg).eval()


def test_llama_document_attention_equals_each_document_alone_and_flex_agrees():
    doc_model = _llama(attention="document")
    assert doc_model.config.kv_heads < doc_model.config.n_head  # GQA is exercised
    plain = _llama().double()
    plain.load_state_dict(doc_model.state_dict())
    idx = _batch()
    with torch.no_grad():
        logits, _ = doc_model(idx)
        for b in range(idx.size(0)):
            cuts = [0, *[t for t in range(1, idx.size(1)) if idx[b, t] == BOS], idx.size(1)]
            for a, e in zip(cuts, cuts[1:], strict=False):
                ref, _ = plain(idx[b : b + 1, a:e], pos=torch.arange(a, e))  # RoPE at the row's positions
                torch.testing.assert_close(logits[b, a:e].double(), ref[0], rtol=1e-4, atol=1e-4)
        targets = torch.roll(idx, -1, dims=1)
        flex = _llama(attention="document", doc_mask="flex")
        torch.testing.assert_close(flex(idx, targets)[1], doc_model(idx, targets)[1], rtol=1e-5, atol=1e-5)
