"""One batched scorer for every task: completion log-likelihoods of many candidates per forward.

    gptforge eval --tasks hellaswag --ckpt runs/shakespeare-cpu --limit 500

Each candidate is a request (context tokens, continuation tokens). Requests from many examples are
sorted by length, packed into right-padded batches of at most ``batch_tokens`` tokens, and run
through the model once; the per-candidate sum of token losses (and token count, and whether greedy
decoding reproduces the continuation) is taken over the continuation tokens only. The model is
causal, so right padding never changes the positions that are scored.

Evaluation runs on every rank over a strided share of the examples and all-reduces the counts; it
always uses the uncompiled, unwrapped module (:func:`unwrap`), so compiled training shapes never
clash with evaluation shapes, and bf16 autocast where the device supports it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gptforge.eval.tasks.base import Example, Task

Request = tuple[list[int], list[int]]  # (context tokens, continuation tokens)


@dataclass(frozen=True)
class CandidateScore:
    sum_loss: float  # total cross-entropy of the continuation tokens (nats)
    n_tokens: int  # continuation tokens scored
    greedy: bool  # argmax at every continuation position equals the continuation token

    @property
    def mean_loss(self) -> float:
        return self.sum_loss / self.n_tokens


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The raw module under DDP/FSDP ``.module`` and torch.compile's ``._orig_mod`` wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def tokenize(enc, examples: list[Example]) -> list[list[Request]]:
    """Per example, its requests: context and continuation encoded separately (build-nanogpt's way,
    so a continuation's leading space stays in its first token)."""
    cache: dict[str, list[int]] = {}

    def ids(s: str) -> list[int]:
        if s not in cache:
            cache[s] = enc.encode_ordinary(s)
        return cache[s]

    return [[(ids(c), ids(k)) for c, k in zip(ex.contexts, ex.continuations, strict=True)] for ex in examples]


@torch.no_grad()
def score_requests(
    model: torch.nn.Module,
    requests: list[Request],
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    batch_tokens: int = 4096,
    progress: Callable[[int], None] | None = None,
) -> list[CandidateScore]:
    """Score every request; results in the order of ``requests``. ``progress(n)`` is called after
    each forward with the number of requests it scored (a progress bar).

    A request longer than the model's context keeps its last ``block_size + 1`` tokens (the context
    is cut from the left, as lm-eval does)."""
    device = torch.device(device)
    block = model.config.block_size
    rows: list[tuple[list[int], int]] = []
    for i, (ctx, cont) in enumerate(requests):
        if not cont:
            raise ValueError(f"request {i} has an empty continuation")
        full = (ctx + cont)[-(block + 1):]
        rows.append((full, min(len(cont), len(full) - 1)))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: least padding
    out: list[CandidateScore | None] = [None] * len(rows)
    start = 0
    while start < len(order):
        width = len(rows[order[start]][0]) - 1  # inputs are the tokens minus the last
        n = max(1, batch_tokens // width)
        idx = order[start : start + n]
        start += n
        x = torch.zeros((len(idx), width), dtype=torch.long)
        y = torch.full((len(idx), width), -1, dtype=torch.long)
        for r, i in enumerate(idx):
            full, n_cont = rows[i]
            L = len(full) - 1
            x[r, :L] = torch.tensor(full[:-1])
            y[r, L - n_cont : L] = torch.tensor(full[-n_cont:])  # targets only on continuation tokens
        x, y = x.to(device), y.to(device)
        with autocast():
            logits, _ = model(x)
        logits = logits.float()
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1,
                                 reduction="none").view_as(y)
        scored = y >= 0
        sums = losses.sum(1).tolist()
        counts = scored.sum(1).tolist()
        greedy = ((logits.argmax(-1) == y) | ~scored).all(1).tolist()
        for r, i in enumerate(idx):
            out[i] = CandidateScore(sums[r], counts[r], greedy[r])
        if progress is not None:
            progress(len(idx))
    return out  # type: ignore[return-value]


def decide(scores: list[CandidateScore]) -> tuple[int, int]:
    """(prediction by lowest total loss, prediction by lowest mean token loss): acc and acc_norm."""
    pred = min(range(len(scores)), key=lambda i: scores[i].sum_loss)
    pred_norm = min(range(len(scores)), key=lambda i: scores[i].mean_loss)
    return pred, pred_norm


def evaluate_requests(
    model: torch.nn.Module,
    task: Task,
    examples: list[Example],
    requests: list[list[Request]],
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    batch_tokens: int = 4096,
    rank: int = 0,
    world: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Score one task on this rank's share (examples rank, rank+world, ...) and all-reduce the counts.

    Choice tasks give ``acc`` and ``acc_norm``; last-word tasks ``acc`` and ``ppl``; both give ``n``.
    ``progress(done, total)``: requests of this rank scored so far, after each forward."""
    device = torch.device(device)
    raw = unwrap(model)
    was_training = raw.training
    raw.eval()
    try:
        mine = list(range(rank, len(examples), world))
        flat = [req for i in mine for req in requests[i]]
        done = [0]

        def step(n: int) -> None:
            done[0] += n
            progress(done[0], len(flat))

        scores = score_requests(raw, flat, device, autocast, batch_tokens, step if progress else None)
    finally:
        raw.train(was_training)
    # totals: [examples, correct (acc), correct (acc_norm) or summed loss]
    totals = torch.zeros(3, dtype=torch.float64)
    pos = 0
    for i in mine:
        k = len(requests[i])
        ex_scores, pos = scores[pos : pos + k], pos + k
        totals[0] += 1
        if task.mode == "choice":
            pred, pred_norm = decide(ex_scores)
            totals[1] += pred == examples[i].label
            totals[2] += pred_norm == examples[i].label
        else:
            totals[1] += ex_scores[0].greedy
            totals[2] += ex_scores[0].sum_loss
    if world > 1:
        import torch.distributed as dist

        totals = totals.to(device)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        totals = totals.cpu()
    n, a, b = totals.tolist()
    if task.mode == "choice":
        return {"n": int(n), "acc": a / n, "acc_norm": b / n}
    return {"n": int(n), "acc": a / n, "ppl": math.exp(b / n)}
