"""The Hugging Face families that are gptforge's one Llama with some fields set: Qwen3, Mistral, Phi-3,
Gemma 2, Gemma 3 (text), Granite and OLMo 2, in and out.

    >>> model = load_hf_llama("./my-qwen3-dir")       # hf_llama reads them all; this module maps the fields
    >>> export_hf_llama(model, "out")                  # written back as the family it came from (model.family)

What each family is, as ``LlamaConfig`` fields (``models/llama.py``):

* ``qwen3``: ``qk_norm`` (RMSNorm per head on q and k), ``head_size`` apart from hidden/heads, and
  Qwen's sliding window on the layers from ``max_window_layers`` on (``use_sliding_window``).
* ``mistral``: Llama with ``sliding_window`` on every layer (``null`` = none) and maybe ``head_size``.
* ``phi3``: Llama with a sliding window, its q/k/v and gate/up weights fused in one matrix each:
  split at import (:func:`split_fused`), fused again at export (:func:`fuse`).
* ``gemma2``: ``norm_plus_one`` RMSNorms, ``post_norms``, ``embed_scale`` sqrt(hidden), GeGLU
  (``mlp=geglu``), ``query_pre_attn_scalar``, ``attn_softcap`` and ``logit_softcap``, and a sliding
  window on alternate layers (``layer_types``).
* ``gemma3_text``: Gemma 2 with ``qk_norm`` and the sliding layers' own rope base (``rope_local_theta``;
  rope scaling applies to the full layers only, as transformers does); its ``final_logit_softcapping`` is
  applied, its ``attn_logit_softcapping`` not (transformers' Gemma 3 carries it and never applies it).
* ``olmo2``: ``post_norms`` without the norms before attention and MLP (``pre_norms`` false), and ``qk_norm``
  over the whole projected q and k (``qk_norm_full``: one RMSNorm across every head's channels).
* ``granite``: Llama with four multipliers: ``embedding_multiplier`` (``embed_scale``),
  ``residual_multiplier`` on each attention and MLP output before its residual add (``residual_scale``),
  ``attention_multiplier`` as the attention scores' scale in place of 1/sqrt(head_dim) (``attn_scale``), and
  ``logits_scaling`` dividing the logits (``logits_scaling``). Like Llama's, its biases and windows are refused.

A key a config leaves out means what transformers' class for its model_type says (``HF_DEFAULTS``: every
default that does not follow from other keys, the context included), a null where that class refuses one is
refused (``NULLABLE``, ``NULL_HEAD_DIM``, ``WINDOW_REQUIRED``), and ``layer_types``, bias switches and rope types
count only as the family's transformers model reads them (``READS_LAYER_TYPES``, ``READS_BIAS``, ``ROPE_TYPES``).
What a config asks beyond these (a rope scaling other than linear/llama3, partial rotary, biases,
another activation, bidirectional attention, chunked attention layers) is refused by name, and so is any key
not accounted for (``READ``, ``UNREAD``, ``INERT``: ``hf_keys.check_keys``). Export
writes the family's config.json, then reads it back through the import: a model the family's
config cannot express (a field it does not carry) is refused by the field's name, never written wrong.
"""

from __future__ import annotations

import math

import torch

from gptforge.interop.hf_keys import GRANITE_KEYS, READ, FamilyConfigError, check_local_rope_keys
from gptforge.interop.hf_keys import refuse as _refuse
from gptforge.models.llama import LlamaConfig

MODEL_TYPES = ("qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "granite", "olmo2")
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "granite": "GraniteForCausalLM",
                 "olmo2": "Olmo2ForCausalLM"}
