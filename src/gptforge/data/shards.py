"""llm.c-compatible token shards: write, read, validate.

Layout: a header of 256 little-endian int32 — ``[magic, version, n_tokens, 0...]`` — then the
tokens. Magic 20240520 / version 1 stores uint16 tokens (vocabularies up to 65,536); magic
20240801 / version 7 stores uint32 tokens for wider vocabularies. Writers pick the narrowest
format that fits; readers check magic, version, count and file length and name the bad file.

    >>> write_shard("val_000000.bin", tokens); read_shard("val_000000.bin")

A shard folder is written by one ``prepare`` at a time and read by any number of readers, never both at once:
``prepare`` holds ``FOLDER/.gptforge-prepare.lock`` exclusive while it writes (:func:`writing`), and every
reader shared while it reads (:func:`reading`: :func:`list_shards` takes it, and the list it returns holds it;
:class:`gptforge.data.loader.ShardLoader` holds it as long as the loader lives). A prepare meeting a reader (a
``train`` whose loader opens shards over epochs), or a reader meeting a prepare, is refused in one line naming
the folder and the other's pid, before any work. A folder where no lock can be taken (a read-only mount without
the lock file, a filesystem without flock) is read unlocked, said once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gptforge.reading import LOOP, not_a_file
from gptforge.storage.lock import FolderLock, Held

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
FORMATS = {  # magic -> (version, token dtype)
    20240520: (1, np.dtype("<u2")),
    20240801: (7, np.dtype("<u4")),
}


MAX_TOKENS = 2**31 - 1  # the header counts tokens in an int32: no shard holds more
MANIFEST = "manifest.json"  # prepare's record of a shard folder (data/prepare/manifest.py writes it; read here)
SHARD_LOCK_NAME = ".gptforge-prepare.lock"  # a shard folder's (not run/lock's LOCK_NAME, which marks a run directory)


class ShardError(ValueError):
    """A shard file that is missing, truncated or not in the llm.c format."""


class TokenRangeError(ShardError):
    """A shard holds a token id the model has no embedding row for (or only a padding row)."""


def magic_for(max_token: int) -> int:
    return 20240520 if max_token < 2**16 else 20240801


def write_shard(path: str | os.PathLike, tokens, magic: int | None = None) -> Path:
    """Write tokens atomically (temporary name, fsync, rename): a crash never leaves a partial shard."""
    path = Path(path)
    toks = np.asarray(tokens)
    if toks.ndim != 1:
        raise ValueError("tokens must be one-dimensional")
    if toks.size > MAX_TOKENS:
        raise ShardError(f"{path}: {toks.size:,} tokens is more than one shard holds (the llm.c header counts at most "
                         f"{MAX_TOKENS:,}); write them as several shards")
    if toks.size and (toks.min() < 0):
        raise ValueError(f"{path}: negative token id {int(toks.min())}")
    max_tok = int(toks.max()) if toks.size else 0
    magic = magic or magic_for(max_tok)
    version, dtype = FORMATS[magic]
    if max_tok > np.iinfo(dtype).max:
        raise ValueError(f"{path}: token {max_tok} does not fit {dtype} (magic {magic})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = magic, version, toks.size
    from gptforge.storage import atomic_open

    with atomic_open(path, "wb", what="the shard") as f:  # never a partial shard under the final name
        f.write(header.tobytes())
        f.write(toks.astype(dtype, copy=False).tobytes())
    return path


def read_header(path: str | os.PathLike) -> tuple[int, int, int, np.dtype]:
    """Return (magic, version, n_tokens, dtype) after checking the header and the file length."""
    path = Path(path)
    if not path.exists():
        raise ShardError(f"{path}: shard file does not exist")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte llm.c header; re-create it")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, n = int(header[0]), int(header[1]), int(header[2])
    if magic not in FORMATS:
        raise ShardError(
            f"{path}: bad magic {magic}; expected {' or '.join(map(str, FORMATS))} (llm.c token shard). "
            "Is this a token shard? Re-create it with `gptforge prepare`."
        )
    want_version, dtype = FORMATS[magic]
    if version != want_version:
        raise ShardError(f"{path}: magic {magic} needs version {want_version}, header says {version}")
    expected = HEADER_BYTES + n * dtype.itemsize
    if n < 0 or size != expected:
        raise ShardError(
            f"{path}: header says {n} tokens ({expected} bytes) but the file has {size} bytes; "
            "it is truncated or corrupt: delete it and re-run `gptforge prepare`"
        )
    return magic, version, n, dtype


def read_shard(path: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """Tokens of one shard as a numpy array (memory-mapped by default)."""
    _, _, n, dtype = read_header(path)
    if mmap:
        return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,))
    return np.fromfile(path, dtype=dtype, offset=HEADER_BYTES, count=n)


def check_token_ids(path: str | os.PathLike, vocab_size: int, tokens: np.ndarray | None = None) -> int:
    """Refuse a shard holding an id >= ``vocab_size``; return its largest id (-1 when empty).

    One vectorised ``max`` over the memory-mapped tokens (about disk speed: ~0.1 s per 100M-token
    shard from the page cache); the offending offset is searched for only when the check fails.
    ``vocab_size`` is the model's real vocabulary, not the padded one: ids in the padded range
    (50257..50303 for GPT-2) would index embedding rows the loss masks out, so they are refused too.
    Without this an out-of-range id is a raw IndexError on CPU, a device-side assert on a GPU, hours in.
    """
    toks = read_shard(path) if tokens is None else tokens
    if toks.size == 0:
        return -1
    hi = int(toks.max())
    if hi >= vocab_size:
        offset = int(np.argmax(toks >= vocab_size))
        raise TokenRangeError(
            f"{path}: token id {int(toks[offset])} at token offset {offset} is outside model.vocab_size="
            f"{vocab_size} (ids 0..{vocab_size - 1}; the largest id in this shard is {hi}). The data was "
            f"tokenized with a larger vocabulary: set --model.vocab_size {hi + 1} or more (GPT-2's is 50257), "
            "or re-create the shards with the model's tokenizer"
        )
    return hi


def unfinished_prepare(d: Path) -> str | None:
    """Why the shards in ``d`` are not yet a dataset: the ``gptforge prepare`` that writes them has not finished
    (stopped by Ctrl-C, SIGTERM, a full disk, a killed job, or still running), which its manifest.json says
    (``"complete": false``). Its finished shards are whole, so every reader took them for the corpus: a run
    trained on a part of it, without a word, and its epochs repeated that part. None when there is no manifest
    (shards of llm.c or another tool), or it says complete, or it is damaged (the tokenizer check names that)."""
    from gptforge.reading import read_json

    path = d / MANIFEST
    if not path.is_file():
        return None
    try:
        m = read_json(path, ShardError, "shard manifest")
    except (ShardError, OSError):
        return None
    if m.get("complete") is not False:
        return None
    shards = m.get("shards") if isinstance(m.get("shards"), list) else []
    tokens = m.get("tokens") if isinstance(m.get("tokens"), int) else 0
    return (f"data directory {d}: the `gptforge prepare` that writes it has not finished ({path} says \"complete\": "
            f"false; {len(shards)} shard{'s' * (len(shards) != 1)}, {tokens:,} tokens so far), so a run would train "
            "on part of the corpus; run the same prepare command again to finish it (it resumes where it stopped), "
            f"or, to train on what is there, delete {path} (prepare then cannot resume it)")


class Reading:
    """A shared hold on a shard folder for as long as its shards are read: released by :meth:`close`, or when the
    last reference to it goes (a loader's, a list's). Refused (:class:`ShardError`, one line) while a ``prepare``
    writes the folder."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        hold = FolderLock(self.folder, SHARD_LOCK_NAME, shared=True)
        try:
            hold.acquire()
        except Held as e:
            raise ShardError(
                f"data directory {self.folder}: a `gptforge prepare` is writing it now ({e.holders}), so a run would "
                "read a part of the corpus, or shards it is replacing; wait for it to finish (or stop it), then start "
                "this again") from None
        if hold.unsupported:
            _say_once(self.folder, f"warning: {hold.path}: {hold.unsupported}; its shards are read without the lock, "
                                   "so nothing stops a `gptforge prepare --force` from rewriting them meanwhile")
        self._release = weakref.finalize(self, hold.release)  # the hold, not self: collected with its owner

    def close(self) -> None:
        self._release()


