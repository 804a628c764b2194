"""Autoregressive sampling with a KV cache.

    >>> tokens = generate(model, prompt_ids, max_new_tokens=32, temperature=1.0, top_k=50, seed=42)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptforge.models.gpt2 import GPT


def _filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    if top_k is not None and top_k > 0 and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cum - F.softmax(sorted_logits, dim=-1) >= top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """idx (B, T) -> (B, T + max_new_tokens). temperature 0 means greedy. A private generator keeps
    sampling from touching the global RNG (so sampling during training never perturbs it)."""
    model.eval()
    device = idx.device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    block = model.config.block_size
    if idx.size(1) + max_new_tokens > block:
        if use_cache:
            raise ValueError(f"prompt ({idx.size(1)}) + max_new_tokens ({max_new_tokens}) exceeds the context {block}")
    cache = model.new_kv_cache(idx.size(0)) if use_cache else None
    out = idx
    next_input = idx
    for _ in range(max_new_tokens):
        if cache is not None:
            logits, _ = model(next_input, kv_cache=cache)
        else:
            logits, _ = model(out[:, -block:])
        logits = logits[:, -1, :].float()
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = F.softmax(_filter_logits(logits / temperature, top_k, top_p), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
        out = torch.cat([out, nxt], dim=1)
        next_input = nxt
    return out
