"""Attention masks shared by the model families: document-causal attention over packed batches, and a
mask narrowed to a sliding window (:func:`window_mask`), and what a forward sets up before its first block
(:func:`forward_start`: positions after the cache, the block-size check, the one mask every layer takes).

    >>> mask = document_causal_mask(idx, bos=50256)  # (B, 1, T, T) bool for SDPA (CPU path)
    >>> block = flex_block_mask(idx, bos=50256)      # FlexAttention BlockMask (GPU path)

A row of a batch packs several documents, each starting with the BOS token (GPT-2's
<|endoftext|>, which the prepare step writes before every document). Document-causal attention lets
a token see only earlier tokens of its own document, so documents do not leak into each other
(modded-nanogpt). Tokens before the first BOS of a row form a document of their own. Both masks
compute the same attention; tests check the losses agree. FlexAttention skips the fully masked
blocks (fast on GPU, forward-only on CPU in torch 2.13); the boolean mask is the portable path.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F


class FlexUnavailable(ValueError):
    """model.doc_mask=flex on a torch without torch.nn.attention.flex_attention."""


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def document_ids(idx: torch.Tensor, bos: int) -> torch.Tensor:
    """(B, T) token ids -> (B, T) document number of each position (a BOS starts a new one)."""
    return (idx == bos).cumsum(dim=1)


def document_causal_mask(idx: torch.Tensor, bos: int) -> torch.Tensor:
    """(B, 1, T, T) bool, True = query t may attend to key s: s <= t and both in one document."""
    T = idx.size(1)
    doc = document_ids(idx, bos)  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()  # (T, T)
    same = doc[:, :, None] == doc[:, None, :]  # (B, T, T)
    return (same & causal)[:, None]  # (B, 1, T, T)


def flex_block_mask(idx: torch.Tensor, bos: int):
    """The same mask as a FlexAttention ``BlockMask`` (heads broadcast)."""
    if not flex_available():
        raise FlexUnavailable(f"FlexAttention needs torch >= 2.5 (this is {torch.__version__}); "
                              "use --model.doc_mask sdpa")
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = idx.shape
    doc = document_ids(idx, bos)

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (doc[b, q] == doc[b, kv])

    return create_block_mask(mask_mod, B, None, T, T, device=idx.device)


_compiled_flex = None


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask,
                   enable_gqa: bool = False) -> torch.Tensor:
    """FlexAttention, compiled once on CUDA (eager flex materialises the scores; fine on CPU for tests).
    ``enable_gqa``: k and v carry fewer heads than q (grouped-query attention)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention as flex

    if q.device.type != "cuda":  # the unfused path is what we want off-GPU: no compile warning per call
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def check_config(attention: str, doc_mask: str) -> None:
    """The model configs' check of ``model.attention`` / ``model.doc_mask`` (ValueError names the key)."""
    if attention not in ("causal", "document") or doc_mask not in ("sdpa", "flex"):
        raise ValueError(f"model.attention={attention!r} / model.doc_mask={doc_mask!r}; "
                         "allowed: causal|document / sdpa|flex")
    if doc_mask == "flex" and not flex_available():
        raise ValueError(f"model.doc_mask=flex needs FlexAttention (torch >= 2.5, this is {torch.__version__}); "
                         "use --model.doc_mask sdpa")


def for_batch(idx: torch.Tensor, attention: str, doc_mask: str, bos: int):
    """The mask a training forward over ``idx`` needs: None (plain causal), a bool mask or a BlockMask."""
    if attention != "document":
        return None
    return flex_block_mask(idx, bos) if doc_mask == "flex" else document_causal_mask(idx, bos)


def is_block_mask(mask) -> bool:
    return mask is not None and not isinstance(mask, torch.Tensor)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, dropout_p: float = 0.0) -> torch.Tensor:
    """(B, nh, T, hs) attention under a bool mask (SDPA) or a BlockMask (FlexAttention)."""
    if is_block_mask(mask):
        return flex_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def for_forward(idx: torch.Tensor, past: int, attn_mask: torch.Tensor | None, cfg,
                cached: bool) -> torch.Tensor | None:
    """The one mask a forward builds for all its layers (both families call this): the caller's
    (left-padded generation); else, after ``past`` cached tokens, query i at position past+i sees
    keys 0..past+i; else, without a KV cache, whatever ``model.attention`` asks (None = plain
    causal, or a document-causal mask). None means causal within the chunk, or every cached key
    for a single new token."""
    T = idx.size(1)
    if attn_mask is not None:
        return attn_mask
    if past > 0 and T > 1:
        return torch.ones(T, past + T, dtype=torch.bool, device=idx.device).tril(diagonal=past)
    if not cached:
        return for_batch(idx, cfg.attention, cfg.doc_mask, cfg.bos_token)
    return None


def forward_start(idx: torch.Tensor, kv_cache, pos: torch.Tensor | None, attn_mask: torch.Tensor | None,
                  cfg) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    """What both families' forwards set up before the first block: the tokens already in ``kv_cache``
    (``past``), each new token's position (``pos`` as given, else past..past+T-1, (T,)) and the one mask for
    every layer (:func:`for_forward`). A sequence past ``cfg.block_size`` is refused here."""
    T = idx.size(1)
    past = kv_cache.length if kv_cache is not None else 0
    if past + T > cfg.block_size:
        raise ValueError(f"sequence length {past + T} exceeds block_size {cfg.block_size}")
    if pos is None:
        pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)  # (T,)
    return past, pos, for_forward(idx, past, attn_mask, cfg, kv_cache is not None)


def window_mask(attn_mask: torch.Tensor | None, T: int, Tk: int, window: int, device) -> torch.Tensor:
    """``attn_mask`` ((B, 1, T, Tk) or (T, Tk) bool, or None = causal) narrowed to a sliding window: the
    query in key slot Tk - T + i sees key slot j only if i's slot - window < j <= i's slot (transformers'
    ``sliding_window_overlay`` over cache slots, so left padding counts as it does there)."""
    q = torch.arange(Tk - T, Tk, device=device)[:, None]  # (T, 1) the queries' key slots
    k = torch.arange(Tk, device=device)[None, :]  # (1, Tk)
    band = (k <= q) & (k > q - window)  # (T, Tk): causal and within the window
    return band if attn_mask is None else attn_mask & band