HF_TYPE = {"gemma3": "gemma3_text"}  # model.family -> config.json model_type where they differ
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")  # transformers' names of gelu(x, approximate="tanh")
LAYER_KIND = {"sliding_attention": "s", "full_attention": "f"}
# A key config.json leaves out takes its value from transformers' config class, and these classes disagree
# with each other (and with Llama's) where it changes the logits: Phi-3's norm eps, Gemma 2's soft-caps on by
# default, Gemma 3's full layers' rope base 1e6, the default windows, kv heads and head sizes. transformers'
# defaults (5.x, the same in 4.4x), per model_type, for every key the reader would otherwise default itself;
# tests/models/test_hardening_round7_families.py compares them with the classes.
HF_DEFAULTS: dict[str, dict] = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, max_position_embeddings=2048),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, use_sliding_window=False,
                  max_window_layers=28, max_position_embeddings=32_768, num_key_value_heads=32),
    "qwen3": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, use_sliding_window=False,
                  max_window_layers=28, head_dim=128, max_position_embeddings=32_768, num_key_value_heads=32),
    "mistral": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, sliding_window=4096,
                    num_key_value_heads=8, max_position_embeddings=131_072),
    "phi3": dict(rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=False, max_position_embeddings=4096),
    "gemma2": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=True, sliding_window=4096,
                   num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, hidden_activation=GELU_TANH[0], max_position_embeddings=8192),
    "gemma3_text": dict(rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                        tie_word_embeddings=True, sliding_window=4096, num_key_value_heads=4, head_dim=256,
                        query_pre_attn_scalar=256, hidden_activation=GELU_TANH[0], max_position_embeddings=131_072),
    # Granite's attention_multiplier defaults to 1.0, not 1/sqrt(head_dim): a config without it is that model
    "granite": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, max_position_embeddings=2048,
                    **dict.fromkeys(GRANITE_KEYS, 1.0)),
    "olmo2": dict(rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=False, max_position_embeddings=2048),
}
# the model_types whose transformers model fails on a null sliding_window (Qwen's only with use_sliding_window);
# Mistral's and Phi-3's null is no window
WINDOW_REQUIRED = ("qwen2", "qwen3", "gemma2", "gemma3_text")
# the model_types whose transformers model reads each bias switch (Mistral's, Phi-3's and Qwen2's read neither,
# Qwen3's and Gemma's no mlp_bias): a switch a model does not read changes nothing there, and loads here too
READS_BIAS = {"attention_bias": ("llama", "qwen3", "gemma2", "gemma3_text", "granite", "olmo2"),
              "mlp_bias": ("llama", "granite")}
# the model_types whose transformers attention reads config.json's layer_types (Mistral's as Ministral's);
# Phi-3's and Llama's read none: every Phi-3 layer slides whatever the list says
READS_LAYER_TYPES = ("qwen2", "qwen3", "mistral", "gemma2", "gemma3_text")


# the keys of HF_DEFAULTS whose null means something to transformers (no window, no cap); a null elsewhere is
# refused by transformers' typed config classes, and gptforge will not read it as the default instead
NULLABLE = ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping")
# a null head_dim is derived (hidden / heads) by these classes only; Qwen2's and Phi-3's models read the null itself
# and fail, Qwen3's and Gemma's classes refuse it
NULL_HEAD_DIM = ("llama", "mistral")


def with_defaults(c: dict, model_type: str) -> dict:
    """``c`` with the keys it leaves out set as transformers' class for ``model_type`` sets them; a key set to
    null where that class types it as a value is refused by name."""
    defaults = HF_DEFAULTS.get(model_type, {})
    null = next((k for k in defaults if k in c and c[k] is None and k not in NULLABLE), None)
    if null is None and "head_dim" in c and c["head_dim"] is None and model_type not in NULL_HEAD_DIM:
        null = "head_dim"
    if null is not None:
        raise FamilyConfigError(f"Hugging Face config {null}=None: expected a value (transformers' {model_type} "
                                f"config refuses null here); leave the key out for its default "
                                f"{defaults.get(null, 'hidden_size / num_attention_heads')!r}")
    return {**defaults, **c}


