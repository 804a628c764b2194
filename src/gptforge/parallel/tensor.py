"""Tensor + sequence parallelism in the Megatron layout, through ``parallelize_module``.

    torchrun --nproc_per_node 2 -m gptforge train --preset tiny --dist.tp 2

Per block: the norms run on sequence shards (``SequenceParallel``: the residual stream is
``Shard(1)``, each rank holds T/tp positions); the attention and MLP inputs are all-gathered to the
whole sequence (``PrepareModuleInput``); q/k/v and the MLP's first matrices are column-parallel
(each rank whole heads / a slice of the hidden width) and the output projections row-parallel,
reduce-scattered back onto sequence shards. Gemma's and OLMo 2's post-norms, on the attention's and MLP's
outputs, are sequence-parallel too; a block without input norms (OLMo 2) hands the attention and MLP the
residual's sequence shard, which they gather the same way. What the newer families add per head (per-head
QK-norm, soft-caps, windows, the scores' scale) acts on each rank's own heads, and their scalars (Granite's
residual multiplier, the logits' divisor) on each rank's shard. OLMo 2's QK-norm over every head's channels
would need a reduction across ranks: ``parallel/mesh.py`` refuses it here. The embedding is row-parallel
over the vocabulary and the output head column-parallel, its logits left vocabulary-sharded for
``loss_parallel`` (the full (B, T, V) logits are never gathered). Rotary angles are computed for the whole sequence, which is
what attention sees, so Llama's positions stay exact; GPT-2's learned position table is split by
rows and reduce-scattered like the token embedding.

GPT-2's ``c_attn`` is one fused (3C, C) matrix [q; k; v]. A plain row split would give rank 0 all
of q and half of k, so it is placed ``_StridedShard(0, split_factor=3)``: each rank holds its own
heads' rows of q, k and v, and ``full_tensor()`` / checkpoints still see Hugging Face's layout.
DCP cannot write strided shards, so :func:`dcp_view` hands it those tensors replicated.

The models do not know their world size: their attention reads the local head count from the
projection's output (``view(B, T, -1, head_size)``). Nothing here communicates by hand.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.distributed.tensor.placement_types import _StridedShard


class FusedColwise(ParallelStyle):
    """Column parallelism for a Linear whose output is ``parts`` matrices stacked by rows (GPT-2's
    c_attn: q, k, v). Rank r holds rows r/tp of each part; its output is [q_r, k_r, v_r]."""

    def __init__(self, parts: int):
        super().__init__()
        self.parts = parts

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        strided = [_StridedShard(0, split_factor=self.parts)]
        module.weight = nn.Parameter(distribute_tensor(module.weight.data, device_mesh, strided))
        if module.bias is not None:
            # the bias stays replicated (FSDP2 could not shard a 1-D strided tensor again); each rank
            # adds its rows, and the slicing's backward all-gathers the bias gradient
            module.bias = nn.Parameter(distribute_tensor(module.bias.data, device_mesh, [Replicate()]))

        def forward(mod, x: torch.Tensor) -> torch.Tensor:
            # x: the whole sequence, identical on every rank; its gradient is a partial sum per rank,
            # summed over the group by the Replicate -> local conversion's backward (as ColwiseParallel)
            xd = x if isinstance(x, DTensor) else DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            xl = xd.to_local(grad_placements=[Partial()])
            bias = mod.bias.redistribute(placements=strided).to_local() if mod.bias is not None else None
            return F.linear(xl, mod.weight.to_local(), bias)

        module.forward = types.MethodType(forward, module)
        return module


def _sp_input(n_args: int) -> PrepareModuleInput:
    """All-gather a sublayer's first input (the normed residual, sequence-sharded) to the whole
    sequence; its other positional inputs (rotary angles, cache, layer, mask) pass untouched."""
    rest = (None,) * (n_args - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))


def _head_plan() -> ColwiseParallel:
    return ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)


def _tie(model: nn.Module, embedding: nn.Embedding) -> None:
    """Both ends were sharded the same way (vocabulary rows, Shard(0)): make them one parameter again."""
    model.lm_head.weight = embedding.weight


def _gpt2(model: nn.Module, mesh) -> None:
    tied = model.lm_head.weight is model.transformer.wte.weight
    plan = {
        "transformer.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "transformer.wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),  # (T, C): T split
        "transformer.ln_f": SequenceParallel(),
        "lm_head": _head_plan(),
    }
    for i in range(len(model.transformer.h)):
        b = f"transformer.h.{i}"
        plan.update({
            f"{b}.ln_1": SequenceParallel(),
            f"{b}.attn": _sp_input(4),  # (x, kv_cache, layer, attn_mask)
            f"{b}.attn.c_attn": FusedColwise(3),
            f"{b}.attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            f"{b}.ln_2": SequenceParallel(),
            f"{b}.mlp": _sp_input(1),
            f"{b}.mlp.c_fc": ColwiseParallel(),
            f"{b}.mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    parallelize_module(model, mesh, _present(model, plan))
    if tied:
        _tie(model, model.transformer.wte)


def _llama(model: nn.Module, mesh) -> None:
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": _head_plan(),
    }
    for i in range(len(model.model.layers)):
        b = f"model.layers.{i}"
        plan.update({
            f"{b}.input_layernorm": SequenceParallel(),
            f"{b}.self_attn": _sp_input(6),  # (x, cos, sin, kv_cache, layer, attn_mask)
            f"{b}.self_attn.q_proj": ColwiseParallel(),
            f"{b}.self_attn.k_proj": ColwiseParallel(),
            f"{b}.self_attn.v_proj": ColwiseParallel(),
            # QK-norm runs per head on this rank's heads (dim 1 of (B, nh, T, hd)); its weight is
            # replicated and its gradient summed over the group, as a sequence-parallel norm's
            f"{b}.self_attn.q_norm": SequenceParallel(sequence_dim=1, use_local_output=True),
            f"{b}.self_attn.k_norm": SequenceParallel(sequence_dim=1, use_local_output=True),
            f"{b}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            f"{b}.post_attention_layernorm": SequenceParallel(),
            f"{b}.mlp": _sp_input(1),
            f"{b}.mlp.gate_proj": ColwiseParallel(),
            f"{b}.mlp.up_proj": ColwiseParallel(),
            f"{b}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
        if model.config.post_norms:
            # Gemma's block (HF's names): post_attention_layernorm normalises the attention's output and
            # post_feedforward_layernorm the MLP's, each per position on the row-parallel output's sequence
            # shard, added to the residual as a local tensor like it; pre_feedforward_layernorm is the MLP's input
            plan.update({
                f"{b}.post_attention_layernorm": SequenceParallel(use_local_output=True),
                f"{b}.pre_feedforward_layernorm": SequenceParallel(),
                f"{b}.post_feedforward_layernorm": SequenceParallel(use_local_output=True),
            })
    parallelize_module(model, mesh, _present(model, plan))
    if tied:
        _tie(model, model.model.embed_tokens)


def _present(model: nn.Module, plan: dict) -> dict:
    """The plan's entries for modules this model has (no q_norm without QK-norm, no gate_proj with
    ReLU², no embeddings on a middle pipeline stage, no input norms where the block holds an
    ``nn.Identity`` in their place: OLMo 2's, whose attention and MLP gather the residual's sequence
    shards themselves, as ``_sp_input`` takes an unwrapped input to be ``Shard(1)``)."""
    names = {n for n, m in model.named_modules() if not isinstance(m, nn.Identity)}
    return {k: v for k, v in plan.items() if k in names}


PLANS = {"gpt2": _gpt2, "llama": _llama}

# what a family's plan splits beyond heads, vocabulary, MLP width and sequence, which dist.tp must divide:
# (config key, why); GPT-2's position table (block_size, C) is split by rows
PLAN_DIVIDES = {"gpt2": (("model.block_size", "the position table is split by rows"),), "llama": ()}


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` (its parameters become DTensors)."""
    arch = model.config.arch
    if arch not in PLANS:
        raise ValueError(f"no tensor-parallel plan for model.arch={arch!r}; known: {', '.join(PLANS)}")
    PLANS[arch](model, tp_mesh)


