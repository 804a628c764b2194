"""The Llama family on a GPU (``pytest -m gpu``; skipped without CUDA, as the GPU lane is).

bf16 + compiled training with every modded-nanogpt switch on, logits against transformers'
LlamaForCausalLM on the same device, each SDPA backend with grouped-query attention against the
math kernel (or refused by name), and KV-cache generation against recomputation.
"""

from __future__ import annotations

import pytest
import torch

from gptforge.models.llama import Llama, LlamaConfig
from tests.conftest import make_shards, tiny_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
SHAPE = dict(n_layer=2, n_head=8, n_kv_head=2, n_embd=256, block_size=128)  # GQA 8:2, head size 32


@pytest.mark.parametrize("switches", [{}, {"qk_norm": True, "mlp": "relu2", "logit_softcap": 15.0,
                                           "zero_init_proj": True}, {"fused_ce": True}],
                         ids=["plain", "modded", "fused_ce"])
def test_train_bf16_compiled_loss_falls(tmp_path, switches):
    from gptforge.training.loop import train

    cfg = tiny_config(make_shards(tmp_path / "data"), tmp_path / "run", device="cuda", dtype="bfloat16",
                      compile=True, max_steps=8)
    cfg.model = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32, vocab_size=512, **switches)
    res = train(cfg)
    losses = [res.train_losses[s] for s in range(1, 9)]
    assert all(v == v for v in losses) and losses[-1] < losses[0] - 0.3, losses


def test_logits_match_transformers_on_cuda():
    from gptforge.interop.hf_llama import to_transformers

    torch.manual_seed(0)
    model = Llama(LlamaConfig(**SHAPE, vocab_size=1000)).eval()
    hf = to_transformers(model).to(CUDA)
    model = model.to(CUDA)
    idx = torch.randint(0, 1000, (2, 100), device=CUDA)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # an earlier training test may have switched TF32 on
    try:
        with torch.no_grad():
            assert torch.allclose(model(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
    finally:
        torch.set_float32_matmul_precision(before)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = model(idx)[0].float(), hf(idx).logits.float()
    assert (a - b).abs().max() < 0.05 * b.abs().max()


@pytest.mark.parametrize("backend", ["cudnn", "flash", "efficient"])
def test_attention_backends_with_gqa_match_math_or_are_refused(backend):
    from gptforge.kernels.attention import sdpa_problem

    why = sdpa_problem(backend, CUDA, torch.bfloat16, SHAPE["n_embd"] // SHAPE["n_head"],
                      gqa=SHAPE.get("n_kv_head", SHAPE["n_head"]) != SHAPE["n_head"])
    if why:
        assert f"model.attn_backend={backend}" in why
        pytest.skip(why)
    torch.manual_seed(0)
    ref = Llama(LlamaConfig(**SHAPE, attn_backend="math")).to(CUDA).eval()
    got = Llama(LlamaConfig(**SHAPE, attn_backend=backend)).to(CUDA).eval()
    got.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 50257, (2, 128), device=CUDA)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(idx)[0].float(), got(idx)[0].float()
    assert (a - b).abs().max() < 0.05 * a.abs().max()


def test_generation_on_cuda_cache_matches_no_cache():
    from gptforge.generation import SamplingParams, stream_tokens

    torch.manual_seed(0)
    model = Llama(LlamaConfig(**SHAPE)).to(CUDA).eval()
    prompts = [[5, 17, 99, 3, 250, 7], [42], [300, 12, 0]]  # left-padded: per-row positions and a mask
    p = SamplingParams(max_new_tokens=20, temperature=0.0)
    a = torch.stack(list(stream_tokens(model, prompts, p, use_cache=True)), 1)
    b = torch.stack(list(stream_tokens(model, prompts, p, use_cache=False)), 1)
    assert torch.equal(a, b)
