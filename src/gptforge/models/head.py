"""The output head and loss, shared by the model families: the vocabulary padded to a multiple of 128
(``padded_vocab``: the embedding's and the head's rows), logits over the real vocabulary (padded
rows never receive probability), an optional divisor (Granite's ``logits_scaling``) and soft-cap,
mean cross-entropy with targets of -1 ignored, and the speed switches ``fused_ce`` and
``lm_head_fp8`` (:mod:`gptforge.kernels`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.tokens import PAD_MULTIPLE


def padded_vocab(vocab_size: int, multiple: int = PAD_MULTIPLE) -> int:
    """Round the vocabulary up to a multiple of 128 (50257 -> 50304) for friendlier matmul shapes."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


def logits_and_loss(x: torch.Tensor, lm_head: nn.Linear, targets: torch.Tensor | None, cfg,
                    training: bool, logits_to_keep: int = 0) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """x (B, T, C) final hidden states -> (logits (B, T, vocab_size), loss or None). A training
    forward with ``fused_ce`` returns no logits: its buffer holds the gradient.

    ``logits_to_keep`` N > 0 (transformers' name): logits for the last N positions only, (B, N, V).
    The head is most of a small model's compute, so sampling (N = 1 at the prefill) and scoring
    replies (N = the reply's length) skip the prompt's rows instead of computing and dropping them."""
    if logits_to_keep:
        if targets is not None:
            raise ValueError("logits_to_keep is for forwards without targets (the loss needs every position)")
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep {logits_to_keep}: must be >= 0 (0 = every position)")
        x = x[:, -logits_to_keep:]
    softcap = getattr(cfg, "logit_softcap", 0.0)
    divisor = getattr(cfg, "logits_scaling", 1.0)  # Granite: logits / logits_scaling
    if targets is not None and cfg.fused_ce and training and torch.is_grad_enabled():
        # llm.c's fused classifier: loss and d(logits) in one kernel pass (configs refuse it with a soft-cap);
        # (x / s) W^T is (x W^T) / s, so a logits divisor goes in before the head
        from gptforge.kernels.fused_ce import fused_linear_cross_entropy

        x = x / divisor if divisor != 1.0 else x
        return None, fused_linear_cross_entropy(x, lm_head.weight, targets, cfg.vocab_size)
    if cfg.lm_head_fp8:
        from gptforge.kernels.fp8 import fp8_linear

        logits = fp8_linear(x, lm_head.weight)[..., : cfg.vocab_size]
    else:
        logits = lm_head(x)
        if not _vocab_sharded(logits):
            logits = logits[..., : cfg.vocab_size]  # (B, T, vocab_size)
    if divisor != 1.0:
        logits = logits / divisor
    if softcap > 0:  # bounded logits (Gemma 2, modded-nanogpt): cap * tanh(z / cap)
        logits = softcap * torch.tanh(logits.float() / softcap)
    if _vocab_sharded(logits) and logits.size(-1) != cfg.vocab_size:
        logits = _mask_padding(logits, cfg.vocab_size)
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        if training and x.device.type == "cpu" and torch.compiler.is_compiling():
            # every output of a compiled forward gets a gradient in backward, zeros when unused: the logits of a
            # training forward (its callers use the loss) would cost a zero-filled (B, T, V) tensor and a pass
            # over it each step (issue 35). Detached, they are returned without one.
            logits = logits.detach()
    return logits, loss


def _vocab_sharded(logits: torch.Tensor) -> bool:
    """Logits split over the vocabulary across tensor-parallel ranks (a DTensor, ``Shard(-1)``): kept
    sharded for ``loss_parallel`` instead of being sliced, which would gather them."""
    return hasattr(logits, "placements") and any(getattr(p, "dim", None) in (-1, logits.ndim - 1)
                                                 for p in logits.placements)


def _mask_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Vocabulary-sharded logits with the padded rows at -inf (zero probability), in place of the slice."""
    from torch.distributed.tensor import Shard, distribute_tensor

    pad = torch.zeros(logits.size(-1), dtype=logits.dtype, device=logits.device)
    pad[vocab_size:] = float("-inf")
    return logits + distribute_tensor(pad, logits.device_mesh, [Shard(0)], src_data_rank=None)
