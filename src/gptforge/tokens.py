"""GPT-2's token constants, spelled once.

Every module that needs GPT-2's vocabulary size, its end-of-text id or the padded size imports them
from here (the bottom layer of the package: it imports nothing).
"""

GPT2_VOCAB = 50257  # 50,000 BPE merges + 256 byte tokens + <|endoftext|>
EOT = 50256  # <|endoftext|>: the document separator (llm.c's shards put it before each document)
EOT_TEXT = "<|endoftext|>"
PAD_MULTIPLE = 128  # embedding rows are rounded up to a multiple of this (50257 -> 50304)
