"""Errors that describe bad input and are shared across layers (the CLI prints them as one line and
exits 2). Each layer's own errors (``ConfigError``, ``ShardError``, ...) live with their code; the ones
here are raised by more than one layer."""

import functools


class UserError(Exception):
    """Bad input whose message is for the user as it stands: the command line's one door (gptforge.cli) prints any
    error of this kind as one line, exit 2, whichever command and however deep it was raised. A class derived from
    it (with ValueError or another base its callers catch) needs no entry in the door's list, so an error a
    command did not expect to meet is never a traceback."""


class CheckpointError(RuntimeError):
    """A checkpoint or model file that is missing, damaged or does not fit the model (names the file)."""


class LoaderStateError(CheckpointError):
    """A checkpoint's saved run position (meta.json ``loader``: the data position, an RL run's state)
    that is missing, of the wrong type or out of range. The checkpointer names the file."""


def saved_int(state: object, key: str, lo: int, hi: int | None = None, section: str = "loader") -> int:
    """``state[key]`` of what a checkpoint saved to resume from (``section`` names where in meta.json: the
    loader state by default, "" for a top-level key), which must be an integer in [lo, hi) (hi None: no
    upper bound); else LoaderStateError naming the field. A checkpoint is data: a position read back
    from it is checked like any other input before it steers a run."""
    v = state.get(key) if isinstance(state, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v >= hi):
        want = f"an integer in [{lo}, {hi})" if hi is not None else f"an integer >= {lo}"
        raise LoaderStateError(f"{section + '.' if section else ''}{key} = {v!r}: not {want}")
    return v


def saved_bool(state: object, key: str, section: str = "loader") -> bool:
    """``state[key]``, which must be true or false (a string "false" is not false)."""
    v = state.get(key) if isinstance(state, dict) else None
    if not isinstance(v, bool):
        raise LoaderStateError(f"{section + '.' if section else ''}{key} = {v!r}: not true or false")
    return v


class ResourceError(ValueError):
    """Work that does not fit the machine, found before it is started (a model whose parameters alone
    are more memory than this machine has free): the message says how much is needed and what is there."""


class ChatFormatError(ValueError):
    """A conversation or chat template that cannot be rendered (unknown role, no assistant turn, bad
    content, a damaged or hostile template). Defined here so both template kinds (data/chat.py and
    data/chat_jinja.py) raise it without importing each other."""


@functools.cache
def field_types(cls: type) -> dict:
    """A dataclass's field name -> type, evaluated once per class (``typing.get_type_hints`` compiles every
    annotation string on each call: 10 ms per Config load before it was cached). The one cache for the
    config's loaders and the saved-config checks below."""
    import typing

    return typing.get_type_hints(cls)


def saved_field_types(section: str, cls: type, values: dict) -> None:
    """Each value of ``values`` (a config section read back from a checkpoint's meta.json) has the JSON
    type its dataclass field ``cls`` declares (bool, int, float, str, a Literal's values, Optional),
    else ValueError naming ``section.key``, what was found and what was expected. The command line's
    parser converts strings to these types; a saved config is JSON already, so its types are checked
    instead, before ``__post_init__`` compares a string with a number (a TypeError traceback)."""
    import dataclasses
    import typing

    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in values and not _json_is(values[f.name], hints.get(f.name, typing.Any)):
            raise ValueError(f"{section}.{f.name} = {values[f.name]!r:.80}: expected {_json_name(hints[f.name])} "
                             "(the saved config is damaged)")


def _json_is(v: object, tp: object) -> bool:
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return True
    if origin is typing.Union:
        return any(_json_is(v, a) for a in args)
    if tp is type(None):
        return v is None
    if origin is typing.Literal:
        return any(v == a and type(v) is type(a) for a in args)
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is str:
        return isinstance(v, str)
    return True  # containers and nested types: their own readers check them


def _json_name(tp: object) -> str:
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join(_json_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(tp, str(tp))


def flagged(flag: str, error: object) -> str:
    """``error`` (an exception or its words) as a refusal of the option ``flag`` (``--tokenizer``, or with its value,
    ``--judge RM``): ``flag: words``, unless the words already start by naming that option, as the layer below often
    words its own refusals (``--tokenizer X: not gpt2, ...``). The one way a command puts its flag before an error
    it re-raises: each wrap that added its prefix unconditionally said ``--tokenizer: --tokenizer X: ...``."""
    words = str(error)
    name = flag.split()[0]
    if words == name or words.startswith((f"{name} ", f"{name}:", f"{name}=")):
        return words
    return f"{flag}: {words}"
