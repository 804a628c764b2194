"""What a prepare run is asked to do (:class:`PrepareSettings`) and whether any shard folder can be made
with it (:func:`check_settings`): every door (``prepare files``, ``prepare fineweb``, ``bench-prepare``)
refuses bad settings here, in one line naming the flag, before any work.

    gptforge prepare files corpus/ --out data/corpus --shard-tokens 100000000 --workers 8
"""

from __future__ import annotations

from dataclasses import dataclass

from gptforge.data.prepare.sources import SourceError
from gptforge.data.prepare.workers import available_cores
from gptforge.data.shards import MAX_TOKENS

DEFAULT_VAL_TOKENS = 10_485_760  # one validation pass of the GPT-2 presets: train.val_tokens = 20 x 524,288


@dataclass
class PrepareSettings:
    name: str = "data"  # shard file prefix: {name}_{val|train}_{index:06d}.bin
    shard_tokens: int = 100_000_000  # tokens per train shard (llm.c: 1e8)
    val_tokens: int | None = None  # val shard size; None = the source's default (DEFAULT_VAL_TOKENS for files)
    val_max_fraction: float = 0.1  # ... but at most this fraction of the corpus
    tokenizer: str = "gpt2"
    skip_bad: bool = False  # skip and count bad rows instead of stopping
    workers: int = 0  # tokenizer processes; 0 = all cores; 1 = tokenize in the main process
    start_method: str = "spawn"  # spawn everywhere: the parent runs pyarrow threads, unsafe to fork
    chunk_docs: int = 512  # documents per worker task
    chunk_chars: int = 1 << 20  # ... or about this many characters, whichever comes first

    def identity(self) -> dict:
        """The settings that decide the output bytes (the rest only decide speed)."""
        return {"name": self.name, "shard_tokens": self.shard_tokens, "tokenizer": self.tokenizer,
                "val_tokens": self.resolved_val_tokens(), "val_max_fraction": self.val_max_fraction}

    def resolved_val_tokens(self) -> int:
        return DEFAULT_VAL_TOKENS if self.val_tokens is None else self.val_tokens


# tokenizer processes per core at most: past one a core they add only start-up and memory (~70 MiB each); a few
# are allowed for timing oversubscription (bench-prepare), --workers 1e6 would have spawned processes without end
MAX_WORKERS_PER_CORE = 4


def check_settings(settings: PrepareSettings) -> int:
    """Refuse (SourceError naming the flag) settings no shard folder can be made with; the worker count to use.
    Every door checks with this before any work: prepare itself, and bench-prepare before its corpus is written."""
    if not 1 <= settings.shard_tokens <= MAX_TOKENS:
        raise SourceError(f"--shard-tokens {settings.shard_tokens}: must be a number of tokens in 1..{MAX_TOKENS:,} "
                          "(the llm.c header counts a shard's tokens in an int32; llm.c's own are 1e8)")
    if not 0 <= settings.resolved_val_tokens() <= MAX_TOKENS:
        raise SourceError(f"--val-tokens {settings.val_tokens}: must be in 0..{MAX_TOKENS:,} (0 = no validation "
                          "shard; the llm.c header counts a shard's tokens in an int32)")
    if not 0 < settings.val_max_fraction <= 1:
        raise SourceError(f"val_max_fraction {settings.val_max_fraction}: must be in (0, 1]")
    _check_name(settings.name)
    workers = settings.workers or available_cores()
    if not 1 <= workers <= MAX_WORKERS_PER_CORE * available_cores():
        raise SourceError(f"--workers {settings.workers}: must be in 1..{MAX_WORKERS_PER_CORE * available_cores():,} "
                          f"({MAX_WORKERS_PER_CORE} per core this process may use; 0 = all cores): more only add start-up "
                          "and memory, never speed")
    return workers


def _check_name(name: str) -> None:
    """``--name`` is the shards' file-name prefix, so it is one plain name: letters, digits, ``.``, ``_``, ``-``
    (a ``/`` or ``..`` wrote shards outside --out), and it holds neither ``train`` nor ``val``: train finds a
    split's shards by that word in the name (``*train*.bin``, ``*val*.bin``), so a prefix holding one
    ("interval", "train") put every shard in that split too: validation on training data, silently."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise SourceError(f"--name {name!r}: the shards' file-name prefix must be 1-100 letters, digits, '.', '_' "
                          "or '-', starting with a letter or digit (no '/', spaces or '..': shards go in --out)")
    split = next((w for w in ("train", "val") if w in name), None)
    if split:
        other = f"{name}_val_000000.bin" if split == "train" else f"{name}_train_000001.bin"
        raise SourceError(f"--name {name!r} holds {split!r}, the word `gptforge train` finds {split} shards by "
                          f"(*{split}*.bin), so {other} would be read as {split} data too; choose a name without "
                          "'train' or 'val'")