_SAID: set[str] = set()


def _say_once(folder: Path, line: str) -> None:
    """One line a process says once a folder (every loader of a run reads the same folder)."""
    if str(folder) not in _SAID:
        _SAID.add(str(folder))
        print(line, file=sys.stderr)


def reading(folder: str | os.PathLike) -> Reading:
    """Hold ``folder`` for reading (shared): see :class:`Reading`."""
    return Reading(folder)


class ShardFiles(list):
    """:func:`list_shards`' answer: the shard paths, holding their folder for reading (``hold``) while it lives."""

    def __init__(self, files: list[Path], hold: Reading):
        super().__init__(files)
        self.hold = hold


def holds_for(files: list) -> list[Reading]:
    """The read holds of the folders ``files`` are in: a :class:`ShardFiles`' own, else one taken per folder."""
    hold = getattr(files, "hold", None)
    if hold is not None:
        return [hold]
    return [reading(d) for d in dict.fromkeys(Path(f).parent for f in files)]


@contextlib.contextmanager
def writing(folder: str | os.PathLike, holder: str = "prepare") -> Iterator[FolderLock]:
    """Hold ``folder`` (made if missing) for writing shards, exclusive, for the block: refused in one line
    (:class:`ShardError`) while another prepare writes it or any reader reads it, naming them. A filesystem
    without flock is said once on stderr and the block runs unlocked."""
    hold = FolderLock(folder, SHARD_LOCK_NAME)
    for attempt in (0, 1):
        try:
            hold.acquire()
            break
        except Held as e:
            if e.readers and os.getpid() in e.pids and attempt == 0:
                gc.collect()  # this process's own loaders, no longer used but not yet collected: gone now
                continue
            if e.readers:
                raise ShardError(f"{folder} is being read by {e.holders}; this {holder} would rewrite the shards it "
                                 f"reads: wait for it to finish or stop it, or give this {holder} another --out") from None
            raise ShardError(f"{folder} is in use by another {holder} ({e.holders}); wait for it to finish or stop "
                             f"it, or give this {holder} another --out") from None
    if hold.unsupported:
        print(f"gptforge {holder}: warning: {hold.path}: {hold.unsupported}; the {holder} goes on without the lock, so "
              f"nothing stops a second {holder} on this --out from writing here too: start only one (or put it on a "
              "local disk)", file=sys.stderr)
    try:
        yield hold
    finally:
        hold.release()


