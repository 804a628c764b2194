"""What the serve tests that check a reply token by token share: a one-layer GPT-2 that answers one chosen token
whatever the prompt, and a small byte-level BPE with ChatML's special tokens and the ChatML template, so a
reply's ids (and where it ends) are known before the server runs."""

from __future__ import annotations

import pytest
import torch

from gptforge.data.chat import ChatTemplate
from gptforge.models.gpt2 import GPT, GPTConfig

T = ChatTemplate.gpt2()
BANG = 0  # GPT-2's id of "!"
CHATML = {"kind": "jinja", "name": "chatml", "end": "<|im_end|>",
          "template": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}


def answering_model(block: int = 64, *, vocab: int = T.vocab_size, answer: int = BANG) -> GPT:
    """Every next token is ``answer``: ln_f's output is its bias whatever the input (gain 0), and wte[answer] is
    that bias times 10, so the tied head's logits peak at ``answer`` by far."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=block, vocab_size=vocab)).eval()
    with torch.no_grad():
        m.transformer.ln_f.weight.zero_()
        m.transformer.ln_f.bias.copy_(torch.randn(32))
        m.transformer.wte.weight[answer] = m.transformer.ln_f.bias * 10
    return m


def chatml_bpe():
    """A byte-level BPE trained here on the question (300 ids) with ChatML's special tokens: the ``tokenizers``
    Tokenizer, and gptforge's HFTokenizer over it (end of text: <|im_end|>)."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from gptforge.data.tokenizer import HFTokenizer

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["What is 2 + 3? It is 5. user assistant system\n"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t, HFTokenizer(t.to_str(), eos="<|im_end|>")
