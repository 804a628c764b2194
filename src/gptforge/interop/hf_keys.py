"""Every key of a Hugging Face Llama-style family's ``config.json``, accounted for (``hf_families`` maps the
families' fields, ``hf_llama_config`` reads the config): a key is READ (turned into ``LlamaConfig`` fields or
refused by name), UNREAD (the family's transformers model carries it and does not apply it) or INERT (it does not
change what the model computes); any other is refused by name (:func:`check_keys`), and so is a key inside a rope
object that the rope type does not read (:func:`check_local_rope_keys`) and a rope type the family's transformers
config refuses (:func:`check_rope_type`). GPT-2's reader (``hf.py``) shares INERT and INERT_AT.
"""

from __future__ import annotations


class FamilyConfigError(ValueError):
    """A field of one of these families' configs that gptforge cannot load faithfully (names the key)."""


def refuse(key: str, value, why: str) -> FamilyConfigError:
    return FamilyConfigError(f"Hugging Face config {key}={value!r}: {why}; gptforge's Llama does not implement it "
                             "and will not load the model wrong")


GRANITE_KEYS = {"embedding_multiplier": "embed_scale", "residual_multiplier": "residual_scale",
                "attention_multiplier": "attn_scale", "logits_scaling": "logits_scaling"}  # key -> LlamaConfig field


# ----------------------------------------------------------------------------- every key, accounted for
# A config.json key changes the logits only where the family's transformers model reads it. Every key that
# transformers' config class for a model_type takes, or its modeling file reads (tests/models/
# test_families_round13.py derives both lists from transformers' source and checks each key is below), is one of:
# READ (the reader turns it into LlamaConfig fields or refuses its value by name), UNREAD (the family's model
# carries it and does not apply it: ignored here as there), or INERT (it does not change the function the model
# computes: names, token ids, generation defaults, dropout and init, which only training from scratch uses). A key
# in none of them is refused by name (check_keys): a field gptforge has not accounted for may change the math, and
# a model is never loaded with it silently dropped.
READ_EVERYWHERE = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                   "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "tie_word_embeddings",
                   "layer_types", "sliding_window", "use_sliding_window", "attention_bias", "mlp_bias", "hidden_act")
GEMMA_KEYS = ("hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
              "use_bidirectional_attention")
READ: dict[str, tuple[str, ...]] = {
    "llama": (), "mistral": (), "phi3": (),
    "qwen2": ("max_window_layers",), "qwen3": ("max_window_layers",),
    "gemma2": GEMMA_KEYS,
    "gemma3_text": tuple(k for k in GEMMA_KEYS if k != "attn_logit_softcapping")
    + ("rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"),
    "granite": tuple(GRANITE_KEYS), "olmo2": (),
}
UNREAD: dict[str, dict[str, str]] = {  # key -> why the family's transformers model leaves the logits as they are
    "phi3": {"original_max_position_embeddings": "read by longrope scaling only, which is refused",
             "embd_pdrop": "dropout", "resid_pdrop": "dropout"},
    "gemma3_text": {"attn_logit_softcapping": "Gemma3Attention keeps it and never passes it to the attention "
                                              "(transformers 4.5x and 5.x; llama.cpp's gemma3 has none either)"},
}
INERT = (
    # names and bookkeeping
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "_commit_hash",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "auto_map", "transformers.js_config",
    "is_llama_config", "rope_interleaved",  # SmolLM2's nanotron leftovers: transformers' Llama reads neither
    "unsloth_version", "unsloth_fixed", "model_name",
    # token ids and what generate() defaults to (gptforge's own sampling settings decide those)
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
    "cache_implementation", "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    # what transformers returns and how it runs, not what it computes
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "chunk_size_feed_forward", "is_decoder", "tokenizer_class", "prefix", "finetuning_task", "task_specific_params",
    "id2label", "label2id", "problem_type", "num_labels",
    # training from scratch only: dropout (model.dropout decides gptforge's) and the initialisation
    "attention_dropout", "initializer_range",
    "pretraining_tp",  # Llama 2's: transformers 4's Llama sums the same products in slices, transformers 5 reads none
)
# base-config keys that are inert only at their no-op value (another is a model this reader does not build)
INERT_AT = {"pruned_heads": {}, "is_encoder_decoder": False, "add_cross_attention": False, "tie_encoder_decoder": False,
            "cross_attention_hidden_size": None}


def check_keys(c: dict, model_type: str) -> None:
    """Refuse, by name, the first key of ``c`` (config.json as written) that is not READ, UNREAD or INERT for
    ``model_type``: one gptforge has not accounted for may change what the model computes."""
    known = set(READ_EVERYWHERE) | set(READ.get(model_type, ())) | set(UNREAD.get(model_type, {})) | set(INERT)
    for key, value in c.items():
        if key in known or key in INERT_AT and value == INERT_AT[key]:
            continue
        if key == "quantization_config":
            raise refuse(key, value if not isinstance(value, dict) else value.get("quant_method", value),
                         "quantized weights (dequantize them to a float dtype first)")
        raise FamilyConfigError(f"Hugging Face config {key}={value!r}: a key gptforge does not read for model_type "
                                f"{model_type} and does not know to leave the model unchanged; it may change what the "
                                "model computes, so gptforge will not load it (if it is only a note, remove it from "
                                "config.json)")


# the rope types a model_type's transformers config accepts, where it narrows them (Phi3Config: longrope only,
# which gptforge does not implement); gptforge's own (default, linear, llama3) are checked in hf_llama.rope_from_hf
ROPE_TYPES = {"phi3": ("default", "longrope")}


def check_rope_type(kind, key: str, model_type: str) -> None:
    """Refuse a rope type transformers' config class for ``model_type`` refuses (``ROPE_TYPES``)."""
    allowed = ROPE_TYPES.get(model_type)
    if allowed is not None and kind not in allowed:
        raise FamilyConfigError(f"Hugging Face config {key}={kind!r}: transformers' {model_type} config accepts "
                                f"rope types {', '.join(allowed)} only and refuses this one; gptforge will not load a "
                                "config its own model class rejects")


def check_local_rope_keys(local: dict) -> None:
    """Refuse, by name, a key of Gemma 3's ``rope_parameters.sliding_attention`` (a default rope) that it does not
    read: the keys hf_llama_config.ROPE_KEYS allows a default rope (a partial rotary only at 1: every dimension)."""
    extra = [k for k in local if k not in ("rope_type", "type", "rope_theta")
             and not (k == "partial_rotary_factor" and local[k] in (None, 1.0))]
    if extra:
        raise FamilyConfigError(f"Hugging Face config rope_parameters.sliding_attention.{extra[0]}="
                                f"{local[extra[0]]!r}: a key gptforge does not read for rope type default and does "
                                "not know to leave the model unchanged")
