"""The chat template in a Hugging Face tokenizer directory (``export hf`` of a chat checkpoint).

The chat tokens become added special tokens with their gptforge ids, and ``tokenizer_config.json``
gets the Jinja ``chat_template``, so ``AutoTokenizer.apply_chat_template`` renders exactly the ids
:meth:`gptforge.data.chat.ChatTemplate.render` does, also for a message that types ``<|assistant|>``
or ``<|endoftext|>``: that stays text, as in gptforge (see :func:`write_hf_chat_template`).

    >>> write_hf_chat_template(Path("exports/hf"), ChatTemplate.gpt2())

Both exporters (GPT-2 and Llama: they share GPT-2's BPE and the padded rows the chat tokens live in)
check the vocabulary with :func:`check_tokenizer_vocab` before writing anything, and write the
tokenizer with :func:`gptforge.interop.hf_tokenizer.write_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.data.chat import ChatTemplate
from gptforge.reading import read_json
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


MARK = "\ue000"  # a private-use character (no meaning in any text): breaks up "<|" typed in a message


def write_hf_chat_template(out: Path, template: ChatTemplate) -> list[Path]:
    """Add the chat tokens and template to the tokenizer files already written in ``out``.

    gptforge encodes a message's content as text (``encode_ordinary``): ``<|assistant|>`` or
    ``<|endoftext|>`` typed in a message are ordinary tokens, never control ids. A Hugging Face
    tokenizer matches added tokens anywhere in the string ``apply_chat_template`` renders. So the
    template writes message content with :data:`MARK` inside every ``<|`` (no control token matches
    it), and ``tokenizer.json``'s normalizer deletes ``MARK`` before BPE: the text is then encoded
    exactly as gptforge encodes it (``tokenizer_class`` is ``PreTrainedTokenizerFast``, which loads
    tokenizer.json as it is). (A message that itself contains U+E000 loses that character;
    it never becomes a control id. Plain ``tokenizer(text)`` calls match control tokens, as every
    Hugging Face tokenizer does; ``tokenizer(text, split_special_tokens=True)`` encodes text as gptforge
    does. Renaming the control tokens would stop that too, but ``convert_tokens_to_ids("<|end|>")``
    would then silently give the unknown id.)"""
    vocab_path, config_path, special_path = out / "vocab.json", out / "tokenizer_config.json", out / "special_tokens_map.json"
    vocab, config, special = (read_json(p) for p in (vocab_path, config_path, special_path))  # written just now
    added = {i: name for i, name in sorted(template.names.items()) if i != template.bos}
    for i, name in added.items():
        vocab[name] = i
    control = {template.bos: "<|endoftext|>", **added}
    config["added_tokens_decoder"] = {
        str(i): {"content": name, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                 "single_word": False}
        for i, name in control.items()
    }
    config["additional_special_tokens"] = list(added.values())
    config["chat_template"] = template.jinja(mark=MARK)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json as written (GPT2Tokenizer rebuilds its own)
    special["additional_special_tokens"] = list(added.values())
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_path.write_text(json.dumps(special, indent=2), encoding="utf-8")
    fast = out / "tokenizer.json"
    fast.write_text(json.dumps(_tokenizer_json(vocab, (out / "merges.txt").read_text(encoding="utf-8"), control),
                               ensure_ascii=False), encoding="utf-8")
    return [vocab_path, config_path, special_path, fast]


def _tokenizer_json(vocab: dict[str, int], merges_txt: str, control: dict[int, str]) -> dict:
    """GPT-2's fast-tokenizer file (the ``tokenizers`` library's format), plus a normalizer deleting MARK."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    merges = [line for line in merges_txt.splitlines() if line and not line.startswith("#version")]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, name in sorted(control.items())],
        "normalizer": {"type": "Replace", "pattern": {"String": MARK}, "content": ""},
        "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
