"""A Hugging Face Llama-style ``config.json`` -> ``LlamaConfig``, refusing by name what gptforge's Llama
does not compute (``hf_llama`` reads and writes the weights; ``hf_families`` maps the other families'
fields; ``hf_keys`` accounts for every key). The rope: ``rope_scaling`` / ``rope_parameters`` both ways.
"""

from __future__ import annotations

import math

from gptforge.interop import hf_families, hf_keys
from gptforge.models.llama_config import LlamaConfig
from gptforge.numbers import MAX_DIM  # past it a config is damaged, not big

REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")
# Every config.json field llama_config_from_hf reads besides REQUIRED, with what it must be when present
# (null = transformers' default). Checked in one place before any is used: a string, a bool, a NaN or a
# zero where a size belongs is one line naming the field, never a TypeError or ZeroDivisionError later.
OPTIONAL_SIZES = ("num_key_value_heads", "max_position_embeddings", "head_dim")
OPTIONAL_COUNTS = ("max_window_layers", "sliding_window")  # Qwen2's: 0 is meaningful (every layer slides)
OPTIONAL_NUMBERS = ("rms_norm_eps", "rope_theta")
OPTIONAL_BOOLS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias")
# config.json model_types read here: Llama, Qwen2 (q/k/v biases) and those of interop/hf_families.py
MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "granite", "olmo2")
# The keys a rope_scaling / rope_parameters object of each rope type gptforge computes may hold: transformers'
# validator's required and optional keys for the type (modeling_rope_utils._validate_<type>_rope_parameters), plus
# the old spelling "type" and partial_rotary_factor, which it accepts for every type (tests/models/
# test_families_round13.py derives them from that source). Another key (mrope_section, a yarn beta_fast under
# linear ...) is refused by name, as an unaccounted top-level key is: transformers would only warn and drop it.
_DEFAULT_ROPE = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
ROPE_KEYS = {"default": _DEFAULT_ROPE, "linear": _DEFAULT_ROPE + ("factor",),
             "llama3": _DEFAULT_ROPE + ("factor", "original_max_position_embeddings", "low_freq_factor",
                                        "high_freq_factor")}


class HFConfigError(ValueError):
    """A Hugging Face config gptforge cannot load faithfully (message names the key; the CLI exits 2)."""


def _refuse(key: str, value, why: str) -> HFConfigError:
    return HFConfigError(f"Hugging Face config {key}={value!r}: {why}; gptforge's Llama does not implement it "
                         "and will not load the model wrong")