def list_shards(data_dir: str | os.PathLike, split: str, other: str | None = None) -> list[Path]:
    """Shards of a split in a folder, sorted by name: files matching ``*{split}*.bin``; never those of a
    ``prepare`` that has not finished (:func:`unfinished_prepare`) or is writing it now (:func:`reading`; the list
    returned holds the folder for reading while it lives). ``other``: the other split's word; a shard whose name holds both (``interval_train_000001.bin`` for train and val) is refused,
    since it would be read as both (validation on training data, silently)."""
    d = Path(data_dir)
    if not d.is_dir():
        if d.exists():
            raise ShardError(f"data directory {d} is not a folder; give the folder `gptforge prepare ...` wrote shards to")
        if d.is_symlink():  # a link to nothing, or a loop: said as what it is, not as a folder never made
            raise ShardError(f"data directory {d} is {not_a_file(d)}; fix the link or give the folder `gptforge "
                             "prepare ...` wrote shards to")
        where = "" if d.is_absolute() else f" (read from the current folder: {d.absolute()})"  # a run's config may
        raise ShardError(f"data directory {d}{where} does not exist; run `gptforge prepare ...` first, or run from the "
                         "folder it is relative to" if where else
                         f"data directory {d} does not exist; run `gptforge prepare ...` first")  # keep it relative

    if not (d / SHARD_LOCK_NAME).exists() and not any(d.glob("*.bin")):
        # nothing here a prepare wrote or could rewrite (a wrong --data.dir): refused as such, without leaving a
        # lock file behind in a folder that was never a shard folder
        _split_files(d, split, other)
        raise AssertionError(f"{d}: no .bin file, yet shards were listed")  # _split_files refuses an empty folder
    hold = reading(d)  # a prepare writing it now: refused here, naming it; else held while the list lives
    try:
        return ShardFiles(_split_files(d, split, other), hold)
    except BaseException:  # refused: let go now, not when the traceback is collected
        hold.close()
        raise


def _split_files(d: Path, split: str, other: str | None) -> list[Path]:
    """:func:`list_shards`' answer, its folder held."""
    unfinished = unfinished_prepare(d)
    if unfinished:
        raise ShardError(unfinished)
    if not split:
        raise ShardError("the split word is empty (--data.train_split / --data.val_split ''): every .bin would match")
    matches = sorted(d.glob(f"*{split}*.bin"))
    both = [p for p in matches if other and other != split and other in p.name]  # equal words: on purpose
    if both:
        raise ShardError(f"shard {both[0]}: its name holds both split words, {split!r} and {other!r}, so it would be "
                         "read as training and as validation data; rename the shards (prepare --name without either "
                         "word) or set --data.train_split / --data.val_split to words only one side holds")
    broken = [p for p in matches if not p.is_file()]  # a dangling symlink or a directory: never skipped unsaid
    if broken:
        p = broken[0]
        what = not_a_file(p)  # a link to a device is a device, not "a link to something that does not exist"
        if p.is_symlink() and what != LOOP:
            what += f" (a symlink to {os.readlink(p)!r})"
        raise ShardError(f"shard {p} is {what}; fix or remove it (the run would silently train without it)")
    files = matches
    if not files:
        others = sorted(p.name for p in d.glob("*.bin") if p.is_file())
        if others:  # e.g. a corpus prepared into a val shard only (prepare's old default on a small corpus)
            raise ShardError(
                f"no '{split}' shards (*{split}*.bin) in {d}, only {', '.join(others[:3])}"
                f"{' ...' if len(others) > 3 else ''}; prepare it again with a smaller --shard-tokens or "
                f"--val-tokens (gptforge prepare files ... --force) so that a '{split}' split is left")
        raise ShardError(f"no '{split}' shards (*{split}*.bin) in {d}; run `gptforge prepare ...` first")
    return files
