"""The training loop: ``train(cfg)``, readable top to bottom.

    gptforge train --preset shakespeare-cpu
    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b

Sections: setup (devices, precision, run dir) -> data -> model and optimizer (or resume, through
the Checkpointer) -> run directory -> loop (train_step, validation, samples, checkpoints) -> finish.
A SIGINT/SIGTERM finishes the current step, writes a checkpoint and exits (training/signals.py says
what a second signal does); ``--resume`` continues from the newest intact checkpoint, bit for bit on
CPU in float32. A non-finite loss stops the run: ``RunResult.diverged_at`` names the step.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptforge import __version__
from gptforge.config import Config, ConfigError
from gptforge.data.aligned import make_loader
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import list_shards, read_header
from gptforge.models.registry import build_model
from gptforge.parallel.mesh import check_layout
from gptforge.runtime import launched_world, set_precision
from gptforge.training import checkpoint as ckpt
from gptforge.training.checkpointer import Checkpointer, TrainState
from gptforge.training.distributed import (
    DistInfo,
    any_rank,
    barrier,
    build_optimizer_for,
    cleanup,
    init_distributed,
    seed_rank,
    wrap_model,
)
from gptforge.training.evaluate import evaluate_during_training, prepare_for_training, print_samples
from gptforge.training.faults import elastic_restart, maybe_inject_fault, oom_advice
from gptforge.training.observe import MetricsLog, environment, flops_per_token, fmt_duration, peak_flops
from gptforge.training.optim import set_lr
from gptforge.training.preflight import check_run_dir
from gptforge.training.signals import StopFlag
from gptforge.training.sinks import open_sinks
from gptforge.training.step import evaluate_loss, train_step
from gptforge.training.switches import check_switches


@dataclass
class RunResult:
    """What train() hands back (tests and the CLI use it)."""

    run_dir: Path
    steps_done: int
    train_losses: dict[int, float] = field(default_factory=dict)  # step (1-based) -> loss
    val_losses: dict[int, float] = field(default_factory=dict)
    interrupted: bool = False
    last_checkpoint: Path | None = None
    diverged_at: int | None = None  # the step whose loss was not finite (the run stopped there)


def train(cfg: Config, resume: str | Path | None = None, force: bool = False, stop_at_step: int | None = None,
          init_weights: Callable[[torch.nn.Module], None] | None = None,
          stop_at_val_loss: float | None = None,
          loaders: Callable[[DistInfo], tuple] | None = None, extra_meta: dict | None = None) -> RunResult:
    """Train per ``cfg``. ``resume``: "latest" or a checkpoint dir. ``stop_at_step``: behave as if
    interrupted after that many steps (tests use it to compare a resumed run with an uninterrupted one).
    ``stop_at_val_loss``: the same at the first validation at or below it (``gptforge race``).
    ``init_weights(model)``: fine-tuning, fill a fresh run's model from other weights (``--init-from``).
    ``loaders(info) -> (train_loader, val_loader, val_batches)``: other data than cfg.data's shards
    (SFT conversations); ``extra_meta``: more keys for every checkpoint's meta.json (the chat template)."""
    # --- setup: devices, precision, run directory -------------------------------------------------
    grad_accum = check_layout(cfg, launched_world())  # the mesh and batch, before joining the group: fail fast
    info = init_distributed(cfg.train.device, cfg.dist)
    device = info.device
    torch.manual_seed(cfg.train.seed)
    autocast, precision, compile_model = set_precision(cfg, device)
    check_switches(cfg, device)  # fused_ce, lm_head_fp8, attn_backend, compile_mode: refused before compute

    run_dir = Path(cfg.train.out_dir)
    if info.is_main:
        check_run_dir(run_dir)  # a file or a read-only filesystem: refuse now, not at the first write
    if resume is None and elastic_restart() and ckpt.latest_checkpoint(run_dir) is not None:
        resume, force = "latest", False  # torchrun restarted us after a failure: continue, never wipe
    def log(msg: str) -> None:
        if info.is_main:
            _write_line(msg)

    resume_dir = Checkpointer.find(run_dir, resume, warn=log)  # the newest intact one; damaged ones named
    start_over = resume_dir is None and ckpt.latest_checkpoint(run_dir) is not None
    if start_over and not force:
        raise ConfigError(
            f"{run_dir} already holds checkpoints; pass --resume to continue that run, --force to start "
            "over (deletes its checkpoints and metrics), or choose another --train.out_dir"
        )

    if info.world == 1 and cfg.dist.shard != "none":
        log(f"(dist.shard={cfg.dist.shard} shards state across processes; on one process it has no effect)")
    env = environment(device)
    checkpointer = Checkpointer(cfg, info, run_dir, resume_dir, log, extra_meta={"git_sha": env.get("git_sha"),
                                                                                 **(extra_meta or {})})

    # --- data -------------------------------------------------------------------------------------
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    if loaders is not None:
        train_loader, val_loader, val_available = loaders(info)
    else:
        train_loader, val_loader, val_available = _shard_loaders(cfg, info)
    val_steps = max(1, min(cfg.train.val_tokens // (B * T * info.dp_world), val_available))

    # --- model and optimizer (or the resumed ones) -------------------------------------------------
    # Wrapping (compile, DDP / FSDP2) comes before the optimizer: FSDP turns parameters into shards.
    model = build_model(cfg.model).to(device)
    n_params = model.num_parameters()
    evals = prepare_for_training(cfg, model, log)  # eval tasks loaded once (None when eval.every is 0)
    if resume_dir is None and init_weights is not None:
        init_weights(model)  # fine-tuning: before wrapping/compiling; the optimizer state starts fresh
    checkpointer.restore_weights(model)  # full weights, before FSDP shards them
    seed_rank(cfg.train.seed, info)  # after init: same weights everywhere, then a stream per rank
    param_dtype = torch.bfloat16 if info.fsdp and device.type == "cuda" and precision == "bfloat16" else None
    wrapped = wrap_model(model, info, compile_model, cfg.dist, param_dtype, cfg.train.compile_mode)
    model.train()
    state = TrainState(model, build_optimizer_for(model, cfg.optim, info), train_loader)
    checkpointer.restore(state)  # optimizer, loader position, step, every rank's RNG
    start_step = state.step
    fpt = flops_per_token(cfg.model, n_params, T, "llmc")
    peak = peak_flops(device, precision, cfg.train.peak_flops)

    # --- run directory: config and environment, written once by rank 0 -------------------------------
    metrics = _open_run_dir(cfg, info, run_dir, start_over, start_step, env, log)
    metrics.write("start", start_step, params=n_params, world=info.world, grad_accum=grad_accum,
                  precision=precision, compile=compile_model, device=str(device), gptforge=__version__)
    log(f"gptforge {__version__} | {n_params/1e6:.2f}M params | device {device} ({env.get('gpu', 'cpu')}) | "
        f"{precision} | compile {compile_model} | world {info.world} ({info.sharded}) | B {B} T {T} x accum {grad_accum} = "
        f"{cfg.train.total_batch_tokens:,} tokens/step | {cfg.train.max_steps} steps | run dir {run_dir}")
    if cfg.train.batch_warmup_steps:
        log(f"batch-size schedule: accum {cfg.train.accum_at(0, info.dp_world)} -> {grad_accum} micro-batches over the "
            f"first {cfg.train.batch_warmup_steps} steps")
    barrier(info)

    # --- the loop ---------------------------------------------------------------------------------
    result = RunResult(run_dir=run_dir, steps_done=start_step)
    max_steps = cfg.train.max_steps
    tokens_per_micro = cfg.train.total_batch_tokens // grad_accum
    tokens_seen = cfg.train.tokens_before(start_step, info.dp_world)  # the batch-size schedule's sum on a resume
    optimizer = state.optimizer
    progress = _progress(start_step, max_steps, info.is_main)
    t_start = time.perf_counter()
    with StopFlag() as stop:
        for step in range(start_step, max_steps):
            t0 = time.perf_counter()
            lr = set_lr(optimizer, step, cfg.optim, max_steps)
            accum = cfg.train.accum_at(step, info.dp_world)
            try:
                loss_accum, norm = train_step(wrapped, model, optimizer, train_loader, accum, autocast, info,
                                              cfg.optim.grad_clip)
            except torch.OutOfMemoryError as e:
                raise torch.OutOfMemoryError(oom_advice(cfg, info, grad_accum) + f"\n(original error: {e})") from e
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            steps_done = state.step = step + 1
            tokens_seen += accum * tokens_per_micro
            maybe_inject_fault(info, steps_done)
            loss_val = loss_accum.item()
            result.train_losses[steps_done] = loss_val
            result.steps_done = steps_done
            if not math.isfinite(loss_val):
                log(f"step {steps_done}: loss is {loss_val}; stopping (lower optim.lr or check the data)")
                metrics.write("train", steps_done, loss=loss_val, lr=lr)
                result.diverged_at = steps_done
                break

            # observability: one line per log_every steps, metrics.jsonl every step
            elapsed = time.perf_counter() - t_start
            tok_s = accum * tokens_per_micro / dt
            mfu = fpt * tok_s / peak if peak else None
            eta = (elapsed / max(1, steps_done - start_step)) * (max_steps - steps_done)
            metrics.write("train", steps_done, loss=loss_val, lr=lr, grad_norm=float(norm), dt_ms=dt * 1000,
                          tokens_per_s=tok_s, mfu=mfu, tokens=tokens_seen)
            if steps_done % cfg.train.log_every == 0 or steps_done == max_steps:
                mfu_s = f" | MFU {mfu * 100:.1f}%" if mfu is not None else ""
                log(f"step {steps_done:>6}/{max_steps} | loss {loss_val:.4f} | lr {lr:.2e} | norm {float(norm):.3f} "
                    f"| {dt * 1000:.1f} ms | {tok_s:,.0f} tok/s{mfu_s} | eta {fmt_duration(eta)}")
            progress.update(loss_val)

            # validation, samples, checkpoints
            last = steps_done == max_steps
            if last or (cfg.train.val_every and steps_done % cfg.train.val_every == 0):
                vl = evaluate_loss(wrapped_eval(wrapped, info), val_loader, val_steps, autocast, info)
                result.val_losses[steps_done] = vl
                metrics.write("val", steps_done, val_loss=vl, tokens=tokens_seen)
                log(f"step {steps_done:>6} | val loss {vl:.4f} ({val_steps} batches)")
                if stop_at_val_loss is not None and vl <= stop_at_val_loss:
                    stop_at_step = steps_done  # reached the target: save and stop here
            if evals and (last or steps_done % cfg.eval.every == 0):  # tasks on the raw module, not `wrapped`
                evaluate_during_training(model, evals, cfg, info, autocast, steps_done, tokens_seen,
                                         metrics, log)
            if info.is_main and (last or (cfg.train.sample_every and steps_done % cfg.train.sample_every == 0)):
                if info.fsdp:  # generation on one rank would wait forever for the others' all-gathers
                    log("(no in-loop samples under dist.shard fsdp; use `gptforge sample --ckpt` on the checkpoint)")
                else:
                    print_samples(model, cfg, info, steps_done, metrics, log)
            interrupted = any_rank(stop.stop, info) or (stop_at_step is not None and steps_done >= stop_at_step)
            if last or interrupted or (cfg.train.ckpt_every and steps_done % cfg.train.ckpt_every == 0):
                result.last_checkpoint = checkpointer.save(state, train_loss=loss_val)
            if interrupted:
                result.interrupted = True
                log(f"stopped at step {steps_done}; continue with --resume")
                break
    progress.close()
    metrics.write("end", result.steps_done, interrupted=result.interrupted,
                  seconds=time.perf_counter() - t_start)
    metrics.close()
    cleanup(info)
    return result


def _shard_loaders(cfg: Config, info: DistInfo) -> tuple:
    """Pretraining data: the train and val shards of cfg.data, and how many val batches they hold."""
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    train_loader = make_loader(list_shards(cfg.data.dir, cfg.data.train_split), B, T, info.dp_rank, info.dp_world,
                               align=cfg.data.align, shuffle=cfg.data.shuffle, seed=cfg.data.shuffle_seed,
                               eot=cfg.data.eot_token, step_tokens=_shard_step_tokens(cfg, info),
                               vocab_size=cfg.model.vocab_size)
    val_files = list_shards(cfg.data.dir, cfg.data.val_split)
    val_loader = ShardLoader(val_files, B, T, info.dp_rank, info.dp_world, vocab_size=cfg.model.vocab_size)
    return train_loader, val_loader, sum(read_header(f)[2] for f in val_files) // (B * T * info.dp_world)


def _shard_step_tokens(cfg: Config, info: DistInfo) -> int:
    """The unit the loader keeps within one shard: a whole optimizer step, so a step's data does not
    depend on how it is split over ranks and micro-steps. Under a batch-size schedule steps change
    size, so the unit is one micro-batch of all ranks (a step may then span two shards)."""
    if cfg.train.batch_warmup_steps:
        return cfg.train.micro_batch * cfg.train.seq_len * info.dp_world
    return cfg.train.total_batch_tokens


def _open_run_dir(cfg: Config, info: DistInfo, run_dir: Path, start_over: bool, start_step: int, env: dict,
                  log: Callable[[str], None]) -> MetricsLog:
    """Rank 0 writes config.json and env.json once, and opens metrics.jsonl (+ TensorBoard / W&B):
    wiped first under --force (only now that data and model are known to be good), repaired after a
    kill (a torn last line, records of steps that will be trained again)."""
    sinks = open_sinks(cfg.train.log_to, run_dir, start_step, cfg.to_dict()) if info.is_main else None
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=info.is_main, sinks=sinks)
    if not info.is_main:
        return metrics
    if start_over:
        shutil.rmtree(ckpt.ckpt_root(run_dir), ignore_errors=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    torn, replayed = metrics.begin(start_step)
    if torn or replayed:
        log(f"metrics.jsonl: cut a torn last line ({torn} bytes), marked {replayed} records after step "
            f"{start_step} as replayed")
    (run_dir / "config.json").write_text(cfg.to_json() + "\n")
    (run_dir / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    return metrics


def wrapped_eval(wrapped: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """Evaluate through the compiled module but not through DDP (no gradient sync needed); under
    FSDP through the sharded module itself (its forward all-gathers the parameters on every rank)."""
    if info.fsdp:
        return wrapped
    return wrapped.module if info.enabled else wrapped


_bar = None


def _write_line(msg: str) -> None:
    if _bar is not None:
        _bar.write(msg)
    else:
        print(msg, flush=True)


class _progress:
    """A live tqdm bar with ETA on an interactive terminal; the log lines carry the ETA otherwise."""

    def __init__(self, start: int, total: int, enabled: bool):
        global _bar
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False)
            _bar = self.bar

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        global _bar
        if self.bar is not None:
            self.bar.close()
            _bar = None
