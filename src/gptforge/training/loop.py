"""The one training loop: ``train(cfg, recipe)``, readable top to bottom, for every recipe.

    gptforge train --preset shakespeare-cpu                 # recipe Pretrain
    gptforge sft --init-from runs/base --data conv.jsonl --out runs/sft   # recipe SFT
    gptforge rl --init-from runs/sft --out runs/rl          # recipe GRPO
    torchrun --nproc_per_node 8 -m gptforge train --preset gpt2-124m-fineweb10b

Sections: setup (the run session: ranks, run directory, resume, signals; precision) -> data -> model
and optimizer (or the resumed ones, through the Checkpointer) -> run directory -> loop (the recipe's
step, metrics, the recipe's eval, checkpoints) -> teardown (always, by the session). A recipe
(:mod:`gptforge.training.recipe`) supplies only its batch source, step and eval.

A SIGINT/SIGTERM/SIGHUP finishes the current step, writes a checkpoint and stops (``RunResult.interrupted``;
exit 130); ``--resume`` continues from the newest intact checkpoint, bit for bit on CPU in float32.
A non-finite loss, grad norm, recipe value (a reward) or weight stops the run before any checkpoint is written or pruned
(``RunResult.diverged_at``; exit 3).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptforge import __version__, allocator, environment
from gptforge.config import ConfigError
from gptforge.errors import ResourceError
from gptforge.optim import build_optimizer, schedule_note, set_lr
from gptforge.parallel.distributed import any_rank, barrier, local_tensor, seed_rank, wrap_model
from gptforge.run.checkpointer import TrainState
from gptforge.run.faults import check_step_memory, maybe_inject_fault, oom_advice, out_of_memory
from gptforge.run.metrics import flops_per_token, fmt_duration, peak_flops
from gptforge.run.session import RunSession
from gptforge.runtime import launched_world, set_precision, set_threads
from gptforge.training.recipe import Recipe, RunCtx
from gptforge.training.switches import check_switches, resolve_model_switches


@dataclass
class RunResult:
    """What train() hands back (tests and the CLI use it)."""

    run_dir: Path
    steps_done: int
    train_losses: dict[int, float] = field(default_factory=dict)  # step (1-based) -> loss
    val_losses: dict[int, float] = field(default_factory=dict)
    interrupted: bool = False
    last_checkpoint: Path | None = None
    diverged_at: int | None = None  # the step whose loss (or another value) was not finite
    last_stats: dict[str, float] = field(default_factory=dict)  # the last step's record
    tokens: int = 0  # training tokens seen by the end (all ranks; 0 for recipes without token batches)
    seconds: float = 0.0  # wall time of this invocation's loop
    stop_reason: str = ""  # why it stopped early: "signal", "target" (stop_at_val_loss) or "stop_at_step"
    complete: bool = False  # resumed at train.max_steps: nothing trained (run.session said so)


def check_run_tokenizer(tok, resume_dir: Path | None, vocab_size: int) -> None:
    """The run's tokenizer fits its model, and a resumed run keeps the tokenizer its checkpoint was
    trained with (both named when they differ)."""
    from gptforge.data.tokenizer import check_fits, tokenizer_from_meta

    if resume_dir is not None:
        from gptforge.run.checkpoint import read_meta

        saved = tokenizer_from_meta(read_meta(resume_dir), resume_dir)
        if saved.fingerprint != tok.fingerprint:
            raise ConfigError(f"{resume_dir} was trained with the {saved.describe()}, but this run's data speaks the "
                              f"{tok.describe()}: resume on the shards the run was trained on")
    check_fits(tok, vocab_size)


def train(cfg, recipe: Recipe | None = None, resume: str | Path | None = None, force: bool = False,
          stop_at_step: int | None = None, init_weights: Callable[[torch.nn.Module], None] | None = None,
          stop_at_val_loss: float | None = None) -> RunResult:
    """Train per ``cfg`` with ``recipe`` (pretraining by default). ``resume``: "latest" or a checkpoint
    dir. ``stop_at_step``: behave as if interrupted after that many steps (tests compare a resumed run
    with an uninterrupted one). ``stop_at_val_loss``: the same at the first val loss at or below it
    (``gptforge race``). ``init_weights(model)``: fill a fresh run's model from other weights."""
    if recipe is None:
        from gptforge.training.pretrain import Pretrain

        recipe = Pretrain()
    grad_accum = recipe.check(cfg, launched_world())  # before joining the group: fail fast
    if cfg.lora.rank:  # the base named in the config before the run records the models it reads (run/resume.py)
        from gptforge.training.lora import resolve_base

        resolve_base(cfg, init_weights, fresh=resume is None)
    with RunSession(cfg, resume, force, extra_meta=recipe.meta()) as run:
        if run.complete:  # a finished run resumed: the session said so and how to extend it; nothing to build
            return RunResult(run_dir=run.run_dir, steps_done=run.resume_step, complete=True)
        # --- setup: precision and switches, checked before any compute ------------------------------
        info, log, device = run.info, run.log, run.info.device
        if not recipe.words_unknown:
            check_run_tokenizer(recipe.words(), run.resume_dir, cfg.model.vocab_size)
        torch.manual_seed(cfg.train.seed)
        autocast, precision, compile_model = set_precision(cfg, device)
        threads = run.env["torch_threads"] = set_threads(cfg.train.threads, device)
        check_switches(cfg, device)  # fused_ce, lm_head_fp8, attn_backend, compile_mode
        if recipe.step_logits:  # a micro-batch whose logits alone outgrow the CPU's memory: said before allocating
            check_step_memory(cfg, device, environment.number("LOCAL_WORLD_SIZE", 1))

        # --- data -----------------------------------------------------------------------------------
        B, T = cfg.train.micro_batch, cfg.train.seq_len
        train_loader, val_loader, val_available = recipe.loaders(cfg, info)
        for loader in (train_loader, val_loader):  # shards too short for one step (ShardLoader.skipped): said
            for f, n in getattr(loader, "skipped", ()):
                log(f"{f}: {n:,} tokens, fewer than one step reads: left out (the other shards of its split are read)")
        val_steps = max(1, min(cfg.train.val_tokens // (B * T * info.dp_world), val_available))

        # --- model and optimizer (or the resumed ones) -----------------------------------------------
        # Wrapping (compile, DDP / FSDP2) comes before the optimizer: FSDP turns parameters into shards.
        # model.fused_ce=auto decided for this device (the saved config keeps auto): one line when it is off for a reason
        model = recipe.build_model(resolve_model_switches(cfg, device, log)).to(device)  # a family model (or rm, ppo)
        n_params = model.num_parameters()
        if run.resume_dir is None and init_weights is not None:
            init_weights(model)  # fine-tuning: before wrapping/compiling; the optimizer state starts fresh
        if cfg.lora.rank:  # base frozen (loaded from lora.base on resume), adapters on: only they train and are saved
            from gptforge.training.lora import attach_lora

            run.checkpointer.extra_meta["lora"] = attach_lora(model, cfg, info, recipe.name, run.checkpointer.meta,
                                                              init_weights, log)
        run.checkpointer.restore_weights(model)  # full weights (a LoRA run's adapters), before FSDP shards them
        seed_rank(cfg.train.seed, info)  # after init: same weights everywhere, then a stream per rank
        param_dtype = torch.bfloat16 if info.fsdp and device.type == "cuda" and precision == "bfloat16" else None
        wrapped = wrap_model(model, info, compile_model, cfg.dist, param_dtype, cfg.train.compile_mode)
        model.train()
        state = TrainState(model, build_optimizer(model, cfg.optim, device.type, zero=bool(info.zero)), train_loader)
        run.checkpointer.restore(state)  # optimizer, loader position, step, every rank's RNG
        start_step, max_steps = state.step, cfg.train.max_steps
        fpt = flops_per_token(cfg.model, n_params, T, "llmc")
        peak = peak_flops(device, precision, cfg.train.peak_flops)

        ctx = RunCtx(cfg, info, model, wrapped, state, autocast, None, log, grad_accum,
                     extras={"val": val_loader, "val_steps": val_steps,
                             "tokens_seen": tokens_before(run.checkpointer.meta, cfg, start_step, info.dp_world)
                             if grad_accum else 0})
        recipe.prepare_model(ctx)  # eval tasks, a reference model: bad settings fail before the run dir is touched

        # --- run directory: config and environment, written once by rank 0 -----------------------------
        metrics = ctx.metrics = run.open_metrics(start_step)
        metrics.write("start", start_step, params=n_params, world=info.world, grad_accum=grad_accum, recipe=recipe.name,
                      precision=precision, compile=compile_model, device=str(device), gptforge=__version__,
                      run=run.checkpointer.extra_meta.get("run_id"))  # which run: its checkpoints record the same id
        log(f"gptforge {__version__} | {recipe.name} | {n_params/1e6:.2f}M params | device {device} "
            f"({run.env.get('gpu', 'cpu')}) | {threads} CPU thread{'s' * (threads != 1)} | {precision} | "
            f"compile {compile_model} | {allocator.short()} | world {info.world} "
            f"({info.sharded}) | " + (f"B {B} T {T} x accum {grad_accum} = {cfg.train.total_batch_tokens:,} tokens/step | "
                                      if grad_accum else "") + f"{max_steps} steps | run dir {run.run_dir}")
        if schedule_note(cfg.optim, max_steps):  # a warmup the run never finishes: said, not silent
            log(schedule_note(cfg.optim, max_steps))
        if cfg.train.batch_warmup_steps:
            log(f"batch-size schedule: accum {cfg.train.accum_at(0, info.dp_world)} -> {grad_accum} micro-batches over "
                f"the first {cfg.train.batch_warmup_steps} steps")
        recipe.begin(ctx, start_step)
        barrier(info)

        # --- the loop ---------------------------------------------------------------------------------
        result = RunResult(run_dir=run.run_dir, steps_done=start_step)
        t_start = time.perf_counter()
        for step in range(start_step, max_steps):
            t0, c0 = time.perf_counter(), time.process_time()
            lr = set_lr(state.optimizer, step, cfg.optim, max_steps)
            try:
                stats = {**recipe.step(ctx, step), "lr": lr}
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not out_of_memory(e):
                    raise
                if not isinstance(e, torch.OutOfMemoryError):  # the CPU allocator's: the same advice, one line
                    raise ResourceError(oom_advice(cfg, info, grad_accum)) from None
                raise torch.OutOfMemoryError(oom_advice(cfg, info, grad_accum) + f"\n(original error: {e})") from e
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            steps_done = state.step = step + 1
            maybe_inject_fault(info, steps_done)
            result.train_losses[steps_done] = stats["loss"]
            result.steps_done, result.last_stats = steps_done, stats
            bad = [k for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad:  # nothing is saved or pruned: the newest checkpoint stays the last good one
                log(f"step {steps_done}: {', '.join(f'{k} is {stats[k]}' for k in bad)}; stopping without a "
                    "checkpoint (lower optim.lr, check the data or the reward; resume from the last checkpoint)")
                metrics.write(recipe.kind, steps_done, **stats)
                result.diverged_at = steps_done
                break

            # observability: one line per log_every steps, metrics.jsonl every step
            ctx.extras["tokens_seen"] += int(stats.get("tokens", 0))
            tok_s = stats.get("tokens", 0) / dt
            mfu = fpt * tok_s / peak if peak and "tokens" in stats else None
            eta = (time.perf_counter() - t_start) / max(1, steps_done - start_step) * (max_steps - steps_done)
            metrics.write(recipe.kind, steps_done, **{k: v for k, v in stats.items() if k != "tokens"},
                          dt_ms=dt * 1000, cpu_ms=(time.process_time() - c0) * 1000,
                          **({"tokens_per_s": tok_s, "mfu": mfu, "tokens": ctx.extras["tokens_seen"]}
                             if "tokens" in stats else {}))
            if steps_done % cfg.train.log_every == 0 or steps_done == max_steps:
                speed = f" | {tok_s:,.0f} tok/s" if "tokens" in stats else ""
                log(f"step {steps_done:>6}/{max_steps} | {recipe.log_line(stats)} | {dt * 1000:.1f} ms{speed}"
                    f"{f' | MFU {mfu * 100:.1f}%' if mfu is not None else ''} | eta {fmt_duration(eta)}")
            run.progress.update(stats["loss"])

            # the recipe's eval, then checkpoints
            last = steps_done == max_steps
            vl = recipe.evaluate(ctx, steps_done, last)
            if vl is not None:
                result.val_losses[steps_done] = vl
                if stop_at_val_loss is not None and vl <= stop_at_val_loss:
                    stop_at_step, result.stop_reason = steps_done, "target"  # reached it: save and stop here
            signalled = any_rank(run.stop.stop, info)
            interrupted = signalled or (stop_at_step is not None and steps_done >= stop_at_step)
            if last or interrupted or (cfg.train.ckpt_every and steps_done % cfg.train.ckpt_every == 0):
                if any_rank(not weights_finite(model), info):  # never save (or prune for) NaN weights
                    log(f"step {steps_done}: the weights are not finite; stopping without a checkpoint (lower "
                        "optim.lr, check the data or the reward; resume from the last checkpoint)")
                    result.diverged_at = steps_done
                    break
                result.last_checkpoint = run.checkpointer.save(state, train_loss=stats["loss"],
                                                               tokens_seen=ctx.extras["tokens_seen"])
            if interrupted:
                result.interrupted = True
                result.stop_reason = "signal" if signalled else result.stop_reason or "stop_at_step"
                log(f"reached the target val loss {stop_at_val_loss:g} at step {steps_done} (val loss {vl:.4f}); "
                    "stopped" if result.stop_reason == "target" else f"stopped at step {steps_done}; continue with --resume")
                break
        result.tokens, result.seconds = ctx.extras["tokens_seen"], time.perf_counter() - t_start
        metrics.write("end", result.steps_done, interrupted=result.interrupted,
                      diverged=result.diverged_at is not None, seconds=result.seconds)
    return result


def tokens_before(meta: dict | None, cfg, step: int, dp_world: int) -> int:
    """Training tokens seen before ``step``: what the resumed checkpoint recorded (``tokens_seen``), so a
    resume with another train.total_batch_tokens keeps counting from the truth; computed from this run's
    batch (and its schedule) for a fresh run or a checkpoint from before the record."""
    saved = (meta or {}).get("tokens_seen")
    if isinstance(saved, int) and not isinstance(saved, bool):  # range checked by check_resume_meta
        return saved
    return cfg.train.tokens_before(step, dp_world)


@torch.no_grad()
def weights_finite(model: torch.nn.Module) -> bool:
    """This rank's parameters (its shards under FSDP) hold no nan or inf."""
    return all(bool(torch.isfinite(local_tensor(p)).all()) for p in model.parameters())
