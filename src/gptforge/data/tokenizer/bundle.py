"""A tokenizer as data: bundles in checkpoints and shard folders, and what ``--tokenizer`` names."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from gptforge import assets
from gptforge.data.tokenizer.base import (
    BUNDLE_DIR,
    INFO,
    INFO_FORMAT,
    MAX_INFO_BYTES,
    MAX_SPECIALS,
    MAX_VOCAB,
    Tokenizer,
    TokenizerError,
    TokenizerUnavailable,
)
from gptforge.data.tokenizer.checks import check_tokenizer_file, read_tokenizer_text
from gptforge.data.tokenizer.hf_kind import HFTokenizer, hf_tokenizer_from_dir
from gptforge.data.tokenizer.tiktoken_kind import TiktokenTokenizer, gpt2_tokenizer, ranks_bytes, tiktoken_from_ranks
from gptforge.reading import not_a_file, read_json

# --- bundles: a tokenizer as data in a checkpoint or a shard folder ----------------------------------

def save_tokenizer(tok: Tokenizer, parent: str | Path) -> dict[str, Any]:
    """Write ``tok`` as ``parent/tokenizer/`` (info.json + its files); returns the info, which a
    checkpoint also keeps in its meta.json. GPT-2's ranks are recorded by name, not copied."""
    folder = Path(parent) / BUNDLE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    files = tok._save_files(folder)
    info = {**tok.entry(), "files": files}
    from gptforge.storage import write_json

    write_json(folder / INFO, info, what="the tokenizer bundle", indent=1)  # last: the bundle's completion marker
    return info


def read_tokenizer_dir(parent: str | Path, expect: dict | None = None) -> Tokenizer:
    """The tokenizer bundle in ``parent/tokenizer/`` (``parent`` may be the bundle folder itself);
    every file checked against the sha256 in info.json (and ``expect``, a checkpoint's meta.json
    entry, when given) and the rebuilt tokenizer's fingerprint against the recorded one."""
    parent = Path(parent)
    folder = parent if (parent / INFO).is_file() else parent / BUNDLE_DIR
    info_path = folder / INFO
    info = (read_json(info_path, TokenizerError, "tokenizer bundle's info.json", MAX_INFO_BYTES, top=None,
                      then="the tokenizer bundle is damaged") if info_path.exists() else expect)
    if info is None:
        raise FileNotFoundError(f"{info_path}: no tokenizer bundle here")
    return tokenizer_from_entry(info, folder, str(info_path))


