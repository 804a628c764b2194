"""Every Llama-style family over the config variants real checkpoints use, against transformers (float32), and the
rule that every config.json key is accounted for.

* Variants: tied and untied embeddings, GQA from MQA to MHA, rms_norm_eps, rope scaling (linear, llama3 load;
  dynamic, yarn, longrope, partial rotary are refused by name at load), head_dim apart from hidden/heads (Llama's
  loads and exports; Qwen2's is refused), q/k norms
  and biases, sliding windows (Qwen2/3's use_sliding_window and max_window_layers, Mistral's, Phi-3's, Gemma's
  alternating layers), soft-caps, embedding scale. Each loaded model gives transformers' logits and round-trips
  through ``export hf``: transformers reloads it to the same logits, and so does gptforge.
* Keys: transformers' config class for each model_type takes some keys and its modeling file reads some config
  attributes; every one must be READ, UNREAD or INERT in ``interop/hf_keys.py`` (derived here from
  transformers' own source, so a transformers upgrade that adds one fails this test), and a key in none of them
  is refused at load by name. The config.json shapes of SmolLM2, Llama 3.2, Qwen2.5, Qwen3, Mistral 7B, Phi-3 and
  Gemma 2/3 (their keys, tiny sizes) load.
* Gemma 3's ``attn_logit_softcapping``: transformers' Gemma3Attention keeps it and never applies it (nor does
  llama.cpp's gemma3); gptforge applied it, 1.2 away from transformers' logits at a cap of 0.5.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.interop import hf_keys  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, llama_config_from_hf, load_hf_llama  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
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
    "llama-tied-pretraining_tp": ("Llama", dict(tie_word_embeddings=True, pretraining_tp=2)),
    "llama-mqa-eps1e-5": ("Llama", dict(num_key_value_heads=1, rms_norm_eps=1e-5)),
    "llama-linear": ("Llama", dict(rope_parameters=_rope(rope_type="linear", factor=2.0))),
    "llama-head_dim": ("Llama", dict(head_dim=32)),  # Llama-3.1-Nemotron-Nano-4B's kind: 128 of 3072 / 32 heads
    "llama-llama3": ("Llama", dict(rope_parameters=_rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0, original_max_position_embeddings=32))),
    "qwen2-window": ("Qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen2-window-unused": ("Qwen2", dict(use_sliding_window=False, sliding_window=8, tie_word_embeddings=True)),
    "qwen3-tied-window": ("Qwen3", dict(head_dim=16, tie_word_embeddings=True, use_sliding_window=True,
                                        sliding_window=8, max_window_layers=1)),
    "mistral-head_dim": ("Mistral", dict(head_dim=32, sliding_window=8)),
    "mistral-mha-linear": ("Mistral", dict(num_key_value_heads=4, sliding_window=None,
                                           rope_parameters=_rope(rope_type="linear", factor=2.0))),
    "phi3-tied-window": ("Phi3", dict(sliding_window=8, tie_word_embeddings=True)),
    "gemma2-untied-nocaps": ("Gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                            tie_word_embeddings=False, attn_logit_softcapping=None,
                                            final_logit_softcapping=None, rms_norm_eps=1e-5, rope_parameters=_rope())),
    "gemma2-caps": ("Gemma2", dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=8, layer_types=[S, F],
                                   attn_logit_softcapping=0.5, final_logit_softcapping=1.0, rope_parameters=_rope())),
    "gemma3-caps": ("Gemma3Text", dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=8, layer_types=[S, F],
                                       attn_logit_softcapping=0.5, final_logit_softcapping=1.0,
                                       rope_parameters={S: _rope(rope_theta=50.0),
                                                        F: _rope(rope_type="linear", factor=2.0)})),
    # Granite 3's multipliers in kind (3.x 2B: 12, 0.22, 1/64, 8): each moves the logits far past ATOL
    "granite-multipliers": ("Granite", dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                                            attention_multiplier=0.0625, logits_scaling=8.0, tie_word_embeddings=True,
                                            rope_parameters=_rope())),
    "granite-defaults-linear": ("Granite", dict(rope_parameters=_rope(rope_type="linear", factor=2.0))),
    "olmo2-gqa": ("Olmo2", dict(rope_parameters=_rope())),
    "olmo2-tied-head_dim-llama3": ("Olmo2", dict(head_dim=32, tie_word_embeddings=True, rope_parameters=_rope(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32))),
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


def test_gemma3s_attention_cap_is_not_applied_as_transformers_does_not_apply_it(tmp_path):
    """transformers' Gemma 3 with attn_logit_softcapping 0.5 computes the logits it computes without it, in its
    eager and SDPA attention alike; gptforge reads the key (its value is still checked) and does not apply it.
    A gptforge gemma3 model that does cap its attention has no Gemma 3 config: export hf refuses it by name."""
    kind, extra = LOADS["gemma3-caps"]
    hf = random_hf_model(kind, **{**COMMON, **extra})
    hf.save_pretrained(tmp_path / "hf")
    for impl in ("eager", "sdpa"):
        tf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                                                               attn_implementation=impl).eval()
        assert (_logits(tf) - _logits(hf)).abs().max().item() <= ATOL, impl
    model = load_hf_llama(str(tmp_path / "hf"))
    assert model.config.attn_softcap == 0.0 and model.config.logit_softcap == 1.0
    capped = Llama(LlamaConfig(**{**model.config.to_dict(), "attn_softcap": 0.5}))
    assert (_logits(capped.eval()) - _logits(hf)).abs().max().item() > 100 * ATOL  # the cap would decide them
    with pytest.raises(ValueError, match="model.attn_softcap=0.5") as e:
        export_hf_llama(capped, tmp_path / "out", tokenizer=False)
    assert "\n" not in str(e.value)
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(HFConfigError, match="attn_logit_softcapping"):  # checked either way
        llama_config_from_hf({**c, "attn_logit_softcapping": -1.0})


# ----------------------------------------------------------------------------- refused by name at load

REFUSED = [  # (model_type, config extras, what the message names)
    *[(mt, {"rope_parameters": _rope(rope_type=kind, factor=2.0, original_max_position_embeddings=32)}, kind)
      for mt in ("llama", "qwen2", "qwen3", "mistral") for kind in ("dynamic", "yarn")],
    ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
    ("llama", {"rope_parameters": _rope(rope_type="longrope", long_factor=[1.0] * 8, short_factor=[1.0] * 8,
                                        original_max_position_embeddings=32)}, "longrope"),
    ("phi3", {"rope_parameters": _rope(rope_type="longrope", long_factor=[2.0] * 8, short_factor=[1.0] * 8),
              "original_max_position_embeddings": 32}, "longrope"),
    ("phi3", {"rope_scaling": {"type": "su", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8}}, "su"),
    ("gemma3_text", {"head_dim": 16, "rope_parameters": {S: _rope(), F: _rope(rope_type="yarn", factor=2.0)}},
     "yarn"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),  # Phi-4-mini's
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("qwen3", {"head_dim": 16, "attention_bias": True}, "attention_bias"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("qwen2", {"head_dim": 32}, "head_dim"),
    ("llama", {"num_attention_heads": 6, "num_key_value_heads": 6}, "head_dim"),  # 64 / 6: no whole heads, no head_dim
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    # keys gptforge has not accounted for: Granite's multipliers on a Llama, a quantized checkpoint, chunked attention
    ("llama", {"logits_scaling": 8.0}, "logits_scaling"),
    ("llama", {"embedding_multiplier": 12.0}, "embedding_multiplier"),
    ("granite", {"attention_bias": True}, "attention_bias"),
    ("granite", {"mlp_bias": True}, "mlp_bias"),
    ("granite", {"sliding_window": 8}, "sliding_window"),
    ("granite", {"logits_scaling": 0.0}, "logits_scaling"),
    ("granite", {"attention_multiplier": None}, "attention_multiplier"),
    ("olmo2", {"attention_bias": True}, "attention_bias"),
    ("olmo2", {"sliding_window": 8}, "sliding_window"),
    ("llama", {"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ("qwen2", {"attention_chunk_size": 8}, "attention_chunk_size"),
    ("mistral", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("llama", {"pruned_heads": {"0": [1]}}, "pruned_heads"),
    # keys nested in the rope object, per rope type (ROPE_KEYS): Qwen2-VL's mrope_section, yarn's beta_fast under
    # linear, llama3's low_freq_factor under default, a Gemma 3 layout on Llama, Gemma 3's sliding rope's extras
    ("qwen2", {"rope_parameters": _rope(mrope_section=[2, 2, 4])}, "rope_parameters.mrope_section"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 32}}, "rope_scaling.beta_fast"),
    ("mistral", {"rope_parameters": _rope(low_freq_factor=1.0)}, "rope_parameters.low_freq_factor"),
    ("llama", {"rope_parameters": {S: _rope(), F: _rope()}}, "rope_parameters.sliding_attention"),
    ("gemma3_text", {"head_dim": 16, "rope_parameters": {S: _rope(factor=2.0), F: _rope()}},
     "rope_parameters.sliding_attention.factor"),
    ("gemma3_text", {"head_dim": 16, "rope_parameters": {S: _rope(partial_rotary_factor=0.5), F: _rope()}},
     "rope_parameters.sliding_attention.partial_rotary_factor"),
]


@pytest.mark.parametrize("model_type, extra, named", REFUSED, ids=[f"{m}-{n}" for m, _, n in REFUSED])
def test_what_gptforge_does_not_compute_is_refused_by_name_at_load(model_type, extra, named):
    c = {**COMMON, "model_type": model_type, **extra}
    with pytest.raises(HFConfigError, match=re.escape(named)) as e:
        llama_config_from_hf(c)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- every key accounted for

TYPES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi3",
         "gemma2": "Gemma2", "gemma3_text": "Gemma3Text", "granite": "Granite", "olmo2": "Olmo2"}


def _transformers_keys(model_type: str) -> set[str]:
    """The keys transformers' config class for ``model_type`` takes (its __init__ and its to_dict, the base
    PretrainedConfig's included) and the config attributes its modeling file reads."""
    cls = getattr(transformers, f"{TYPES[model_type]}Config")
    inst = cls()
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    keys |= set(inst.to_dict()) | set(transformers.PretrainedConfig().to_dict())
    name = model_type.removesuffix("_text")
    src = (Path(transformers.__file__).parent / "models" / name / f"modeling_{name}.py").read_text()
    read = set(re.findall(r"config\.(\w+)", src)) | set(re.findall(r'getattr\(\s*(?:self\.)?config,\s*"(\w+)"', src))
    # attributes of the config object (not methods; Gemma 3's multimodal ones are Gemma3Config's, not its text's)
    keys |= {k for k in read if hasattr(inst, k) and not callable(getattr(inst, k)) and not k.endswith("_config")}
    return keys


