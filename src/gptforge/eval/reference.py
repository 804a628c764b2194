"""A straightforward one-example-at-a-time scorer, written the way build-nanogpt's ``hellaswag.py``
scores: stack the candidates of one example, pad to the longest, one forward, mask the context.

    gptforge eval --tasks hellaswag --random d2 --limit 50 --bench   # batched vs this, examples/s

It shares nothing with the batched scorer (:mod:`gptforge.eval.scorer`) beyond the rendered
example, so the tests use it as the independent reference and the benchmark as the baseline.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptforge.eval.tasks.base import Example


@torch.no_grad()
def score_example(model: torch.nn.Module, enc, example: Example, device: torch.device | str = "cpu") -> dict:
    """{"pred": lowest total loss, "pred_norm": lowest mean loss, "greedy": [per candidate],
    "sum_loss": [...], "n_tokens": [...]} for one example. No truncation: it must fit the context."""
    tok_rows, mask_rows = [], []
    for ctx, end in zip(example.contexts, example.continuations, strict=True):
        ctx_tokens, end_tokens = enc.encode_ordinary(ctx), enc.encode_ordinary(end)
        tok_rows.append(ctx_tokens + end_tokens)
        mask_rows.append([0] * len(ctx_tokens) + [1] * len(end_tokens))
    max_len = max(len(r) for r in tok_rows)
    if max_len > model.config.block_size:
        raise ValueError(f"example of {max_len} tokens exceeds the model's context {model.config.block_size}")
    tokens = torch.zeros((len(tok_rows), max_len), dtype=torch.long)
    mask = torch.zeros((len(tok_rows), max_len), dtype=torch.long)
    for i, (t, m) in enumerate(zip(tok_rows, mask_rows, strict=True)):
        tokens[i, : len(t)] = torch.tensor(t)
        mask[i, : len(m)] = torch.tensor(m)
    tokens, mask = tokens.to(device), mask.to(device)
    logits, _ = model(tokens)
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_tokens = tokens[..., 1:].contiguous()
    losses = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_tokens.view(-1), reduction="none")
    losses = losses.view(tokens.size(0), -1)
    shift_mask = mask[..., 1:].contiguous()
    masked = losses * shift_mask
    sum_loss = masked.sum(dim=1)
    avg_loss = sum_loss / shift_mask.sum(dim=1)
    hits = (shift_logits.argmax(-1) == shift_tokens) | (shift_mask == 0)
    return {
        "pred": int(sum_loss.argmin().item()),
        "pred_norm": int(avg_loss.argmin().item()),
        "greedy": hits.all(dim=1).tolist(),
        "sum_loss": sum_loss.tolist(),
        "n_tokens": shift_mask.sum(dim=1).tolist(),
    }
