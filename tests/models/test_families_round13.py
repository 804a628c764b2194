"""Every Llama-style family over the config variants real checkpoints use, against transformers (float32), and the
rule that every config.json key is accounted for.

* Variants: tied and untied embeddings, GQA from MQA to MHA, rms_norm_eps, rope scaling (linear, llama3 load;
  dynamic, yarn, longrope, partial rotary are refused by name at load), head_dim apart from hidden/heads, q/k norms
  and biases, sliding windows (Qwen2/3's use_sliding_window and max_window_layers, Mistral's, Phi-3's, Gemma's
  alternating layers), soft-caps, embedding scale. Each loaded model gives transformers' logits and round-trips
  through ``export hf``: transformers reloads it to the same logits, and so does gptforge.
* Keys: transformers' config class for each model_type takes some keys and its modeling file reads some config
  attributes; every one must be READ, UNREAD or INERT in ``interop/hf_families.py`` (derived here from
  transformers' own source, so a transformers upgrade that adds one fails this test), and a key in none of them
  is refused at load by name. The config.json shapes of SmolLM2, Llama 3.2, Qwen2.5, Qwen3, Mistral 7B, Phi-3 and
  Gemma 2/3 (their keys, tiny sizes) load.
* Gemma 3's ``attn_logit_softcapping``: transformers' Gemma3Attention keeps it and never applies it (nor does
  llama.cpp's gemma3); gptforge applied it, 1.2 away from transformers' logits at a cap of 0.5.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.interop.hf_llama import export_hf_llama, load_hf_llama  # noqa: E402
from tests.models.hf_reference import random_hf_model  # noqa: E402

V, T = 268, 48  # T over the window of 8 and the original context of 32: the window and the scaling decide
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
IDX = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(7))
S, F = "sliding_attention", "full_attention"
# float32 (eps 1.2e-7): each logit is a chain of dot products of at most 96 terms (the MLP width; heads and
# T = 48 keys are shorter) through 2 blocks and the head, |logits| < 3; a reordered sum of n terms moves by at
# most n * eps * |terms|, so 96 * 3 stages * 1.2e-7 * 3 ~ 1e-4 bounds it (measured: 0 to 1.2e-6)
ATOL = 96 * 3 * 1.2e-7 * 3


def _rope(**kw) -> dict:
    return {"rope_type": "default", "rope_theta": 500.0, **kw}


LOADS = {  # name -> (transformers class prefix, config extras)
    "llama-tied": ("Llama", dict(tie_word_embeddings=True)),
    "llama-mqa": ("Llama", dict(num_key_value_heads=1)),
    "llama-mha-eps1e-5": ("Llama", dict(num_key_value_heads=4, rms_norm_eps=1e-5)),
    "llama-linear": ("Llama", dict(rope_parameters=_rope(rope_type="linear", factor=2.0))),
    "llama-llama3": ("Llama", dict(rope_parameters=_rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0, original_max_position_embeddings=32))),
    "llama-pretraining_tp": ("Llama", dict(pretraining_tp=2)),
    "qwen2-window": ("Qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen2-window-unused": ("Qwen2", dict(use_sliding_window=False, sliding_window=8, tie_word_embeddings=True)),
    "qwen3-tied-window": ("Qwen3", dict(head_dim=16, tie_word_embeddings=True, use_sliding_window=True,
                                        sliding_window=8, max_window_layers=1)),
    "mistral-head_dim": ("Mistral", dict(head_dim=32, sliding_window=8)),
    "mistral-linear": ("Mistral", dict(sliding_window=None, rope_parameters=_rope(rope_type="linear", factor=2.0))),
    "phi3-tied-window": ("Phi3", dict(sliding_window=8, tie_word_embeddings=True)),
    "gemma2-untied-nocaps": ("Gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                            tie_word_embeddings=False, attn_logit_softcapping=None,
                                            final_logit_softcapping=None, rms_norm_eps=1e-5, rope_parameters=_rope())),
    "gemma2-caps": ("Gemma2", dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=8, layer_types=[S, F],
                                   attn_logit_softcapping=0.5, final_logit_softcapping=1.0, rope_parameters=_rope())),
}


def _logits(model, idx=IDX) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out[0]


@pytest.mark.parametrize("name", list(LOADS))
def test_a_variant_loads_to_transformers_logits_and_round_trips_through_export(name, tmp_path):
    kind, extra = LOADS[name]
    hf = random_hf_model(kind, **{**COMMON, **extra})
    hf.save_pretrained(tmp_path / "hf")
    ref = _logits(hf)
    model = load_hf_llama(str(tmp_path / "hf"))
    assert (_logits(model) - ref).abs().max().item() <= ATOL
    export_hf_llama(model, tmp_path / "out", tokenizer=False)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(back).__name__ == type(hf).__name__
    assert (_logits(back) - ref).abs().max().item() <= ATOL
    assert (_logits(load_hf_llama(str(tmp_path / "out"))) - _logits(model)).abs().max().item() == 0.0