@pytest.mark.parametrize("model_type", list(TYPES))
def test_every_key_transformers_takes_or_reads_is_accounted_for(model_type):
    known = (set(hf_keys.READ_EVERYWHERE) | set(hf_keys.READ[model_type])
             | set(hf_keys.UNREAD.get(model_type, {})) | set(hf_keys.INERT) | set(hf_keys.INERT_AT))
    missing = sorted(_transformers_keys(model_type) - known)
    assert not missing, f"{model_type}: transformers takes or reads {missing}; say in hf_keys what each does"


@pytest.mark.parametrize("model_type", list(TYPES))
def test_the_hub_doors_full_config_dict_passes(model_type):
    """A hub name is read through AutoConfig(...).to_dict(): every attribute, the base config's included."""
    c = getattr(transformers, f"{TYPES[model_type]}Config")(**{**COMMON, "head_dim": 16}).to_dict()
    hf_keys.check_keys(c, model_type)


def test_the_rope_keys_per_type_are_transformers_validators_keys():
    """ROPE_KEYS[type] is the required and optional keys of transformers' _validate_<type>_rope_parameters (a
    transformers that adds one fails here), plus "type" and partial_rotary_factor, which it takes for every type."""
    from gptforge.interop.hf_llama_config import ROPE_KEYS

    src = (Path(transformers.__file__).parent / "modeling_rope_utils.py").read_text()
    for kind, keys in ROPE_KEYS.items():
        body = re.search(rf"def _validate_{kind}_rope_parameters\(.*?\n    def ", src, re.S).group(0)
        sets = re.findall(r"(?:required|optional)_keys = \{(.*?)\}", body, re.S)
        theirs = {k for s in sets for k in re.findall(r'"(\w+)"', s)}
        assert theirs and set(keys) == theirs | {"type", "partial_rotary_factor"}, kind


