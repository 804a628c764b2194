"""The chat template in a Hugging Face tokenizer directory (``export hf`` of a chat checkpoint).

The chat tokens become added special tokens with their gptforge ids, and ``tokenizer_config.json``
gets the Jinja ``chat_template``, so ``AutoTokenizer.apply_chat_template`` renders exactly the ids
:meth:`gptforge.data.chat.ChatTemplate.render` does.

    >>> write_hf_chat_template(Path("exports/hf"), ChatTemplate.gpt2())

Both exporters (GPT-2 and Llama: they share GPT-2's BPE and the padded rows the chat tokens live in)
check the vocabulary with :func:`check_tokenizer_vocab` before writing anything, and write the
tokenizer with :func:`gptforge.interop.hf.write_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.data.chat import ChatTemplate
from gptforge.tokens import GPT2_VOCAB


def check_tokenizer_vocab(vocab_size: int, chat_template: dict | None) -> ChatTemplate | None:
    """The chat template (or None), after checking the model's logits are exactly GPT-2's tokens
    plus, for a chat model, the chat tokens: otherwise the GPT-2 tokenizer does not describe it."""
    chat = ChatTemplate.from_dict(chat_template) if chat_template else None
    want = chat.vocab_size if chat else GPT2_VOCAB
    if vocab_size != want:
        what = f"the chat template's {want} (GPT-2's 50257 + chat tokens)" if chat else "GPT-2's 50257"
        raise ValueError(f"model.vocab_size={vocab_size} is not {what}; export without the tokenizer (--no-tokenizer)")
    return chat


def write_hf_chat_template(out: Path, template: ChatTemplate) -> list[Path]:
    """Add the chat tokens and template to the tokenizer files already written in ``out``."""
    vocab_path, config_path, special_path = out / "vocab.json", out / "tokenizer_config.json", out / "special_tokens_map.json"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    config = json.loads(config_path.read_text(encoding="utf-8"))
    special = json.loads(special_path.read_text(encoding="utf-8"))
    added = {i: name for i, name in sorted(template.names.items()) if i != template.bos}
    for i, name in added.items():
        vocab[name] = i
    config["added_tokens_decoder"] = {
        str(i): {"content": name, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                 "single_word": False}
        for i, name in {template.bos: "<|endoftext|>", **added}.items()
    }
    config["additional_special_tokens"] = list(added.values())
    config["chat_template"] = template.jinja()
    special["additional_special_tokens"] = list(added.values())
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_path.write_text(json.dumps(special, indent=2), encoding="utf-8")
    return [vocab_path, config_path, special_path]
