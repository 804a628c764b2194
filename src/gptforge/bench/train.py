"""Training-speed benchmark: warm up, synchronize, repeat, write JSON. Not a test.

    gptforge bench --preset tiny --steps 20 --json bench.json
    gptforge bench --preset gpt2-124m --train.micro_batch 16 --train.total_batch_tokens 16384 --ladder
    gptforge bench --preset gpt2-124m --sweep-micro-batch 8,16,32 --trace trace.json   # + where a step goes

Each configuration is built fresh and trained on a synthetic shard (uniform random tokens,
written to a temporary llm.c file, read through the real loader), so data loading is part of
what is measured. Per configuration it reports ms/step (median of the timed steps), tokens/s, MFU
by llm.c's formula (6N + 6LCT FLOPs/token) and by PaLM's (6N' + 12LCT), the forward / backward /
optimizer / data-wait split, peak memory (CUDA allocator peak, or process max RSS on CPU), and the
process's user and system CPU seconds and minor page faults per timed step (``sys_frac``: the
kernel's share; a big one on CPU is memory being mapped and unmapped every step, issue 35).

``--switch KEY=VALUE`` (repeatable) times the config as given, then once per switch with it applied:
each speed switch on and off side by side in one process (``--switch model.fused_ce=true``).

``--ladder`` reproduces the seeds' speed ladder side by side in one process: fp32 -> +TF32 ->
+bf16 autocast -> +torch.compile -> +flash attention -> +padded vocab -> +fused AdamW. A rung whose
switch the device cannot do is reported as skipped with the reason, never measured as something else.
"""

from __future__ import annotations

import copy
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptforge import allocator
from gptforge.bench.timing import cpu_usage, machine, sync, write_json
from gptforge.bench.trace import TraceError, format_summary
from gptforge.bench.trace import summarize as summarize_trace
from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import write_shard
from gptforge.models.registry import build_model
from gptforge.optim import build_optimizer, fused_available, set_lr
from gptforge.parallel.distributed import DistInfo, wrap_model
from gptforge.run.faults import out_of_memory
from gptforge.run.metrics import environment, flops_per_token, peak_flops
from gptforge.runtime import resolve_device, set_precision, set_threads
from gptforge.training.step import PhaseTimer, train_step
from gptforge.training.switches import TRITON_SWITCHES, resolve_model_switches, switch_problem


@dataclass
class Rung:
    name: str
    changes: dict[str, Any]  # dotted key -> value, applied on top of the previous rung


LADDER = [
    Rung("fp32", {"train.dtype": "float32", "train.tf32": False, "train.compile": False,
                  "model.flash": False, "model.pad_vocab": False, "optim.fused": False, "model.fused_ce": False}),
    Rung("+tf32", {"train.tf32": True}),
    Rung("+bf16", {"train.dtype": "bfloat16"}),
    Rung("+compile", {"train.compile": True}),
    Rung("+flash", {"model.flash": True}),
    Rung("+pad_vocab", {"model.pad_vocab": True}),
    Rung("+fused_adamw", {"optim.fused": True}),
    Rung("+fused_ce", {"model.fused_ce": None}),  # auto, today's default: the fused classifier on CUDA
]


