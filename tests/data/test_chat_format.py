"""Chat template: the loss mask checked by hand, decoding of the chat ids, refusals, and the round
trip through `export hf` and transformers' AutoTokenizer.apply_chat_template."""

from __future__ import annotations

import pytest
import torch

from gptforge.data.chat import ChatFormatError, ChatTemplate, ChatTokenizer
from gptforge.models.gpt2 import GPTConfig

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "And 1 + 1?"},
    {"role": "assistant", "content": "2."},
]


def test_mask_covers_assistant_text_and_end_only(tokenizer):
    t = ChatTemplate.gpt2()
    ids, mask = t.render(CONV, tokenizer)
    enc = tokenizer.encode_ordinary
    S, U, A, E = 50257, 50258, 50259, 50260
    # built by hand, segment by segment: (ids, trained?)
    segments = [([50256], 0), ([S], 0), (enc("Be brief."), 0), ([E], 0), ([U], 0), (enc("What is 2 + 3?"), 0),
                ([E], 0), ([A], 0), (enc("2 + 3 = 5."), 1), ([E], 1), ([U], 0), (enc("And 1 + 1?"), 0), ([E], 0),
                ([A], 0), (enc("2."), 1), ([E], 1)]
    assert ids == [i for seg, _ in segments for i in seg]
    assert mask == [m for seg, m in segments for _ in seg]
    trained = ChatTokenizer(tokenizer, t).decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == "2 + 3 = 5.<|end|>2.<|end|>"


def test_generation_prompt_and_decode(tokenizer):
    t = ChatTemplate.gpt2()
    ids = t.render_for_generation(CONV[:2], tokenizer)
    assert ids[-1] == 50259
    assert t.decode(ids, tokenizer) == "<|endoftext|><|system|>Be brief.<|end|><|user|>What is 2 + 3?<|end|><|assistant|>"
    # an unused padded row decodes to a placeholder instead of crashing a stream
    assert ChatTokenizer(tokenizer, t).decode([50300]) == "<|50300|>"


@pytest.mark.parametrize("conv, msg", [
    ([{"role": "bot", "content": "x"}], "unknown role 'bot'"),
    ([{"role": "user", "content": "x"}], "no assistant turn"),
    ([{"role": "assistant", "content": 3}], "content must be a string"),
    (["hello"], "expected an object"),
])
def test_bad_conversations_are_named(tokenizer, conv, msg):
    with pytest.raises(ChatFormatError, match=msg):
        ChatTemplate.gpt2().render(conv, tokenizer)


def test_template_round_trips_and_refuses_unpadded_model():
    t = ChatTemplate.gpt2()
    assert ChatTemplate.from_dict(t.to_dict()) == t
    assert t.vocab_size == 50261
    t.check_model(GPTConfig(n_layer=1, n_head=1, n_embd=8, pad_vocab=True))
    with pytest.raises(ChatFormatError, match="pad_vocab true"):
        t.check_model(GPTConfig(n_layer=1, n_head=1, n_embd=8, pad_vocab=False))
    with pytest.raises(ChatFormatError, match="roles"):
        ChatTemplate.from_dict({"bos": 1, "end": 2, "roles": {"user": 3}})


def test_hf_export_chat_template_matches_renderer(tmp_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    from gptforge.interop.hf import export_hf
    from gptforge.models.gpt2 import GPT

    t = ChatTemplate.gpt2()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=t.vocab_size))
    export_hf(model, tmp_path / "hf", chat_template=t.to_dict())
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    got = tok.apply_chat_template(CONV, tokenize=True, return_dict=False)
    assert list(got) == t.render(CONV, tokenizer)[0]
    gen = tok.apply_chat_template(CONV[:2], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(gen) == t.render_for_generation(CONV[:2], tokenizer)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([t.render(CONV, tokenizer)[0]])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, model.eval()(ids)[0], atol=1e-4, rtol=1e-4)
