"""Tiny Hugging Face directories of each Llama-style family, as a user holds them: a random
``*ForCausalLM`` (2 layers, 32 wide; Gemma 3 six, for its one full layer in six), a small tokenizer
trained here in the family's shape with its control tokens (Llama 3's and Qwen2's regex split and
byte-level BPE, trained with ``tokenizers``; for Mistral, Phi-3 and Gemma a ``sentencepiece`` BPE with
byte fallback, converted to tokenizer.json by transformers' own converter), and the family's chat template (written from the published templates' rules: Llama 3's headers, Qwen's
ChatML, Mistral's ``[INST]`` with alternation and no system role, Phi-3's ``<|user|>``/``<|end|>``,
Gemma's ``<start_of_turn>`` that refuses a system role). Built offline with ``save_pretrained``; the
shapes are what llama.cpp's fixed choices need (Gemma's query scale by head_dim, Gemma 2's alternating
and Gemma 3's every-6th full layer, Gemma 3's local rope base 10,000), so every export can run."""

from __future__ import annotations

from pathlib import Path

import torch

WINDOW = 8  # every sliding family's window: the chains' prompts and replies run past it
WORDS = ("the king queen sword ship crown seven twenty answer larger which is what plus minus one two three "
         "four five six eight nine ten eleven twelve say yes no good brief hello world number").split()
S, F = "sliding_attention", "full_attention"
ROPE = {"rope_type": "default", "rope_theta": 500.0}
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6)

LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
PHI3 = ("{% for message in messages %}{% if message['role'] in ['system', 'user', 'assistant'] %}"
        "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
TULU = ("{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + "
        "'\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
        "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")  # OLMo 2's
GRANITE = ("{% for message in messages %}{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + "
           "message['content'] + '<|end_of_text|>\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}")

# Llama 3's and Qwen2's split regexes (their tokenizer.json's Split) and Llama 3's ignore_merges
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
SPLITS = {"llama3": (_LLAMA3, True), "qwen2": (_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}"), False),
          "gpt2": (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+", False)}  # Granite's

# name -> (transformers class prefix, config extras, tokenizer style, special tokens (bos, eos, others), template)
FAMILIES = {
    "llama": ("Llama", dict(rope_parameters=ROPE), "llama3",
              ("<|begin_of_text|>", "<|end_of_text|>", ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
              LLAMA3),
    "qwen2": ("Qwen2", dict(rope_parameters=ROPE), "qwen2", (None, "<|endoftext|>", ["<|im_start|>", "<|im_end|>"]),
              CHATML),
    "qwen3": ("Qwen3", dict(head_dim=16, rope_parameters=ROPE), "qwen2",
              (None, "<|im_end|>", ["<|endoftext|>", "<|im_start|>"]), CHATML),
    "mistral": ("Mistral", dict(sliding_window=WINDOW, rope_parameters=ROPE), "spm", ("<s>", "</s>", ["<unk>"]),
                MISTRAL),
    "phi3": ("Phi3", dict(sliding_window=WINDOW, rope_parameters=ROPE), "spm",
             ("<s>", "<|endoftext|>", ["<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]), PHI3),
    "gemma2": ("Gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=[S, F],
                              attn_logit_softcapping=5.0, final_logit_softcapping=3.0, rope_parameters=ROPE), "gemma",
               ("<bos>", "<eos>", ["<pad>", "<unk>", "<start_of_turn>", "<end_of_turn>"]), GEMMA),
    "gemma3": ("Gemma3Text", dict(num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                                  layer_types=[S] * 5 + [F],
                                  rope_parameters={S: {"rope_type": "default", "rope_theta": 10_000.0},
                                                   F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
               "gemma", ("<bos>", "<eos>", ["<pad>", "<unk>", "<start_of_turn>", "<end_of_turn>"]), GEMMA),
    # Granite 3's multipliers in kind (its 2B's embedding 12, residual 0.22, logits / 8; the attention scale
    # 1/8 here, not 1/sqrt(8), so the scale is read, not defaulted)
    "granite": ("Granite", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.125,
                                logits_scaling=8.0, rope_parameters=ROPE), "gpt2",
                (None, "<|end_of_text|>", ["<|start_of_role|>", "<|end_of_role|>"]), GRANITE),
    "olmo2": ("Olmo2", dict(rope_parameters=ROPE), "llama3", (None, "<|endoftext|>", ["<|pad|>"]), TULU),
}


def corpus() -> list[str]:
    """What the tokenizers train on: the words, the digits and the chat tasks' phrasing."""
    import random

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)]
    lines += [f"What is {a} + {b}? {a} + {b} = {a + b}. The answer is {a + b}." for a in range(0, 60, 7)
              for b in range(0, 60, 9)]
    lines += [f"Which is larger, {a} or {b}? {max(a, b)} is larger than {min(a, b)}." for a in range(0, 99, 11)
              for b in range(3, 99, 13)]
    return lines


def bpe_tokenizer(style: str, specials: list[str], vocab: int = 300):
    """Llama 3's or Qwen's tokenizer.json shape, trained here: a regex split, then bytes as GPT-2's
    characters, a byte-level BPE; the control tokens first (ids 0..len-1)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    regex, ignore_merges = SPLITS[style]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def spm_tokenizer(style: str, bos: str, eos: str, others: list[str], folder: Path):
    """Mistral's, Phi-3's or Gemma's shape: a SentencePiece BPE with byte fallback trained here
    (``sentencepiece``), converted to tokenizer.json by transformers' own converter (Llama's Metaspace
    with a ``▁`` before the text; Gemma's spaces-as-``▁`` normalizer with nothing prepended)."""
    import pytest
    import transformers

    sentencepiece = pytest.importorskip("sentencepiece")  # and protobuf, for transformers' converter
    pytest.importorskip("google.protobuf")

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("\n".join(corpus()))
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if style == "gemma" else dict(unk_id=0, bos_id=1, eos_id=2,
                                                                                     pad_id=-1)
    named = {"pad_id": "<pad>", "eos_id": eos, "bos_id": bos, "unk_id": "<unk>"}
    extra = [t for t in others if t not in named.values()]
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "tokenizer"), vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, user_defined_symbols=extra, minloglevel=2, **ids,
        **{k.replace("_id", "_piece"): v for k, v in named.items() if ids.get(k, -1) >= 0})
    cls = transformers.GemmaTokenizerFast if style == "gemma" else transformers.LlamaTokenizerFast
    fast = cls.from_pretrained(folder, from_slow=True, bos_token=bos, eos_token=eos, unk_token="<unk>",
                               pad_token="<pad>" if style == "gemma" else None)
    fast.add_special_tokens({"additional_special_tokens": extra})  # the template's control tokens
    return fast


def build_family(name: str, out: Path, seed: int = 0):
    """``out``: the family's HF directory (model, tokenizer, template, generation config). Returns the
    transformers model (eval mode) and its tokenizer."""
    import transformers

    kind, extra, style, (bos, eos, others), template = FAMILIES[name]
    specials = [t for t in (bos, eos, *others) if t is not None]
    if style in SPLITS:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer(style, specials), bos_token=bos,
                                                    eos_token=eos)
    else:
        fast = spm_tokenizer(style, bos, eos, others, out.parent / f"{name}_spm")
    fast.chat_template = template
    ids = {t: fast.convert_tokens_to_ids(t) for t in specials}
    torch.manual_seed(seed)
    cfg = getattr(transformers, f"{kind}Config")(
        **{**COMMON, **extra}, vocab_size=len(fast), bos_token_id=ids.get(bos), eos_token_id=ids[eos],
        pad_token_id=ids.get("<pad>"), tie_word_embeddings=name.startswith("gemma"))
    hf = getattr(transformers, f"{'Gemma3' if kind == 'Gemma3Text' else kind}ForCausalLM")(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial norms (transformers starts them at 1, Gemma's at 0), larger weights
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() == 1 else 0.1))
    hf.save_pretrained(out)
    fast.save_pretrained(out)
    return hf, fast
