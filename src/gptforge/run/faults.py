"""Faults at scale: advice on running out of memory, elastic restarts, and a fault-injection switch.

    GPTFORGE_FAULT_INJECT=1:5 torchrun --nproc_per_node 2 --max-restarts 1 -m gptforge train --preset tiny

torchrun's ``--max-restarts N`` restarts the whole worker group when a rank dies; the restarted
workers see ``TORCHELASTIC_RESTART_COUNT > 0`` and ``train()`` then resumes from the newest complete
checkpoint (checkpoints are renamed into place only when complete, so a rank dying mid-save leaves
nothing that resume would pick). ``GPTFORGE_FAULT_INJECT=RANK:STEP`` kills one rank mid-run to
exercise exactly that; ``RANK:STEP:int`` is a Ctrl-C (SIGINT) at a known step, which the tests send
to every training command in turn.
"""

from __future__ import annotations

import os
import signal
import sys

from gptforge import environment
from gptforge.config import Config, ConfigError
from gptforge.parallel.distributed import DistInfo


def out_of_memory(e: BaseException) -> bool:
    """An allocation the device refused: CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError ("[enforce
    fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"), which is no OutOfMemoryError."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def check_step_memory(cfg: Config, device, ranks_here: int = 1) -> None:
    """ResourceError, before the model is built, when a step of a language-model recipe (pretrain, sft) on the CPU
    cannot fit the memory free now (MemAvailable under any cgroup limit: :func:`gptforge.resources.free_memory`) by
    a lower bound: the float32 parameters (4 bytes each) and one (micro_batch x seq_len, padded vocabulary) tensor
    of logits in the compute dtype, which every path of the head materialises, for each of the ``ranks_here``
    processes on this machine.
    Past that, the CPU allocator's refusal came as a raw RuntimeError after gigabytes were allocated, or the
    kernel's OOM killer ended the run (and maybe others) unsaid. What the bound leaves out (gradients, optimizer
    state, activations) only adds, so a run it refuses could never have run; CUDA has its own OOM, met with
    :func:`oom_advice` and sized by `gptforge plan`."""
    from gptforge import resources
    from gptforge.errors import ResourceError
    from gptforge.models.registry import counts

    if getattr(device, "type", device) != "cpu":
        return
    free = resources.free_memory()
    if free is None:
        return
    avail = free.bytes
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    per_logit = 4 if cfg.train.dtype == "float32" else 2
    params = 4 * counts(cfg.model, T).params
    row = T * cfg.model.padded_vocab_size * per_logit  # one sequence's logits
    need = ranks_here * (params + B * row)
    if need <= avail:
        return
    fits = (avail // ranks_here - params) // row
    fix = (f"lower --train.micro_batch well below {fits + 1:,} (gradient accumulation keeps the "
           f"{cfg.train.total_batch_tokens:,}-token batch; the logits' gradient and the activations come on top of "
           "this bound)" if fits >= 1 else
           "lower --train.seq_len or use a smaller model")
    raise ResourceError(
        f"train.micro_batch={B:,} x train.seq_len={T:,} on the CPU needs at least {need / 2**30:,.1f} GiB a step "
        f"(the {B * T:,} tokens' logits over {cfg.model.padded_vocab_size:,} ids, {B * row / 2**30:,.1f} GiB, and the "
        f"parameters{f', in each of {ranks_here} processes' if ranks_here > 1 else ''}), and {free}: {fix}; "
        "`gptforge plan --measure` estimates a step's peak")


def oom_advice(cfg: Config, info: DistInfo, grad_accum: int) -> str:
    """What to turn when a step runs out of device memory."""
    B = cfg.train.micro_batch
    tips = [f"--train.micro_batch {max(1, B // 2)} (gradient accumulation grows to keep the "
            f"{cfg.train.total_batch_tokens:,}-token batch)"]
    if cfg.model.recompute != "block":
        tips.append(f"--model.recompute {'mlp' if cfg.model.recompute == 'none' else 'block'} (recompute activations)")
    if info.world > 1 and not info.zero and not info.fsdp:
        tips.append("--dist.shard zero1 (shard optimizer state across ranks)")
    if info.world > 1 and not info.fsdp:
        tips.append("--dist.shard fsdp (shard parameters, gradients and optimizer state)")
    return (
        f"out of {'device ' if info.device.type != 'cpu' else ''}memory at micro_batch {B} x seq_len {cfg.train.seq_len} (accum {grad_accum}, world "
        f"{info.world}, recompute {cfg.model.recompute}, sharding {info.sharded}). Try: " + "; ".join(tips)
        + ". `gptforge plan` estimates what fits a given GPU memory and world size."
    )


FAULT_ENV = "GPTFORGE_FAULT_INJECT"


def elastic_restart() -> bool:
    """True when torchrun (--max-restarts) has restarted this worker group after a failure."""
    return environment.number("TORCHELASTIC_RESTART_COUNT", 0) > 0


def exit_status(interrupted: bool) -> int:
    """The exit status of ``gptforge train``: 0 when finished, 130 when stopped by a signal (the
    shell's convention for Ctrl-C), except under torchrun, where a clean stop exits 0.

    torchrun reports any non-zero worker exit as ``ChildFailedError`` ("gptforge FAILED"), and with
    ``--max-restarts`` it would restart the group, which resumes and trains on: the stop would not
    stop. A rank that saved its checkpoint and said "stopped at step N" has not failed. What the
    workers cannot change: when torchrun itself gets the signal (Ctrl-C in its terminal), its agent
    raises ``SignalException`` and prints that traceback whatever the workers do; rank 0 says so.
    """
    if not interrupted:
        return 0
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return 130
    if os.environ.get("RANK", "0") == "0":
        print("(under torchrun: the run stopped cleanly at the checkpoint above and the workers exit 0; a "
              "SignalException traceback from torchrun after this, if any, is its own report of the signal "
              "it received)", file=sys.stderr, flush=True)
    return 0


def maybe_inject_fault(info: DistInfo, steps_done: int) -> None:
    """Fault injection for testing: ``GPTFORGE_FAULT_INJECT=RANK:STEP`` kills that rank (SIGKILL, no
    cleanup: like a crashed node) right after optimizer step STEP; ``RANK:STEP:term`` sends it SIGTERM
    instead (a polite stop that only this rank receives), ``RANK:STEP:int`` SIGINT (Ctrl-C), ``RANK:STEP:hup``
    SIGHUP (the terminal closed). First attempt only, so a group restarted by
    torchrun runs to the end."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or elastic_restart():
        return
    parts = spec.split(":")
    try:
        rank, step = int(parts[0]), int(parts[1])
        sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT,
               "hup": signal.SIGHUP}[parts[2] if len(parts) > 2 else "kill"]
        if len(parts) > 3:
            raise ValueError
    except (ValueError, IndexError, KeyError):
        raise ConfigError(f"{FAULT_ENV}={spec!r}: expected RANK:STEP or RANK:STEP:kill|term|int|hup, e.g. 1:5") from None
    if info.rank == rank and steps_done == step:
        print(f"[gptforge] {FAULT_ENV}: sending {sig.name} to rank {rank} after step {step}",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), sig)