# --- checkpoints ---------------------------------------------------------------------------------

def fsdp_placement(param) -> Shard | None:
    """FSDP2's ``shard_placement_fn``: a strided (fused q/k/v) matrix is sharded by columns across
    the data dimension, so its two shardings never nest on one dimension; the rest by rows."""
    return Shard(1) if _strided(param) else None


def _strided(t) -> bool:
    return isinstance(t, DTensor) and any(isinstance(p, _StridedShard) for p in t.placements)


def dcp_view(state: dict) -> tuple[dict, callable]:
    """(a state dict DCP can write and read, a function that copies what was read back into
    ``state``). Strided shards (GPT-2's c_attn and its optimizer moments) become replicated
    DTensors on the same mesh; everything else is passed through as is."""
    pending: list[tuple[DTensor, DTensor]] = []

    def convert(x):
        if isinstance(x, dict):
            return {k: convert(v) for k, v in x.items()}
        if _strided(x):
            rep = x.redistribute(placements=[Replicate() if isinstance(p, _StridedShard) else p
                                             for p in x.placements])
            pending.append((x, rep))
            return rep
        return x

    view = convert(state)

    def copy_back() -> None:
        for orig, rep in pending:
            orig.to_local().copy_(rep.redistribute(placements=orig.placements).to_local())

    return view, copy_back
