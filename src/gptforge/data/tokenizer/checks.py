"""Structural checks of tokenizer files, with the file and field named: sizes bounded before
anything is read, ids in range and unique, merges over known tokens, specials not ordinary tokens,
normalizers that cannot multiply text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptforge.data.tokenizer.base import MAX_SPECIALS, MAX_TOKEN_BYTES, MAX_TOKENIZER_BYTES, MAX_VOCAB, TokenizerError
from gptforge.reading import utf8


def parse_tokenizer_json(text: str, where: str) -> dict:
    """Structural checks the tokenizers library does not make, with the field named: ids in range
    and unique, merges over known tokens, special tokens that are not ordinary ones."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise TokenizerError(f"{where}: not valid JSON ({str(e)[:120]}); the file is damaged or truncated") from None
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise TokenizerError(f"{where}: no \"model\" object: not a Hugging Face tokenizer.json")
    model = d["model"]
    vocab = model.get("vocab")
    if model.get("type") in ("BPE", "WordPiece", "WordLevel", None) and isinstance(vocab, dict):
        ids = list(vocab.values())
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TokenizerError(f"{where}: model.vocab holds a value that is not an integer id")
        check_ids(sorted(ids), where, "model.vocab")
        for tok in vocab:
            if len(tok) > MAX_TOKEN_BYTES:
                raise TokenizerError(f"{where}: model.vocab holds a {len(tok):,}-character token (at most {MAX_TOKEN_BYTES})")
        merges = model.get("merges") or []
        if not isinstance(merges, list):
            raise TokenizerError(f"{where}: model.merges is not a list")
        for k, m in enumerate(merges):
            pair = m.split(" ") if isinstance(m, str) else m
            if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
                raise TokenizerError(f"{where}: model.merges[{k}] = {m!r:.60}: expected two tokens")
            for p in pair:
                if p not in vocab:
                    raise TokenizerError(f"{where}: model.merges[{k}] names {p!r:.40}, which is not in model.vocab")
            if "".join(pair) not in vocab:
                raise TokenizerError(f"{where}: model.merges[{k}] makes {''.join(pair)!r:.40}, which is not in model.vocab")
    elif model.get("type") == "Unigram" and isinstance(vocab, list):
        if len(vocab) > MAX_VOCAB:
            raise TokenizerError(f"{where}: model.vocab has {len(vocab):,} entries (at most {MAX_VOCAB:,})")
        vocab = {v[0]: i for i, v in enumerate(vocab) if isinstance(v, list) and v and isinstance(v[0], str)}
    else:
        raise TokenizerError(f"{where}: model.type {model.get('type')!r} with a {type(vocab).__name__} vocab is not "
                             "a tokenizer gptforge reads (BPE, WordPiece, WordLevel or Unigram)")
    _check_normalizer(d.get("normalizer"), where, "normalizer")
    added = d.get("added_tokens") or []
    if not isinstance(added, list) or len(added) > MAX_SPECIALS:
        raise TokenizerError(f"{where}: added_tokens must be a list of at most {MAX_SPECIALS}")
    seen: dict[int, str] = {}
    for k, a in enumerate(added):
        if not isinstance(a, dict) or not isinstance(a.get("content"), str) or not isinstance(a.get("id"), int) \
                or isinstance(a.get("id"), bool) or not 0 <= a["id"] < MAX_VOCAB or not a["content"]:
            raise TokenizerError(f"{where}: added_tokens[{k}] needs a non-empty \"content\" and an \"id\" in [0, {MAX_VOCAB:,})")
        if len(a["content"]) > MAX_TOKEN_BYTES:
            raise TokenizerError(f"{where}: added_tokens[{k}].content: a {len(a['content']):,}-character token "
                                 f"(at most {MAX_TOKEN_BYTES})")
        if a["id"] in seen and seen[a["id"]] != a["content"]:
            raise TokenizerError(f"{where}: added_tokens[{k}] id {a['id']} is also {seen[a['id']]!r}: duplicate id")
        seen[a["id"]] = a["content"]
        if a.get("special") and a["content"] in vocab and vocab[a["content"]] != a["id"]:
            raise TokenizerError(f"{where}: added_tokens[{k}] special token {a['content']!r} collides with the ordinary "
                                 f"token {vocab[a['content']]} of model.vocab; a special token needs its own text")
        if a.get("special") and a["id"] in set(vocab.values()) and vocab.get(a["content"]) != a["id"]:
            raise TokenizerError(f"{where}: added_tokens[{k}] special token {a['content']!r} takes id {a['id']}, "
                                 "which an ordinary token of model.vocab already has: duplicate id")
    return d


