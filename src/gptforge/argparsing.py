"""The command line's parser: one class for every ``gptforge`` command and every ``python -m gptforge.bench.*``
tool, so a refusal reads the same everywhere.

    >>> p = OneLineParser(prog="gptforge eval")
    >>> p.add_argument("--limit", type=int)        # parses through count(): 1e4 and 32_768 taken, nan refused

argparse's own refusal (a bad value, an unknown or missing flag) is one line naming the flag and pointing at
``--help``, exit 2, like every other bad input, instead of the command's whole usage above it. Every
``type=int`` / ``type=float`` flag parses through gptforge.numbers, the one number parser.

A single-valued option given twice with different values (``--steps 5 ... --steps 50``, ``--world 4 --gpus 8``,
``--optim.lr 1e-3 ... --optim.lr 3e-4`` among a command's ``--section.key`` overrides) takes the last, as argparse
and nanoGPT's configurator do, so a script that appends its own settings to a shared line (``gptforge train
$COMMON --optim.lr 3e-4``) overrides it; the parser says so in one line on stderr naming the flag, both values and
the one taken (argparse kept the last in silence, so a long line's earlier value was lost unseen). The same value
twice (``--optim.lr 1e-3 --optim.lr 0.001``) says nothing. Options meant to repeat (``action="append"``:
``--prompt``, ``--stop``, ``--special``, ``--switch``) keep every value.
"""

from __future__ import annotations

import argparse

from gptforge.numbers import parse_float, parse_int

MAX_SEED = 2**32  # as gptforge.config's seeds: numpy's range, and every seeded generator's
# the options whose empty value means something: an empty prompt (sample from the model's first token on), no system
# prompt. Every other option and positional names a file, folder, model, word or number, where '' named the current
# folder (`prepare files ''` read it whole), turned a guard off (`serve --api-key "$UNSET"` served without a key) or
# fell through to a traceback, so '' is refused by name at the parser, for every command and tool alike.
EMPTY_MEANS_SOMETHING = frozenset({"prompt", "system"})


def count(raw: str) -> int:
    """An integer flag (argparse type; ``type=int`` is this too): also written 1e8 or 100_000_000; not ASCII
    ('１０'), an underscore that separates no thousands ('1_0'), not finite, not whole or past 64 bits is refused
    naming the flag (gptforge.numbers, the one number parser)."""
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


def _same(a: object, b: object) -> bool:
    """Two values of one option agree: equal as parsed, or (an override's text) as numbers (1e-3 and 0.001)."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str):
        try:
            return parse_float(a) == parse_float(b)
        except ValueError:
            return False
    return False


def _shown(raw: list[str] | None, value: object) -> str:
    """A value as the command line wrote it (its words), else as parsed."""
    if raw:
        return repr(raw[0]) if len(raw) == 1 else repr(" ".join(raw))
    return repr(value)


def overridden(flag: str, before: str, now: str, now_flag: str | None = None) -> str:
    """The line said when a later setting of one option replaces an earlier, different one (the last is taken)."""
    if now_flag is None or now_flag == flag:
        return f"{flag} given twice, {before} then {now}: the last, {now}, is taken"
    return f"{flag} {before} and {now_flag} {now} set the same option: the last, {now_flag} {now}, is taken"


class _Once:
    """Mixin of the single-valued actions (store, store_const, store_true, store_false): a setting of one ``dest``
    that replaces an earlier, different one in the same parse is said in one line on stderr (the last is taken)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(parser, "_given", None)
        if given is not None and self.option_strings:
            raw = getattr(parser, "_raw", {}).pop(id(self), None)
            value = self.const if self.nargs == 0 else values
            first = given.get(self.dest)
            if first is not None and not _same(first[2], value):
                flag, raw0, value0 = first
                if self.nargs == 0:
                    msg = f"{flag} and {option_string} contradict each other: the last, {option_string}, is taken"
                else:
                    msg = overridden(flag, _shown(raw0, value0), _shown(raw, value), option_string)
                _say(parser, msg)
            given[self.dest] = (option_string, raw, value)
        super().__call__(parser, namespace, values, option_string)  # type: ignore[misc]


def _say(parser: argparse.ArgumentParser, msg: str) -> None:
    import sys

    print(f"{parser.prog}: {msg}", file=sys.stderr, flush=True)


class _StoreOnce(_Once, argparse._StoreAction):
    pass


class _StoreConstOnce(_Once, argparse._StoreConstAction):
    pass


class _StoreTrueOnce(_Once, argparse._StoreTrueAction):
    pass


class _StoreFalseOnce(_Once, argparse._StoreFalseAction):
    pass


