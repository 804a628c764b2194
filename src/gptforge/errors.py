"""Errors that describe bad input and are shared across layers (the CLI prints them as one line and
exits 2). Each layer's own errors (``ConfigError``, ``ShardError``, ...) live with their code; the ones
here are raised by more than one layer."""


class CheckpointError(RuntimeError):
    """A checkpoint or model file that is missing, damaged or does not fit the model (names the file)."""
