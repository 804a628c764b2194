"""gptforge: pretrain GPT-2 class language models from scratch, fast and readably."""

__version__ = "0.1.0"