def apply_switch(cfg: Config, spec: str) -> Config:
    """A copy of ``cfg`` with ``KEY=VALUE[,KEY=VALUE...]`` applied (``model.fused_ce=true``)."""
    pairs = [p.split("=", 1) for p in spec.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise ConfigError(f"--switch {spec!r}: expected KEY=VALUE[,KEY=VALUE], e.g. model.fused_ce=true")
    return apply_overrides(copy.deepcopy(cfg), [f"--{k}={v}" for k, v in pairs])


def _set(cfg: Config, key: str, value: Any) -> None:
    section, name = key.split(".", 1)
    setattr(getattr(cfg, section), name, value)


def unsupported(cfg: Config, device: torch.device) -> str | None:
    """Why this device cannot run the config as asked, or None."""
    if cfg.train.tf32 and cfg.train.dtype == "float32" and device.type == "cuda":
        if torch.cuda.get_device_capability(device)[0] < 8:
            return "TF32 needs an Ampere or newer GPU"
    if cfg.train.dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "bf16 is not supported on this GPU"
    if cfg.optim.fused and not fused_available(device.type):
        return f"fused AdamW is not available on {device.type}"
    return switch_problem(cfg, device)  # fused_ce, lm_head_fp8, attn_backend, compile_mode


def _synthetic_shard(folder: Path, n_tokens: int, vocab: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    return write_shard(folder / "bench_train_000000.bin", rng.integers(0, vocab, n_tokens, dtype=np.int64))


def _say(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def _check_batch_fits(cfg: Config, steps: int, warmup: int) -> None:
    """Refuse (one line naming the keys) a micro-batch whose synthetic token ids alone, int64 as numpy
    draws them, exceed the memory free now: ``--sweep-micro-batch 1e9`` asked numpy for 239 GiB in a
    traceback. What fits the ids may still not fit the activations: that is an out-of-memory result."""
    from gptforge import resources
    from gptforge.errors import ResourceError

    B, T = cfg.train.micro_batch, cfg.train.seq_len
    n_tokens = min(B * T * cfg.validate() * (steps + warmup) + 1, 50_000_000) + B * T + 1  # bench_one's shard
    free = resources.free_memory()
    if free is not None and 8 * n_tokens > free.bytes:
        raise ResourceError(f"train.micro_batch={B:,} x train.seq_len={T:,}: {n_tokens:,} token ids to time it need "
                            f"{8 * n_tokens / 2**30:,.1f} GiB before any activation, and {free}; lower train.micro_batch (or --sweep-micro-batch)")


_out_of_memory = out_of_memory  # run/faults.py's: training's loop and the benchmark tell one refusal alike


def _peak_memory(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated_MiB"
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss_kib / 1024, "process_max_rss_MiB"


def bench_one(cfg: Config, steps: int, warmup: int, device: torch.device, trace: str | None = None) -> dict:
    """Time ``steps`` optimizer steps of ``cfg`` after ``warmup`` untimed ones."""
    info = DistInfo(device=device)
    grad_accum = cfg.validate()
    torch.manual_seed(cfg.train.seed)
    autocast, precision, compile_model = set_precision(cfg, device)
    threads = set_threads(cfg.train.threads, device)
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    if device.type == "cuda":
        torch.cuda.init()  # the allocator's stats need CUDA initialised: the ladder's fp32 rung touches it first here
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        need = B * T * grad_accum * (steps + warmup) + 1
        shard = _synthetic_shard(Path(tmp), min(need, 50_000_000) + B * T + 1, cfg.model.vocab_size)
        loader = ShardLoader([shard], B, T, vocab_size=cfg.model.vocab_size)
        model_cfg = resolve_model_switches(cfg, device, _say)  # model.fused_ce=auto, as a training run decides it
        model = build_model(model_cfg).to(device)
        optimizer = build_optimizer(model, cfg.optim, device.type)
        wrapped = wrap_model(model, info, compile_model, compile_mode=cfg.train.compile_mode)
        model.train()
        timer = PhaseTimer(device)
        step_times, phases = [], []
        t_compile = time.perf_counter()
        for step in range(warmup + steps):
            if step == warmup:
                warmup_s = time.perf_counter() - t_compile
                usage0 = resource.getrusage(resource.RUSAGE_SELF)  # CPU time and page faults of the timed steps
                prof = _profiler(trace, device) if trace else None
                if prof:
                    prof.__enter__()
            set_lr(optimizer, step, cfg.optim, cfg.train.max_steps)
            sync(device)
            t0 = time.perf_counter()
            timer.mark("start")
            loss, _ = train_step(wrapped, model, optimizer, loader, grad_accum, autocast, info,
                                 cfg.optim.grad_clip, timer=timer if step >= warmup else None)
            sync(device)
            dt = time.perf_counter() - t0
            if step >= warmup:
                step_times.append(dt)
                phases.append(timer.totals())
            else:
                timer.totals()
        usage = cpu_usage(usage0, resource.getrusage(resource.RUSAGE_SELF), steps)
        if warmup == 0:
            warmup_s = 0.0
        if trace and prof:
            prof.__exit__(None, None, None)
            from gptforge.storage import atomic_path

            with atomic_path(trace, what="the trace") as tmp:  # keeps the suffix: a .gz trace is compressed
                prof.export_chrome_trace(str(tmp))
        final_loss = loss.item()
    ms = statistics.median(step_times) * 1000
    tokens_per_step = cfg.train.total_batch_tokens
    tok_s = tokens_per_step / (ms / 1000)
    n_params = model.num_parameters()
    peak = peak_flops(device, precision, cfg.train.peak_flops)
    mem, mem_kind = _peak_memory(device)
    phase_ms = {k: 1000 * statistics.median(p.get(k, 0.0) for p in phases) for k in ("data", "forward", "backward", "optimizer")}
    out = {
        "ms_per_step": ms,
        "ms_per_step_min": min(step_times) * 1000,
        "ms_per_step_max": max(step_times) * 1000,
        "tokens_per_s": tok_s,
        "tokens_per_step": tokens_per_step,
        "micro_batch": B, "seq_len": T, "grad_accum": grad_accum,
        "phase_ms": phase_ms,
        **usage,
        "params": n_params,
        "precision": precision, "compile": compile_model, "threads": threads,
        "flash": cfg.model.flash, "pad_vocab": cfg.model.pad_vocab,
        "switches": {"fused_ce": getattr(model_cfg, "fused_ce", False),
                     **{k: getattr(cfg.model, k, False) for k in TRITON_SWITCHES},
                     "lm_head_fp8": getattr(cfg.model, "lm_head_fp8", False),
                     "attn_backend": getattr(cfg.model, "attn_backend", "auto"), "compile_mode": cfg.train.compile_mode},
        "fused_adamw": bool(optimizer.defaults.get("fused")),
        "mfu_llmc": flops_per_token(cfg.model, n_params, T, "llmc") * tok_s / peak if peak else None,
        "mfu_palm": flops_per_token(cfg.model, n_params, T, "palm") * tok_s / peak if peak else None,
        "peak_flops": peak,
        mem_kind: mem,
        "warmup_s": warmup_s,
        "final_loss": final_loss,
    }
    del model, wrapped, optimizer
    return out


def _profiler(trace: str, device: torch.device):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts, record_shapes=False)


def run_bench(
    cfg: Config,
    steps: int = 10,
    warmup: int = 3,
    out: str | None = None,
    ladder: bool = False,
    trace: str | None = None,
    sweep_micro_batch: list[int] | None = None,
    switches: list[str] | None = None,
) -> dict:
    device = resolve_device(cfg.train.device)
    skipped: dict[str, str] = {}
    variants: list[tuple[str, Config]] = []  # the switches: ladder rungs, or the config as given
    if ladder:
        c = copy.deepcopy(cfg)
        for rung in LADDER:
            for k, v in rung.changes.items():
                _set(c, k, v)
            if rung.name == "+tf32" and device.type != "cuda":
                # the switch is a no-op off CUDA: measuring it would time plain float32 again
                skipped[rung.name] = f"TF32 is a CUDA tensor-core mode; on {device.type} it changes nothing"
            if rung.name == "+fused_ce" and device.type != "cuda":  # auto is the plain loss off CUDA: the rung before
                skipped[rung.name] = f"model.fused_ce=auto is the plain loss on {device.type}; it changes nothing"
            variants.append((rung.name, copy.deepcopy(c)))
    else:
        variants.append((cfg.train.out_dir.rsplit("/", 1)[-1] or "run", cfg))
    for spec in switches or []:  # --switch model.fused_ce=true: the base config, then each switch on its own
        variants.append((spec, apply_switch(cfg, spec)))
    runs: list[tuple[str, Config]] = []
    for name, c in variants:  # x micro-batch sizes
        for b in sweep_micro_batch or [None]:
            if b is None:
                runs.append((name, c))
                continue
            cb = copy.deepcopy(c)
            cb.train.micro_batch = b
            # keep the preset's total batch when it divides, else one micro-batch per step
            if cb.train.total_batch_tokens % (b * cb.train.seq_len):
                cb.train.total_batch_tokens = b * cb.train.seq_len
            runs.append((f"{name} B={b}" if ladder else f"B={b}", cb))

    for _, c in runs:  # every size before the first is timed, so a bad one costs no timing
        _check_batch_fits(c, steps, warmup)
    results = []
    for i, (name, c) in enumerate(runs):
        why = skipped.get(name) or unsupported(c, device)
        if why:
            print(f"[bench] {name}: skipped: {why}", file=sys.stderr)
            results.append({"name": name, "skipped": why})
            continue
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            traced = trace if i == len(runs) - 1 else None
            r = bench_one(c, steps, warmup, device, trace=traced)
            if traced:  # where the traced steps went, by kernel family (bench/trace.py)
                try:
                    r["trace"] = {"file": str(traced), **summarize_trace(traced, steps)}
                except TraceError as e:  # the timings stand: say why the split is missing, keep the report
                    print(f"[bench] {name}: the trace is written but not summarised: {e}", file=sys.stderr)
        except (torch.OutOfMemoryError, RuntimeError) as e:  # a size this device cannot hold: the next may fit
            if not _out_of_memory(e):
                raise
            r = {"skipped": f"out of memory: {str(e).splitlines()[0]}"}
        results.append({"name": name, **r})
    base = next((r for r in results if "tokens_per_s" in r), None)
    for r in results:
        if base and "tokens_per_s" in r:
            r["speedup_vs_first"] = r["tokens_per_s"] / base["tokens_per_s"]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["gptforge", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("gptforge") else None,
        "env": {k: v for k, v in environment(device).items() if k != "nvidia_smi"},
        "machine": machine(device),
        "allocator": allocator.describe(),
        "steps": steps, "warmup": warmup,
        "config": cfg.to_dict(),
        "results": results,
    }
    print(format_table(results))
    for r in results:
        if "trace" in r:
            print(f"\n{r['name']}: trace -> {r['trace']['file']}\n" + format_summary(r["trace"]))
    write_json(out, report)
    return report


def format_table(results: list[dict]) -> str:
    head = (f"{'config':<18} {'ms/step':>9} {'tok/s':>11} {'x first':>7} {'MFU llm.c':>9} {'fwd':>7} {'bwd':>7} {'opt':>7} "
            f"{'data':>7} {'peak MiB':>9} {'user s':>7} {'sys s':>7} {'faults':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['name']:<18} skipped: {r['skipped']}")
            continue
        p = r["phase_ms"]
        mem = r.get("cuda_max_allocated_MiB", r.get("process_max_rss_MiB", 0))
        mfu = f"{100 * r['mfu_llmc']:.1f}%" if r["mfu_llmc"] is not None else "n/a"
        lines.append(
            f"{r['name']:<18} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>11,.0f} {r.get('speedup_vs_first', 1):>7.2f} "
            f"{mfu:>9} {p['forward']:>7.1f} {p['backward']:>7.1f} {p['optimizer']:>7.1f} {p['data']:>7.1f} {mem:>9.0f} "
            f"{r['cpu_user_s_per_step']:>7.3f} {r['cpu_sys_s_per_step']:>7.3f} {r['minor_faults_per_step']:>9,.0f}"
        )
    if any("cpu_user_s_per_step" in r for r in results):
        lines.append("user s, sys s, faults: per timed step, this process (all threads; resource.getrusage)")
    return "\n".join(lines)
