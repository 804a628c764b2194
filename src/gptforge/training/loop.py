"""The training loop: ``train(cfg)``, readable top to bottom.

    gptforge train --preset shakespeare-cpu
    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b

Sections: setup (devices, precision, run dir) -> data -> model and optimizer (or resume) ->
wrap (compile, DDP) -> loop (train_step, validation, samples, checkpoints) -> finish.
A SIGINT/SIGTERM finishes the current step, writes a checkpoint and exits; ``--resume`` continues
from it, bit for bit on CPU in float32.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptforge import __version__
from gptforge.config import Config, ConfigError
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import list_shards, read_header
from gptforge.eval.run import evaluate_during_training, prepare_for_training
from gptforge.models.gpt2 import GPT
from gptforge.training import checkpoint as ckpt
from gptforge.training.dist_checkpoint import (
    full_optimizer_state,
    is_sharded,
    load_sharded,
    save_sharded,
    set_full_optimizer_state,
)
from gptforge.training.distributed import (
    DistInfo,
    all_reduce_mean,
    any_rank,
    barrier,
    build_optimizer_for,
    cleanup,
    gather_rng_states,
    grad_sync,
    init_distributed,
    launched_world,
    local_tensor,
    restore_rank_rng,
    seed_rank,
    wrap_model,
)
from gptforge.training.faults import elastic_restart, maybe_inject_fault, oom_advice
from gptforge.training.observe import MetricsLog, environment, flops_per_token, fmt_duration, peak_flops
from gptforge.training.optim import build_optimizer, lr_at
from gptforge.training.precision import autocast_for, resolve_dtype


@dataclass
class RunResult:
    """What train() hands back (tests and the CLI use it)."""

    run_dir: Path
    steps_done: int
    train_losses: dict[int, float] = field(default_factory=dict)  # step (1-based) -> loss
    val_losses: dict[int, float] = field(default_factory=dict)
    interrupted: bool = False
    last_checkpoint: Path | None = None


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.stop:  # second signal: give up immediately
            raise KeyboardInterrupt
        self.stop = True
        print(f"\n[gptforge] got signal {signum}: finishing this step, saving a checkpoint, then exiting "
              "(send again to abort without saving)", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def set_precision(cfg: Config, device: torch.device):
    """Apply the TF32 switch; return (autocast context factory, precision name for MFU, compile?)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
        torch.backends.cudnn.allow_tf32 = cfg.train.tf32
    precision = resolve_dtype(device, cfg.train.dtype)
    if precision == "float32" and device.type == "cuda" and cfg.train.tf32:
        precision = "tf32"
    compile_model = device.type == "cuda" if cfg.train.compile is None else cfg.train.compile
    autocast = autocast_for(device, cfg.train.dtype)
    return autocast, precision, compile_model


def evaluate_loss(model: torch.nn.Module, loader: ShardLoader, steps: int, autocast, info: DistInfo) -> float:
    """Mean loss over ``steps`` batches from the start of the val split, averaged over ranks."""
    was_training = model.training
    model.eval()
    loader.reset()
    total = torch.zeros((), device=info.device)
    with torch.no_grad():
        for _ in range(steps):
            x, y = loader.next_batch()
            x, y = x.to(info.device), y.to(info.device)
            with autocast():
                _, loss = model(x, y)
            total += loss.detach().float()
    total /= steps
    all_reduce_mean(total, info)
    model.train(was_training)
    return total.item()


def print_samples(model: GPT, cfg: Config, info: DistInfo, step: int, metrics: MetricsLog, log) -> None:
    from gptforge.data.tokenizer import EOT, TokenizerUnavailable, get_tokenizer
    from gptforge.generation import generate

    if cfg.model.vocab_size < EOT + 1:
        log(f"(no samples: model.vocab_size={cfg.model.vocab_size} is not the GPT-2 vocabulary)")
        return
    try:
        enc = get_tokenizer()
    except TokenizerUnavailable as e:
        log(f"(no samples: {str(e).splitlines()[0]})")
        return
    was_training = model.training
    n = min(cfg.train.sample_tokens, cfg.model.block_size - 1)
    idx = torch.full((2, 1), EOT, dtype=torch.long, device=info.device)
    out = generate(model, idx, max_new_tokens=n, temperature=1.0, top_k=50, seed=cfg.train.seed + step)
    model.train(was_training)
    for i, row in enumerate(out.tolist()):
        text = enc.decode(row[1:])
        log(f"sample {i}: {text!r}")
        metrics.write("sample", step, index=i, text=text)


