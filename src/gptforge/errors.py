"""Errors that describe bad input and are shared across layers (the CLI prints them as one line and
exits 2). Each layer's own errors (``ConfigError``, ``ShardError``, ...) live with their code; the ones
here are raised by more than one layer."""


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


class ChatFormatError(ValueError):
    """A conversation or chat template that cannot be rendered (unknown role, no assistant turn, bad
    content, a damaged or hostile template). Defined here so both template kinds (data/chat.py and
    data/chat_jinja.py) raise it without importing each other."""
