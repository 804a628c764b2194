"""A Hugging Face ``tokenizer.json`` behind the seam (through the ``tokenizers`` library), with a
checked tiktoken twin where the two algorithms provably agree."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.tokenizer.base import MAX_INFO_BYTES, Tokenizer, TokenizerError, library_failure
from gptforge.data.tokenizer.checks import parse_tokenizer_json, read_tokenizer_text
from gptforge.data.tokenizer.split_bounds import check_hf, tiktoken_probe
from gptforge.reading import read_json

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
        self._json = parse_tokenizer_json(text, where)
        self._text = text
        try:
            self._tok = RustTokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception on a bad model
            raise TokenizerError(f"{where}: the tokenizers library refuses it: {str(e)[:300]}") from None
        check_hf(self._json, self._tok, where)  # a split that is not linear in a line's length: refused here
        self._plain = RustTokenizer.from_str(text)
        self._plain.encode_special_tokens = True  # special-token text in the input stays text
        self._continued = self._continuation_twin(RustTokenizer)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.n_vocab = max(vocab.values(), default=-1) + 1
        added = self._json.get("added_tokens") or []
        self.special_tokens = {a["content"]: a["id"] for a in added if a.get("special")}
        # where gptforge cuts the control tokens out itself (encode's allowed_special, a chat template's render), the
        # whitespace the library's lstrip/rstrip would take, and single_word (Phi-3's turn tokens strip to the right)
        self.special_flags = {a["content"]: (bool(a.get("lstrip")), bool(a.get("rstrip")), bool(a.get("single_word")))
                              for a in added if a.get("special") and (a.get("lstrip") or a.get("rstrip")
                                                                      or a.get("single_word"))}
        self._set_ends(where, bos, eos,
                       self.special_tokens.get(bos) if bos else _guess(self.special_tokens, BOS_NAMES),
                       self.special_tokens.get(eos) if eos else _guess(self.special_tokens, EOS_NAMES),
                       hint="; add one with `gptforge tokenizer train --special ...`")
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
            if tiktoken_probe(pattern) is not None:  # linear in Oniguruma (checked) but not in fancy-regex: keep
                return None  # the library, whose split is
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

    def _continuation_twin(self, rust_tokenizer: Any) -> Any:
        """The file's tokenizer for text that follows earlier input, or None where it encodes alike. A
        Metaspace pre-tokenizer with prepend_scheme 'first' prepends '▁' only to the piece at the start
        of the whole input (transformers: after ``<s>`` or ``<|im_start|>`` no '▁' is added); gptforge
        encodes the stretches between control ids one by one, so those after the first take a twin whose
        scheme is 'never'. ('always' and the older add_prefix_space prepend to every piece, as does a
        Prepend normalizer: per stretch is already right for them.)"""
        def first_schemes(node: Any) -> list[dict]:  # the Metaspace nodes with scheme 'first', at any depth
            if isinstance(node, dict):
                own = [node] if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first" else []
                return own + [m for v in node.values() for m in first_schemes(v)]
            return [m for v in node for m in first_schemes(v)] if isinstance(node, list) else []

        if not first_schemes(self._json.get("pre_tokenizer")):
            return None  # nearly every tokenizer: no copy of its JSON, no second library tokenizer
        doc = json.loads(self._text)
        for node in first_schemes(doc.get("pre_tokenizer")):
            node["prepend_scheme"] = "never"
        twin = rust_tokenizer.from_str(json.dumps(doc))
        twin.encode_special_tokens = True
        return twin

    def offsets(self, text: str, ids: Sequence[int], continued: bool = False) -> list[tuple[int, int]] | None:
        """Each id's character range in ``text`` from the library's offsets, where ``ids`` are its encoding
        (``continued``: as text after a control id); else None."""
        lib = self._continued if continued and self._continued is not None else self._plain
        enc = lib.encode(text, add_special_tokens=False)
        return [tuple(o) for o in enc.offsets] if list(enc.ids) == list(ids) else None

    def encode_ordinary_continued(self, text: str) -> list[int]:
        if self._continued is None:
            return self._encode_plain(text)
        with library_failure(self.where, len(text), text):
            return self._continued.encode(text, add_special_tokens=False).ids

    def _encode_plain(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode_ordinary(text)
        with library_failure(self.where, len(text), text):
            return self._plain.encode(text, add_special_tokens=False).ids

    def encode_batch_numpy(self, texts: Sequence[str], dtype: Any = np.uint32) -> list[np.ndarray]:
        if self._fast is not None:  # tiktoken's twin: no Python int per token
            return [self._fast.encode_to_numpy(t, allowed_special=set(), disallowed_special=()).astype(dtype, copy=False)
                    for t in texts]
        batch = getattr(self._plain, "encode_batch_fast", self._plain.encode_batch)  # fast: no offsets
        with library_failure(self.where, sum(map(len, texts)), texts):
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
        from gptforge.storage import write_bytes

        write_bytes(folder / "tokenizer.json", data, what="the tokenizer")
        return {"tokenizer.json": hashlib.sha256(data).hexdigest()}



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



def hf_tokenizer_from_dir(folder: str | Path) -> HFTokenizer:
    """A Hugging Face directory's ``tokenizer.json``, with bos/eos and the chat template from its
    ``tokenizer_config.json`` when there is one."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    cfg: dict = {}
    cfg_path = folder / "tokenizer_config.json"
    if _there(cfg_path):  # a damaged one (a folder, a dangling link) is named, not skipped: bos/eos/template
        cfg = read_json(cfg_path, TokenizerError, "tokenizer_config.json", MAX_INFO_BYTES * 8)
    bos, eos = (_token_text(cfg.get(k), cfg_path, k) for k in ("bos_token", "eos_token"))
    template = cfg.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one, as transformers picks it
        template = _default_template(template, cfg_path)
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{cfg_path}: chat_template is a {type(template).__name__}, expected Jinja text")
    template_where = f"{cfg_path} (chat_template)"
    if template is None and _there(folder / "chat_template.jinja"):
        template = read_tokenizer_text(folder / "chat_template.jinja", MAX_INFO_BYTES)
        template_where = str(folder / "chat_template.jinja")
    tok = HFTokenizer(read_tokenizer_text(path), name=folder.name or "tokenizer", where=str(path), bos=bos, eos=eos,
                      chat_template=template, source_path=path)
    tok.chat_template_where = template_where
    return tok


def _default_template(templates: list, where: Path) -> str | None:
    """transformers' choice among named templates (``[{"name": ..., "template": ...}, ...]``): the one named
    ``default``; none at all is no template. A list without a default, or with entries that are not
    name/template pairs, is refused as transformers refuses it (KeyError, "multiple chat templates with no
    default"): it was read as no template at all, and the model's own chat format silently replaced."""
    pairs = [(t.get("name"), t.get("template")) if isinstance(t, dict) else (None, None) for t in templates]
    bad = next((i for i, (n, t) in enumerate(pairs) if not (isinstance(n, str) and isinstance(t, str))), None)
    if bad is not None:
        raise TokenizerError(f"{where}: chat_template[{bad}] = {templates[bad]!r:.60}: expected an object with a "
                             '"name" and a "template" (Jinja text)')
    named = dict(pairs)
    if templates and "default" not in named:
        raise TokenizerError(f"{where}: chat_template holds {len(named)} named templates ({', '.join(sorted(named))}) "
                             "and none is named 'default', which is the one a chat uses; rename the one to use "
                             "'default' (transformers refuses such a list too)")
    return named.get("default")


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


