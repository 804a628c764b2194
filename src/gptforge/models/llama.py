"""Llama in one readable file: config, RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

A pre-norm decoder like ``gpt2.py``, with the changes Llama and modded-nanogpt made: RMSNorm instead
of LayerNorm, rotary position embeddings instead of learned ones, grouped-query attention (``n_kv_head``
key/value heads shared by ``n_head`` query heads), a SwiGLU MLP (or ReLU²), an untied output head,
no biases; plus optional QK-norm and a logit soft-cap (``cap * tanh(logits / cap)``), and the variants
common small models need: q/k/v biases (``qkv_bias``, Qwen2) and rope scaling (``rope_type`` linear
or llama3, Llama 3.1/3.2). The rotary angles and rotation are ``models/rope.py``'s, the attention masks
(document, sliding window) ``models/masks.py``'s.

Parameter names are Hugging Face ``LlamaForCausalLM``'s (``model.embed_tokens.weight``,
``model.layers.0.self_attn.q_proj.weight``, ... ``lm_head.weight``) and rotary embeddings use HF's
``rotate_half`` convention, so import/export is the identity key map plus the vocabulary padding
(``gptforge.interop.hf_llama``). ``qk_norm`` adds ``self_attn.q_norm``/``k_norm`` (Qwen3's names)
and ``mlp="relu2"`` drops ``gate_proj``; such models have no ``LlamaForCausalLM`` equivalent.

Other families are this model with fields set, each off by default (``interop/hf_families.py``):
``head_size`` apart from n_embd/n_head and ``qk_norm`` (Qwen3); ``sliding_window`` on every layer
(Mistral, Phi-3) or on those ``layer_types`` marks ``s`` (Qwen, Gemma); Gemma's ``norm_plus_one``
RMSNorms, ``post_norms`` around attention and MLP, ``embed_scale``, ``mlp="geglu"``,
``query_pre_attn_scalar``, ``attn_softcap`` and ``logit_softcap``; and Gemma 3's ``rope_local_theta``
for its sliding layers. They are decided when the model is built: a plain Llama's forward does no
work for them.

No optimizer, sampling or IO lives here. The interface is ``GPT``'s (see ``models.registry``), so
generation, evaluation and training use either family unchanged: ``forward(idx, targets, kv_cache,
pos, attn_mask)``, ``new_kv_cache``, ``num_parameters``, ``blocks``.

    >>> from gptforge.models.llama import Llama, LlamaConfig
    >>> model = Llama(LlamaConfig.from_size("llama-tiny"))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.kernels.attention import sdpa_for
from gptforge.models import masks, rope
from gptforge.models.counting import Counts, attention_flops
from gptforge.models.family import FamilyConfig
from gptforge.models.head import logits_and_loss
from gptforge.models.kv_cache import KVCache
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
FAMILIES = ("", "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3")
FEATURES = ("head_size", "sliding_window", "layer_types", "attn_softcap", "query_pre_attn_scalar", "embed_scale",
            "norm_plus_one", "post_norms", "rope_local_theta")


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
        """The fields other families add (Qwen3, Mistral, Phi-3, Gemma 2/3): each named when it is wrong."""
        for key in ("attn_softcap", "query_pre_attn_scalar", "rope_local_theta"):
            v = getattr(self, key)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"model.{key}={v} must be a finite number >= 0 (0 = off)")
        if not (self.embed_scale > 0 and math.isfinite(self.embed_scale)):
            raise ValueError(f"model.embed_scale={self.embed_scale} must be a positive number (1 = off)")
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
        """The fields set away from their defaults that other families add: what tensor and pipeline
        parallelism do not run yet (``parallel/mesh.py`` refuses them by these names)."""
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


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as HF's LlamaRMSNorm), returned in x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RMSNormPlusOne(RMSNorm):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), all in float32; the weight starts at 0 (the identity)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


def norm_class(cfg: LlamaConfig) -> type[RMSNorm]:
    return RMSNormPlusOne if cfg.norm_plus_one else RMSNorm


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.softcap = cfg.attn_softcap  # SDPA cannot cap scores: a capped model takes the explicit path
        self.flash = cfg.flash and not self.softcap
        self.sdpa = sdpa_for(cfg.attn_backend)  # F.scaled_dot_product_attention, maybe pinned to one kernel
        self.scale = 1.0 / math.sqrt(cfg.query_pre_attn_scalar or self.hd)
        if cfg.query_pre_attn_scalar:  # SDPA's own default is 1/sqrt(hd): only a different scale is passed
            self.sdpa = functools.partial(self.sdpa, scale=self.scale)
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.o_proj.RESIDUAL_SCALE = True  # type: ignore[attr-defined]  # see Llama._init_weights
        if cfg.qk_norm:
            self.q_norm = norm_class(cfg)(cfg.head_dim, cfg.norm_eps)
            self.k_norm = norm_class(cfg)(cfg.head_dim, cfg.norm_eps)
        self.qk_norm = cfg.qk_norm
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, C = x.size()
        # head counts from the outputs: under tensor parallelism a rank holds some of the heads
        q = self.q_proj(x).view(B, T, -1, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, -1, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, -1, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
        if kv_cache is not None:  # the cache holds n_kv_head heads: GQA's memory saving
            k, v = kv_cache.update(layer, k, v)  # (B, nkv, past+T, hd)
        Tk = k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        # attn_mask (B or 1, 1, T, Tk) bool, True = may attend, built once per forward by Llama.forward;
        # None means plain causal attention (T == Tk), or every cached key (one new token)
        causal = attn_mask is None and T == Tk and T > 1
        if masks.is_block_mask(attn_mask):  # FlexAttention BlockMask (model.attention=document, doc_mask=flex)
            y = masks.flex_attention(q, k, v, attn_mask, enable_gqa=self.n_kv_head != self.n_head)
        elif self.flash:
            y = self.sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
                          enable_gqa=self.n_kv_head != self.n_head)
        else:
            rep = self.n_head // self.n_kv_head  # query head h reads key/value head h // rep (HF's repeat_kv)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, nh, Tk, hd)
            att = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, T, Tk)
            if self.softcap:  # Gemma 2: cap * tanh(scores / cap), before the mask
                att = self.softcap * torch.tanh(att / self.softcap)
            if causal:
                attn_mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril()
            if attn_mask is not None:  # (B, 1, T, Tk) or (T, Tk) bool, True = may attend
                att = att.masked_fill(~attn_mask, float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), p=dropout_p, training=self.training)
            y = att @ v  # (B, nh, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # heads side by side
        return self.resid_dropout(self.o_proj(y))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), GeGLU with gelu_tanh in silu's place (Gemma); or ReLU²:
    down(relu(up(x))²) (modded-nanogpt)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        H = cfg.hidden_dim
        self.swiglu = cfg.mlp != "relu2"  # gated: SwiGLU, or GeGLU with the tanh GELU
        self.act = functools.partial(F.gelu, approximate="tanh") if cfg.mlp == "geglu" else F.silu
        if self.swiglu:
            self.gate_proj = nn.Linear(cfg.n_embd, H, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, H, bias=False)
        self.down_proj = nn.Linear(H, cfg.n_embd, bias=False)
        self.down_proj.RESIDUAL_SCALE = True  # type: ignore[attr-defined]
        self.dropout = nn.Dropout(cfg.dropout)
        self.recompute_act = cfg.recompute == "mlp"

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.act(self.gate_proj(x)) * self.up_proj(x)
        return F.relu(self.up_proj(x)).square()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_act and self.training and torch.is_grad_enabled():
            # keep only the MLP's input; the H-wide activations are recomputed in backward
            h = torch.utils.checkpoint.checkpoint(self._act, x, use_reentrant=False)
        else:
            h = self._act(x)
        return self.dropout(self.down_proj(h))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        Norm = norm_class(cfg)
        self.input_layernorm = Norm(cfg.n_embd, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = Norm(cfg.n_embd, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, layer, attn_mask)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class PostNormBlock(Block):
    """Gemma 2/3's block: a norm before and after both attention and MLP. HF's names, so
    ``post_attention_layernorm`` here normalises the attention's output (in ``Block`` it is the MLP's
    input norm) and ``pre_feedforward_layernorm`` the MLP's input."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg)
        self.pre_feedforward_layernorm = norm_class(cfg)(cfg.n_embd, cfg.norm_eps)
        self.post_feedforward_layernorm = norm_class(cfg)(cfg.n_embd, cfg.norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, layer,
                                                             attn_mask))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        V = cfg.padded_vocab_size
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(V, cfg.n_embd),
                layers=nn.ModuleList([(PostNormBlock if cfg.post_norms else Block)(cfg) for _ in range(cfg.n_layer)]),
                norm=norm_class(cfg)(cfg.n_embd, cfg.norm_eps),
            )
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(cfg.n_embd, V, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)
        # decided here, once: a plain Llama's forward does no per-layer work for the features it lacks
        self._embed_scale = cfg.embed_scale if cfg.embed_scale != 1.0 else None
        self._per_layer = bool(cfg.sliding_window or cfg.rope_local_theta)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks (what FSDP shards and compiles one by one)."""
        return self.model.layers

    def _init_weights(self, module: nn.Module) -> None:
        # N(0, 0.02) as GPT-2; projections into the residual stream 1/sqrt(2*n_layer) smaller, or zero
        if isinstance(module, nn.Linear):
            if module.bias is not None:  # q/k/v biases (qkv_bias) start at zero
                torch.nn.init.zeros_(module.bias)
            std = 0.02
            if getattr(module, "RESIDUAL_SCALE", False):
                if self.config.zero_init_proj:
                    torch.nn.init.zeros_(module.weight)
                    return
                std *= (2 * self.config.n_layer) ** -0.5
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters (a tied head counted once). ``exclude_embeddings`` leaves out the input
        embedding table when it is untied: a lookup, not a matmul (as GPT leaves out wpe)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and not self.config.tie_embeddings:
            n -= self.model.embed_tokens.weight.numel()
        return n

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        pos: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) token ids -> logits (B, T, vocab_size), and the mean cross-entropy if targets.
        (Training forwards with ``fused_ce`` return no logits: their buffer holds the gradient.)

        Same contract as ``GPT.forward``: logits sliced to the real vocabulary, targets of -1 ignored,
        ``pos`` (B, T) per-row positions and ``attn_mask`` (B, 1, T, Tk) bool for left-padded batches,
        ``logits_to_keep`` for the last N positions' logits only.
        """
        x = self.hidden_states(idx, kv_cache, pos, attn_mask)
        return logits_and_loss(x, self.lm_head, targets, self.config, self.training, logits_to_keep)

    def embed(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> the first block's input (B, T, C): token embeddings, then dropout (no
        position table: positions enter every block as rotary cos/sin, :meth:`block_args`)."""
        x = self.model.embed_tokens(idx)
        if self._embed_scale is not None:  # Gemma: the scale rounded to the weights' dtype first, as HF does
            x = x * torch.tensor(self._embed_scale, dtype=x.dtype)
        return self.drop(x)

    def block_args(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What every block takes after its input: the rotary (cos, sin) for positions ``pos`` (T,) or
        (B, T). The pipeline's stages call this for their own blocks."""
        return rope.rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta, **rope.scaling_of(self.config))

    def layer_args(self, pos: torch.Tensor) -> list[tuple[tuple, torch.Tensor | None]]:
        """Per layer, by its index in the whole model: (what its block takes after its input, its attention
        mask) in a causal forward over positions ``pos`` (T,) without a cache. The pipeline's stages call
        this, so a stage's sliding layers get their window and local rope by their global index."""
        cos, sin = self.block_args(pos)
        if not self._per_layer:
            return [((cos, sin), None)] * self.config.n_layer
        return [((c, s), mask) for c, s, mask in self._layer_inputs(pos, cos, sin, None, pos.size(-1))]

    def hidden_states(self, idx: torch.Tensor, kv_cache: KVCache | None = None, pos: torch.Tensor | None = None,
                      attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> the final hidden states (B, T, C), after the last RMSNorm and before the LM
        head (what transformers' ``LlamaModel`` returns; a reward model's or value head's input)."""
        cfg = self.config
        past, pos, attn_mask = masks.forward_start(idx, kv_cache, pos, attn_mask, cfg)  # one mask, every layer
        x = self.embed(idx, pos)  # (B, T, C)
        cos, sin = self.block_args(pos)  # (T, hd) or (B, T, hd)
        per_layer = self._layer_inputs(pos, cos, sin, attn_mask, past + idx.size(1)) if self._per_layer else None
        for i, block in enumerate(self.model.layers):
            if per_layer is not None:  # sliding windows or local rope bases: this layer's kind
                cos, sin, attn_mask = per_layer[i]
            if cfg.recompute == "block" and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, None, i, attn_mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, kv_cache, i, attn_mask)
        if kv_cache is not None:
            kv_cache.advance()
        return self.model.norm(x)

    def _layer_inputs(self, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: torch.Tensor | None,
                      Tk: int) -> list[tuple]:
        """(cos, sin, mask) per layer: full layers take the forward's; sliding layers the mask narrowed to
        the window (and, with ``rope_local_theta``, their own unscaled rotary angles). Built once per forward."""
        cfg = self.config
        full = (cos, sin, attn_mask)
        local = full
        if "s" in cfg.sliding_pattern:
            T = pos.size(-1)
            local_cos, local_sin = cos, sin
            if cfg.rope_local_theta:
                local_cos, local_sin = rope.rope_cos_sin(pos, cfg.head_dim, cfg.rope_local_theta)
            local = (local_cos, local_sin, masks.window_mask(attn_mask, T, Tk, cfg.sliding_window, pos.device))
        return [local if kind == "s" else full for kind in cfg.sliding_pattern]

    def new_kv_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        cfg = self.config
        p = self.lm_head.weight
        return KVCache(cfg.n_layer, batch, cfg.kv_heads, max_len or cfg.block_size, cfg.head_dim,
                       p.device, dtype or p.dtype)


# --- counting from the config (the planner's and MFU's numbers; see models/counting.py) ----------------


def layer_act_bytes(cfg: LlamaConfig, dtype: str, recompute: str) -> float:
    """Bytes autograd keeps per token per block, counted from this file (g = kv heads / heads, h = MLP
    width / C). float32: two RMSNorms keep input, normalised and output (6C); q, k, v, attention output
    and one copy ((3 + 2g)C); SwiGLU keeps gate, SiLU, up and product (4hC), ReLU² two (2hC),
    ``recompute mlp`` only the product (hC). bf16 autocast: each projection keeps its own bf16 copy of
    the normalised input (q/k/v: three, gate/up: two), q/k/v and the attention output are bf16, the
    MLP's H-wide tensors bf16. QK-norm adds its inputs and normalised values (8(1 + g)C bytes). A
    head_size apart scales the attention terms by n_head*head_size/C; post_norms adds two norms.
    ``recompute block`` keeps each block's input (4C)."""
    C = cfg.n_embd
    if recompute == "block":
        return 4 * C
    g, h, swiglu = cfg.kv_heads / cfg.n_head, cfg.hidden_dim / C, cfg.mlp != "relu2"
    a = cfg.n_head * cfg.head_dim / C  # attention width over C: 1 unless head_size is set apart
    qk = 8 * (1 + g) * a if cfg.qk_norm else 0
    if dtype == "float32":
        mlp = h if recompute == "mlp" else (4 * h if swiglu else 2 * h)
        post = 16 if cfg.post_norms else 0  # two more RMSNorms: input and normalised values each
        return (4 * (6 + (3 + 2 * g) * a + mlp) + qk + post) * C
    norm2 = 8 + (4 if recompute == "mlp" or swiglu else 2)
    mlp = 2 * h if recompute == "mlp" else (8 * h if swiglu else 4 * h)
    post = 16 if cfg.post_norms else 0  # each: bf16 input, its float32 copy, the bf16 normalised values
    return (14 + 2 * (2 + 2 * g) * a + norm2 + mlp + qk + post) * C


def counts(cfg: LlamaConfig, seq_len: int) -> Counts:
    """Parameters and FLOPs of :class:`Llama` from its config (equal to ``Llama(cfg).num_parameters()``)."""
    C, V, H, hd = cfg.n_embd, cfg.padded_vocab_size, cfg.hidden_dim, cfg.head_dim
    attn = C * cfg.n_head * hd * 2 + C * cfg.kv_heads * hd * 2
    bias = (cfg.n_head + 2 * cfg.kv_heads) * hd if cfg.qkv_bias else 0  # split by heads under TP, as the weights
    mlp_in = (2 if cfg.mlp != "relu2" else 1) * C * H
    matmul = attn + mlp_in + H * C
    norms = (4 if cfg.post_norms else 2) * C + (2 * hd if cfg.qk_norm else 0)
    # a sliding layer's query meets at most sliding_window keys: the attention products, averaged over layers
    ctx = [min(seq_len, cfg.sliding_window) if kind == "s" else seq_len for kind in cfg.sliding_pattern]
    attn_flops = sum(attention_flops(cfg.n_head * hd, t) for t in ctx) / cfg.n_layer
    span = cfg.n_head * hd * sum(ctx) / cfg.n_layer
    layer = matmul + bias + norms
    embed = V * C
    head = C + (0 if cfg.tie_embeddings else V * C)
    return Counts(
        params=embed + cfg.n_layer * layer + head, layer_params=layer, embed_params=embed, head_params=head,
        lookup=0 if cfg.tie_embeddings else embed, positions=0, mlp_in_params=mlp_in,
        layer_replicated=norms, final_norm=C, tied=cfg.tie_embeddings, layer_norms=norms, qkv_bias=0,
        layer_tensors=(4 if cfg.post_norms else 2) + 4 + (3 if cfg.mlp != "relu2" else 2) + (2 if cfg.qk_norm else 0)
        + (3 if bias else 0),
        embed_tensors=1, head_tensors=1 + (0 if cfg.tie_embeddings else 1),
        layer_flops=2.0 * matmul + attn_flops, head_flops=2.0 * C * V,
        n_layer=cfg.n_layer, n_embd=C, n_head=cfg.n_head, kv_heads=cfg.kv_heads, vocab=V, seq_len=seq_len,
        attn_span=span if span != C * seq_len else 0.0,
    )
