"""The chat template in a Hugging Face tokenizer directory (``export hf`` of a chat checkpoint).

The chat tokens become added special tokens with their gptforge ids, and ``tokenizer_config.json``
gets the Jinja ``chat_template``, so ``AutoTokenizer.apply_chat_template`` renders exactly the ids
:meth:`gptforge.data.chat.ChatTemplate.render` does, also for a message that types ``<|assistant|>``
or ``<|endoftext|>``: that stays text, as in gptforge (see :func:`write_hf_chat_template`).

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
        raise ValueError(f"model.vocab_size={vocab_size} is not {what}; export with tokenizer=False")
    return chat


MARK = "\ue000"  # a private-use character (no meaning in any text) before every control token's name


def write_hf_chat_template(out: Path, template: ChatTemplate) -> list[Path]:
    """Add the chat tokens and template to the tokenizer files already written in ``out``.

    gptforge encodes a message's content as text (``encode_ordinary``): ``<|assistant|>`` or
    ``<|endoftext|>`` typed in a message are ordinary tokens, never control ids. A Hugging Face
    tokenizer matches an added token's text anywhere, in ``apply_chat_template``'s rendered string
    and in plain ``tokenizer(text)`` alike. So the control tokens (the chat tokens and
    ``<|endoftext|>``) are named :data:`MARK` + their name here: typed text never matches them, the
    template writes the marked names, and it removes ``MARK`` from message content (the one difference
    from gptforge: a message containing U+E000 loses that character; it never becomes a control id)."""
    vocab_path, config_path, special_path = out / "vocab.json", out / "tokenizer_config.json", out / "special_tokens_map.json"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    config = json.loads(config_path.read_text(encoding="utf-8"))
    special = json.loads(special_path.read_text(encoding="utf-8"))
    control = {i: MARK + name for i, name in sorted(template.names.items())}
    vocab = {k: v for k, v in vocab.items() if v not in control}
    vocab.update({name: i for i, name in control.items()})
    config["added_tokens_decoder"] = {
        str(i): {"content": name, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                 "single_word": False}
        for i, name in control.items()
    }
    added = [name for i, name in control.items() if i != template.bos]
    eot = control[template.bos]
    for d in (config, special):
        d.update(bos_token=eot, eos_token=eot, unk_token=eot, additional_special_tokens=added)
    config["chat_template"] = template.jinja(mark=MARK)
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_path.write_text(json.dumps(special, indent=2), encoding="utf-8")
    return [vocab_path, config_path, special_path]