def tokenizer_from_entry(info: Any, folder: Path | None, where: str) -> Tokenizer:
    """Rebuild a tokenizer from its info (info.json or a meta.json's ``"tokenizer"``)."""
    if not isinstance(info, dict) or info.get("format") != INFO_FORMAT or info.get("kind") not in ("tiktoken", "hf"):
        raise TokenizerError(f"{where}: tokenizer.format/kind: expected format {INFO_FORMAT!r} and kind tiktoken or "
                             f"hf, found {str(info)[:120]}")
    _check_entry(info, where)
    fp = info.get("fingerprint")
    if info.get("builtin") == "gpt2":
        tok: Tokenizer = gpt2_tokenizer()
    else:
        files = info.get("files")
        if not isinstance(files, dict) or not files or folder is None:
            raise TokenizerError(f"{where}: tokenizer.files: the bundle lists no files to read")
        if len(files) > 16:
            raise TokenizerError(f"{where}: tokenizer.files lists {len(files):,} files; a tokenizer bundle has a few")
        for name, sha in files.items():
            if not isinstance(name, str) or "/" in name or "\\" in name or "\0" in name or name.startswith("."):
                raise TokenizerError(f"{where}: tokenizer.files: {name!r:.60} is not a file name of the bundle")
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise TokenizerError(f"{where}: tokenizer.files[{name[:60]!r}] = {json.dumps(sha)[:70]}: expected a sha256 "
                                     "(64 hex digits)")
            f = folder / name
            check_tokenizer_file(f)
            if assets.sha256_file(f) != sha:
                raise TokenizerError(f"{f}: does not match the sha256 recorded in {where}; the tokenizer changed "
                                     "since it was saved")
        chat = info.get("chat_template")
        if chat is not None and not isinstance(chat, str):
            raise TokenizerError(f"{where}: tokenizer.chat_template: expected Jinja text")
        if info["kind"] == "hf":
            if "tokenizer.json" not in files:
                raise TokenizerError(f"{where}: tokenizer.files: an hf tokenizer needs tokenizer.json")
            specials = info.get("special_tokens") or {}
            by_id = {v: k for k, v in specials.items()} if isinstance(specials, dict) else {}
            bos, eos = by_id.get(info.get("bos")), by_id.get(info.get("eos"))
            tok = HFTokenizer(read_tokenizer_text(folder / "tokenizer.json"), name=str(info.get("name") or "tokenizer"),
                              where=str(folder / "tokenizer.json"), bos=bos, eos=eos, chat_template=chat,
                              source_path=folder / "tokenizer.json")
        else:
            pattern, specials = info.get("pattern"), info.get("special_tokens")
            if not isinstance(pattern, str) or not isinstance(specials, dict):
                raise TokenizerError(f"{where}: tokenizer.pattern / special_tokens missing for a tiktoken tokenizer")
            by_id = {v: k for k, v in specials.items()}
            tok = tiktoken_from_ranks(folder / "ranks.tiktoken", pattern, specials, name=str(info.get("name") or "ranks"),
                                      where=where, bos=by_id.get(info.get("bos")), eos=by_id.get(info.get("eos")))
            tok.chat_template = chat
    if fp != tok.fingerprint:
        raise TokenizerError(f"{where}: tokenizer.fingerprint {str(fp)[:16]}... is not the fingerprint of the "
                             f"tokenizer its files make ({tok.short}...); the bundle is damaged")
    _check_entry_agrees(info, tok, where)
    if tok.chat_template:
        tok.chat_template_where = f"{where} (tokenizer.chat_template)"
    return tok


_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "fingerprint": (str,), "n_vocab": (int,), "eot": (int,), "bos": (int, type(None)),
    "eos": (int, type(None)), "special_tokens": (dict,), "chat_template": (str, type(None)),
    "pattern": (str,), "ranks_sha256": (str,), "builtin": (str,), "files": (dict,)}
_ENTRY_REQUIRED = ("name", "fingerprint", "n_vocab", "eot", "special_tokens")


