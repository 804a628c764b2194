"""The tokenizer inside a GGUF file (``tokenizer.ggml.*``) as a ``tokenizers`` tokenizer.json text.

    >>> from gptforge.interop.gguf_read import read_gguf
    >>> read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf").tokenizer   # built here

For the byte-level BPE (``tokenizer.ggml.model`` "gpt2"): the vocabulary by id, the merges, the control
tokens as special added tokens and the user-defined ones as plain added tokens, and the pre-tokenizer
llama.cpp runs for ``tokenizer.ggml.pre`` (its regexes in ``llama-vocab.cpp``; see ``PRE_TOKENIZERS``).
The arrays were bounded by ``gguf_read``'s header walk before anything here reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

_STRING = 8  # GGUF's string value type (gguf_read.py reads the others)
_INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)  # GGUF's integer value types (uint8 ... int64)


class GGUFReadError(ValueError):
    """A GGUF file gptforge cannot read faithfully; the one-line message names the file and the key."""


# llama.cpp's split for each tokenizer.ggml.pre it names (llama-vocab.cpp, llm_tokenizer_bpe): the regexes
# run one after another, each splitting the pieces the previous one left; no normalizer.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, tuple[list[str], bool]] = {  # name -> (regexes in order, ignore_merges)
    # GPT-2's regex (llama.cpp writes it without the final |\s+, which its splitter supplies: text no
    # alternative matches stays a piece of its own, as a Split that keeps the gaps does)
    "gpt-2": ([_GPT2_REGEX], False),
    # every numeric character alone first, then GPT-2's regex (StarCoder's split, which SmolLM uses)
    "smollm": ([r"\p{N}", _GPT2_REGEX], False),
    "starcoder": ([r"\p{N}", _GPT2_REGEX], False),
    # Llama 3's regex (digits in runs of up to three); llama.cpp sets ignore_merges for this family:
    # a word that is itself a token is taken whole, before any merge
    "llama-bpe": ([_LLAMA3_REGEX], True),
    "llama3": ([_LLAMA3_REGEX], True),
    "llama-v3": ([_LLAMA3_REGEX], True),
    # Qwen2's: Llama 3's with single digits
    "qwen2": ([_QWEN2_REGEX], False),
}

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def _byte_alphabet() -> dict[int, str]:
    from gptforge.data.tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def tokenizer_json_from_gguf(tokens: list[str], types: list[int] | None, merges: list[str], pre: str,
                             path: Path, bos_id: int | None = None, eos_id: int | None = None) -> str:
    """A ``tokenizer.json`` text for a GGUF byte-level BPE (``tokenizer.ggml.model`` "gpt2")."""
    if pre not in PRE_TOKENIZERS:
        raise GGUFReadError(f"{path}: tokenizer.ggml.pre={pre!r}: gptforge knows how llama.cpp splits text for "
                            f"{', '.join(sorted(PRE_TOKENIZERS))} only")
    regexes, ignore_merges = PRE_TOKENIZERS[pre]
    alphabet = set(_byte_alphabet().values())
    spell = _byte_alphabet()
    vocab: dict[str, int] = {}
    added = []
    for i, tok in enumerate(tokens):
        kind = types[i] if types else TOKEN_NORMAL
        special = kind == TOKEN_CONTROL or i in (bos_id, eos_id)
        if special or kind == TOKEN_USER_DEFINED:
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": special})
        # the BPE model spells every token in the byte alphabet; a user-defined token llama.cpp stored as
        # its text is spelled from its UTF-8 bytes (as transformers' GGUF reader does)
        piece = tok if set(tok) <= alphabet else "".join(spell[b] for b in tok.encode("utf-8"))
        vocab.setdefault(piece, i)  # a duplicate spelling keeps its first id, as tokenizers would
    steps: list[dict] = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
                         for r in regexes]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }
    return json.dumps(doc, ensure_ascii=False)


def tokenizer_from_gguf(items: dict[str, list], scalars: dict, arrays: dict, path: Path):
    """(HFTokenizer, chat template or None, token count) from a file's ``tokenizer.ggml.*``: ``items``
    holds each array's items (strings as bytes), ``arrays`` each array's (item type, count)."""
    from gptforge.data.tokenizer import HFTokenizer, TokenizerError

    model = scalars.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFReadError(f"{path}: tokenizer.ggml.model={model!r}: gptforge reads the byte-level BPE ('gpt2') "
                            "only; SentencePiece ('llama') and others are not converted yet")
    for key, itype in (("tokenizer.ggml.tokens", _STRING), ("tokenizer.ggml.merges", _STRING)):
        if arrays.get(key, (itype,))[0] != itype or key not in arrays:
            raise GGUFReadError(f"{path}: {key} is missing or not a list of strings")
    tokens = _string_array(items, "tokenizer.ggml.tokens", path)
    merges = _string_array(items, "tokenizer.ggml.merges", path)
    types = None
    if "tokenizer.ggml.token_type" in arrays:
        types = items["tokenizer.ggml.token_type"]
        if arrays["tokenizer.ggml.token_type"][0] not in _INTEGERS:
            raise GGUFReadError(f"{path}: tokenizer.ggml.token_type is not a list of integers")
        if len(types) != len(tokens):
            raise GGUFReadError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    ids = {}
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        v = scalars.get(key)
        if v is not None and not (isinstance(v, int) and 0 <= v < len(tokens)):
            raise GGUFReadError(f"{path}: {key}={v!r} is not a token id (0 to {len(tokens) - 1})")
        ids[key] = v
    bos_id, eos_id = ids["tokenizer.ggml.bos_token_id"], ids["tokenizer.ggml.eos_token_id"]
    pre = scalars.get("tokenizer.ggml.pre")
    if not isinstance(pre, str):  # llama.cpp falls back to its "default" regexes, which are not GPT-2's
        raise GGUFReadError(f"{path}: tokenizer.ggml.pre is missing; gptforge reproduces llama.cpp's split for "
                            f"{', '.join(sorted(PRE_TOKENIZERS))} only, not its 'default' one")
    text = tokenizer_json_from_gguf(tokens, types, merges, pre, path, bos_id, eos_id)
    template = scalars.get("tokenizer.chat_template")
    template = template if isinstance(template, str) and template else None
    try:
        tok = HFTokenizer(text, name=path.stem, where=f"{path} (tokenizer.ggml.*)",
                          bos=tokens[bos_id] if bos_id is not None else None,
                          eos=tokens[eos_id] if eos_id is not None else None, chat_template=template)
    except TokenizerError as e:
        raise GGUFReadError(str(e).replace("\n", " ")) from None
    return tok, template, len(tokens)


def _string_array(items: dict[str, list], key: str, path: Path) -> list[str]:
    try:
        return [b.decode("utf-8") for b in items[key]]
    except UnicodeDecodeError:
        raise GGUFReadError(f"{path}: {key} holds a string that is not UTF-8") from None