class PhaseTimer:
    """Accumulates wall time per phase (data, forward, backward, optimizer) for the bench command.
    On CUDA it records events (no host sync inside the step); ``totals()`` synchronizes once."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []

    def mark(self, phase: str) -> None:
        """Everything since the previous mark belongs to ``phase``."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((phase, ev))
        else:
            self.marks.append((phase, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        """Seconds per phase since the first mark; resets."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:], strict=False):
            dt = a.elapsed_time(b) / 1000 if self.cuda else b - a
            out[phase] = out.get(phase, 0.0) + dt
        self.marks = []
        return out


def train_step(
    wrapped: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: ShardLoader,
    grad_accum: int,
    autocast,
    info: DistInfo,
    grad_clip: float,
    timer: PhaseTimer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``grad_accum`` micro-batches. The loss is scaled by 1/grad_accum so
    the gradient does not depend on how the total batch is split; DDP syncs gradients only on the
    last micro-step. Returns (mean loss over ranks, pre-clip grad norm)."""
    device = info.device
    loss_accum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        x, y = loader.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if timer:
            timer.mark("data")
        with grad_sync(wrapped, info, sync=micro == grad_accum - 1):
            with autocast():
                _, loss = wrapped(x, y)
            loss = loss / grad_accum
            loss_accum += loss.detach()
            if timer:
                timer.mark("forward")
            loss.backward()
            if timer:
                timer.mark("backward")
    all_reduce_mean(loss_accum, info)
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    norm = local_tensor(norm)  # FSDP: the norm is a DTensor over the shards
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if timer:
        timer.mark("optimizer")
    return loss_accum, norm


def train(cfg: Config, resume: str | None = None, force: bool = False, stop_at_step: int | None = None,
          init_weights: Callable[[GPT], None] | None = None) -> RunResult:
    """Train per ``cfg``. ``resume``: "latest" or a checkpoint dir. ``stop_at_step``: behave as if
    interrupted after that many steps (tests use it to compare a resumed run with an uninterrupted one).
    ``init_weights(model)``: fine-tuning, fill a fresh run's model from other weights (``--init-from``)."""
    # --- setup: devices, precision, run directory -------------------------------------------------
    grad_accum = cfg.validate(launched_world())  # before joining the group: fail fast
    info = init_distributed(cfg.train.device, cfg.dist)
    device = info.device
    torch.manual_seed(cfg.train.seed)
    autocast, precision, compile_model = set_precision(cfg, device)

    run_dir = Path(cfg.train.out_dir)
    if resume is None and elastic_restart() and ckpt.latest_checkpoint(run_dir) is not None:
        resume, force = "latest", False  # torchrun restarted us after a failure: continue, never wipe
    resume_dir = _find_resume(run_dir, resume)
    start_over = resume_dir is None and ckpt.latest_checkpoint(run_dir) is not None
    if start_over and not force:
        raise ConfigError(
            f"{run_dir} already holds checkpoints; pass --resume to continue that run, --force to start "
            "over (deletes its checkpoints and metrics), or choose another --train.out_dir"
        )

    def log(msg: str) -> None:
        if info.is_main:
            _write_line(msg)

    if info.world == 1 and (cfg.dist.zero or cfg.dist.fsdp):
        log("(dist.zero / dist.fsdp shard state across processes; on one process they have no effect)")

    # --- data -------------------------------------------------------------------------------------
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    train_loader = ShardLoader(list_shards(cfg.data.dir, cfg.data.train_split), B, T, info.rank, info.world,
                               shuffle=cfg.data.shuffle, seed=cfg.data.shuffle_seed, eot=cfg.data.eot_token,
                               step_tokens=cfg.train.total_batch_tokens)
    val_files = list_shards(cfg.data.dir, cfg.data.val_split)
    val_loader = ShardLoader(val_files, B, T, info.rank, info.world)
    val_available = sum(read_header(f)[2] for f in val_files) // (B * T * info.world)
    val_steps = max(1, min(cfg.train.val_tokens // (B * T * info.world), val_available))

    # --- model and optimizer ----------------------------------------------------------------------
    # Wrapping (compile, DDP / FSDP2) comes before the optimizer: FSDP turns parameters into shards.
    model = GPT(cfg.model).to(device)
    n_params = model.num_parameters()
    evals = prepare_for_training(cfg, model, log)  # eval tasks loaded once (None when eval.every is 0)
    if resume_dir is None and init_weights is not None:
        init_weights(model)  # fine-tuning: before wrapping/compiling; the optimizer state starts fresh
    start_step, carried_optim = 0, None
    sharded_ckpt = resume_dir is not None and is_sharded(resume_dir)
    if resume_dir is not None and not sharded_ckpt:
        ckpt.load_model_weights(model, resume_dir)  # full weights, before FSDP shards them
        if info.fsdp:  # a single-file optimizer state, to be sharded into the FSDP optimizer below
            plain = build_optimizer(model, cfg.optim, device.type)
            ckpt.load_training_state(resume_dir, plain)
            carried_optim = full_optimizer_state(model, plain)
            del plain
    seed_rank(cfg.train.seed, info)  # after init: same weights everywhere, then a stream per rank
    param_dtype = torch.bfloat16 if info.fsdp and device.type == "cuda" and precision == "bfloat16" else None
    wrapped = wrap_model(model, info, compile_model, cfg.dist, param_dtype)
    model.train()
    optimizer = build_optimizer_for(model, cfg.optim, info)
    if resume_dir is not None:
        meta = ckpt.read_meta(resume_dir)
        if sharded_ckpt and info.zero:  # DCP reads into a plain AdamW; ZeRO then takes its share
            plain = build_optimizer(model, cfg.optim, device.type)
            load_sharded(model, plain, resume_dir)
            optimizer.load_state_dict(plain.state_dict())
            del plain
        elif sharded_ckpt:
            load_sharded(model, optimizer, resume_dir)
        elif carried_optim is not None:
            set_full_optimizer_state(model, optimizer, carried_optim)
        else:
            ckpt.load_training_state(resume_dir, optimizer)
        train_loader.load_state_dict(meta["loader"])
        start_step = int(meta["step"])
        restore_rank_rng(resume_dir, info, int(meta.get("world", 1)), cfg.train.seed, start_step)
        log(f"resumed from {resume_dir} at step {start_step} (saved at world {meta.get('world', 1)}, "
            f"now {info.world})")
    fpt = flops_per_token(cfg.model, n_params, T, "llmc")
    peak = peak_flops(device, precision, cfg.train.peak_flops)

    # --- run directory: config and environment, written once by rank 0 -------------------------------
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=info.is_main)
    env = environment(device)
    if info.is_main:
        if start_over:  # --force, and only now that data and model are known to be good
            shutil.rmtree(ckpt.ckpt_root(run_dir), ignore_errors=True)
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(cfg.to_json() + "\n")
        (run_dir / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    metrics.write("start", start_step, params=n_params, world=info.world, grad_accum=grad_accum,
                  precision=precision, compile=compile_model, device=str(device), gptforge=__version__)
    log(f"gptforge {__version__} | {n_params/1e6:.2f}M params | device {device} ({env.get('gpu', 'cpu')}) | "
        f"{precision} | compile {compile_model} | world {info.world} ({info.sharded}) | B {B} T {T} x accum {grad_accum} = "
        f"{cfg.train.total_batch_tokens:,} tokens/step | {cfg.train.max_steps} steps | run dir {run_dir}")
    barrier(info)

    # --- the loop ---------------------------------------------------------------------------------
    result = RunResult(run_dir=run_dir, steps_done=start_step)
    max_steps = cfg.train.max_steps
    tokens_per_step = cfg.train.total_batch_tokens

    def save(steps_done: int) -> Path:
        meta = {
            "config": cfg.to_dict(), "loader": train_loader.state_dict(), "gptforge": __version__,
            "torch": torch.__version__, "git_sha": env.get("git_sha"), "world": info.world,
            "train_loss": result.train_losses.get(steps_done), "sharding": info.sharded,
        }
        path = None
        rngs = gather_rng_states(info)  # every rank's stream, for an exact continuation at this world
        if info.fsdp:  # every rank writes its shards (DCP); resumable at any world size
            path = save_sharded(run_dir, steps_done, model, optimizer, meta, cfg.train.keep_ckpts, info.is_main,
                                rngs)
        else:
            if info.zero:  # gather the optimizer shards on rank 0: an ordinary single-file checkpoint
                optimizer.consolidate_state_dict(to=0)
            if info.is_main:
                path = ckpt.save_checkpoint(run_dir, steps_done, model, optimizer, meta, keep=cfg.train.keep_ckpts,
                                            extra_rng=rngs)
        if path is not None:
            log(f"checkpoint -> {path}")
        barrier(info)
        result.last_checkpoint = path
        return path

    progress = _progress(start_step, max_steps, info.is_main)
    t_start = time.perf_counter()
    with _StopFlag() as stop:
        for step in range(start_step, max_steps):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg.optim, max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            try:
                loss_accum, norm = train_step(wrapped, model, optimizer, train_loader, grad_accum, autocast, info,
                                              cfg.optim.grad_clip)
            except torch.OutOfMemoryError as e:
                raise torch.OutOfMemoryError(oom_advice(cfg, info, grad_accum) + f"\n(original error: {e})") from e
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            steps_done = step + 1
            maybe_inject_fault(info, steps_done)
            loss_val = loss_accum.item()
            result.train_losses[steps_done] = loss_val
            result.steps_done = steps_done
            if not math.isfinite(loss_val):
                log(f"step {steps_done}: loss is {loss_val}; stopping (lower optim.lr or check the data)")
                metrics.write("train", steps_done, loss=loss_val, lr=lr)
                break

            # observability: one line per log_every steps, metrics.jsonl every step
            elapsed = time.perf_counter() - t_start
            tok_s = tokens_per_step / dt
            mfu = fpt * tok_s / peak if peak else None
            eta = (elapsed / max(1, steps_done - start_step)) * (max_steps - steps_done)
            metrics.write("train", steps_done, loss=loss_val, lr=lr, grad_norm=float(norm), dt_ms=dt * 1000,
                          tokens_per_s=tok_s, mfu=mfu, tokens=steps_done * tokens_per_step)
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
                metrics.write("val", steps_done, val_loss=vl, tokens=steps_done * tokens_per_step)
                log(f"step {steps_done:>6} | val loss {vl:.4f} ({val_steps} batches)")
            if evals and (last or steps_done % cfg.eval.every == 0):  # tasks on the raw module, not `wrapped`
                evaluate_during_training(model, evals, cfg, info, autocast, steps_done, steps_done * tokens_per_step,
                                         metrics, log)
            if info.is_main and (last or (cfg.train.sample_every and steps_done % cfg.train.sample_every == 0)):
                if info.fsdp:  # generation on one rank would wait forever for the others' all-gathers
                    log("(no in-loop samples under dist.fsdp; use `gptforge sample --ckpt` on the checkpoint)")
                else:
                    print_samples(model, cfg, info, steps_done, metrics, log)
            interrupted = any_rank(stop.stop, info) or (stop_at_step is not None and steps_done >= stop_at_step)
            if last or interrupted or (cfg.train.ckpt_every and steps_done % cfg.train.ckpt_every == 0):
                save(steps_done)
            if interrupted:
                result.interrupted = True
                log(f"stopped at step {steps_done}; continue with --resume")
                break
    progress.close()
    metrics.write("end", result.steps_done, interrupted=result.interrupted,
                  seconds=time.perf_counter() - t_start)
    cleanup(info)
    return result


def wrapped_eval(wrapped: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """Evaluate through the compiled module but not through DDP (no gradient sync needed); under
    FSDP through the sharded module itself (its forward all-gathers the parameters on every rank)."""
    if info.fsdp:
        return wrapped
    return wrapped.module if info.enabled else wrapped


def _find_resume(run_dir: Path, resume: str | None) -> Path | None:
    if resume is None:
        return None
    if resume == "latest":
        latest = ckpt.latest_checkpoint(run_dir)
        if latest is None:
            raise ckpt.CheckpointError(
                f"--resume: no complete checkpoint in {ckpt.ckpt_root(run_dir)}; "
                "start without --resume, or point --train.out_dir at the run to continue"
            )
        return latest
    return ckpt.resolve_checkpoint(resume)


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