def _number(where: str, d: dict, key: str, default=None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise HFConfigError(f"Hugging Face config {where}.{key}={v!r}: expected a number")
    return v


def rope_from_hf(c: dict, model_type: str = "llama") -> dict:
    """``model.rope_theta`` and ``model.rope_*`` fields from ``rope_scaling`` (transformers < 5) or
    ``rope_parameters`` (>= 5), as transformers 5 reads them: a ``rope_scaling`` replaces ``rope_parameters``
    whole, and the base is the chosen one's ``rope_theta``, else the top-level ``rope_theta`` (else 10,000);
    other scalings refused by name."""
    rope = c.get("rope_parameters") or {}
    where = "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
    scaling = c.get("rope_scaling") or rope
    if not isinstance(scaling, dict) or not isinstance(rope, dict):
        raise HFConfigError(f"Hugging Face config {where}={scaling!r}: expected an object")
    for d in (scaling, rope, c):
        if d.get("partial_rotary_factor") not in (None, 1.0):  # null: transformers' default, every dimension
            raise _refuse("partial_rotary_factor", d["partial_rotary_factor"], "only part of each head rotates")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    try:  # a type the family's transformers class itself refuses (Phi-3's linear, llama3)
        hf_keys.check_rope_type(kind, f"{where}.rope_type", model_type)
    except hf_keys.FamilyConfigError as e:
        raise HFConfigError(str(e)) from None
    if kind not in ("default", "linear", "llama3"):
        raise _refuse(f"{where}.rope_type", kind, "this rope scaling changes the rotary frequencies in a way only "
                      "default, linear and llama3 are implemented for")
    check_rope_keys(scaling, where, kind)
    theta = scaling.get("rope_theta", c.get("rope_theta", 10_000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        key = f"{where}.rope_theta" if "rope_theta" in scaling else "rope_theta"
        raise HFConfigError(f"Hugging Face config {key}={theta!r}: expected a positive finite number")
    out: dict = {"rope_type": kind, "rope_theta": float(theta)}
    if kind != "default":
        out["rope_factor"] = float(_number(where, scaling, "factor"))
    if kind == "llama3":
        out["rope_low_freq_factor"] = float(_number(where, scaling, "low_freq_factor"))
        out["rope_high_freq_factor"] = float(_number(where, scaling, "high_freq_factor"))
        orig = scaling.get("original_max_position_embeddings", c.get("max_position_embeddings"))
        if isinstance(orig, bool) or not isinstance(orig, int):
            raise HFConfigError(f"Hugging Face config {where}.original_max_position_embeddings={orig!r}: expected "
                                "an integer")
        out["rope_original_context"] = orig
    return out


def check_rope_keys(d: dict, where: str, kind: str) -> None:
    """Refuse, by name, the first key of the rope object ``d`` (config.json's ``where``) that rope type ``kind``
    does not read (``ROPE_KEYS``)."""
    extra = [k for k in d if k not in ROPE_KEYS[kind]]
    if extra:
        raise HFConfigError(f"Hugging Face config {where}.{extra[0]}={d[extra[0]]!r}: a key gptforge does not read "
                            f"for rope type {kind} and does not know to leave the model unchanged; it may change what "
                            "the model computes, so gptforge will not load it")


def _is_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DIM


def check_field_types(c: dict) -> None:
    """HFConfigError naming the first field of ``c`` (a config.json dict) that is not what Llama reads it as."""
    absent = [k for k in REQUIRED if not isinstance(c.get(k), int) or isinstance(c.get(k), bool)]
    if absent:
        raise HFConfigError(f"Hugging Face config lacks integer {', '.join(absent)}; is this a LlamaForCausalLM config?")
    for k in REQUIRED + tuple(k for k in OPTIONAL_SIZES if c.get(k) is not None):
        if not _is_size(c[k]):
            raise HFConfigError(f"Hugging Face config {k}={c[k]!r}: expected a positive integer up to {MAX_DIM}")
    for k in OPTIONAL_COUNTS:
        if c.get(k) is not None and not (_is_size(c[k]) or c[k] == 0 and not isinstance(c[k], bool)):
            raise HFConfigError(f"Hugging Face config {k}={c[k]!r}: expected an integer in [0, {MAX_DIM}]")
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    for where, d in (("", c), ("rope_parameters.", rope)):
        for k in OPTIONAL_NUMBERS:
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                raise HFConfigError(f"Hugging Face config {where}{k}={v!r}: expected a positive finite number")
    for k in OPTIONAL_BOOLS:
        if c.get(k) is not None and not isinstance(c[k], bool):
            raise HFConfigError(f"Hugging Face config {k}={c[k]!r}: expected true or false")


def llama_config_from_hf(c: dict, **overrides) -> LlamaConfig:
    """A ``LlamaConfig`` from a HF ``config.json`` dict (``llama`` or ``qwen2``), refusing features gptforge lacks."""
    model_type = c.get("model_type")
    if model_type not in MODEL_TYPES:
        raise HFConfigError(f"Hugging Face config model_type={model_type!r}: only {', '.join(MODEL_TYPES)} load into "
                            "gptforge's Llama")
    raw = c
    try:
        hf_keys.check_keys(c, model_type)  # every key accounted for: read, unread as transformers, or inert
        c = hf_families.with_defaults(c, model_type)  # a key left out means what transformers' class says
    except hf_keys.FamilyConfigError as e:
        raise HFConfigError(str(e)) from None
    check_field_types(c)
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    if heads % kv:  # named as config.json names it (a family's default kv heads included), not as model.n_kv_head
        raise HFConfigError(f"Hugging Face config num_key_value_heads={kv}: num_attention_heads={heads} is not a "
                            f"multiple of it (each key/value head serves whole query heads)"
                            + ("" if "num_key_value_heads" in raw else f"; left out, {model_type}'s default is {kv}"))
    try:
        hf_families.check_layer_types(c)
        extra = hf_families.family_fields(c, model_type) if model_type != "llama" else {}
        if model_type == "gemma3_text":  # its full layers' rope (the sliding ones' is model.rope_local_theta)
            c = hf_families.gemma3_rope(c)
    except hf_keys.FamilyConfigError as e:
        raise HFConfigError(str(e)) from None
    scaling = rope_from_hf(c, model_type)  # model.rope_theta and the scaling
    if model_type in ("llama", "granite", "olmo2") and (c.get("sliding_window") or c.get("use_sliding_window")):
        raise _refuse("sliding_window", c.get("sliding_window"), f"sliding-window attention ({model_type}'s "
                      "transformers model has none; a Llama with a window is model_type mistral)")
    reads = hf_families.READS_BIAS  # where the family's transformers model ignores the switch, so does gptforge
    if c.get("attention_bias") and model_type in reads["attention_bias"]:  # a bias on o_proj too (Qwen2's: q/k/v)
        raise _refuse("attention_bias", c["attention_bias"], "a bias on o_proj (q/k/v biases alone are Qwen2's, "
                      "model_type qwen2)")
    if c.get("mlp_bias") and model_type in reads["mlp_bias"]:
        raise _refuse("mlp_bias", c["mlp_bias"], "biases in the MLP projections")
    if extra.get("mlp") != "geglu" and c.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", c["hidden_act"], "the MLP is SwiGLU with SiLU")
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    apart = c.get("head_dim") not in (None, hidden // heads) or hidden % heads
    if model_type == "llama" and apart and c.get("head_dim") is not None:  # LlamaAttention reads head_dim too
        extra["head_size"] = c["head_dim"]
    if "head_size" not in extra and apart:
        raise _refuse("head_dim", c.get("head_dim"), f"heads must split hidden_size={hidden} evenly into "
                      f"num_attention_heads={heads} (a head_dim apart is Llama's, Qwen3's, Mistral's and Gemma's; "
                      f"transformers' {model_type} model takes it only as hidden_size / num_attention_heads)")
    kwargs = dict(
        n_layer=c["num_hidden_layers"], n_head=heads, n_kv_head=c.get("num_key_value_heads") or heads,
        n_embd=hidden, intermediate_size=c["intermediate_size"], block_size=c["max_position_embeddings"],
        vocab_size=c["vocab_size"], norm_eps=c.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(c.get("tie_word_embeddings")),
        qkv_bias=model_type == "qwen2", **scaling, **extra,
    )
    try:
        return LlamaConfig(**{**kwargs, **overrides})
    except ValueError as e:  # the values transformers would take but no model has (a factor of 0 ...)
        raise HFConfigError(f"Hugging Face config: {e}") from None



def rope_to_hf(cfg: LlamaConfig) -> dict | None:
    """``rope_scaling`` for transformers (None when unscaled); ``rope_parameters`` is it plus rope_theta."""
    if cfg.rope_type == "default":
        return None
    out = {"rope_type": cfg.rope_type, "factor": cfg.rope_factor}
    if cfg.rope_type == "llama3":
        out.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor,
                   original_max_position_embeddings=cfg.rope_original_context)
    return out


