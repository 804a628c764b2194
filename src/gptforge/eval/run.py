"""Evaluate a model on several tasks: load and render the data once, score, print a table.

    gptforge eval --tasks hellaswag,piqa,winogrande --ckpt runs/shakespeare-cpu --limit 200 --json eval.json

Used by the ``eval`` command and, every ``eval.every`` steps, by the training loop (through
``gptforge.training.evaluate``, which prepares the tasks once at start-up, so a missing dataset
stops a run before any compute). Nothing here knows of run configs or metrics.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gptforge.eval.scorer import Request, evaluate_requests, tokenize
from gptforge.eval.stats import chance_level, fmt_ci, with_context
from gptforge.eval.tasks import Example, Task, get_tasks, load_rows
from gptforge.eval.tasks.base import EvalDataError
from gptforge.runtime import autocast_for
from gptforge.tokens import GPT2_VOCAB


@dataclass
class PreparedTask:
    task: Task
    examples: list[Example]
    requests: list[list[Request]]
    available: int  # examples in the dataset before --limit


def prepare_tasks(names: str | list[str], limit: int | None = None, log: Callable[[str], None] = print,
                  enc=None) -> list[PreparedTask]:
    """Load, render and tokenize each task's first ``limit`` examples (all when None or 0).

    A limit beyond the data is clamped, and the log says so."""
    if limit is not None and limit < 0:
        raise EvalDataError(f"limit {limit}: must be >= 0 (0 or none = all examples)")
    if enc is None:  # the model's tokenizer, when the caller has one; GPT-2's otherwise
        from gptforge.data.tokenizer import gpt2_tokenizer

        enc = gpt2_tokenizer()
    out = []
    for task in get_tasks(names):
        rows = load_rows(task.name)
        n = len(rows)
        if limit and limit > n:
            log(f"{task.name}: limit {limit} exceeds the {n:,} examples in the data; using all {n:,}")
        if limit:
            rows = rows[:limit]
        examples = [task.render(row, i) for i, row in enumerate(rows)]
        out.append(PreparedTask(task, examples, tokenize(enc, examples), n))
    return out


def default_batch_tokens(device: torch.device) -> int:
    # the logits of a batch are tokens x 50257 floats: ~0.4 GB at 2048 tokens, fine for a CPU;
    # a GPU fits many more examples per forward
    return 32768 if device.type == "cuda" else 2048


def check_model_vocab(model: torch.nn.Module, enc=None) -> None:
    """The model's logits cover every id the task text can tokenize to (``enc``: the model's
    tokenizer; GPT-2's when None)."""
    vocab = model.config.vocab_size
    need = enc.n_vocab if enc is not None else GPT2_VOCAB
    if vocab < need:
        raise EvalDataError(
            f"the model's vocab_size is {vocab}, but the evaluation tasks are tokenized with "
            f"{enc.describe() if enc is not None else 'GPT-2 BPE (50,257 tokens)'}; evaluate a model with "
            f"model.vocab_size >= {need}"
        )


def evaluate(
    model: torch.nn.Module,
    prepared: list[PreparedTask],
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
    batch_tokens: int | None = None,
    rank: int = 0,
    world: int = 1,
    log: Callable[[str], None] | None = None,
) -> dict[str, dict[str, float]]:
    """task name -> {"n", "acc", "acc_norm" | "ppl", "seconds"} for the uncompiled ``model``.
    With ``log`` (the ``eval`` command, rank 0): a progress bar per task on stderr and a line per
    finished task, so a long evaluation is never silent."""
    device = torch.device(device)
    top = max((max(max(c, default=0), max(x, default=0)) for p in prepared for reqs in p.requests for c, x in reqs),
              default=0)
    if top >= model.config.vocab_size:  # task text tokenized with a larger vocabulary than the model's
        raise EvalDataError(f"the model's vocab_size is {model.config.vocab_size}, but the tasks were tokenized "
                            f"to ids up to {top}: evaluate with the model's own tokenizer")
    autocast = autocast or autocast_for(device)
    batch_tokens = batch_tokens or default_batch_tokens(device)
    results = {}
    for p in prepared:
        t0 = time.perf_counter()
        bar = _task_bar(p, world) if log is not None else None
        try:
            r = evaluate_requests(model, p.task, p.examples, p.requests, device, autocast, batch_tokens, rank, world,
                                  progress=bar.progress if bar else None)
        finally:
            if bar is not None:
                bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        r["seconds"] = time.perf_counter() - t0
        results[p.task.name] = with_context(r, chance_level(p.examples))
        if log is not None:
            log(f"{p.task.name}: done, {_summary(r)} ({r['seconds']:.1f} s)")
    return results