MAX_REPLACEMENT = 16  # characters a normalizer may put in place of one match


def _check_normalizer(n: Any, where: str, field: str) -> None:
    """A normalizer that cannot multiply a text: a Replace (per match, and a regex may match the empty
    string at every position) or Prepend writes at most MAX_REPLACEMENT characters. One writing 10,000
    made a 1,000-character prompt 10 million characters and 1.6 GB of encoding (real ones write one:
    Llama's and Mistral's ' ' -> '▁')."""
    if n is None:
        return
    if not isinstance(n, dict):
        raise TokenizerError(f"{where}: {field}: expected an object or null")
    if n.get("type") == "Sequence":
        subs = n.get("normalizers")
        if not isinstance(subs, list) or len(subs) > 64:
            raise TokenizerError(f"{where}: {field}.normalizers: expected a list of at most 64 normalizers")
        for k, sub in enumerate(subs):
            _check_normalizer(sub, where, f"{field}.normalizers[{k}]")
    for key in ("content", "prepend"):
        v = n.get(key)
        if n.get("type") in ("Replace", "Prepend") and isinstance(v, str) and len(v) > MAX_REPLACEMENT:
            raise TokenizerError(f"{where}: {field}.{key}: a {n['type']} normalizer writing {len(v):,} characters "
                                 f"for each match (at most {MAX_REPLACEMENT}) would multiply every text it is given")


def check_ids(ids: list[int], where: str, field: str, dense: bool = False) -> None:
    """``ids`` sorted: unique, >= 0, below MAX_VOCAB."""
    if len(ids) > MAX_VOCAB:
        raise TokenizerError(f"{where}: {field} has {len(ids):,} tokens (at most {MAX_VOCAB:,})")
    if ids and (ids[0] < 0 or ids[-1] >= MAX_VOCAB):
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise TokenizerError(f"{where}: {field} holds id {bad}, outside [0, {MAX_VOCAB:,})")
    for a, b in zip(ids, ids[1:], strict=False):
        if a == b:
            raise TokenizerError(f"{where}: {field} gives id {a} to two tokens: duplicate id")


def check_specials(specials: Any, where: str, ordinary_ids: set[int]) -> None:
    if not isinstance(specials, dict) or len(specials) > MAX_SPECIALS:
        raise TokenizerError(f"{where}: special_tokens must be an object of at most {MAX_SPECIALS} name -> id")
    seen: dict[int, str] = {}
    for s, i in specials.items():
        if not isinstance(s, str) or not s or len(s) > MAX_TOKEN_BYTES or isinstance(i, bool) or not isinstance(i, int) \
                or not 0 <= i < MAX_VOCAB:
            raise TokenizerError(f"{where}: special_tokens[{s!r:.40}] = {i!r:.20}: expected a token id in [0, {MAX_VOCAB:,})")
        if i in ordinary_ids:
            raise TokenizerError(f"{where}: special token {s!r} has id {i}, which an ordinary token already has")
        if i in seen:
            raise TokenizerError(f"{where}: special tokens {seen[i]!r} and {s!r} share id {i}")
        seen[i] = s


def check_tokenizer_file(path: Path, limit: int = MAX_TOKENIZER_BYTES) -> None:
    """Refuse a file that is missing, not a file, or larger than ``limit``, before reading it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such tokenizer file")
    if not path.is_file():
        raise TokenizerError(f"{path}: not a file")
    size = path.stat().st_size
    if size > limit:
        raise TokenizerError(f"{path}: {size:,} bytes, larger than any tokenizer gptforge reads ({limit:,}); "
                             "the file is damaged or not a tokenizer")


def read_tokenizer_text(path: Path, limit: int = MAX_TOKENIZER_BYTES) -> str:
    check_tokenizer_file(path, limit)
    try:
        return utf8(path.read_bytes(), at_start=True)
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); the file is damaged") from None


