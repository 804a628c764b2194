"""Counting a model from its config alone: parameters, FLOPs per token, activation bytes.

Each family (``gpt2.py``, ``llama.py``) supplies ``counts(cfg, seq_len) -> Counts`` and
``layer_act_bytes(cfg, dtype, recompute)``; :mod:`gptforge.models.registry` finds them by the config's
``arch``. What both families share lives here: the :class:`Counts` record, the FLOPs-per-token
formulas (llm.c's and PaLM's), and the attention term. Nothing here builds a tensor, so ``gptforge
plan`` answers for a 1T-parameter model in milliseconds.

    >>> from gptforge.models.registry import counts, size_config
    >>> counts(size_config("gpt2"), 1024).params
    124475904
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    """A model's sizes, as the planner needs them. ``layer_flops`` and ``head_flops`` are forward
    matmul FLOPs per token (2 per multiply-add; attention's score and value products counted over the
    whole T x T square, as Megatron-LM and PaLM count them, causal masking notwithstanding)."""

    params: int  # all parameters, a tied embedding once (= model.num_parameters())
    layer_params: int  # one transformer block
    embed_params: int  # input side, on the first pipeline stage: token table (+ position table)
    head_params: int  # output side, on the last pipeline stage: final norm (+ untied head)
    lookup: int  # parameters used by lookup, not matmul: an untied input token table
    positions: int  # learned position table (GPT-2's wpe); 0 for rotary embeddings
    mlp_in_params: int  # the MLP's input projection(s): what ``recompute mlp`` runs again
    layer_replicated: int  # per block, what tensor parallelism leaves whole: norms, row-parallel output biases
    final_norm: int  # the final norm's parameters (part of head_params)
    layer_norms: int  # per block, the norms' (and QK-norms') parameters: sequence-parallel, gradients summed over TP
    qkv_bias: int  # per block, a fused q/k/v bias (GPT-2's c_attn), whose gradient TP all-gathers
    layer_tensors: int  # parameter tensors per block (the gradient norm reduces one value per tensor)
    embed_tensors: int  # ... on the input side (token table, position table)
    head_tensors: int  # ... on the output side (final norm, an untied head)
    tied: bool  # the output head is the input token table
    layer_flops: float  # forward FLOPs per token in one block at this sequence length
    head_flops: float  # forward FLOPs per token of the output projection (2 * C * padded vocab)
    n_layer: int
    n_embd: int
    n_head: int
    kv_heads: int
    vocab: int  # padded vocabulary (the head's rows)
    seq_len: int
    # per token, the mean over layers of (query width x keys each query meets), when that is not
    # n_embd x seq_len: a head size apart from n_embd/n_head, or sliding windows (models/llama.py)
    attn_span: float = 0.0


def attention_flops(n_embd: int, seq_len: int) -> float:
    """Forward FLOPs per token of the two attention products (q·kᵀ and p·v) over T keys: 4·T·C."""
    return 4.0 * seq_len * n_embd


def flops_per_token(c: Counts, formula: str = "llmc", n_params: int | None = None) -> float:
    """Training FLOPs per token (forward + backward, no recomputation):

    * ``llmc``: ``6*(N - lookup) + 6*L*C*T`` (llm.c's count; the attention term halved for causality);
    * ``palm``: ``6*(N - lookup - positions) + 12*L*C*T`` (PaLM / nanoGPT / Megatron-LM);

    C*T is ``attn_span`` where a family sets it (query width x keys met, a sliding window's fewer).

    ``n_params`` overrides the counted N (the training log passes the built model's count)."""
    N = c.params if n_params is None else n_params
    L, CT = c.n_layer, c.attn_span or c.n_embd * c.seq_len
    if formula == "llmc":
        return 6 * (N - c.lookup) + 6 * L * CT
    if formula == "palm":
        return 6 * (N - c.lookup - c.positions) + 12 * L * CT
    raise ValueError(f"unknown FLOPs formula {formula!r}")
