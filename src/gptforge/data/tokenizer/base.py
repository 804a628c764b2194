"""The tokenizer interface, its errors and bounds (the seam's bottom: imports no kind)."""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptforge import assets
from gptforge.tokens import EOT, EOT_TEXT

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



@contextlib.contextmanager
def library_failure(where: str, chars: int, texts: Any = ()) -> Iterator[None]:
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
        bad = not_unicode([texts] if isinstance(texts, str) else texts)
        if bad is not None:  # the input's fault, named as such: the tokenizer never saw valid text
            raise TokenizerError(f"the text is not valid Unicode ({bad}); it came from bytes that are not UTF-8 "
                                 "(decoded with errors='surrogateescape'): re-encode the input as UTF-8") from None
        raise TokenizerError(f"{where}: the tokenizer failed on a text of {chars:,} characters "
                             f"({type(e).__name__}: {str(e)[:200]}); its split pattern or normalizer "
                             "gives up on this text") from None



def not_unicode(texts: Any) -> str | None:
    """Where the first of ``texts`` that no UTF-8 encoder takes (a lone surrogate) goes wrong, in words; or None."""
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            continue
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            which = f"text {i}, " if i else ""
            return f"{which}character {e.start:,} is a lone surrogate {t[e.start]!r}"
    return None


# Unicode's White_Space property (Rust's char::is_whitespace, what the tokenizers library strips; str.isspace
# also takes U+001C-U+001F)
_WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B))))


def _is_word(c: str) -> bool:
    """A word character as the tokenizers library's single_word test takes it (Rust regex's Unicode \\w:
    Alphabetic, marks, decimal digits, connector punctuation, joiners; Python's \\w leaves the marks out, so
    an a with U+030A before "<mask>" would differ). Letters and letter numbers stand for Alphabetic, plus the circled and
    squared Latin letters it also holds."""
    cat = unicodedata.category(c)
    return (cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or c in "\u200c\u200d"
            or any(a <= ord(c) <= b for a, b in _ALPHABETIC_SYMBOLS))


_ALPHABETIC_SYMBOLS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))


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

    def encode_ordinary_continued(self, text: str) -> list[int]:
        """``encode_ordinary`` of text that continues an input after a control id (a chat template's stretch
        after ``<|im_start|>``): the same ids, except for a tokenizer that treats the start of the whole
        input specially (SentencePiece's Metaspace with prepend_scheme 'first' prepends '▁' there only)."""
        return self._encode_plain(text)

    def offsets(self, text: str, ids: Sequence[int], continued: bool = False) -> list[tuple[int, int]] | None:
        """Each id's character range in ``text`` where a kind's library reports them (normalizers,
        SentencePiece prefixes); None here: the ids' bytes must spell the text."""
        return None

    def encode(self, text: str, allowed_special: Iterable[str] | str = (), **_: Any) -> list[int]:
        """Like tiktoken's: the special tokens named in ``allowed_special`` ("all" for every one) are
        parsed where they appear (with the whitespace their ``lstrip``/``rstrip`` flags take, see
        ``special_spans``); every other special-token text stays text."""
        names = set(self.special_tokens) if allowed_special == "all" else set(allowed_special) & set(self.special_tokens)
        if not names:
            return self._encode_plain(text)
        out: list[int] = []
        pattern = re.compile("|".join(re.escape(s) for s in sorted(names, key=len, reverse=True)))
        pos = 0
        for a, b, _s, _e, name in self.special_spans(text, pattern):
            if a > pos:  # only the text before the first special token starts the input
                out += self._encode_plain(text[pos:a]) if pos == 0 else self.encode_ordinary_continued(text[pos:a])
            out.append(self.special_tokens[name])
            pos = b
        if pos < len(text):
            out += self._encode_plain(text[pos:]) if pos == 0 else self.encode_ordinary_continued(text[pos:])
        return out

    special_flags: dict[str, tuple[bool, bool, bool]] = {}  # name -> (lstrip, rstrip, single_word); tokenizer.json's

    def special_spans(self, text: str, pattern: re.Pattern, skip: Any = None) -> list[tuple[int, int, int, int, str]]:
        """The special tokens ``pattern`` finds in ``text``, as the ``tokenizers`` library takes its added tokens:
        (start, end with the whitespace taken, the token's own start and end, its text). A ``single_word`` token
        touching a word character stays text; ``lstrip`` takes the whitespace before it (not what an earlier
        token took), ``rstrip`` the whitespace after it. ``skip(start, end)`` true: that match is text (a chat
        message's own). Without flags (tiktoken kinds, most tokenizer.json files): the matches as they are."""
        out: list[tuple[int, int, int, int, str]] = []
        taken = 0
        for m in pattern.finditer(text):
            s, e = m.span()
            if s < taken or (skip is not None and skip(s, e)):
                continue
            lstrip, rstrip, single_word = self.special_flags.get(m.group(0), (False, False, False))
            if single_word and ((s > 0 and _is_word(text[s - 1])) or (e < len(text) and _is_word(text[e]))):
                continue
            a, b = s, e
            if lstrip:
                while a > taken and text[a - 1] in _WHITE_SPACE:
                    a -= 1
            if rstrip:
                while b < len(text) and text[b] in _WHITE_SPACE:
                    b += 1
            out.append((a, b, s, e, m.group(0)))
            taken = b
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

    def _set_ends(self, where: str, bos: str | None, eos: str | None, bos_id: int | None, eos_id: int | None,
                  hint: str = "") -> None:
        """bos/eos ids (the texts a config named must be special tokens) and the document separator:
        the bos token where there is one, else the eos; a tokenizer with neither is refused."""
        self.bos_token_id, self.eos_token_id = bos_id, eos_id
        for field, text, tid in (("bos", bos, bos_id), ("eos", eos, eos_id)):
            if text and tid is None:
                raise TokenizerError(f"{where}: {field} token {text!r} is not one of its special tokens "
                                     f"({', '.join(sorted(self.special_tokens)) or 'none'})")
        eot = bos_id if bos_id is not None else eos_id
        if eot is None:
            raise TokenizerError(f"{where}: no bos or eos special token (such as {EOT_TEXT}): shards need a "
                                 f"document separator{hint}")
        self.eot_token = eot

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


def gpt2_fingerprint() -> str:
    """GPT-2's fingerprint without reading its ranks (the identity is their known sha256)."""
    ident = {"kind": "tiktoken", "ranks_sha256": assets.GPT2_RANKS_SHA256, "pattern": R50K_PAT,
             "special_tokens": [[EOT_TEXT, EOT]]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
