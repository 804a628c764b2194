"""GGUF metadata to a model config: the keys each architecture (llama, qwen2, gpt2; qwen3, gemma2, gemma3
and phi3, whose keys :func:`config_fields` reads and ``gguf_families.py`` writes) must hold, their bounds,
and one-line refusals, naming the file and the key, of anything gptforge's models do not implement (rope
scaling they cannot do, experts, sliding windows where no family has them, grouped heads in a GPT, ...), and of
any ``{arch}.*`` key not accounted for (:func:`check_keys`).
Read by :func:`gptforge.interop.gguf_read.read_gguf` before any tensor is allocated."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptforge.interop.gguf_tokenizer import GGUFReadError

if TYPE_CHECKING:  # torch stays unimported: cli/common.py builds --gguf's help from ARCHITECTURES
    import torch

# qwen2: a Llama with q/k/v biases and rotate-half (NEOX) rotary; qwen3, gemma2, gemma3, phi3: config_fields below
ARCHITECTURES = ("llama", "qwen2", "gpt2", "qwen3", "gemma2", "gemma3", "phi3")
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency rope divisors (Llama 3.1/3.2's scaling)
MAX_LAYERS = 1024
MAX_CONTEXT = 1 << 24
GPT2_NORM_EPS = 1e-5  # nn.LayerNorm's, which models/gpt2.py uses (and gguf.py writes)

# llama.cpp's tensor names (per block) -> Hugging Face's (gptforge's Llama)
BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",  # qwen2
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
}

# the families that are gptforge's Llama with fields set: the keys that set them (gguf_families.py writes them)
ARCHS = ("qwen3", "gemma2", "gemma3", "phi3")
SWA_PERIOD = {"gemma2": 2, "gemma3": 6}  # llama.cpp's set_swa_pattern(n): layer i slides if i % n < n - 1
BIG_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models: llama.cpp scales queries by n_embd / n_head
GEMMA3_LOCAL_THETA = 10_000.0  # llama.cpp's gemma3 sliding layers' rope base (not in the file)
# what llama.cpp's loader takes for a key a file leaves out (src/models/gemma2.cpp: "n_swa = 4096; // default value
# of gemma 2", and llama-hparams.h's soft-caps 50 and 30, which its gemma2 always applies): the same model here
# the architectures whose llama.cpp loader does not apply {arch}.attention.sliding_window: llama never reads it
# (src/models/llama.cpp), phi3 reads it and turns the window off (llama.cpp PR 13676, "Phi SWA is currently
# disabled"); transformers' GGUF loader maps the key for neither (a LlamaConfig or Phi3Config without a window).
# Both attend over the whole context, so the reader loads such a file without its window (Phi-3-mini-4k's 2047,
# a Mistral's 4096), and a model whose window is shorter than its context has no GGUF form in them (export refuses)
IGNORES_WINDOW = ("llama", "phi3")
LLAMA_CPP_DEFAULTS = {"gemma2": {"attention.sliding_window": 4096, "attn_logit_softcapping": 50.0,
                                 "final_logit_softcapping": 30.0}}


# Every {arch}.* metadata key, accounted for (as interop/hf_keys.py does for config.json): the keys the readers
# below READ (into config fields, or refused by value), the ones that do not change what llama.cpp computes
# (INERT; INERT_AT: only at the value that changes nothing), and any other is refused by name (check_keys). llama.cpp
# reads some keys for every architecture (attention.causal, rope.scaling.attn_factor, the *_swa head sizes, pooling):
# a key gptforge ignored could change the model llama.cpp runs, so none is ignored unseen.
LLAMA_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
              "rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.scaling.type", "rope.scaling.factor",
              "rope.scaling.original_context_length", "vocab_size", "expert_count", "attention.sliding_window",
              "attention.sliding_window_pattern")
READ_KEYS: dict[str, tuple[str, ...]] = {
    **{a: LLAMA_KEYS for a in ("llama", "qwen2", "qwen3", "phi3")},
    "gemma2": LLAMA_KEYS + ("attn_logit_softcapping", "final_logit_softcapping", "rope.freq_base_swa"),
    "gemma3": LLAMA_KEYS + ("rope.freq_base_swa",),
    "gpt2": ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
             "attention.head_count_kv", "attention.layer_norm_epsilon", "vocab_size", "expert_count",
             "attention.sliding_window"),
}
INERT_KEYS = ("rope.scaling.finetuned",  # a note of the converter's
              "tensor_data_layout")  # old llama files' "Meta AI original pth": the converter's, llama.cpp reads none
INERT_AT = {"attention.causal": True, "rope.scaling.attn_factor": 1.0, "expert_used_count": 0, "pooling_type": 0}


def check_keys(arch: str, scalars: dict, arrays: dict, path: Path) -> None:
    """GGUFReadError naming the first ``{arch}.*`` key that is neither read nor known to change nothing."""
    known = set(READ_KEYS[arch]) | set(INERT_KEYS)
    for key in [*scalars, *arrays]:
        name = key.removeprefix(f"{arch}.")
        if name == key or name in known or name in INERT_AT and scalars.get(key, "array") == INERT_AT[name]:
            continue
        value = scalars.get(key, "an array")
        raise _refuse(path, key, value, f"a key gptforge does not read for architecture {arch} and does not know "
                      "to leave the model unchanged (llama.cpp may compute another model with it)",
                      "GPT" if arch == "gpt2" else "Llama")


def swa_pattern(arch: str, n_layer: int) -> str:
    n = SWA_PERIOD[arch]
    return "".join("s" if i % n < n - 1 else "f" for i in range(n_layer))


def check_pattern_array(arch: str, pattern: list | None, window: int, path: Path, n_layer: int) -> None:
    """``{arch}.attention.sliding_window_pattern`` written as a per-layer array (nonzero = the layer slides, as
    llama.cpp's per-layer readers take it): llama.cpp's gemma2 and gemma3 read only a period there (an array is
    skipped for their fixed one) and its other architectures read none, so the array loads only where it says
    what they run (the fixed Gemma pattern; every layer sliding with a window, none without) and is refused by
    name otherwise, never read as either."""
    if pattern is None:
        return
    key = f"{arch}.attention.sliding_window_pattern"
    runs = swa_pattern(arch, n_layer) if arch in SWA_PERIOD else ("s" if window else "f") * n_layer
    says = "".join("s" if v else "f" for v in pattern)
    if len(pattern) != n_layer or any(isinstance(v, (str, bytes, float)) for v in pattern) or says != runs:
        raise _refuse(path, key, f"a per-layer array ({says if len(says) <= 64 else len(says)})",
                      f"per-layer sliding kinds other than the ones llama.cpp's {arch} runs ({runs}, for "
                      f"{n_layer} layers), which it uses whatever the array says")


def config_fields(arch: str, scalars: dict, path: Path, n_layer: int, n_embd: int, n_head: int, head_dim: int,
                  pattern: list | None = None) -> dict:
    """``LlamaConfig`` fields a family architecture's keys (and llama.cpp's fixed choices) set; ``pattern``: the
    items of a per-layer ``{arch}.attention.sliding_window_pattern`` array (:func:`check_pattern_array`)."""
    defaults = LLAMA_CPP_DEFAULTS.get(arch, {})
    window = scalars.get(f"{arch}.attention.sliding_window", defaults.get("attention.sliding_window")) or 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise GGUFReadError(f"{path}: metadata key {arch}.attention.sliding_window={window!r}: expected an integer")
    check_pattern_array(arch, pattern, window, path, n_layer)
    if arch in IGNORES_WINDOW:  # the file's window is not what llama.cpp (or transformers' GGUF loader) runs: every
        window = 0  # layer attends over the whole context, and so does the model read here
    if arch == "llama":
        return {"sliding_window": window, "family": "mistral"} if window else {}
    out: dict = {"family": arch}
    if arch == "qwen3":
        if window:
            raise GGUFReadError(f"{path}: {arch}.attention.sliding_window={window}: llama.cpp's qwen3 has no sliding "
                                "window, and gptforge will not guess which layers it covers")
        return {**out, "qk_norm": True}
    if arch == "phi3":
        return {**out, "sliding_window": window}
    # gemma2, gemma3
    if f"{arch}.attention.sliding_window" in scalars and not window:  # present and 0: not "missing"
        raise _refuse(path, f"{arch}.attention.sliding_window", 0, "Gemma's sliding layers with a window of no "
                      "tokens (no model has one; llama.cpp's gemma3 then runs every layer full)")
    if not window:
        raise GGUFReadError(f"{path}: metadata key {arch}.attention.sliding_window is missing; Gemma's sliding "
                            "layers need it")
    # newer llama.cpp reads these two where present; gptforge keeps each family's fixed choice and refuses another
    fixed = {f"{arch}.attention.sliding_window_pattern": SWA_PERIOD[arch],
             f"{arch}.rope.freq_base_swa": GEMMA3_LOCAL_THETA if arch == "gemma3"
             else scalars.get(f"{arch}.rope.freq_base", 10_000.0)}
    for key, want in fixed.items():
        if key in scalars and scalars[key] != want:
            raise _refuse(path, key, scalars[key], f"{arch}'s sliding layers other than llama.cpp's default ({want!r})")
    scalar = n_embd / n_head if n_layer == BIG_LAYERS[arch] else head_dim
    out.update(sliding_window=window, layer_types=swa_pattern(arch, n_layer), mlp="geglu", norm_plus_one=True,
               post_norms=True, embed_scale=n_embd ** 0.5, query_pre_attn_scalar=float(scalar))
    if arch == "gemma2":
        for key, field in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "logit_softcap")):
            v = scalars.get(f"{arch}.{key}", defaults[key])  # llama.cpp's gemma2 always caps: 0 divides by zero
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise GGUFReadError(f"{path}: metadata key {arch}.{key}={v!r}: expected a positive number "
                                    "(llama.cpp's gemma2 always soft-caps)")
            out[field] = float(v)
    else:
        out.update(qk_norm=True, rope_local_theta=GEMMA3_LOCAL_THETA)
    return out


def _key(scalars: dict, key: str, path: Path, kind: type | tuple = int, required: bool = True,
         default: Any = None, what: str = "Llama") -> Any:
    if key not in scalars:
        if required:
            raise GGUFReadError(f"{path}: metadata key {key} is missing; gptforge needs it to build the {what}")
        return default
    v = scalars[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise GGUFReadError(f"{path}: metadata key {key}={v!r} has the wrong type")
    return v


def _refuse(path: Path, key: str, value: Any, why: str, what: str = "Llama") -> GGUFReadError:
    return GGUFReadError(f"{path}: {key}={value!r}: {why}; gptforge's {what} does not implement it and will not "
                         "load the model wrong")


def _check_extras_and_vocab(scalars: dict, path: Path, arch: str, vocab_size: int, what: str,
                            window: bool = False) -> None:
    """What every architecture refuses alike: experts and (unless ``window``: read by the caller) sliding
    windows, and a vocabulary size that is absurd or disagrees with ``{arch}.vocab_size``."""
    for key in (f"{arch}.expert_count",) + (() if window else (f"{arch}.attention.sliding_window",)):
        if scalars.get(key):
            raise _refuse(path, key, scalars[key], "experts and sliding windows", what)
    if not 1 <= vocab_size <= 1 << 20:
        raise GGUFReadError(f"{path}: tokenizer.ggml.tokens holds {vocab_size} tokens (1 to {1 << 20})")
    declared = scalars.get(f"{arch}.vocab_size", vocab_size)
    if declared != vocab_size:
        raise GGUFReadError(f"{path}: {arch}.vocab_size={declared} but tokenizer.ggml.tokens holds {vocab_size}")


def _rope_scaling(scalars: dict, path: Path, arch: str, head_dim: int, theta: float,
                  rope_freqs: torch.Tensor | None) -> dict:
    """``model.rope_*`` from ``{arch}.rope.scaling.*`` and the ``rope_freqs.weight`` divisors."""
    from gptforge.models import rope

    kind = scalars.get(f"{arch}.rope.scaling.type", "linear")  # llama.cpp's default: a factor alone is linear
    factor = _key(scalars, f"{arch}.rope.scaling.factor", path, (int, float), required=False, default=0.0)
    if kind not in ("none", "", "linear"):
        raise _refuse(path, f"{arch}.rope.scaling.type", kind, "only linear rope scaling and Llama 3's "
                      "(rope_freqs.weight) are implemented")
    linear = factor not in (0.0, 1.0)  # llama.cpp divides every frequency by a factor whatever the type says
    if linear and not (factor > 0 and math.isfinite(factor)):
        raise _refuse(path, f"{arch}.rope.scaling.factor", factor, "a rope scaling factor must be positive")
    if rope_freqs is None:
        return rope.config_fields({"rope_type": "linear", "factor": float(factor)} if linear else {})
    if linear or arch != "llama":
        raise _refuse(path, f"tensor {ROPE_FREQS}", "present", f"per-frequency rope divisors with architecture "
                      f"{arch} or {arch}.rope.scaling.factor={factor}")
    orig = scalars.get(f"{arch}.rope.scaling.original_context_length")
    scaling = rope.scaling_from_factors(head_dim, theta, rope_freqs, orig if isinstance(orig, int) and orig > 0
                                        else None)
    if scaling is None:
        raise _refuse(path, f"tensor {ROPE_FREQS}", rope_freqs[:4].tolist(), "these per-frequency rope divisors "
                      "follow neither linear nor Llama 3's scaling")
    return rope.config_fields(scaling)


def llama_config_from_gguf(scalars: dict, arrays: dict, names: set[str], path: Path, vocab_size: int,
                           rope_freqs: torch.Tensor | None = None, items: dict | None = None):
    """A ``LlamaConfig`` from GGUF metadata (architecture llama or qwen2), refusing what gptforge's
    Llama cannot represent. ``rope_freqs``: the file's ``rope_freqs.weight``, dequantized; ``items``: the
    arrays' items by key (a per-layer sliding pattern is checked against them; without them it is refused)."""
    from gptforge.models.llama import LlamaConfig

    arch = scalars.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFReadError(f"{path}: general.architecture={arch!r}; gptforge reads GGUF architectures "
                            f"{', '.join(ARCHITECTURES)}")
    for key in (f"{arch}.feed_forward_length", f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"):
        if key in arrays:
            raise _refuse(path, key, "an array", "per-layer widths")
    n_layer = _key(scalars, f"{arch}.block_count", path)
    n_embd = _key(scalars, f"{arch}.embedding_length", path)
    n_head = _key(scalars, f"{arch}.attention.head_count", path)
    n_kv = _key(scalars, f"{arch}.attention.head_count_kv", path, required=False, default=n_head)
    ffn = _key(scalars, f"{arch}.feed_forward_length", path)
    ctx = _key(scalars, f"{arch}.context_length", path)
    for key, v, hi in (("block_count", n_layer, MAX_LAYERS), ("embedding_length", n_embd, 1 << 16),
                       ("attention.head_count", n_head, 1 << 10), ("attention.head_count_kv", n_kv, 1 << 10),
                       ("feed_forward_length", ffn, 1 << 18), ("context_length", ctx, MAX_CONTEXT)):
        if not 1 <= v <= hi:
            raise GGUFReadError(f"{path}: metadata key {arch}.{key}={v} is out of range (1 to {hi})")
    # a head size apart from embedding_length/head_count (Qwen3, Gemma, Mistral Nemo) is attention.key_length
    head_dim = _key(scalars, f"{arch}.attention.key_length", path, required=False, default=0)
    if head_dim and not 2 <= head_dim <= 1 << 12:
        raise GGUFReadError(f"{path}: metadata key {arch}.attention.key_length={head_dim} is out of range (2 to 4096)")
    if not head_dim and n_embd % n_head:
        head_dim = 1  # not whole heads: refused just below
    head_dim = head_dim or n_embd // n_head
    if n_head % n_kv or head_dim % 2:
        size = f"{arch}.attention.key_length={head_dim}" if f"{arch}.attention.key_length" in scalars \
            else f"{arch}.embedding_length={n_embd}"
        raise GGUFReadError(f"{path}: {size}, {arch}.attention.head_count={n_head} and "
                            f"{arch}.attention.head_count_kv={n_kv} do not make whole, even heads shared evenly")
    theta = _key(scalars, f"{arch}.rope.freq_base", path, (int, float), required=False, default=10_000.0)
    # required, as llama.cpp's loader requires it (transformers' would fall back to 1e-6): no guessed epsilon
    eps = _key(scalars, f"{arch}.attention.layer_norm_rms_epsilon", path, (int, float))
    if not (eps > 0 and math.isfinite(eps)):  # named as the file names it, not as model.norm_eps
        raise GGUFReadError(f"{path}: metadata key {arch}.attention.layer_norm_rms_epsilon={eps} must be a positive "
                            "number")
    if not (theta > 0 and math.isfinite(theta)):
        raise GGUFReadError(f"{path}: metadata key {arch}.rope.freq_base={theta} must be a positive number")
    scaling = _rope_scaling(scalars, path, arch, head_dim, float(theta), rope_freqs)
    for key in (f"{arch}.rope.dimension_count", f"{arch}.attention.key_length", f"{arch}.attention.value_length"):
        if key in scalars and scalars[key] != head_dim:
            raise _refuse(path, key, scalars[key], f"heads of {head_dim} channels (attention.key_length, or "
                          "embedding_length/head_count), all of them rotated")
    extra: dict = {}
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    pattern = None
    if pattern_key in arrays:  # a per-layer array: its items (none known: an array of one string, refused)
        pattern = list((items or {}).get(pattern_key, ["?"]))
    if arch in ("llama",) + ARCHS:  # families of the one Llama: their keys and llama.cpp's choices
        extra = config_fields(arch, scalars, path, n_layer, n_embd, n_head, head_dim, pattern)
    elif pattern is not None:  # qwen2: no window at all (refused below if the file has one)
        check_pattern_array(arch, pattern, 0, path, n_layer)
    if head_dim != n_embd // n_head or n_embd % n_head:
        extra["head_size"] = head_dim
    _check_extras_and_vocab(scalars, path, arch, vocab_size, "Llama", window=arch in ("llama",) + ARCHS)
    check_keys(arch, scalars, arrays, path)
    try:
        return LlamaConfig(n_layer=n_layer, n_head=n_head, n_kv_head=n_kv, n_embd=n_embd, intermediate_size=ffn,
                           block_size=ctx, vocab_size=vocab_size, rope_theta=float(theta), norm_eps=float(eps),
                           tie_embeddings="output.weight" not in names, qkv_bias=arch == "qwen2", **scaling, **extra)
    except ValueError as e:
        raise GGUFReadError(f"{path}: {e}") from None


def gpt2_config_from_gguf(scalars: dict, arrays: dict, path: Path, vocab_size: int):
    """A ``GPTConfig`` from GGUF metadata (architecture gpt2), refusing what gptforge's GPT cannot represent."""
    from gptforge.models.gpt2 import GPTConfig

    arch = "gpt2"
    for key in (f"{arch}.feed_forward_length", f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"):
        if key in arrays:
            raise _refuse(path, key, "an array", "per-layer widths", "GPT")
    n_layer = _key(scalars, f"{arch}.block_count", path, what="GPT")
    n_embd = _key(scalars, f"{arch}.embedding_length", path, what="GPT")
    n_head = _key(scalars, f"{arch}.attention.head_count", path, what="GPT")
    ffn = _key(scalars, f"{arch}.feed_forward_length", path, what="GPT")
    ctx = _key(scalars, f"{arch}.context_length", path, what="GPT")
    for key, v, hi in (("block_count", n_layer, MAX_LAYERS), ("embedding_length", n_embd, 1 << 16),
                       ("attention.head_count", n_head, 1 << 10), ("feed_forward_length", ffn, 1 << 18),
                       ("context_length", ctx, MAX_CONTEXT)):
        if not 1 <= v <= hi:
            raise GGUFReadError(f"{path}: metadata key {arch}.{key}={v} is out of range (1 to {hi})")
    if n_embd % n_head:
        raise GGUFReadError(f"{path}: {arch}.embedding_length={n_embd} is not whole heads of "
                            f"{arch}.attention.head_count={n_head}")
    n_kv = scalars.get(f"{arch}.attention.head_count_kv", n_head)
    if n_kv != n_head:
        raise _refuse(path, f"{arch}.attention.head_count_kv", n_kv, f"grouped keys and values (head_count is "
                      f"{n_head})", "GPT")
    if ffn != 4 * n_embd:
        raise _refuse(path, f"{arch}.feed_forward_length", ffn, f"an MLP other than 4 x embedding_length "
                      f"({4 * n_embd})", "GPT")
    eps = _key(scalars, f"{arch}.attention.layer_norm_epsilon", path, (int, float), what="GPT")
    if not abs(eps - GPT2_NORM_EPS) <= GPT2_NORM_EPS * 1e-6:  # stored as float32: 1e-5 to a part in 10^7
        raise _refuse(path, f"{arch}.attention.layer_norm_epsilon", eps, f"a LayerNorm epsilon other than "
                      f"{GPT2_NORM_EPS}", "GPT")
    _check_extras_and_vocab(scalars, path, arch, vocab_size, "GPT")
    check_keys(arch, scalars, arrays, path)
    try:
        return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=ctx, vocab_size=vocab_size)
    except ValueError as e:
        raise GGUFReadError(f"{path}: {e}") from None
