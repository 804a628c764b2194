"""Scoring a group's replies with its shared prompt encoded once (GRPO's reference, old and policy log-probs).

    >>> packed = pack_replies(prompts, replies, block_size=model.config.block_size, pad=pad, device=device)
    >>> logp = packed_logprobs(model, packed, temperature)      # (N, L) float32, 0 off the reply tokens
    >>> packed.mask                                             # (N, L) 1.0 on reply i's first len(replies[i]) columns

GRPO samples G replies to each prompt; scoring them one sequence per reply ([prompt, reply]) runs the
prompt through the model G times. Here consecutive replies with the same prompt share a row:

    [prompt, reply 1 minus its last token, reply 2 minus its last token, ...]

Reply k's tokens take the positions they have in its own sequence (position ids continue from the
prompt's end for every reply) and attend to the prompt and to themselves only (a dense (T, T) mask
through the models' ``pos``/``attn_mask`` arguments), so each reply's log-probs are those of its own
sequence. The logit at the prompt's last token predicts every reply's first token; reply k's token j
predicts its token j + 1 (its last token predicts nothing, so it is left out). A row holds at most
``block_size`` tokens: a group too long for one row goes on over several, each starting with the prompt.

The log-probs come back as (N, L) with row i holding reply i's tokens in its first ``len(replies[i])``
columns (``mask`` 1 there, the log-prob 0 elsewhere), the layout the loss reads; float32 whatever the
model's dtype, softmax(logits / temperature) as :func:`gptforge.training.grpo.token_logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Packed:
    """Rows to run the model on, and where each reply token's log-prob is read from its output."""

    ids: torch.Tensor  # long (R, T): prompt, then the replies minus their last tokens, right-padded
    pos: torch.Tensor  # long (R, T): position ids (each reply's as in its own sequence)
    attn_mask: torch.Tensor  # bool (R, 1, T, T): True = may attend (causal, prompt + own reply)
    keep: int  # logits_to_keep: the output head runs on the last ``keep`` columns only
    row: torch.Tensor  # long (N, L): the row of reply i's token j's logit
    col: torch.Tensor  # long (N, L): its column among the kept logits
    target: torch.Tensor  # long (N, L): the token whose log-prob is read there
    mask: torch.Tensor  # float (N, L): 1 on reply tokens

    @property
    def tokens(self) -> int:
        """Tokens through the model (padding included): the cost this layout saves."""
        return self.ids.numel()


def pack_replies(prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], block_size: int, pad: int,
                 device: torch.device | str = "cpu") -> Packed:
    """Lay replies out by shared prompt (consecutive replies whose prompts are equal share rows), at most
    ``block_size`` tokens a row; ``pad`` fills the rows' ends (its logits are never read). ValueError
    when a prompt is empty or a prompt and one reply do not fit ``block_size`` (their own sequence
    would not fit the model either)."""
    if len(prompts) != len(replies) or not replies:
        raise ValueError(f"{len(prompts)} prompts for {len(replies)} replies: give one prompt a reply, at least one")
    rows: list[tuple[list[int], list[int], list[int]]] = []  # (ids, positions, segments) per row
    where: list[tuple[int, int, int, list[int]]] = []  # per reply: row, prompt's last column, first column, tokens
    prev: list[int] = []  # the last row's prompt (prompts are never empty: the first reply starts a row)
    for i, p in enumerate(prompts):
        r, n_p = list(replies[i]), len(p)
        body = r[:-1]  # the last token is a target only
        if n_p == 0:
            raise ValueError("every reply needs a prompt of at least one token")
        if n_p + len(body) > block_size:
            raise ValueError(f"a prompt of {n_p} tokens and a reply of {len(r)} need {n_p + len(body)} positions; "
                             f"the model's context (block_size) is {block_size}")
        if list(p) != prev or len(rows[-1][0]) + len(body) > block_size:
            prev = list(p)
            rows.append((list(p), list(range(n_p)), [0] * n_p))  # a new row starts with the prompt
        ids, pos, seg = rows[-1]
        where.append((len(rows) - 1, n_p - 1, len(ids), r))
        label = max(seg) + 1
        ids += body
        pos += range(n_p, n_p + len(body))
        seg += [label] * len(body)
    T = max(len(ids) for ids, _, _ in rows)
    R = len(rows)
    ids_t = torch.full((R, T), pad, dtype=torch.long)
    pos_t = torch.zeros(R, T, dtype=torch.long)
    seg_t = torch.full((R, T), -1, dtype=torch.long)  # padding: a segment of its own (sees the prompt, never read)
    for k, (ids, pos, seg) in enumerate(rows):
        ids_t[k, : len(ids)] = torch.tensor(ids)
        pos_t[k, : len(pos)] = torch.tensor(pos)
        seg_t[k, : len(seg)] = torch.tensor(seg)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    visible = (seg_t[:, None, :] == 0) | (seg_t[:, None, :] == seg_t[:, :, None])  # (R, query, key)
    first = min(c for _, c, _, _ in where)  # the earliest column whose logit is read
    keep = T - first
    L = max(1, *(len(r) for _, _, _, r in where))
    N = len(where)
    row = torch.zeros(N, L, dtype=torch.long)
    col = torch.zeros(N, L, dtype=torch.long)
    target = torch.zeros(N, L, dtype=torch.long)
    mask = torch.zeros(N, L)
    for i, (k, last, start, r) in enumerate(where):
        n = len(r)
        row[i, :n] = k
        col[i, :n] = torch.tensor([last] + list(range(start, start + n - 1)))[:n] - first
        target[i, :n] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :n] = 1.0
    return Packed(ids_t.to(device), pos_t.to(device), (visible & causal)[:, None].to(device), keep, row.to(device),
                  col.to(device), target.to(device), mask.to(device))


def packed_logprobs(model: torch.nn.Module, packed: Packed, temperature: float = 1.0) -> torch.Tensor:
    """(N, L) float32: log softmax(logits / temperature) of each reply token given its prompt and the reply
    before it, 0 off the reply tokens. ``model``: a family model, its DDP wrapper or a LoRA base
    (anything called as ``model(ids, pos=, attn_mask=, logits_to_keep=)``)."""
    logits, _ = model(packed.ids, pos=packed.pos, attn_mask=packed.attn_mask, logits_to_keep=packed.keep)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (R, keep, V)
    got = logp[packed.row, packed.col, packed.target]  # (N, L)
    return got.masked_fill(packed.mask == 0, 0.0)