def _joined(args: list[str]) -> list[str]:
    """``--section.key VALUE`` as the one word ``--section.key=VALUE``: argparse knows no ``--section.key`` and so
    not that it takes a value, and gave that value to a positional (``race --train.max_steps 5 tiny small`` raced
    a preset named 5). Nothing after ``--`` is touched; a value starting ``--`` is left for override_pairs to
    name as missing."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        if a.startswith("--") and "=" not in a and "." in a and i + 1 < len(args) \
                and not args[i + 1].startswith("--"):
            out.append(f"{a}={args[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def repeated_overrides(args: list[str]) -> list[str]:
    """A line for each ``--section.key=VALUE`` override (as :func:`_joined` writes them all) that replaces an
    earlier, different value of its key (config.apply_overrides applies them in order: the last is taken)."""
    seen: dict[str, str] = {}
    said: list[str] = []
    for a in args:
        if a == "--":
            break
        if a.startswith("--") and "=" in a and "." in a.split("=", 1)[0]:
            key, value = a[2:].split("=", 1)
            if key in seen and not _same(seen[key], value):
                said.append(overridden(f"--{key}", repr(seen[key]), repr(value)))
            seen[key] = value
    return said


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
        # every single-valued option says when a second, different value replaces the first (the docstring: why)
        for name, cls in ((None, _StoreOnce), ("store", _StoreOnce), ("store_const", _StoreConstOnce),
                          ("store_true", _StoreTrueOnce), ("store_false", _StoreFalseOnce)):
            self.register("action", name, cls)
        self._given: dict[str, tuple] | None = None
        self._raw: dict[int, list[str]] = {}

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        import sys

        args = _joined(list(sys.argv[1:] if args is None else args))
        # in the parser of the command (the one without sub-commands), whose name the line then bears
        for msg in [] if self._subparsers is not None else repeated_overrides(args):
            _say(self, msg)
        self._words = args  # what a refusal of a missing option looks through for its typo
        outer = self._given
        self._given, self._raw = {}, {}
        try:
            parsed, rest = super().parse_known_args(args, namespace)
        finally:
            self._given = outer
        self._check_seeds(parsed)
        return parsed, rest

    def _check_seeds(self, parsed: argparse.Namespace) -> None:
        """Every ``--seed``-like flag of every command (and tool) is a seed as the config's seeds are, [0, 2**32):
        Python's random takes a negative seed as its absolute value, so ``prepare conversations --seed -3`` wrote
        the very file ``--seed 3`` did, and sample's torch took -1 as 2**64-1 while refusing 2**64-1 itself."""
        for a in self._actions:
            value = getattr(parsed, a.dest, None)
            if a.option_strings and a.dest.endswith("seed") and isinstance(value, int) and not isinstance(value, bool) \
                    and not 0 <= value < MAX_SEED:
                self.error(f"argument {'/'.join(a.option_strings)}: {value} is not a seed: expected an integer in "
                           "[0, 2**32) (Python's random would take a negative seed as its absolute value)")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, rest = self.parse_known_args(args, namespace)
        refuse_strays(self, rest)  # the tools' parsers too: a mistyped option named with the one it is close to
        return parsed

    def _get_values(self, action, arg_strings):  # the words as written, for a refusal that quotes them
        self._raw[id(action)] = list(arg_strings)
        if "" in arg_strings and action.dest not in EMPTY_MEANS_SOMETHING \
                and action.nargs not in (argparse.PARSER, argparse.REMAINDER):  # a command's words: its own parser
            name = "/".join(action.option_strings) or action.metavar or action.dest
            raise argparse.ArgumentError(None, f"argument {name}: '' is empty; it names no file, folder or value "
                                               "(give one, or leave the option out for its default)")
        return super()._get_values(action, arg_strings)

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("the following arguments are required:"):  # `--outt x` for --out: the typo, named
            import difflib
            import re

            known = {o for a in self._actions for o in a.option_strings}
            needed = re.findall(r"--[\w-]+", message)
            typos = [(w, c[0]) for w in {x.split("=", 1)[0] for x in getattr(self, "_words", [])
                                         if x.startswith("--") and "." not in x} - known
                     if (c := difflib.get_close_matches(w, needed, n=1))]
            message += "".join(f"; {w} is not an option here: did you mean {c}?" for w, c in sorted(typos))
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def refuse_strays(parser: argparse.ArgumentParser, strays: list[str]) -> None:
    """Refuse words no option of ``parser`` (the command's own, the sub-command's where it has one) took, through
    its one-line error, naming each ``--option`` the parser knows that is close to a mistyped one: ``sample --promt
    hi`` is "unrecognized arguments: --promt hi; did you mean --prompt?" from ``gptforge sample``, where it was the
    top-level parser's "gptforge: error: ..." pointing at ``gptforge --help``, with no hint. No-op when empty."""
    import difflib

    if not strays:
        return
    known = {o[2:]: o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    close = []
    for word in strays:  # compared without the dashes every option shares (--out is not close to --gpu)
        if word.startswith("--") and word != "--":
            close += [known[c] for c in difflib.get_close_matches(word.split("=", 1)[0][2:], list(known), n=2)
                      if known[c] not in close]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    parser.error(f"unrecognized arguments: {' '.join(strays)}{hint}")


def chosen_parser(parser: argparse.ArgumentParser, names: list[str]) -> argparse.ArgumentParser:
    """The parser of the command (and sub-command) a parse chose: down ``parser``'s sub-parsers by the first of
    ``names`` (the chosen command's name first, then its sub-command's) each level knows."""
    while parser._subparsers is not None:
        action = next((a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction)),
                      None)
        name = next((n for n in names if action is not None and n in action.choices), None)
        if name is None:
            break
        parser = action.choices[name]
    return parser


def tool_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of a ``python -m gptforge.bench.*`` tool: the commands' own class, so its numbers parse as every
    command's do (1e4, 32_768; nan, 1e30 and 2**64 refused naming the flag) and a refusal is one line, exit 2."""
    return OneLineParser(prog=prog, description=description)


def check_tool_output(p: argparse.ArgumentParser, path: str | None, flag: str = "--json") -> None:
    """A tool's output file checked before any work, as the commands' are (cli/outputs.py): empty, a folder or a
    device is one line through ``p.error``; an existing file is replaced (the tools have no --force)."""
    if path is None:
        return
    from gptforge.storage.faults import OutputError
    from gptforge.storage.guards import check_output

    if not path.strip():
        p.error(f"{flag} is empty; name the file to write")
    try:
        check_output(path, True, "file", flag)
    except OutputError as e:
        p.error(str(e))
