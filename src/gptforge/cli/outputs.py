"""What each command writes, declared once: the CLI checks every declared output before the command
runs, and the writer test walks this table (tests/cli/test_writers.py), so a command added later with
an output flag it does not declare here fails that test.

    gptforge export hf --ckpt runs/x --out exports/x          # refused if exports/x holds files
    gptforge export hf --ckpt runs/x --out exports/x --force  # replaces them, never a run or checkpoint

Kinds:

* ``file`` / ``dir``: written by :mod:`gptforge.storage`'s one writer (temporary name, fsync, rename).
  An existing output is replaced only with ``--force``, and ``--force`` never replaces a checkpoint or
  a run directory; checked here before any work is done.
* ``run``: a run directory, written by the run stack (checkpoints renamed into place, ``--resume``,
  and training's own ``--force``).
* ``shards``: prepare's resumable shard folder (shards and manifest.json written by the same writer;
  re-running resumes, ``--force`` starts over).
* ``cache``: gptforge's cache folder (``$GPTFORGE_CACHE``), filled by the same writer.
* ``scratch``: a folder for temporary work files, deleted afterwards.
"""

from __future__ import annotations

import argparse
import os

# command -> {"[SUBCOMMAND ]--flag" (or "" for a fixed place): kind}
OUTPUTS: dict[str, dict[str, str]] = {
    "train": {"--out": "run"},
    "prepare": {"shakespeare --out": "shards", "fineweb --out": "shards", "files --out": "shards",
                "conversations --out": "file", "preferences --out": "file"},
    "assets": {"": "cache"},
    "bench": {"--json": "file", "--trace": "file", "--out": "run"},
    "bench-prepare": {"--json": "file", "--workdir": "scratch"},
    "eval": {"--json": "file"},
    "plot": {"--image": "file"},
    "export": {"--out": "dir"},
    "import": {"--out": "run"},
    "bench-generate": {"--json": "file"},
    "plan": {"--json": "file"},
    "race": {"--out": "run"},
    "sft": {"--out": "run"},
    "rl": {"--out": "run"},
    "rm": {"--out": "run"},
    "dpo": {"--out": "run"},
    "tokenizer": {"train --out": "dir"},
}
CHECKED = ("file", "dir")  # the kinds checked here, before the command runs
SUBCOMMAND_DESTS = ("source_name", "action", "format")  # where a command keeps its subcommand's name


def declared(command: str, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(flag, dest, kind) of each output ``command`` declares for the subcommand ``args`` chose."""
    chosen = {getattr(args, d, None) for d in SUBCOMMAND_DESTS}
    out = []
    for key, kind in OUTPUTS.get(command, {}).items():
        sub, _, flag = key.rpartition(" ")
        if flag and (not sub or sub in chosen):
            out.append((flag, flag.lstrip("-").replace("-", "_"), kind))
    return out


def writes_files(command: str, args: argparse.Namespace) -> bool:
    """Whether this invocation's work is files: an output flag given, or shards or the cache, which have a default
    place (a fixed one: ``assets``). Then a closed stdout does not end it before they are written
    (gptforge.environment.delivering)."""
    return "" in OUTPUTS.get(command, {}) or any(getattr(args, dest, None) or kind in ("shards", "cache")
                                                  for _, dest, kind in declared(command, args))


def check_outputs(command: str, args: argparse.Namespace) -> None:
    """Refuse (OutputExistsError, one line) a declared file or folder output that exists without
    ``--force``, or that is a checkpoint or run directory, and (CliError) any output whose place cannot
    take it (a file where a folder is needed above it, a read-only folder), before the command does any work."""
    from gptforge.cli.common import CliError
    from gptforge.run.preflight import place_fault
    from gptforge.storage.guards import check_output, check_shard_folder, literal_home

    for flag, dest, kind in declared(command, args):
        value = getattr(args, dest, None)
        home = literal_home(value, flag) if isinstance(value, str) else None
        if home:  # every kind: a run, shards and a cache land in ./~ as a file does
            raise CliError(home)
        if kind in CHECKED and isinstance(value, str) and not value.strip():  # `--json ""`: no path, not "none"
            raise CliError(f"{flag} is empty; name the {'file' if kind == 'file' else 'folder'} to write")
        if kind == "file" and isinstance(value, str) and value.endswith(("/", os.sep)):  # `--json results/`: pathlib
            # drops the slash, so a file named `results` was written where a folder was meant
            raise CliError(f"{flag} {value} ends with '/', a folder; name the file to write in it ({flag} {value}FILE)")
        if kind in CHECKED and value:
            check_output(value, bool(getattr(args, "force", False)), kind, flag)
        if kind == "run" and isinstance(value, str) and value:  # the run stack's own preflight, before the work
            if getattr(args, "resume", None) is None:  # a resume: its session says first what it can resume, then this
                from gptforge.run.preflight import check_run_dir  # (with the config: torch; a run's command loads it)

                check_run_dir(value)  # (import's reading of the model; train's at RunSession says the same again)
        elif isinstance(value, str) and value:  # a file above it, a read-only folder: before the work, not after it
            fault = place_fault(value, flag)
            if fault:
                raise CliError(fault)
        if kind == "shards" and value:  # resumable, so not CHECKED for --force; but never into a run
            check_shard_folder(value, flag)
