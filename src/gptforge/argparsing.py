"""The command line's parser: one class for every ``gptforge`` command and every ``python -m gptforge.bench.*``
tool, so a refusal reads the same everywhere.

    >>> p = OneLineParser(prog="gptforge eval")
    >>> p.add_argument("--limit", type=int)        # parses through count(): 1e4 and 32_768 taken, nan refused

argparse's own refusal (a bad value, an unknown or missing flag) is one line naming the flag and pointing at
``--help``, exit 2, like every other bad input, instead of the command's whole usage above it. Every
``type=int`` / ``type=float`` flag parses through gptforge.numbers, the one number parser.
"""

from __future__ import annotations

import argparse

from gptforge.numbers import parse_float, parse_int


def count(raw: str) -> int:
    """An integer flag (argparse type; ``type=int`` is this too): also written 1e8 or 100_000_000; not
    finite, not whole or past 64 bits is refused naming the flag (gptforge.numbers, the one number parser)."""
    try:
        return parse_int(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def finite(raw: str) -> float:
    """A float flag (``type=float`` is this too): nan, inf and 1e400 are refused naming the flag (exit 2)."""
    try:
        return parse_float(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusal as one line, exit 2, instead of the command's whole usage (16 lines for ``rl``) above
    it. Sub-commands' parsers are of this class too (``add_subparsers`` makes its parsers of the parent's type),
    so every command has it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # every `type=int` / `type=float` flag of every command (argument groups share this registry) parses
        # through the one number parser: 1e400, nan and 2**64 are one line naming the flag, not a traceback
        self.register("type", int, count)
        self.register("type", float, finite)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def tool_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of a ``python -m gptforge.bench.*`` tool: the commands' own class, so its numbers parse as every
    command's do (1e4, 32_768; nan, 1e30 and 2**64 refused naming the flag) and a refusal is one line, exit 2."""
    return OneLineParser(prog=prog, description=description)


def check_tool_output(p: argparse.ArgumentParser, path: str | None, flag: str = "--json") -> None:
    """A tool's output file checked before any work, as the commands' are (cli/outputs.py): empty, a folder or a
    device is one line through ``p.error``; an existing file is replaced (the tools have no --force)."""
    if path is None:
        return
    from gptforge.storage import OutputError, check_output

    if not path.strip():
        p.error(f"{flag} is empty; name the file to write")
    try:
        check_output(path, True, "file", flag)
    except OutputError as e:
        p.error(str(e))
