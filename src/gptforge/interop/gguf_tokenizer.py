"""The tokenizer inside a GGUF file (``tokenizer.ggml.*``) as a ``tokenizers`` tokenizer.json text.

    >>> from gptforge.interop.gguf_read import read_gguf
    >>> read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf").tokenizer   # built here

For the byte-level BPE (``tokenizer.ggml.model`` "gpt2"): the vocabulary by id, the merges, the control
tokens as special added tokens and the user-defined ones as plain added tokens, and the pre-tokenizer
llama.cpp runs for ``tokenizer.ggml.pre`` (its regexes in ``llama-vocab.cpp``; see ``PRE_TOKENIZERS``).
For the SentencePiece vocabulary (``tokenizer.ggml.model`` "llama": Llama 2, Mistral, TinyLlama, Gemma):
the tokens by id with their scores, split as llama.cpp's ``llm_tokenizer_spm`` splits them: a space
prepended to each stretch of text between control or user-defined tokens (``add_space_prefix``), spaces
written '▁', then a BPE model with byte fallback whose merges are every pair of tokens that spells
another token, best merged piece's score first (llama.cpp's greedy merge). See
``spm_tokenizer_json_from_gguf``.
The arrays were bounded by ``gguf_read``'s header walk before anything here reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

GGUF_STRING = 8  # GGUF's string value type (gguf_read.py reads the others)
_INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)  # GGUF's integer value types (uint8 ... int64)
_FLOATS = (6, 12)  # float32, float64


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

# the special ids llama.cpp gives a SentencePiece vocabulary (tokenizer.ggml.model "llama") whose file names none
# (llama-vocab.cpp, load: "default special tokens"); a BPE vocabulary has no such defaults
SPM_DEFAULT_IDS = {"tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
                   "tokenizer.ggml.eos_token_id": 2}


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
    merged = {"".join(m.split(" ", 1)) if isinstance(m, str) else "".join(m) for m in merges}  # what merges make
    for i, tok in enumerate(tokens):
        kind = types[i] if types else TOKEN_NORMAL
        special = kind == TOKEN_CONTROL or i in (bos_id, eos_id)
        if special or kind == TOKEN_USER_DEFINED:
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": special})
        # the BPE model spells every token in the byte alphabet; a user-defined token llama.cpp stored as
        # its text is spelled from its UTF-8 bytes (as transformers' GGUF reader does) where a merge makes
        # that piece, and is otherwise keyed by its text (below)
        piece = tok if set(tok) <= alphabet else "".join(spell[b] for b in tok.encode("utf-8"))
        if kind == TOKEN_USER_DEFINED and piece != tok and piece not in merged:
            # tokenizers gives an added token whose content is no key of the model's vocab a new id past it: the
            # key is its text, so it keeps its own id, as in llama.cpp (no merge makes its spelled piece, and no
            # BPE piece holds a character outside the byte alphabet, so nothing else encodes differently)
            piece = tok
        vocab[piece] = i  # a token stored twice keeps its last id, as llama.cpp and transformers' GGUF loader do
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


def spm_merges(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """The BPE merges a SentencePiece vocabulary implies: every split of a token into two tokens, the
    merged token's score highest first (llama.cpp merges the adjacent pair whose merged piece scores
    best), ties by the longer left piece, then the longer right one, then the token's place in the
    vocabulary and the pieces' ids. This is the order transformers' GGUF loader gives them
    (``generate_merges``), so the two tokenizers are one; a repeated token keeps its last id and score."""
    ids = {t: i for i, t in enumerate(tokens)}
    score = dict(zip(tokens, scores, strict=True))
    found: list[tuple[str, str, float]] = []
    for tok, s in score.items():
        pairs = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ids and tok[k:] in ids]
        pairs.sort(key=lambda lr: (ids[lr[0]], ids[lr[1]]))
        found.extend((left, right, s) for left, right in pairs)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: equal keys keep their order
    return [[left, right] for left, right, _ in found]


def spm_normalizer(add_space_prefix: bool) -> dict:
    """llama.cpp's SentencePiece text preparation as a ``tokenizers`` normalizer: a space before each stretch
    of text (the library normalizes each stretch between added tokens on its own, which is llama.cpp's
    per-fragment prefix), then every space as '▁' (``llama_escape_whitespace``)."""
    escape = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    if not add_space_prefix:
        return escape
    return {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, escape]}


def spm_tokenizer_json_from_gguf(tokens: list[str], types: list[int] | None, scores: list[float],
                                 path: Path, bos_id: int | None = None,
                                 eos_id: int | None = None, unk_id: int | None = None, add_space_prefix: bool = True,
                                 add_bos: bool = True, add_eos: bool = False) -> str:
    """A ``tokenizer.json`` text for a GGUF SentencePiece vocabulary (``tokenizer.ggml.model`` "llama").

    Split as llama.cpp's ``llm_tokenizer_spm`` splits (``llama_vocab::impl::tokenize``): the control and
    user-defined tokens are cut out of the text first (the library's added tokens: control ones special,
    user-defined ones plain, so ``encode_ordinary`` still takes a user-defined token whole, as llama.cpp's
    ``parse_special`` false does); each stretch of text left between them gets one space before it
    (``add_space_prefix``, llama.cpp's default; SentencePiece's dummy prefix), even where it already begins
    with a space, and every space is written '▁' (``spm_normalizer``); then a BPE model with byte fallback
    to the ``<0xXX>`` tokens merges by the merges the scores imply (``spm_merges``; a file's own
    ``tokenizer.ggml.merges`` are not used: llama.cpp reads none for this model, transformers' loader prefers
    them). The decoder undoes it all and drops the one leading space;
    the post-processor adds bos (and eos) as ``add_bos_token``/``add_eos_token`` say. With
    ``add_space_prefix`` false (Gemma) no space is prepended anywhere.

    transformers' GGUF loader reads the same file another way (a Metaspace pre-tokenizer, prepend_scheme
    'first'): it prepends no '▁' where the text already begins with a space, nor to text after a control or
    user-defined token, and ignores ``add_space_prefix``. gptforge follows llama.cpp, the format's own
    reader, which SentencePiece agrees with on text without such tokens (its dummy prefix goes before any
    text). One difference from llama.cpp remains: two different pieces of equal score merge in the order
    ``spm_merges`` gives (the longer left piece first), where llama.cpp takes the leftmost pair; trained
    vocabularies give every normal piece its own score."""
    known = set(tokens)
    missing = [b for b in range(256) if f"<0x{b:02X}>" not in known]
    if missing:
        raise GGUFReadError(f"{path}: tokenizer.ggml.tokens lacks the byte token <0x{missing[0]:02X}> ({len(missing)} "
                            "of the 256 missing); gptforge converts SentencePiece vocabularies with byte fallback only")
    added = []
    for i, tok in enumerate(tokens):
        kind = types[i] if types else TOKEN_NORMAL
        special = kind == TOKEN_CONTROL or i in (bos_id, eos_id, unk_id)
        if special or kind == TOKEN_USER_DEFINED:
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": special})
    pairs = spm_merges(tokens, scores)
    ends = [tid for flag, tid in ((add_bos, bos_id), (add_eos, eos_id)) if flag and tid is not None]

    def seq(name: str, type_id: int) -> list[dict]:  # bos, the text, eos (those the flags add)
        around = [{"SpecialToken": {"id": tokens[t], "type_id": type_id}} for t in ends]
        body = [{"Sequence": {"id": name, "type_id": type_id}}]
        return around[:1] + body + around[1:] if add_bos and bos_id is not None else body + around

    special_ends = {tokens[t]: {"id": tokens[t], "ids": [t], "tokens": [tokens[t]]} for t in ends}
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]
    if add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    vocab = {tok: i for i, tok in enumerate(tokens)}  # a repeated token: its last id, as llama.cpp and transformers
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": spm_normalizer(add_space_prefix), "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": seq("A", 0), "pair": seq("A", 0) + seq("B", 1),
                           "special_tokens": special_ends},
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": pairs},
    }
    return json.dumps(doc, ensure_ascii=False)


def tokenizer_from_gguf(items: dict[str, list], scalars: dict, arrays: dict, path: Path):
    """(HFTokenizer, chat template or None, token count) from a file's ``tokenizer.ggml.*``: ``items``
    holds each array's items (strings as bytes), ``arrays`` each array's (item type, count)."""
    from gptforge.data.tokenizer import HFTokenizer, TokenizerError

    model = scalars.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise GGUFReadError(f"{path}: tokenizer.ggml.model={model!r}: gptforge reads the byte-level BPE ('gpt2') "
                            "and SentencePiece ('llama') vocabularies only")
    keys = ["tokenizer.ggml.tokens"] + (["tokenizer.ggml.merges"] if model == "gpt2" else [])
    if model == "llama" and ("tokenizer.ggml.merges" in arrays or "tokenizer.ggml.merges" in scalars):
        keys.append("tokenizer.ggml.merges")  # checked, not used: the scores say how a SentencePiece vocabulary merges
    for key in keys:
        if arrays.get(key, (GGUF_STRING,))[0] != GGUF_STRING or key not in arrays:
            raise GGUFReadError(f"{path}: {key} is missing or not a list of strings")
    tokens = _string_array(items, "tokenizer.ggml.tokens", path)
    if not tokens:
        raise GGUFReadError(f"{path}: tokenizer.ggml.tokens is empty")
    merges = _string_array(items, "tokenizer.ggml.merges", path) if "tokenizer.ggml.merges" in keys else None
    if merges is not None and any(m.count(" ") != 1 for m in merges):
        bad = next(m for m in merges if m.count(" ") != 1)
        raise GGUFReadError(f"{path}: tokenizer.ggml.merges holds {bad!r:.60}, not two tokens joined by one space")
    types = None
    if "tokenizer.ggml.token_type" in arrays:
        types = items["tokenizer.ggml.token_type"]
        if arrays["tokenizer.ggml.token_type"][0] not in _INTEGERS:
            raise GGUFReadError(f"{path}: tokenizer.ggml.token_type is not a list of integers")
        if len(types) != len(tokens):
            raise GGUFReadError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    ids = {}
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"):
        v = scalars.get(key)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(tokens)):
            raise GGUFReadError(f"{path}: {key}={v!r} is not a token id (0 to {len(tokens) - 1})")
        ids[key] = v
    if model == "llama":  # llama.cpp's SentencePiece defaults where a key is missing: <unk> 0, <s> 1, </s> 2
        for key, default in SPM_DEFAULT_IDS.items():
            if ids[key] is None and default < len(tokens):
                ids[key] = default
    bos_id, eos_id = ids["tokenizer.ggml.bos_token_id"], ids["tokenizer.ggml.eos_token_id"]
    if model == "llama":
        scores = _scores(items, arrays, len(tokens), path)
        flags = {}
        for key, default in (("tokenizer.ggml.add_space_prefix", True), ("tokenizer.ggml.add_bos_token", True),
                             ("tokenizer.ggml.add_eos_token", False)):
            v = scalars.get(key, default)
            if not isinstance(v, bool):
                raise GGUFReadError(f"{path}: {key}={v!r} is not a boolean")
            flags[key] = v
        text = spm_tokenizer_json_from_gguf(
            tokens, types, scores, path, bos_id, eos_id, ids["tokenizer.ggml.unknown_token_id"],
            add_space_prefix=flags["tokenizer.ggml.add_space_prefix"], add_bos=flags["tokenizer.ggml.add_bos_token"],
            add_eos=flags["tokenizer.ggml.add_eos_token"])
    else:
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


def _scores(items: dict[str, list], arrays: dict, n_tokens: int, path: Path) -> list[float]:
    key = "tokenizer.ggml.scores"
    if key not in arrays:
        raise GGUFReadError(f"{path}: {key} is missing: a SentencePiece vocabulary (tokenizer.ggml.model='llama') "
                            "needs one score per token")
    if arrays[key][0] not in _FLOATS:
        raise GGUFReadError(f"{path}: {key} is not a list of floats (GGUF item type {arrays[key][0]})")
    scores = items[key]
    if len(scores) != n_tokens:
        raise GGUFReadError(f"{path}: {key} has {len(scores)} entries for {n_tokens} tokens")
    if any(s != s for s in scores):
        raise GGUFReadError(f"{path}: {key} holds NaN")
    return scores


def _string_array(items: dict[str, list], key: str, path: Path) -> list[str]:
    try:
        return [b.decode("utf-8") for b in items[key]]
    except UnicodeDecodeError:
        raise GGUFReadError(f"{path}: {key} holds a string that is not UTF-8") from None
