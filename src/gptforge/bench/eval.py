"""Benchmark: examples/s of the batched scorer against the one-at-a-time reference, as JSON.

    gptforge eval --tasks hellaswag --random d2 --limit 200 --bench --json eval_bench.json

Both score the same rendered examples with the same model; each is warmed up on a few examples,
then timed ``repeats`` times (synchronized on CUDA), and the best time is reported. The JSON also
records whether both made identical predictions.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import torch

from gptforge.bench.timing import timed
from gptforge.eval.reference import score_example
from gptforge.eval.run import PreparedTask
from gptforge.eval.scorer import decide, score_requests, unwrap


def run_eval_bench(model: torch.nn.Module, prepared: PreparedTask, enc, device: torch.device, autocast,
                   batch_tokens: int, repeats: int = 3, warmup: int = 8, out: str | None = None,
                   log: Callable[[str], None] = print) -> dict:
    """Time batched vs reference scoring of ``prepared``'s examples; return (and write) the results."""
    model = unwrap(model).eval()
    examples, requests = prepared.examples, prepared.requests
    flat = [r for rq in requests for r in rq]

    def batched():
        return score_requests(model, flat, device, autocast, batch_tokens)

    def reference():
        with autocast():
            return [score_example(model, enc, ex, device) for ex in examples]

    # warm-up: allocator, kernels, autocast caches
    score_requests(model, [r for rq in requests[:warmup] for r in rq], device, autocast, batch_tokens)
    with autocast():
        for ex in examples[:warmup]:
            score_example(model, enc, ex, device)
    tb, tr = timed(batched, device, repeats), timed(reference, device, repeats)
    t_batched, scores, t_ref, refs = tb.best, tb.result, tr.best, tr.result
    pos, same = 0, 0
    for rq, ref in zip(requests, refs, strict=True):
        s = scores[pos : pos + len(rq)]
        pos += len(rq)
        same += decide(s) == (ref["pred"], ref["pred_norm"])
    n = len(examples)
    res = {
        "task": prepared.task.name,
        "examples": n,
        "candidates": len(flat),
        "batched_examples_per_s": n / t_batched,
        "reference_examples_per_s": n / t_ref,
        "speedup": t_ref / t_batched,
        "batched_seconds": t_batched,
        "reference_seconds": t_ref,
        "identical_predictions": same,
        "batch_tokens": batch_tokens,
        "repeats": repeats,
        "params": sum(p.numel() for p in model.parameters()),
        "model": {k: getattr(model.config, k) for k in ("n_layer", "n_head", "n_embd", "block_size")},
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }
    log(f"{prepared.task.name}: {n} examples | batched {res['batched_examples_per_s']:.1f} ex/s | "
        f"one-at-a-time {res['reference_examples_per_s']:.1f} ex/s | speedup {res['speedup']:.2f}x | "
        f"identical predictions {same}/{n}")
    if out:
        from gptforge import storage

        storage.write_json(out, res)  # temporary name, fsync, rename
    return res
