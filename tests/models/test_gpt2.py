"""The model against an independent reference: Hugging Face transformers' GPT2LMHeadModel."""

import math

import pytest
import torch

from gptforge.interop.hf import load_hf
from gptforge.models.gpt2 import GPT, GPTConfig

transformers = pytest.importorskip("transformers")


def _hf_tiny(tmp_path, vocab=50257):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf_cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=vocab,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(hf_cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    return hf


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("pad_vocab", [True, False])
def test_logits_match_transformers(tmp_path, flash, pad_vocab):
    hf = _hf_tiny(tmp_path)
    ours = load_hf(str(tmp_path / "hf"), flash=flash, pad_vocab=pad_vocab)
    assert ours.config.padded_vocab_size == (50304 if pad_vocab else 50257)
    idx = torch.randint(0, 50257, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        got, _ = ours(idx)
    assert got.shape == ref.shape == (3, 20, 50257)  # padded rows sliced away
    assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()


def test_loss_matches_transformers(tmp_path):
    hf = _hf_tiny(tmp_path)
    ours = load_hf(str(tmp_path / "hf"))
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(idx, labels=idx).loss  # HF shifts labels internally
        _, loss = ours(idx[:, :-1], idx[:, 1:])
    assert abs(loss.item() - ref.item()) < 1e-5


def test_initial_loss_is_ln_vocab():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64))
    idx = torch.randint(0, 50257, (4, 64))
    targets = torch.randint(0, 50257, (4, 64))  # independent of the input (tied weights favour idx itself)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(50257)) < 0.1


def test_padded_vocab_gets_no_probability():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    assert model.lm_head.weight.shape[0] == 50304
    logits, _ = model(torch.zeros(1, 4, dtype=torch.long))
    assert logits.shape[-1] == 50257
    assert torch.allclose(torch.softmax(logits, -1).sum(-1), torch.ones(1, 4))


def test_gpt2_init_and_tying():
    cfg = GPTConfig(n_layer=4, n_head=2, n_embd=64, block_size=16)
    torch.manual_seed(0)
    model = GPT(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    proj = model.transformer.h[0].mlp.c_proj.weight
    fc = model.transformer.h[0].mlp.c_fc.weight
    assert abs(fc.std().item() - 0.02) < 0.002
    assert abs(proj.std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert torch.count_nonzero(model.transformer.h[0].attn.c_attn.bias) == 0


def test_flash_and_math_attention_agree():
    torch.manual_seed(0)
    a = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, flash=True)).eval()
    b = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, flash=False)).eval()
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 50257, (2, 32))
    assert torch.allclose(a(idx)[0], b(idx)[0], atol=1e-5)


@pytest.mark.parametrize("mode", ["mlp", "block"])
def test_recompute_gives_same_gradients(mode):
    torch.manual_seed(0)
    a = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))
    b = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, recompute=mode))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 50257, (2, 16))
    a(idx, idx)[1].backward()
    b(idx, idx)[1].backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), n


def test_kv_cache_matches_full_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)).eval()
    idx = torch.randint(0, 50257, (2, 12))
    full, _ = model(idx)
    cache = model.new_kv_cache(2)
    first, _ = model(idx[:, :8], kv_cache=cache)
    rest = [model(idx[:, i : i + 1], kv_cache=cache)[0] for i in range(8, 12)]
    inc = torch.cat([first, *rest], dim=1)
    assert torch.allclose(full, inc, atol=1e-5)


def test_named_sizes_have_gpt2s_parameter_counts():
    for name, n in [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168)]:
        cfg = GPTConfig.from_size(name, pad_vocab=False)
        with torch.device("meta"):
            model = GPT(cfg)
        assert model.num_parameters() == n  # OpenAI's published counts (tied embeddings once)