# config.json of real checkpoints: their keys as published (sizes made tiny; values that matter kept in kind)
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2,
            vocab_size=V)
REAL = {
    "SmolLM2-135M-Instruct": dict(
        architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=1,
        eos_token_id=2, hidden_act="silu", initializer_range=0.041666666666666664, is_llama_config=True,
        max_position_embeddings=8192, mlp_bias=False, model_type="llama", pad_token_id=2, pretraining_tp=1,
        rms_norm_eps=1e-05, rope_interleaved=False, rope_scaling=None, rope_theta=100000, tie_word_embeddings=True,
        torch_dtype="bfloat16", transformers_version="4.42.3", use_cache=True,
        **{"transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}}}),
    "Llama-3.2-1B-Instruct": dict(
        architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009], head_dim=16, hidden_act="silu", initializer_range=0.02,
        max_position_embeddings=131072, mlp_bias=False, model_type="llama", pretraining_tp=1, rms_norm_eps=1e-05,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rope_theta=500000.0, tie_word_embeddings=True, torch_dtype="bfloat16", transformers_version="4.45.0.dev0",
        use_cache=True),
    "Qwen2.5-0.5B-Instruct": dict(
        architectures=["Qwen2ForCausalLM"], attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645,
        hidden_act="silu", initializer_range=0.02, max_position_embeddings=32768, max_window_layers=21,
        model_type="qwen2", rms_norm_eps=1e-06, rope_theta=1000000.0, sliding_window=32768,
        tie_word_embeddings=True, torch_dtype="bfloat16", transformers_version="4.43.1", use_cache=True,
        use_sliding_window=False),
    "Qwen3-0.6B": dict(
        architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=151643,
        eos_token_id=151645, head_dim=16, hidden_act="silu", initializer_range=0.02, max_position_embeddings=40960,
        max_window_layers=28, model_type="qwen3", rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000,
        sliding_window=None, tie_word_embeddings=True, torch_dtype="bfloat16", transformers_version="4.51.0",
        use_cache=True, use_sliding_window=False),
    "Mistral-7B-v0.1": dict(
        architectures=["MistralForCausalLM"], bos_token_id=1, eos_token_id=2, hidden_act="silu",
        initializer_range=0.02, max_position_embeddings=32768, model_type="mistral", rms_norm_eps=1e-05,
        rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False, torch_dtype="bfloat16",
        transformers_version="4.34.0.dev0", use_cache=True),
    "Mistral-7B-Instruct-v0.3": dict(
        architectures=["MistralForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=2, head_dim=16,
        hidden_act="silu", initializer_range=0.02, max_position_embeddings=32768, model_type="mistral",
        rms_norm_eps=1e-05, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
        torch_dtype="bfloat16", transformers_version="4.42.0.dev0", use_cache=True),
    "Phi-3-mini-4k-instruct": dict(
        _name_or_path="Phi-3-mini-4k-instruct", architectures=["Phi3ForCausalLM"], attention_bias=False,
        attention_dropout=0.0, auto_map={"AutoConfig": "configuration_phi3.Phi3Config",
                                         "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        bos_token_id=1, embd_pdrop=0.0, eos_token_id=32000, hidden_act="silu", initializer_range=0.02,
        max_position_embeddings=4096, model_type="phi3", original_max_position_embeddings=4096, pad_token_id=0,
        resid_pdrop=0.0, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=10000.0, sliding_window=2047,
        tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.40.2", use_cache=True),
    "gemma-2-2b-it": dict(
        architectures=["Gemma2ForCausalLM"], attention_bias=False, attention_dropout=0.0,
        attn_logit_softcapping=50.0, bos_token_id=2, cache_implementation="hybrid", eos_token_id=[1, 107],
        final_logit_softcapping=30.0, head_dim=16, hidden_act="gelu_pytorch_tanh",
        hidden_activation="gelu_pytorch_tanh", initializer_range=0.02, max_position_embeddings=8192,
        model_type="gemma2", pad_token_id=0, query_pre_attn_scalar=256, rms_norm_eps=1e-06, rope_theta=10000.0,
        sliding_window=4096, torch_dtype="float32", transformers_version="4.42.4", use_cache=True),
    "gemma-3-1b-it": dict(
        architectures=["Gemma3ForCausalLM"], attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=None,
        bos_token_id=2, cache_implementation="hybrid", eos_token_id=[1, 106], final_logit_softcapping=None,
        head_dim=16, hidden_activation="gelu_pytorch_tanh", initializer_range=0.02, max_position_embeddings=32768,
        model_type="gemma3_text", pad_token_id=0, query_pre_attn_scalar=256, rms_norm_eps=1e-06,
        rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000, sliding_window=512,
        sliding_window_pattern=6, torch_dtype="bfloat16", transformers_version="4.50.0.dev0", use_cache=True),
    "granite-3.1-2b-instruct": dict(
        architectures=["GraniteForCausalLM"], attention_bias=False, attention_dropout=0.1,
        attention_multiplier=0.015625, bos_token_id=0, embedding_multiplier=12.0, eos_token_id=0, hidden_act="silu",
        initializer_range=0.02, logits_scaling=8.0, max_position_embeddings=131072, mlp_bias=False,
        model_type="granite", pad_token_id=0, residual_multiplier=0.22, rms_norm_eps=1e-05, rope_scaling=None,
        rope_theta=5000000.0, tie_word_embeddings=True, torch_dtype="bfloat16", transformers_version="4.47.0",
        use_cache=True),
    "OLMo-2-1124-7B": dict(
        architectures=["Olmo2ForCausalLM"], attention_bias=False, attention_dropout=0.0, eos_token_id=100257,
        hidden_act="silu", initializer_range=0.02, max_position_embeddings=4096, model_type="olmo2",
        pad_token_id=100277, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=500000, tie_word_embeddings=False,
        torch_dtype="float32", transformers_version="4.47.0.dev0", use_cache=True),
}


# what transformers 4.4x's to_dict() adds (the hub door under transformers 4, and full-dict saves): its base keys
REAL["llama, transformers 4 to_dict()"] = {**REAL["Llama-3.2-1B-Instruct"], **dict(
    return_dict=True, output_hidden_states=False, output_attentions=False, torchscript=False, use_bfloat16=False,
    tf_legacy_loss=False, pruned_heads={}, chunk_size_feed_forward=0, is_encoder_decoder=False, is_decoder=False,
    cross_attention_hidden_size=None, add_cross_attention=False, tie_encoder_decoder=False, max_length=20,
    min_length=0, do_sample=False, early_stopping=False, num_beams=1, num_beam_groups=1, diversity_penalty=0.0,
    temperature=1.0, top_k=50, top_p=1.0, typical_p=1.0, repetition_penalty=1.0, length_penalty=1.0,
    no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0, bad_words_ids=None, num_return_sequences=1,
    output_scores=False, return_dict_in_generate=False, forced_bos_token_id=None, forced_eos_token_id=None,
    remove_invalid_values=False, exponential_decay_length_penalty=None, suppress_tokens=None,
    begin_suppress_tokens=None, finetuning_task=None, id2label={"0": "LABEL_0", "1": "LABEL_1"},
    label2id={"LABEL_0": 0, "LABEL_1": 1}, tokenizer_class=None, prefix=None, pad_token_id=None, sep_token_id=None,
    decoder_start_token_id=None, task_specific_params=None, problem_type=None, _name_or_path="",
    _attn_implementation_autoset=True)}


@pytest.mark.parametrize("name", list(REAL))
def test_real_checkpoints_config_shapes_load(name):
    cfg = llama_config_from_hf({**REAL[name], **TINY})
    assert cfg.family == {"llama": "", "qwen2": ""}.get(REAL[name]["model_type"], cfg.family)
    assert transformers.AutoConfig.for_model(**{**REAL[name], **TINY}).model_type == REAL[name]["model_type"]


def test_an_unaccounted_key_is_named_in_one_line_and_an_inert_one_is_not():
    base = {**REAL["SmolLM2-135M-Instruct"], **TINY}
    with pytest.raises(HFConfigError, match=r"residual_multiplier=0\.22: a key gptforge does not read for "
                                            "model_type llama") as e:
        llama_config_from_hf({**base, "residual_multiplier": 0.22})
    assert "\n" not in str(e.value)
    assert llama_config_from_hf({**base, "temperature": 0.7, "id2label": {"0": "a"}, "pruned_heads": {}}).n_layer == 2


# ----------------------------------------------------------------------------- GPT-2's config.json, the same rule

GPT2_REAL = {  # openai-community/gpt2's config.json keys (sizes tiny), and distilgpt2's extras
    "gpt2": dict(activation_function="gelu_new", architectures=["GPT2LMHeadModel"], attn_pdrop=0.1, bos_token_id=50256,
                 embd_pdrop=0.1, eos_token_id=50256, initializer_range=0.02, layer_norm_epsilon=1e-05,
                 model_type="gpt2", n_ctx=32, n_embd=32, n_head=2, n_layer=1, n_positions=32, resid_pdrop=0.1,
                 summary_activation=None, summary_first_dropout=0.1, summary_proj_to_labels=True,
                 summary_type="cls_index", summary_use_proj=True,
                 task_specific_params={"text-generation": {"do_sample": True, "max_length": 50}}, vocab_size=300),
    "distilgpt2": dict(_num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, n_layer=1),
}


def test_every_gpt2config_key_is_accounted_for_and_real_gpt2_configs_load():
    from gptforge.interop.hf import GPT2_ALIASES, GPT2_INERT, GPT2_READ, gpt2_config_from_hf

    cls = transformers.GPT2Config
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    keys |= set(cls().to_dict()) | set(cls.attribute_map)
    src = (Path(transformers.__file__).parent / "models" / "gpt2" / "modeling_gpt2.py").read_text()
    keys |= {k for k in re.findall(r"config\.(\w+)", src) if hasattr(cls(), k) and not callable(getattr(cls(), k))}
    known = (set(GPT2_READ) | set(GPT2_ALIASES) | set(GPT2_INERT) | set(hf_keys.INERT)
             | set(hf_keys.INERT_AT))
    assert not sorted(keys - known)
    c = {**GPT2_REAL["gpt2"], **GPT2_REAL["distilgpt2"]}
    assert gpt2_config_from_hf(c)["n_embd"] == 32
    # GPT2Config's other names for the sizes are the sizes (the default 768 would not fit the weights)
    alias = {k: v for k, v in c.items() if k not in ("n_embd", "n_positions")} | dict(hidden_size=32,
                                                                                       max_position_embeddings=32)
    assert gpt2_config_from_hf(alias)["n_embd"] == 32
    from gptforge.interop.hf_folder import HFModelError

    for extra, named in ((dict(hidden_size=64), "hidden_size=64 and n_embd=32"),
                         (dict(attn_logit_softcapping=5.0), "attn_logit_softcapping=5.0: a key gptforge does not")):
        with pytest.raises(HFModelError, match=named) as e:
            gpt2_config_from_hf({**c, **extra})
        assert "\n" not in str(e.value)