class _task_bar:
    """A tqdm bar over one task's requests (candidates), this rank's share."""

    def __init__(self, p: PreparedTask, world: int):
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=f"{p.task.name} ({len(p.examples)} examples)", unit="req",
                        dynamic_ncols=True, leave=False, mininterval=1.0)

    def progress(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def _summary(r: dict) -> str:
    return f"n {r['n']} acc {r['acc']:.4f}" + (f" acc_norm {r['acc_norm']:.4f}" if "acc_norm" in r
                                               else f" ppl {r['ppl']:.2f}")


def format_table(results: dict[str, dict[str, float]]) -> str:
    """A plain text table: task, n, acc and its 95% interval, acc_norm and its interval, the chance
    level, ppl, seconds. An accuracy whose interval holds the chance level is noise at this n."""
    lines = [f"{'task':<14} {'n':>6} {'acc':>7} {'95% CI':>12} {'acc_norm':>9} {'95% CI':>12} {'chance':>7} "
             f"{'ppl':>9} {'seconds':>8}"]
    for name, r in results.items():
        ci = fmt_ci(r["acc_ci95"]) if "acc_ci95" in r else "-"
        norm = f"{r['acc_norm']:.4f}" if "acc_norm" in r else "-"
        norm_ci = fmt_ci(r["acc_norm_ci95"]) if "acc_norm_ci95" in r else "-"
        chance = f"{r['chance']:.3f}" if r.get("chance") is not None else "-"
        ppl = _ppl(r["ppl"]) if "ppl" in r else "-"
        lines.append(f"{name:<14} {r['n']:>6} {r['acc']:>7.4f} {ci:>12} {norm:>9} {norm_ci:>12} {chance:>7} "
                     f"{ppl:>9} {r.get('seconds', 0):>8.1f}")
    if any(_noise(r) for r in results.values()):
        lines.append("(an accuracy whose 95% interval holds the chance level is not distinguishable from guessing "
                     "at this n; raise --limit)")
    return "\n".join(lines)


def _ppl(x: float) -> str:
    """A perplexity in the table's 9 columns: 2 decimals while they fit (< 1e5), else 3 significant digits in
    e-notation, at most 9 characters for any float (an untrained model's LAMBADA ppl of 1,415,902.00 pushed
    every column after it out of line)."""
    return f"{x:.2f}" if abs(x) < 1e5 else f"{x:.2e}"


def _noise(r: dict) -> bool:
    chance = r.get("chance")
    return chance is not None and any(lo <= chance <= hi for key in ("acc_ci95", "acc_norm_ci95")
                                      for lo, hi in [r.get(key, (2, 2))])


def run_eval(
    model: torch.nn.Module,
    tasks: str,
    info,
    *,
    limit: int = 0,
    dtype: str = "auto",
    batch_tokens: int | None = None,
    timer: Callable[..., dict] | None = None,
    json_out: str | None = None,
    source: dict | None = None,
    enc=None,
) -> dict:
    """``gptforge eval``: score ``model`` (already on ``info.device``) on the tasks, print the table
    and write JSON on rank 0. ``timer`` (``gptforge.bench.eval.run_eval_bench``, for ``--bench``)
    instead times batched against one-at-a-time scoring:
    ``timer(model, prepared_task, device, autocast, batch_tokens, log) -> dict``."""

    log = print if info.is_main else (lambda _: None)
    prepared = prepare_tasks(tasks, limit or None, log, enc=enc)
    autocast = autocast_for(info.device, dtype)
    batch_tokens = batch_tokens or default_batch_tokens(info.device)
    if timer is not None:
        results = {p.task.name: timer(model, p, info.device, autocast, batch_tokens, log) for p in prepared}
    else:
        results = evaluate(model, prepared, info.device, autocast, batch_tokens, info.rank, info.world,
                           log=log if info.is_main else None)
        log(format_table(results))
    if json_out and info.is_main:
        from gptforge import storage

        storage.write_json(json_out, {"model": source, "limit": limit, "dtype": dtype,  # temporary name, fsync, rename
                                      "world": info.world, "results": results})
        log(f"wrote {json_out}")
    return results
