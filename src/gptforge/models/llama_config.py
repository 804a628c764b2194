"""``LlamaConfig``: the Llama family's settings, their checks and the values derived from them.

One dataclass for every Llama-style family: the fields other families add (``FEATURES``) are each off
by default, so a plain Llama's config says nothing about them; ``interop/hf_families.py`` sets them
from a Hugging Face config, ``models/llama.py`` builds the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

from gptforge.models import rope
from gptforge.models.family import FamilyConfig
from gptforge.numbers import MAX_DIM
from gptforge.tokens import GPT2_VOCAB

# name -> shape. intermediate_size 0 derives it from n_embd (see LlamaConfig.hidden_dim).
SIZES: dict[str, dict] = {
    # seconds on a CPU: tests and smoke runs
    "llama-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=128),
    # GPT-2 small's compute per token: 12 layers, 768 wide, MHA, SwiGLU 2048 (3*768*2048 = GPT-2's 2*768*3072),
    # GPT-2 tokenizer; the untied head adds 38.6M parameters but no FLOPs
    "llama-124m": dict(n_layer=12, n_head=12, n_kv_head=12, n_embd=768, intermediate_size=2048, block_size=1024),
    # Llama-3.2-1B's shape (tied embeddings, 128,256 vocabulary, llama3 rope scaling) for `plan`
    "llama3-1b": dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, intermediate_size=8192, block_size=8192,
                      vocab_size=128_256, pad_vocab=False, rope_theta=500_000.0, tie_embeddings=True,
                      rope_type="llama3", rope_factor=32.0, rope_original_context=8192),
}


MLPS = ("swiglu", "relu2", "geglu")  # geglu: down(gelu_tanh(gate(x)) * up(x)), Gemma's
# what export can write a model as (HF model_type and llama.cpp arch); "" = llama, or qwen2 with q/k/v biases
FAMILIES = ("", "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3", "granite", "olmo2")
FEATURES = ("head_size", "sliding_window", "layer_types", "attn_softcap", "query_pre_attn_scalar", "embed_scale",
            "norm_plus_one", "post_norms", "rope_local_theta", "attn_scale", "residual_scale", "logits_scaling",
            "pre_norms", "qk_norm_full")


@dataclass
class LlamaConfig(FamilyConfig):
    arch: str = "llama"  # model family (the registry's key); always "llama" here
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # query heads
    n_kv_head: int = 0  # key/value heads, n_head a multiple of it (GQA); 0 = n_head (plain MHA)
    n_embd: int = 768  # width of the residual stream
    intermediate_size: int = 0  # MLP width; 0 = derived (see hidden_dim)
    block_size: int = 1024  # maximum context length (rotary embeddings have no table, this is a limit)
    vocab_size: int = GPT2_VOCAB  # real tokens
    pad_vocab: bool = True  # embedding/lm_head rows rounded up to a multiple of 128
    rope_theta: float = 10_000.0  # base of the rotary position frequencies
    rope_type: str = "default"  # rope scaling: default | linear | llama3 (HF rope_scaling's rope_type)
    rope_factor: float = 1.0  # linear, llama3: how many times the trained context is stretched
    rope_low_freq_factor: float = 1.0  # llama3: wavelengths over original_context/low are divided by factor
    rope_high_freq_factor: float = 4.0  # llama3: wavelengths under original_context/high are kept
    rope_original_context: int = 0  # llama3: the context it was trained on (original_max_position_embeddings)
    qkv_bias: bool = False  # biases on the q, k and v projections, none on o_proj (Qwen2)
    norm_eps: float = 1e-5  # RMSNorm epsilon
    mlp: str = "swiglu"  # swiglu | relu2 | geglu
    qk_norm: bool = False  # RMSNorm over each head's queries and keys, before the rotation
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap); 0 = off
    # --- the features other families add (each off by default; models/llama.py's docstring lists them)
    head_size: int = 0  # width of one head; 0 = n_embd / n_head (Qwen3 and Gemma set it apart)
    sliding_window: int = 0  # > 0: a sliding layer's query sees only the last sliding_window keys, itself included
    layer_types: str = ""  # per layer, one letter: s = sliding window, f = full attention; "" = all s (with a window)
    attn_softcap: float = 0.0  # > 0: attention scores = cap * tanh(scores / cap) (Gemma 2); 0 = off
    query_pre_attn_scalar: float = 0.0  # > 0: scores scaled by its -1/2 power, not head_size's (Gemma)
    embed_scale: float = 1.0  # token embeddings multiplied by this (Gemma: sqrt(n_embd))
    norm_plus_one: bool = False  # every RMSNorm scales by (1 + weight), its weight starting at 0 (Gemma)
    post_norms: bool = False  # RMSNorms on the attention and MLP outputs too, before each residual add (Gemma 2/3)
    rope_local_theta: float = 0.0  # > 0: sliding layers rotate with this base, unscaled (Gemma 3); 0 = as full ones
    attn_scale: float = 0.0  # > 0: attention scores multiplied by this, not by 1/sqrt(head size) (Granite); 0 = off
    residual_scale: float = 1.0  # attention and MLP outputs multiplied by this before each residual add (Granite)
    logits_scaling: float = 1.0  # logits divided by this (Granite's logits_scaling); 1 = off
    pre_norms: bool = True  # False: no RMSNorm before attention and MLP, post_norms alone (OLMo 2)
    qk_norm_full: bool = False  # qk_norm over all heads' projected q (and k) at once, not per head (OLMo 2)
    family: str = ""  # how export writes it (HF model_type, llama.cpp arch): see FAMILIES; "" = llama or qwen2
    tie_embeddings: bool = False  # lm_head shares the input embedding's weights
    zero_init_proj: bool = False  # o_proj and down_proj start at zero: each block starts as the identity
    dropout: float = 0.0  # dropout probability in training (0 = off)
    recompute: str = "none"  # activation recomputation: none | mlp | block
    flash: bool = True  # F.scaled_dot_product_attention; False = explicit matmul + softmax
    attn_backend: str = "auto"  # SDPA kernel: auto | cudnn | flash | efficient | math (gptforge.kernels.attention)
    fused_ce: Optional[bool] = None  # training loss via the fused Triton classifier; auto = on with CUDA and triton
    lm_head_fp8: bool = False  # lm_head matmul in rowwise-scaled float8 (gptforge.kernels.fp8)
    attention: str = "causal"  # causal | document (each token sees only its own document; models/masks.py)
    doc_mask: str = "sdpa"  # document attention through SDPA (bool mask, any device) or flex (FlexAttention)
    bos_token: int = 50256  # the token that starts a document (GPT-2's <|endoftext|>)

    def check_family(self) -> None:
        for key in ("n_kv_head", "head_size", "intermediate_size", "sliding_window"):
            if getattr(self, key) > MAX_DIM:
                raise ValueError(f"model.{key}={getattr(self, key)} must be at most {MAX_DIM} (no model is that big)")
        if self.n_kv_head < 0:
            raise ValueError(f"model.n_kv_head={self.n_kv_head} must be >= 1 (or 0 = model.n_head)")
        if self.head_size < 0:
            raise ValueError(f"model.head_size={self.head_size} must be >= 1 (or 0 = model.n_embd / model.n_head)")
        if self.n_head % self.kv_heads != 0:
            raise ValueError(f"model.n_head={self.n_head} must be divisible by model.n_kv_head={self.n_kv_head} "
                             "(grouped-query attention shares each key/value head among n_head/n_kv_head queries)")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head size {self.head_dim} (model.head_size, or model.n_embd/model.n_head) must be even "
                             "(rotary embeddings rotate pairs of channels)")
        if self.intermediate_size < 0:
            raise ValueError(f"model.intermediate_size={self.intermediate_size} must be >= 0 (0 = derived)")
        if self.mlp not in MLPS:
            raise ValueError(f"model.mlp={self.mlp!r}; allowed: {', '.join(MLPS)}")
        if self.fused_ce and self.logit_softcap:
            raise ValueError(f"model.fused_ce computes the loss from raw logits; it cannot apply model.logit_softcap="
                             f"{self.logit_softcap}: switch one off")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"model.rope_theta={self.rope_theta} must be a positive number")
        rope.check_config(self)
        if not self.norm_eps > 0:
            raise ValueError(f"model.norm_eps={self.norm_eps} must be > 0")
        if not (self.logit_softcap >= 0 and math.isfinite(self.logit_softcap)):
            raise ValueError(f"model.logit_softcap={self.logit_softcap} must be >= 0 (0 = off)")
        self._check_family_features()

    def _check_family_features(self) -> None:
        """The fields other families add (Qwen3, Mistral, Phi-3, Gemma 2/3, Granite): each named when it is wrong."""
        for key in ("attn_softcap", "query_pre_attn_scalar", "rope_local_theta", "attn_scale"):
            v = getattr(self, key)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"model.{key}={v} must be a finite number >= 0 (0 = off)")
        for key in ("embed_scale", "residual_scale", "logits_scaling"):
            v = getattr(self, key)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"model.{key}={v} must be a positive number (1 = off)")
        if not self.pre_norms and not self.post_norms:
            raise ValueError("model.pre_norms=false without model.post_norms: a block with no norm at all; set "
                             "model.post_norms true (OLMo 2's norms after attention and MLP)")
        if self.qk_norm_full and not self.qk_norm:
            raise ValueError("model.qk_norm_full=true says how model.qk_norm normalises, and model.qk_norm is off")
        if self.attn_scale and self.query_pre_attn_scalar:
            raise ValueError(f"model.attn_scale={self.attn_scale} and model.query_pre_attn_scalar="
                             f"{self.query_pre_attn_scalar} both set the attention scores' scale; set one")
        if self.sliding_window < 0:
            raise ValueError(f"model.sliding_window={self.sliding_window} must be >= 1 (or 0 = off)")
        if self.layer_types and (len(self.layer_types) != self.n_layer or set(self.layer_types) - set("sf")):
            raise ValueError(f"model.layer_types={self.layer_types!r} must be one letter per layer ({self.n_layer}), "
                             "s (sliding window) or f (full attention), or empty (every layer slides)")
        if self.layer_types and not self.sliding_window:
            raise ValueError(f"model.layer_types={self.layer_types!r} names sliding layers but model.sliding_window=0; "
                             "set the window, or leave layer_types empty")
        if self.rope_local_theta and "s" not in self.sliding_pattern:
            raise ValueError(f"model.rope_local_theta={self.rope_local_theta} is the sliding layers' rope base, and no "
                             "layer slides (model.sliding_window, model.layer_types)")
        if self.sliding_window and self.attention == "document" and self.doc_mask == "flex":
            raise ValueError("model.sliding_window with model.doc_mask=flex: the FlexAttention mask has no window yet; "
                             "use --model.doc_mask sdpa")
        if self.attn_softcap and self.attn_backend != "auto":
            raise ValueError(f"model.attn_softcap={self.attn_softcap} computes the attention scores explicitly (no SDPA "
                             f"kernel caps them), so model.attn_backend={self.attn_backend} cannot apply; leave it auto")
        if self.family not in FAMILIES:
            raise ValueError(f"model.family={self.family!r}; allowed: {', '.join(f or repr(f) for f in FAMILIES)}")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or ``n_head`` when it is 0."""
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def sliding_pattern(self) -> str:
        """One letter per layer, s (sliding window) or f (full attention): ``layer_types``, or every
        layer s when only ``sliding_window`` is set (Mistral, Phi-3), f without a window."""
        if not self.sliding_window:
            return "f" * self.n_layer
        return self.layer_types or "s" * self.n_layer

    def features(self) -> list[str]:
        """The fields set away from their defaults that other families add, by name. Which of them tensor
        and pipeline parallelism run is ``parallel/mesh.py``'s to say (its allow-list); it refuses the rest
        by these names."""
        out = [f"model.{f.name}" for f in fields(self) if f.name in FEATURES and getattr(self, f.name) != f.default]
        return out + (["model.mlp=geglu"] if self.mlp == "geglu" else [])

    @property
    def hidden_dim(self) -> int:
        """MLP width: ``intermediate_size``, or when 0 the parameter-matched default: SwiGLU's three
        matrices at 8/3·C rounded up to a multiple of 64 (two matrices at 4·C for ReLU²)."""
        if self.intermediate_size:
            return self.intermediate_size
        if self.mlp == "relu2":
            return 4 * self.n_embd
        return ((8 * self.n_embd // 3 + 63) // 64) * 64

    @classmethod
    def from_size(cls, name: str, **overrides) -> LlamaConfig:
        if name not in SIZES:
            raise ValueError(f"unknown model size {name!r}; known: {', '.join(SIZES)}")
        return cls(**{**SIZES[name], **overrides})

