"""What both families' forwards set up before the first block (models/masks.py forward_start): a sequence
past block_size refused, counting the tokens a KV cache already holds, and default positions that continue
after them (a cached forward equals the uncached one)."""

from __future__ import annotations

import pytest
import torch

from gptforge.models.registry import FAMILIES, build_model, model_config
from tests.tolerances import sum_tol

SHAPE = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 32}


@pytest.fixture(params=sorted(FAMILIES))
def model(request):
    torch.manual_seed(0)
    return build_model(model_config({"arch": request.param, **SHAPE})).eval()


def test_a_sequence_past_block_size_is_refused(model):
    model(torch.zeros(1, 8, dtype=torch.long))  # exactly block_size: fine
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_the_cached_tokens_count_toward_block_size(model):
    cache = model.new_kv_cache(1)
    model(torch.zeros(1, 6, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)


def test_positions_continue_after_the_cache(model):
    idx = torch.randint(0, 32, (1, 6))
    with torch.no_grad():
        whole, _ = model(idx)
        cache = model.new_kv_cache(1)
        model(idx[:, :4], kv_cache=cache)
        last, _ = model(idx[:, 4:], kv_cache=cache)
    # the same math with the keys' sums grouped otherwise (cached keys against one matmul): at most the 16-wide
    # dot products over up to 6 keys reordered, at the logits' size (tests/tolerances.py)
    atol = sum_tol(whole.abs().max().item(), SHAPE["n_embd"] * idx.size(1))
    torch.testing.assert_close(last, whole[:, 4:], rtol=0, atol=atol)
