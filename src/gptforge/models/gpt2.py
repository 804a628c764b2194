"""GPT-2 in one readable file: config, attention, MLP, block, GPT.

Parameter names match Hugging Face's ``GPT2LMHeadModel`` (``transformer.h.0.attn.c_attn.weight``
...), so import/export is a key map plus the Conv1D transposes (``gptforge.interop.hf``).
No optimizer, sampling or IO lives here.

    >>> from gptforge.models.gpt2 import GPT, GPTConfig
    >>> model = GPT(GPTConfig.from_size("d2"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.kernels.attention import sdpa_for
from gptforge.models import masks
from gptforge.models.counting import Counts, attention_flops
from gptforge.models.family import FamilyConfig
from gptforge.models.head import logits_and_loss
from gptforge.models.kv_cache import KVCache
from gptforge.tokens import GPT2_VOCAB

# name -> (n_layer, n_head, n_embd). The four OpenAI sizes plus tiny CPU sizes.
SIZES: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 12, 768),  # 124M
    "gpt2-medium": (24, 16, 1024),  # 350M
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),  # 1558M
    "d2": (2, 2, 64),  # tests
    "d4": (4, 4, 128),  # CPU default job
    "d6": (6, 6, 192),  # bigger CPU run
    # GPT-3 (Brown et al. 2020, Table 2.1) at context 2048; 13B's d_model 5140 is not divisible by its 40
    # heads, so 5120 (128 per head) as in most reproductions
    "gpt3-13b": (40, 40, 5120),
    "gpt3-175b": (96, 96, 12288),
    # Megatron-LM's weak-scaling models (Narayanan et al. 2021, "Efficient Large-Scale Language Model
    # Training on GPU Clusters using Megatron-LM", Table 1), vocabulary 51,200 and sequence 2048 there
    "megatron-1.7b": (24, 24, 2304),
    "megatron-3.6b": (30, 32, 3072),
    "megatron-7.5b": (36, 32, 4096),
    "megatron-18b": (40, 48, 6144),
    "megatron-39b": (48, 64, 8192),
    "megatron-76b": (60, 80, 10240),
    "megatron-145b": (80, 96, 12288),
    "megatron-310b": (96, 128, 16384),
    "megatron-530b": (105, 128, 20480),
    "megatron-1t": (128, 160, 25600),
}


@dataclass
class GPTConfig(FamilyConfig):
    arch: str = "gpt2"  # model family (see gptforge.models.registry)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block (n_embd must divide by it)
    n_embd: int = 768  # width of the residual stream
    block_size: int = 1024  # maximum context length (learned position embeddings)
    vocab_size: int = GPT2_VOCAB  # real tokens
    pad_vocab: bool = True  # embedding/lm_head rows rounded up to a multiple of 128
    dropout: float = 0.0  # dropout probability in training (0 = off, as in pretraining at scale)
    bias: bool = True  # biases in Linear layers and LayerNorms (GPT-2 has them)
    flash: bool = True  # F.scaled_dot_product_attention; False = explicit matmul + softmax
    recompute: str = "none"  # activation recomputation: none | mlp | block
    attn_backend: str = "auto"  # SDPA kernel: auto | cudnn | flash | efficient | math (gptforge.kernels.attention)
    fused_ce: Optional[bool] = None  # training loss via the fused Triton classifier; auto = on with CUDA and triton
    lm_head_fp8: bool = False  # lm_head matmul in rowwise-scaled float8 (gptforge.kernels.fp8)
    fused_ln_residual: bool = False  # training: attention's residual add + ln_2 in one Triton kernel (kernels.fused_block)
    fused_bias_gelu: bool = False  # training: c_fc's bias + tanh GELU in one Triton kernel (kernels.fused_block)
    attention: str = "causal"  # causal | document (each token sees only its own document; models/masks.py)
    doc_mask: str = "sdpa"  # document attention through SDPA (bool mask, any device) or flex (FlexAttention)
    bos_token: int = 50256  # the token that starts a document (GPT-2's <|endoftext|>)

    def check_family(self) -> None:
        if self.fused_bias_gelu and not self.bias:
            raise ValueError("model.fused_bias_gelu fuses c_fc's bias into the GELU; it needs model.bias=true")

    @classmethod
    def from_size(cls, name: str, **overrides) -> GPTConfig:
        if name not in SIZES:
            raise ValueError(f"unknown model size {name!r}; known: {', '.join(SIZES)}")
        n_layer, n_head, n_embd = SIZES[name]
        return cls(n_layer=n_layer, n_head=n_head, n_embd=n_embd, **overrides)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.flash = cfg.flash
        self.dropout = cfg.dropout
        self.sdpa = sdpa_for(cfg.attn_backend)  # F.scaled_dot_product_attention, maybe pinned to one kernel
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v for all heads
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.RESIDUAL_SCALE = True  # type: ignore[attr-defined]  # see GPT._init_weights
        self.resid_dropout = nn.Dropout(cfg.dropout)
        if not cfg.flash:
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, C = x.size()
        hs = C // self.n_head
        # heads counted from the output, not n_head: under tensor parallelism this rank holds some
        # of them (c_attn's output is then its own heads' [q, k, v], see gptforge.parallel.tensor)
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        q = q.view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)  # (B, nh, past+T, hs)
        Tk = k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        # attn_mask (B or 1, 1, T, Tk) bool, True = may attend, built once per forward by GPT.forward;
        # None means plain causal attention (T == Tk), or every cached key (one new token)
        if masks.is_block_mask(attn_mask):  # FlexAttention BlockMask (model.attention=document, doc_mask=flex)
            y = masks.flex_attention(q, k, v, attn_mask)
        elif self.flash:
            y = self.sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                          is_causal=attn_mask is None and T == Tk and T > 1)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, Tk)
            if attn_mask is None and T == Tk:
                attn_mask = self.mask[:, :, :T, :Tk]
            if attn_mask is not None:
                att = att.masked_fill(~attn_mask, float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), p=dropout_p, training=self.training)
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # re-assemble heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.RESIDUAL_SCALE = True  # type: ignore[attr-defined]
        self.dropout = nn.Dropout(cfg.dropout)
        self.recompute_gelu = cfg.recompute == "mlp"
        self.fused_bias_gelu = cfg.fused_bias_gelu

    def _fc_gelu(self, x: torch.Tensor) -> torch.Tensor:
        # training only (evaluation keeps the plain ops), and a plain c_fc only: a LoRA layer adds its update itself
        if self.fused_bias_gelu and self.training and torch.is_grad_enabled() and type(self.c_fc) is nn.Linear:
            from gptforge.kernels.fused_block import bias_gelu  # imports triton: only when switched on

            return bias_gelu(F.linear(x, self.c_fc.weight), self.c_fc.bias)  # the matmul, then bias + GELU fused
        return self.gelu(self.c_fc(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_gelu and self.training and torch.is_grad_enabled():
            # llm.c's -r 1: keep only c_fc's input, recompute the 4C-wide activations in backward
            h = torch.utils.checkpoint.checkpoint(self._fc_gelu, x, use_reentrant=False)
        else:
            h = self._fc_gelu(x)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.fused_ln_residual = cfg.fused_ln_residual

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        a = self.attn(self.ln_1(x), kv_cache, layer, attn_mask)  # pre-LayerNorm residual blocks
        if self.fused_ln_residual and self.training and torch.is_grad_enabled():  # evaluation keeps the plain ops
            from gptforge.kernels.fused_block import add_layer_norm  # imports triton: only when switched on

            x, h = add_layer_norm(x, a, self.ln_2.weight, self.ln_2.bias, self.ln_2.eps)  # x + a, ln_2 of it
        else:
            x = x + a
            h = self.ln_2(x)
        return x + self.mlp(h)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        V = cfg.padded_vocab_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(V, cfg.n_embd),  # token embeddings, tied to lm_head
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),  # learned position embeddings
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init: N(0, 0.02); projections into the residual stream scaled by 1/sqrt(2*n_layer)
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "RESIDUAL_SCALE", False):
                std *= (2 * self.config.n_layer) ** -0.5
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks (FSDP shards and recomputation work per block)."""
        return self.transformer.h

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weights are counted once
        if exclude_embeddings:
            n -= self.transformer.wpe.weight.numel()
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

        Logits are sliced back to the real vocabulary, so padded rows never receive probability.
        Targets equal to -1 are ignored. ``pos`` (B, T) and ``attn_mask`` (B, 1, T, Tk) bool let a
        batch of left-padded prompts carry per-row positions (see ``gptforge.generation``).
        ``logits_to_keep`` N > 0: logits for the last N positions only (see ``models.head``).
        """
        x = self.hidden_states(idx, kv_cache, pos, attn_mask)
        return logits_and_loss(x, self.lm_head, targets, self.config, self.training, logits_to_keep)

    def embed(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) at positions ``pos`` -> the first block's input (B, T, C): token plus
        position embeddings, then dropout (the pipeline's first stage calls this too)."""
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def layer_args(self, pos: torch.Tensor) -> list[tuple[tuple, None]]:
        """Per layer: (what its block takes after its input, its attention mask) in a causal forward over
        positions ``pos`` without a cache (the pipeline's stages call this): nothing, as positions are in
        the embedding, and no mask; Llama's blocks take the rotary cos/sin, sliding layers a window."""
        return [((), None)] * self.config.n_layer

    def hidden_states(self, idx: torch.Tensor, kv_cache: KVCache | None = None, pos: torch.Tensor | None = None,
                      attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> the final hidden states (B, T, C), after ``ln_f`` and before the LM head (what
        transformers' ``GPT2Model`` returns; a reward model's or value head's input)."""
        _, pos, attn_mask = masks.forward_start(idx, kv_cache, pos, attn_mask, self.config)  # one mask, every layer
        x = self.embed(idx, pos)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            if self.config.recompute == "block" and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, None, i, attn_mask, use_reentrant=False)
            else:
                x = block(x, kv_cache, i, attn_mask)
        if kv_cache is not None:
            kv_cache.advance()
        return self.transformer.ln_f(x)

    def new_kv_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        cfg = self.config
        p = self.lm_head.weight
        return KVCache(
            cfg.n_layer, batch, cfg.n_head, max_len or cfg.block_size, cfg.n_embd // cfg.n_head,
            p.device, dtype or p.dtype,
        )


# --- counting from the config (the planner's and MFU's numbers; see models/counting.py) ----------------

# bytes autograd keeps per token per layer, in units of n_embd, counted from this file: in float32 the
# LayerNorm inputs and outputs, q/k/v, the attention output and its contiguous copy, the 4C-wide MLP input
# and GELU output (68); under bf16 autocast 38; ``recompute mlp`` drops the c_fc output, ``block`` keeps
# only each block's input
ACT_BYTES = {
    ("float32", "none"): 68, ("float32", "mlp"): 52, ("float32", "block"): 4,
    ("bfloat16", "none"): 38, ("bfloat16", "mlp"): 30, ("bfloat16", "block"): 4,
}


def layer_act_bytes(cfg: GPTConfig, dtype: str, recompute: str) -> float:
    """Bytes autograd keeps per token per block (flash attention; see ACT_BYTES)."""
    return ACT_BYTES[(dtype, recompute)] * cfg.n_embd


def counts(cfg: GPTConfig, seq_len: int) -> Counts:
    """Parameters and FLOPs of :class:`GPT` from its config (equal to ``GPT(cfg).num_parameters()``)."""
    C, V, b = cfg.n_embd, cfg.padded_vocab_size, 1 if cfg.bias else 0
    norm = C * (1 + b)
    layer = 2 * norm + (3 * C * C + 3 * C * b) + (C * C + C * b) + (4 * C * C + 4 * C * b) + (4 * C * C + C * b)
    embed, pos = V * C, cfg.block_size * C
    return Counts(
        params=embed + pos + cfg.n_layer * layer + norm, layer_params=layer, embed_params=embed + pos,
        head_params=norm, lookup=0, positions=pos, mlp_in_params=4 * C * C + 4 * C * b,
        layer_replicated=2 * norm + 2 * C * b, final_norm=norm, tied=True, layer_norms=2 * norm,
        qkv_bias=3 * C * b, layer_tensors=6 * (1 + b), embed_tensors=2, head_tensors=1 + b,
        layer_flops=2.0 * 12 * C * C + attention_flops(C, seq_len), head_flops=2.0 * C * V,
        n_layer=cfg.n_layer, n_embd=C, n_head=cfg.n_head, kv_heads=cfg.n_head, vocab=V, seq_len=seq_len,
    )
