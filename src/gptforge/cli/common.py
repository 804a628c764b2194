"""What the command modules share: the bad-input error, the model-source flags, number parsing, and the
one path from a command line to a run (fresh, resumed or started over) that train, sft and rl take."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from gptforge.load import ModelSource


class CliError(Exception):
    """Bad input: printed without a traceback, exit status 2."""


def add_model_source(p: argparse.ArgumentParser) -> None:
    """The same four flags wherever a command takes a model."""
    p.add_argument("--ckpt", help="checkpoint directory, or a run directory (its newest checkpoint)")
    p.add_argument("--hf", help="Hugging Face hub name (online) or save_pretrained directory")
    p.add_argument("--llmc", help="llm.c model file (gpt2_124M.bin, version 3 or 5)")
    p.add_argument("--random", metavar="SIZE", help="random weights of a model size (d2, gpt2, ...): "
                                                   "benchmarks and smoke tests")


def model_source(args: argparse.Namespace) -> ModelSource:
    src = ModelSource(ckpt=args.ckpt, hf=args.hf, llmc=args.llmc, random=args.random)
    if len(src.given()) != 1:
        raise CliError("give exactly one of --ckpt DIR, --hf NAME_OR_DIR, --llmc FILE or --random SIZE")
    return src


def load(source: ModelSource):
    """``load.load_model`` with its bad-input errors as CliError."""
    from gptforge.load import load_model

    try:
        return load_model(source)
    except ValueError as e:
        raise CliError(str(e)) from e


def count(raw: str) -> int:
    """An integer that may be written 1e8 or 100_000_000."""
    try:
        v = float(raw.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not v.is_integer():
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number")
    return int(v)


def chat_template_of(ckpt: str | None):
    """The chat template a checkpoint (or run directory) carries, or None."""
    if ckpt is None:
        return None
    from gptforge.data.chat import template_from_meta
    from gptforge.run import checkpoint as ckpt_mod

    return template_from_meta(ckpt_mod.read_meta(ckpt_mod.resolve_checkpoint(ckpt)))


# --- the one resume / force path of train, sft and rl ----------------------------------------------

COMMAND_OF = {"pretrain": "train", "sft": "sft", "grpo": "rl", "ppo": "rl", "rm": "rm", "dpo": "dpo"}  # recipe -> the command that continues it


def resolve_run(out: str | None, resume: str | None, overrides: list[str], recipe: str | tuple[str, ...], fresh: Callable[[], object],
                trusted: bool = False, frozen: tuple[str, ...] = (), default_out: str | None = None):
    """(config, checkpoint to resume or None, its meta or None) for ``gptforge train|sft|rl``.

    A fresh run is ``fresh()`` (a preset or the recipe's defaults with this command line applied). A
    resumed run is the checkpoint's own config with this command line's overrides on top, all of them
    applied (``frozen`` keys refused if changed), written to ``out``, else to the run the ``--resume``
    path names, else to ``default_out``; never where the checkpoint says it came from. It must be a run
    of the same recipe (or one of a tuple: ``rl`` continues GRPO and PPO). Trust comes only from this command line. ``--force`` (start over) is the
    loop's, after data and model are known to be good."""
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.checkpointer import Checkpointer
    from gptforge.run.resume import recipe_of, resume_config

    if resume is None:
        cfg = fresh()
        cfg.train.trust_checkpoint = trusted
        return cfg, None, None
    run_dir = out
    if run_dir is None and resume != "latest":  # --resume PATH: the run that PATH is in
        where = ckpt.resolve_checkpoint(resume)
        run_dir = str(where.parent.parent if where.parent.name == "checkpoints" else where)
    run_dir = run_dir or default_out
    if not run_dir:
        raise CliError("--resume needs --out RUN_DIR (or the checkpoint itself: --resume RUN/checkpoints/step_N)")
    found = Checkpointer.find(run_dir, resume, warn=lambda m: print(m, file=sys.stderr))
    meta = ckpt.read_meta(found)
    kind = recipe_of(meta)
    if kind not in ((recipe,) if isinstance(recipe, str) else recipe):
        name = recipe if isinstance(recipe, str) else COMMAND_OF[recipe[0]]
        raise CliError(f"--resume: {found} is a {kind} checkpoint; continue it with `gptforge {COMMAND_OF[kind]} "
                       f"--out {run_dir} --resume`, or start a new {name} run from it with --init-from")
    cfg = resume_config(meta, overrides, run_dir, frozen)
    cfg.train.trust_checkpoint = trusted
    return cfg, found, meta


def init_from(source: str, cfg) -> Callable:
    """Fine-tuning: take the model's family and shape from a gptforge checkpoint, a Hugging Face
    directory or an llm.c model file (so it overrides the preset's) and return a function that copies
    its weights in."""
    src = load(ModelSource.from_path(source))
    knobs = {k: getattr(cfg.model, k) for k in ("dropout", "recompute", "flash")  # training knobs stay the preset's
             if hasattr(cfg.model, k) and hasattr(src.config, k)}
    cfg.model = dataclasses.replace(src.config, **knobs)
    sd = src.state_dict()

    def init_weights(model) -> None:
        model.load_state_dict(sd)

    return init_weights


def finish(result, command: str) -> int:
    """The exit status of a training command: 3 diverged (nothing saved past the last good checkpoint),
    130 stopped by a signal (0 under torchrun; see run.faults.exit_status), 0 done."""
    from gptforge.run.faults import exit_status

    if result.diverged_at is not None:
        print(f"gptforge {command}: the run diverged (not finite) at step {result.diverged_at} (see the log line above); "
              f"nothing was saved past the last checkpoint: lower --optim.lr or check the data or reward, then "
              f"resume with --resume", file=sys.stderr)
        return 3
    return exit_status(result.interrupted)
