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
``query_pre_attn_scalar``, ``attn_softcap`` and ``logit_softcap``; Gemma 3's ``rope_local_theta``
for its sliding layers; Granite's ``embed_scale``, ``residual_scale``, ``attn_scale`` and ``logits_scaling``;
OLMo 2's ``post_norms`` without ``pre_norms`` and ``qk_norm_full`` (one q/k norm across every head). They are decided when the model is built: a plain Llama's forward does no
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

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.kernels.attention import sdpa_for
from gptforge.models import masks, rope
from gptforge.models.counting import Counts, attention_flops
from gptforge.models.head import logits_and_loss
from gptforge.models.kv_cache import KVCache
from gptforge.models.llama_config import FAMILIES, FEATURES, MLPS, SIZES, LlamaConfig  # noqa: F401 - re-export


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
        self.scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.query_pre_attn_scalar or self.hd)  # Granite's, Gemma's
        if cfg.query_pre_attn_scalar or cfg.attn_scale:  # SDPA's own default is 1/sqrt(hd): only another is passed
            self.sdpa = functools.partial(self.sdpa, scale=self.scale)
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.o_proj.RESIDUAL_SCALE = True  # type: ignore[attr-defined]  # see Llama._init_weights
        if cfg.qk_norm:  # per head (Qwen3, Gemma 3), or over every head's channels at once (OLMo 2)
            full = cfg.qk_norm_full
            self.q_norm = norm_class(cfg)(cfg.head_dim * (cfg.n_head if full else 1), cfg.norm_eps)
            self.k_norm = norm_class(cfg)(cfg.head_dim * (cfg.kv_heads if full else 1), cfg.norm_eps)
        self.qk_norm, self.qk_norm_full = cfg.qk_norm and not cfg.qk_norm_full, cfg.qk_norm_full
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, C = x.size()
        # head counts from the outputs: under tensor parallelism a rank holds some of the heads
        q, k = self.q_proj(x), self.k_proj(x)  # (B, T, nh * hd), (B, T, nkv * hd)
        if self.qk_norm_full:  # OLMo 2: one RMSNorm over all heads' channels
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, -1, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, -1, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
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
        # Granite's residual_multiplier: each branch's output scaled before its add (None: a plain Llama, no work)
        self.residual_scale = cfg.residual_scale if cfg.residual_scale != 1.0 else None

    def branch(self, y: torch.Tensor) -> torch.Tensor:
        """An attention or MLP output as it joins the residual stream."""
        return y if self.residual_scale is None else y * self.residual_scale

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.branch(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, layer, attn_mask))
        x = x + self.branch(self.mlp(self.post_attention_layernorm(x)))
        return x


class PostNormBlock(Block):
    """Gemma 2/3's block: a norm before and after both attention and MLP; OLMo 2's (``pre_norms`` false) the
    norms after them alone. HF's names, so ``post_attention_layernorm`` here normalises the attention's output
    (in ``Block`` it is the MLP's input norm) and ``pre_feedforward_layernorm`` the MLP's input."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg)
        Norm = norm_class(cfg)
        self.pre_feedforward_layernorm = Norm(cfg.n_embd, cfg.norm_eps) if cfg.pre_norms else nn.Identity()
        self.post_feedforward_layernorm = Norm(cfg.n_embd, cfg.norm_eps)
        if not cfg.pre_norms:  # OLMo 2: no weights, nothing computed
            self.input_layernorm = nn.Identity()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None = None,
        layer: int = 0, attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.branch(self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache,
                                                                         layer, attn_mask)))
        x = x + self.branch(self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))))
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
        if self._embed_scale is not None:  # Gemma, Granite: the scale rounded to the weights' dtype first, as HF's
            # Gemma does (Granite's multiplies by the Python float: the same in float32, and for its 12.0 in bf16)
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
        post = 16 if cfg.post_norms and cfg.pre_norms else 0  # two more RMSNorms (OLMo 2: two in all, as Llama)
        return (4 * (6 + (3 + 2 * g) * a + mlp) + qk + post) * C
    norm2 = 8 + (4 if recompute == "mlp" or swiglu else 2)
    mlp = 2 * h if recompute == "mlp" else (8 * h if swiglu else 4 * h)
    post = 16 if cfg.post_norms and cfg.pre_norms else 0  # each: bf16 input, its float32 copy, the bf16 normalised values
    return (14 + 2 * (2 + 2 * g) * a + norm2 + mlp + qk + post) * C


def counts(cfg: LlamaConfig, seq_len: int) -> Counts:
    """Parameters and FLOPs of :class:`Llama` from its config (equal to ``Llama(cfg).num_parameters()``)."""
    C, V, H, hd = cfg.n_embd, cfg.padded_vocab_size, cfg.hidden_dim, cfg.head_dim
    attn = C * cfg.n_head * hd * 2 + C * cfg.kv_heads * hd * 2
    bias = (cfg.n_head + 2 * cfg.kv_heads) * hd if cfg.qkv_bias else 0  # split by heads under TP, as the weights
    mlp_in = (2 if cfg.mlp != "relu2" else 1) * C * H
    matmul = attn + mlp_in + H * C
    n_norms = (4 if cfg.post_norms else 2) - (0 if cfg.pre_norms else 2)  # OLMo 2: the post norms alone
    qk = ((cfg.n_head + cfg.kv_heads) * hd if cfg.qk_norm_full else 2 * hd) if cfg.qk_norm else 0
    norms = n_norms * C + qk
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
        layer_tensors=n_norms + 4 + (3 if cfg.mlp != "relu2" else 2) + (2 if cfg.qk_norm else 0)
        + (3 if bias else 0),
        embed_tensors=1, head_tensors=1 + (0 if cfg.tie_embeddings else 1),
        layer_flops=2.0 * matmul + attn_flops, head_flops=2.0 * C * V,
        n_layer=cfg.n_layer, n_embd=C, n_head=cfg.n_head, kv_heads=cfg.kv_heads, vocab=V, seq_len=seq_len,
        attn_span=span if span != C * seq_len else 0.0,
    )