def _int(c: dict, key: str, default: int | None = None) -> int | None:
    v = c.get(key, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise FamilyConfigError(f"Hugging Face config {key}={v!r}: expected a non-negative integer")
    return v


def _float(c: dict, key: str) -> float:
    v = c.get(key)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        raise FamilyConfigError(f"Hugging Face config {key}={v!r}: expected a positive finite number or null")
    return float(v)


def check_layer_types(c: dict) -> list | None:
    """config.json's ``layer_types``, checked (one known kind per layer) whatever the model_type, as every
    transformers config class checks it, whether or not its model reads it."""
    n, types = c["num_hidden_layers"], c.get("layer_types")
    if isinstance(types, list):
        if len(types) != n or any(t not in LAYER_KIND for t in types):
            bad = next((t for t in types if t not in LAYER_KIND), f"{len(types)} entries for {n} layers")
            raise _refuse("layer_types", bad, "attention kinds other than sliding_attention and full_attention "
                          "(one per layer)")
    elif types is not None:
        raise FamilyConfigError(f"Hugging Face config layer_types={types!r}: expected a list of strings")
    return types


def _null_window(model_type: str) -> FamilyConfigError:
    return FamilyConfigError(f"Hugging Face config sliding_window=None: transformers' {model_type} model builds its "
                             "sliding layers' mask from the window and fails on null; give the window"
                             + (", or use_sliding_window false" if model_type.startswith("qwen") else ""))


def layer_pattern(c: dict, model_type: str) -> tuple[int, str]:
    """(sliding_window, layer_types) from a config: the window (0 = none) and, where only some layers
    slide, one letter per layer (s sliding, f full), as transformers decides it for ``model_type``
    (``layer_types`` where its model reads them, ``READS_LAYER_TYPES``). A window of 0 on a layer that
    slides is refused: no model has one (transformers fails on it), and null is how a config says none."""
    n = c["num_hidden_layers"]
    window = _int(c, "sliding_window")
    if model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window"):
        window = None  # Qwen's configs carry a window they do not use unless asked
    qwen = model_type in ("qwen2", "qwen3")
    null = window is None and model_type in WINDOW_REQUIRED and "sliding_window" in c and (
        c.get("use_sliding_window") or not qwen)
    types = check_layer_types(c)
    if null and not qwen:  # Gemma builds its sliding mask whatever the layers (round seven: even all full)
        raise _null_window(model_type)
    if window is None and not null:
        return 0, ""
    if types is not None and model_type in READS_LAYER_TYPES:
        pattern = "".join(LAYER_KIND[t] for t in types)
    elif model_type in ("qwen2", "qwen3"):
        first = _int(c, "max_window_layers", 28)
        pattern = "".join("s" if i >= first else "f" for i in range(n))
    elif model_type == "gemma2":
        pattern = "".join("s" if (i + 1) % 2 else "f" for i in range(n))
    elif model_type == "gemma3_text":
        key = "sliding_window_pattern" if "sliding_window_pattern" in c else "_sliding_window_pattern"
        every = _int(c, key, 6)  # a period: a list or string here is refused by name, as transformers fails on it
        if not every:
            raise FamilyConfigError(f"Hugging Face config {key}=0: a period of no layers (transformers divides by "
                                    "it); give the period of full layers (6), or layer_types")
        pattern = "".join("s" if (i + 1) % every else "f" for i in range(n))
    else:
        pattern = "s" * n
    if "s" not in pattern:
        return 0, ""
    if null:  # Qwen's: some layer slides
        raise _null_window(model_type)
    if window == 0:
        raise FamilyConfigError("Hugging Face config sliding_window=0: a window of no tokens on the layers that "
                                "slide; set it to the model's window, or null for none")
    return window, "" if pattern == "s" * n else pattern


def family_fields(c: dict, model_type: str) -> dict:
    """The ``LlamaConfig`` fields a ``model_type`` config sets beyond Llama's (``hf_llama`` reads the rest),
    refusing what they cannot express. Also handles sliding windows for ``qwen2``."""
    out: dict = {}
    window, types = layer_pattern(c, model_type)
    ctx = c["max_position_embeddings"]  # with_defaults: the family's own when left out
    if window and not types and window >= ctx and model_type != "gemma3_text":
        window = 0  # a window as long as the context is plain causal attention
    out.update(sliding_window=window, layer_types=types)
    if model_type == "qwen2":
        return out
    head_dim, hidden, heads = c.get("head_dim"), c["hidden_size"], c["num_attention_heads"]
    if head_dim is not None and (hidden % heads or head_dim != hidden // heads):  # else the default says it
        out["head_size"] = head_dim
    if model_type in ("qwen3", "gemma3_text"):
        out["qk_norm"] = True
    if model_type in ("gemma2", "gemma3_text"):
        act = c.get("hidden_activation")  # what transformers' Gemma uses (hidden_act is unread)
        if act not in GELU_TANH:
            raise _refuse("hidden_activation", act, f"Gemma's MLP is GeGLU with the tanh GELU ({GELU_TANH[0]})")
        if c.get("use_bidirectional_attention"):
            raise _refuse("use_bidirectional_attention", True, "attention that also looks ahead")
        scalar = c.get("query_pre_attn_scalar")
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0:
            raise FamilyConfigError(f"Hugging Face config query_pre_attn_scalar={scalar!r}: expected a positive number")
        attn_cap = _float(c, "attn_logit_softcapping")  # checked either way; applied where READ says (Gemma 2)
        out.update(mlp="geglu", norm_plus_one=True, post_norms=True, embed_scale=c["hidden_size"] ** 0.5,
                   query_pre_attn_scalar=float(scalar),
                   attn_softcap=attn_cap if "attn_logit_softcapping" in READ[model_type] else 0.0,
                   logit_softcap=_float(c, "final_logit_softcapping"))
    if model_type == "olmo2":  # its norms after attention and MLP alone; q/k norms over all heads at once
        out.update(post_norms=True, pre_norms=False, qk_norm=True, qk_norm_full=True)
    if model_type == "granite":
        for key, field in GRANITE_KEYS.items():  # with_defaults: each present (1.0 when left out), a null refused
            out[field] = _float(c, key)
    if model_type == "gemma3_text":
        local = gemma3_local_theta(c)  # checked either way; used only where some layer slides
        if window:
            out["rope_local_theta"] = local
    out["family"] = {"gemma3_text": "gemma3"}.get(model_type, model_type)
    return out


def gemma3_rope(c: dict) -> dict:
    """Gemma 3's full layers' rope parameters as a flat config, for ``hf_llama.rope_from_hf``, as
    transformers' Gemma3TextConfig builds them: ``rope_parameters.full_attention`` (a flat ``rope_parameters``
    is not read), updated by ``rope_scaling`` when one is set, its base ``rope_theta`` else the top-level
    ``rope_theta`` (1e6 when absent, ``HF_DEFAULTS``)."""
    params = c.get("rope_parameters")
    full = params.get("full_attention") if isinstance(params, dict) else None
    if not isinstance(full, (dict, type(None))):
        raise FamilyConfigError(f"Hugging Face config rope_parameters.full_attention={full!r}: expected an object")
    scaling = c.get("rope_scaling")
    if not isinstance(scaling, (dict, type(None))):
        raise FamilyConfigError(f"Hugging Face config rope_scaling={scaling!r}: expected an object")
    full = {**(full if full is not None else {"rope_type": "default"}), **(scaling or {})}
    full.setdefault("rope_theta", c.get("rope_theta", HF_DEFAULTS["gemma3_text"]["rope_theta"]))
    return {**c, "rope_parameters": full, "rope_scaling": None}


def gemma3_local_theta(c: dict) -> float:
    """The sliding layers' rope base: ``rope_parameters.sliding_attention.rope_theta``, else
    ``rope_local_base_freq``, else 10,000 (Gemma3TextConfig's order); a scaled local rope is refused."""
    params = c.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    if not isinstance(local, (dict, type(None))):
        raise FamilyConfigError(f"Hugging Face config rope_parameters.sliding_attention={local!r}: expected an "
                                "object")
    local = local or {}
    kind = local.get("rope_type", "default")
    if kind != "default":
        raise _refuse("rope_parameters.sliding_attention.rope_type", kind, "scaled rope on the sliding layers")
    check_local_rope_keys(local)
    if "rope_theta" in local:
        theta, key = local["rope_theta"], "rope_parameters.sliding_attention.rope_theta"
    else:
        theta, key = c.get("rope_local_base_freq", 10_000.0), "rope_local_base_freq"
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (theta > 0 and math.isfinite(theta)):
        raise FamilyConfigError(f"Hugging Face config {key}={theta!r}: expected a positive finite number")
    return float(theta)


# ----------------------------------------------------------------------------- Phi-3's fused weights


def fused_shapes(expected: dict[str, tuple], cfg: LlamaConfig) -> dict[str, tuple]:
    """Phi-3's file shapes from the model's: q/k/v rows stacked in ``qkv_proj``, gate/up in ``gate_up_proj``."""
    out = dict(expected)
    for i in range(cfg.n_layer):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        rows = sum(out.pop(f"{a}{p}_proj.weight")[0] for p in "qkv")
        out[f"{a}qkv_proj.weight"] = (rows, cfg.n_embd)
        rows = out.pop(f"{m}gate_proj.weight")[0] + out.pop(f"{m}up_proj.weight")[0]
        out[f"{m}gate_up_proj.weight"] = (rows, cfg.n_embd)
    return out


def split_fused(sd: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Phi-3's state dict under Llama's names: ``qkv_proj`` split into q (n_head heads), k and v
    (kv heads each), ``gate_up_proj`` into gate (first half) and up (second half), as Phi3Attention and
    Phi3MLP slice their outputs."""
    out = dict(sd)
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.n_layer):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        if f"{a}qkv_proj.weight" in out:
            q, k, v = out.pop(f"{a}qkv_proj.weight").split([q_rows, kv_rows, kv_rows])
            out.update({f"{a}q_proj.weight": q, f"{a}k_proj.weight": k, f"{a}v_proj.weight": v})
        if f"{m}gate_up_proj.weight" in out:
            gate, up = out.pop(f"{m}gate_up_proj.weight").chunk(2)
            out.update({f"{m}gate_proj.weight": gate, f"{m}up_proj.weight": up})
    return out


def fuse(sd: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_fused`: Llama's names -> Phi-3's fused matrices."""
    out = dict(sd)
    for i in range(cfg.n_layer):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[f"{a}qkv_proj.weight"] = torch.cat([out.pop(f"{a}{p}_proj.weight") for p in "qkv"]).contiguous()
        out[f"{m}gate_up_proj.weight"] = torch.cat([out.pop(f"{m}gate_proj.weight"),
                                                    out.pop(f"{m}up_proj.weight")]).contiguous()
    return out


# ----------------------------------------------------------------------------- export


def family_config(cfg: LlamaConfig, base: dict) -> dict:
    """config.json for ``cfg.family`` from Llama's (``hf_llama.hf_llama_config``'s ``base``)."""
    fam = cfg.family
    c = {k: v for k, v in base.items() if k not in ("attention_bias", "mlp_bias")}
    # pad_token_id null: a family's default (Phi-3's 32000) may lie outside a small vocabulary
    c.update(architectures=[ARCHITECTURES[fam]], model_type=HF_TYPE.get(fam, fam), head_dim=cfg.head_dim,
             pad_token_id=None)
    pattern = cfg.sliding_pattern
    types = [("sliding_attention" if k == "s" else "full_attention") for k in pattern]
    window = cfg.sliding_window or None
    if fam == "qwen3":
        first = pattern.find("s") if window else cfg.n_layer
        c.update(attention_bias=False, use_sliding_window=bool(window), sliding_window=window,
                 max_window_layers=first, layer_types=types)
    elif fam == "mistral":
        c.update(sliding_window=window)
        if cfg.layer_types:  # some layers full: transformers reads a mistral config with layer_types as Ministral's
            c["layer_types"] = types
    elif fam == "phi3":
        c.update(sliding_window=window, original_max_position_embeddings=cfg.block_size)
        c["rope_parameters"] = {**c["rope_parameters"], "partial_rotary_factor": 1.0}
    elif fam in ("gemma2", "gemma3"):
        del c["hidden_act"]
        # transformers' Gemma builds its sliding layers' mask even where every layer is full, and fails on a
        # window of null: such a model gets one as long as its context, which no layer uses (the import drops it)
        c.update(hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                 query_pre_attn_scalar=_int_if_whole(cfg.query_pre_attn_scalar or cfg.head_dim),
                 sliding_window=window or cfg.block_size,
                 layer_types=types, final_logit_softcapping=cfg.logit_softcap or None,
                 attn_logit_softcapping=cfg.attn_softcap or None)
        if fam == "gemma3":
            full = c["rope_parameters"]
            local = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}
            c.update(rope_parameters={"full_attention": full, "sliding_attention": local}, rope_scaling=None,
                     rope_local_base_freq=local["rope_theta"], use_bidirectional_attention=False)
    elif fam == "olmo2":
        c.update(attention_bias=False)
    elif fam == "granite":  # its attention scale is always written: Granite's default is 1.0, not 1/sqrt(head_dim)
        c.update(attention_bias=False, mlp_bias=False, embedding_multiplier=cfg.embed_scale,
                 residual_multiplier=cfg.residual_scale, logits_scaling=cfg.logits_scaling,
                 attention_multiplier=attention_scale(cfg))
    return c


def attention_scale(cfg: LlamaConfig) -> float:
    """What the attention scores are multiplied by: ``attn_scale``, else 1/sqrt(query_pre_attn_scalar or head size)
    (``models/llama.py``'s Attention computes it so)."""
    return cfg.attn_scale or 1.0 / math.sqrt(cfg.query_pre_attn_scalar or cfg.head_dim)


def _int_if_whole(x: float) -> int | float:
    """transformers' Gemma configs type query_pre_attn_scalar as an int: 256.0 is written 256."""
    return int(x) if float(x).is_integer() else x