def _check_entry(info: dict, where: str) -> None:
    """Every field of a bundle's info (or meta.json's ``"tokenizer"``) of its type, before any is used:
    a list where an id belongs is a refusal naming the field, not a TypeError deep inside."""
    for key in _ENTRY_REQUIRED:
        if key not in info:
            raise TokenizerError(f"{where}: tokenizer.{key} is missing; the tokenizer bundle is damaged")
    for key, types in _ENTRY_TYPES.items():
        if key not in info:
            continue
        v = info[key]
        if isinstance(v, bool) or not isinstance(v, types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise TokenizerError(f"{where}: tokenizer.{key} = {json.dumps(v, default=str)[:60]}: expected {want}")
        if isinstance(v, int) and not 0 <= v < MAX_VOCAB + (key == "n_vocab"):
            raise TokenizerError(f"{where}: tokenizer.{key} = {v}: outside [0, {MAX_VOCAB:,}]")
        if isinstance(v, str) and len(v) > (MAX_INFO_BYTES if key in ("chat_template", "pattern") else 4096):
            raise TokenizerError(f"{where}: tokenizer.{key}: a {len(v):,}-character string; the bundle is damaged")
    if not re.fullmatch(r"[0-9a-f]{64}", info["fingerprint"]):
        raise TokenizerError(f"{where}: tokenizer.fingerprint {info['fingerprint'][:80]!r}: expected 64 hex digits")
    if "builtin" in info and info["builtin"] != "gpt2":
        raise TokenizerError(f"{where}: tokenizer.builtin {info['builtin'][:80]!r}: the only built-in tokenizer is 'gpt2'")
    specials = info["special_tokens"]
    if len(specials) > MAX_SPECIALS:
        raise TokenizerError(f"{where}: tokenizer.special_tokens: {len(specials):,} of them (at most {MAX_SPECIALS})")
    for s, i in specials.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < MAX_VOCAB:
            raise TokenizerError(f"{where}: tokenizer.special_tokens[{s[:40]!r}] = {json.dumps(i, default=str)[:40]}: "
                                 f"expected a token id in [0, {MAX_VOCAB:,})")


# fields of an entry that record a setting the files cannot confirm: the tokenizer is built with them
# (bos/eos pick the document separator, which ``eot`` confirms), so they agree with it by construction
ENTRY_SETTINGS = ("name", "chat_template", "bos", "eos")


def _check_entry_agrees(info: dict, tok: Tokenizer, where: str) -> None:
    """What the entry says of the tokenizer (its size, special tokens, document separator, split pattern,
    ranks' checksum: every field the rebuilt tokenizer's own entry has, but the settings it was built
    with) is what its files make: a lie there would change the ids every document starts with. Taken
    from ``tok.entry()``, so a field a kind adds later is checked without a line here."""
    real_entry = tok.entry()
    for key in sorted(set(real_entry) - set(ENTRY_SETTINGS)):
        real = real_entry[key]
        if key in info and info[key] != real:
            raise TokenizerError(f"{where}: tokenizer.{key} = {json.dumps(info[key])[:80]} but the tokenizer its "
                                 f"files make has {json.dumps(real)[:80]}; the bundle is damaged")


def tokenizer_from_meta(meta: dict, ckpt_dir: str | Path) -> Tokenizer:
    """A checkpoint's tokenizer: its ``tokenizer/`` bundle, checked against meta.json's entry. A
    checkpoint written before tokenizers were data (no ``"tokenizer"`` key) is GPT-2's."""
    entry = meta.get("tokenizer")
    if entry is None:
        return gpt2_tokenizer()
    where = f"{Path(ckpt_dir) / 'meta.json'}"
    tok = tokenizer_from_entry(entry, Path(ckpt_dir) / BUNDLE_DIR, where)
    return tok


def load_tokenizer(spec: str | os.PathLike | None) -> Tokenizer:
    """A tokenizer by what a user types for ``--tokenizer``: ``gpt2`` (the default); a tiktoken
    encoding name (``cl100k_base``; online the first time); a bundle folder (``tokenizer train``'s
    output, a checkpoint's or a shard folder's ``tokenizer/``); a ``tokenizer.json``; a Hugging Face
    directory holding one; or a ``.tiktoken`` ranks file (GPT-2's split pattern)."""
    if spec is None or str(spec) == "gpt2":
        return gpt2_tokenizer()
    p = Path(spec)
    if p.is_dir():
        if (p / INFO).is_file() or (p / BUNDLE_DIR / INFO).is_file():
            return read_tokenizer_dir(p)
        if (p / "tokenizer.json").is_file():
            return hf_tokenizer_from_dir(p)
        raise TokenizerError(f"{p}: a folder without a tokenizer (no info.json, tokenizer/info.json or tokenizer.json)")
    if p.is_file() or p.suffix in (".json", ".tiktoken"):
        if p.suffix == ".tiktoken":
            return tiktoken_from_ranks(p)
        if p.name == "tokenizer.json" and p.is_file():
            return hf_tokenizer_from_dir(p.parent)
        return HFTokenizer(read_tokenizer_text(p), name=p.stem, where=str(p), source_path=p)
    if p.exists() or p.is_symlink():  # a device, a pipe, a link to nothing or a loop: said as what it is
        raise TokenizerError(f"--tokenizer {spec}: {not_a_file(p)}; give gpt2, a tiktoken encoding name, a "
                             "tokenizer.json, a folder holding one, or a .tiktoken ranks file")
    import tiktoken

    if str(spec) in tiktoken.list_encoding_names():
        try:
            enc = tiktoken.get_encoding(str(spec))
        except Exception as e:  # offline: requests' and urllib's errors come in many types
            raise TokenizerUnavailable(
                f"--tokenizer {spec}: tiktoken could not load its ranks ({type(e).__name__}; it downloads them the "
                f"first time). Fix: run once with network access, or give a .tiktoken ranks file as --tokenizer") from None
        # its identity is its ranks (as a bundle stores them), so it reads back with the same fingerprint
        return TiktokenTokenizer(enc, str(spec), hashlib.sha256(ranks_bytes(enc)).hexdigest(), builtin=False)
    raise TokenizerError(f"--tokenizer {spec}: not gpt2, a tiktoken encoding name, a tokenizer.json, a folder holding "
                         "one, or a .tiktoken ranks file")


def shard_tokenizer(data_dir: str | Path) -> Tokenizer:
    """The tokenizer that made the shards in ``data_dir``: the bundle ``prepare`` keeps beside them
    (``tokenizer/info.json``); shards prepared before tokenizers were recorded are GPT-2's."""
    d = Path(data_dir)
    if (d / BUNDLE_DIR / INFO).exists() or (d / BUNDLE_DIR / INFO).is_symlink():
        return read_tokenizer_dir(d)  # names what is wrong with it (not a file, damaged, ...)
    manifest = d / "manifest.json"
    if manifest.exists() or manifest.is_symlink():
        # a damaged manifest (or one too large to be one) cannot say the shards are GPT-2's: ids of another
        # tokenizer trained as GPT-2's, silently, and the checkpoint then claimed GPT-2
        m = read_json(manifest, TokenizerError, "shard manifest", top=None,
                      then="so which tokenizer made the shards is not known; prepare them again")
        settings = (m.get("settings") or {}) if isinstance(m, dict) else None
        if not isinstance(settings, dict):
            field, found = ("settings", settings) if isinstance(m, dict) else ("the manifest", m)
            raise TokenizerError(f"{manifest}: {field}: expected an object, found {json.dumps(found)[:60]}, so which "
                                 "tokenizer made the shards is not known; prepare them again")
        name = settings.get("tokenizer", "gpt2")
        if not isinstance(name, str):
            raise TokenizerError(f"{manifest}: settings.tokenizer: expected the name of the tokenizer that made the "
                                 f"shards, found {json.dumps(name)[:80]}; prepare them again")
        if name != "gpt2":
            raise TokenizerError(f"{manifest}: the shards were made with tokenizer {name!r:.80} but {d / BUNDLE_DIR} "
                                 "holds no copy of it; prepare them again")
    return gpt2_tokenizer()


def shard_tokenizer_recorded(data_dir: str | Path) -> bool:
    """Whether ``data_dir``'s shards name their tokenizer (prepared by gptforge since tokenizers are data)."""
    return (Path(data_dir) / BUNDLE_DIR / INFO).is_file()


def check_fits(tok: Tokenizer, vocab_size: int, where: str = "model.vocab_size") -> None:
    """Refuse a model whose logits do not cover every id the tokenizer can produce."""
    if tok.n_vocab > vocab_size:
        raise TokenizerError(f"{where}={vocab_size} is smaller than the {tok.describe()}, which produces ids up to "
                             f"{tok.n_vocab - 1}: the vocabulary does not fit the model (use --model.vocab_size "
                             f"{tok.n_vocab} or more)")


def encode_document(enc: Tokenizer, text: str) -> list[int]:
    """llm.c convention: every document is preceded by the separator (GPT-2's <|endoftext|>)."""
    return [enc.eot_token, *enc.encode_ordinary(text)]
