"""What the command modules share: the bad-input error, the model-source flags, number parsing."""

from __future__ import annotations

import argparse
from pathlib import Path

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


def port(raw: str) -> int:
    """A TCP port number (argparse type): one line for 99999 instead of the server's tracebacks."""
    try:
        v = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{v} is not a TCP port; give 1 to 65535")
    return v


def chat_template_of(ckpt: str | None):
    """The chat template a checkpoint (or run directory) carries, or None."""
    if ckpt is None:
        return None
    from gptforge.data.chat import ChatFormatError, template_from_meta
    from gptforge.training import checkpoint as ckpt_mod

    where = ckpt_mod.resolve_checkpoint(ckpt)
    try:
        return template_from_meta(ckpt_mod.read_meta(where), where=str(Path(where) / "meta.json"))
    except ChatFormatError as e:
        raise CliError(str(e)) from None
