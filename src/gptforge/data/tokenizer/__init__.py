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

from gptforge.data.tokenizer.base import (  # noqa: F401
    BUNDLE_DIR,
    GPT4_PAT,
    INFO,
    INFO_FORMAT,
    MAX_INFO_BYTES,
    MAX_SPECIALS,
    MAX_TOKEN_BYTES,
    MAX_TOKENIZER_BYTES,
    MAX_VOCAB,
    R50K_PAT,
    Tokenizer,
    TokenizerError,
    TokenizerUnavailable,
    gpt2_fingerprint,
)
from gptforge.data.tokenizer.bundle import (  # noqa: F401
    check_fits,
    encode_document,
    load_tokenizer,
    read_tokenizer_dir,
    save_tokenizer,
    shard_tokenizer,
    shard_tokenizer_recorded,
    tokenizer_from_entry,
    tokenizer_from_meta,
)
from gptforge.data.tokenizer.hf_kind import (  # noqa: F401
    BOS_NAMES,
    BYTE_DECODER,
    EOS_NAMES,
    HFTokenizer,
    bytes_to_unicode,
    hf_tokenizer_from_dir,
)
from gptforge.data.tokenizer.tiktoken_kind import (  # noqa: F401
    TiktokenTokenizer,
    gpt2_tokenizer,
    load_ranks,
    tiktoken_from_ranks,
)
