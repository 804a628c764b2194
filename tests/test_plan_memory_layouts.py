"""The planner's memory model pinned per layout against bytes counted by hand from a built model
(issue 36): the parameters come from ``named_parameters()`` of the real module (on the meta device),
split by stage and tensor-parallel rank with the rules written out here, and the per-token activation
bytes are the hand counts of ``plan/memory.py``'s docstring (38·C per GPT-2 block under bf16, 30·C with
``recompute mlp``, 4·C with ``recompute block``). Nothing here calls the planner's own counting.

Planted bugs these catch: ZeRO-1's optimizer bytes not divided by the data-parallel degree; FSDP not
dividing weights/gradients or forgetting its gathered blocks; the pipeline's first stage keeping one
micro-batch in flight instead of ``min(m, p)`` (or all ``m``); interleaving's extra in-flight share;
the tied head's copy on the last stage; TP splitting the whole biases and norms."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptforge.config import Config
from gptforge.models.registry import build_model, size_config
from gptforge.plan.cluster import get_cluster
from gptforge.plan.cost import Layout, memory
from gptforge.plan.memory import estimate

SEQ = 64
# per token per GPT-2 block, bf16 autocast, flash attention (plan/memory.py's docstring hand count)
ACT_PER_C = {"none": 38, "mlp": 30, "block": 4}


def _cfg(n_layer: int = 4):
    # a small vocabulary so the first pipeline stage (in-flight micro-batches) is the fuller one
    return dataclasses.replace(size_config("d2"), n_layer=n_layer, vocab_size=256, pad_vocab=False, block_size=SEQ)


def _params(cfg) -> dict:
    """Parameter counts by part, from the built module's names."""
    with torch.device("meta"):
        model = build_model(cfg)
    out = {"embed": 0, "final_norm": 0, "blocks": [0] * cfg.n_layer, "tp_block": [0] * cfg.n_layer, "wte": 0}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:  # a tied table counts once
            continue
        seen.add(id(p))
        n = p.numel()
        if name.startswith("transformer.h."):
            i = int(name.split(".")[2])
            out["blocks"][i] += n
            # Megatron-style split on one of 2 TP ranks: column-parallel c_attn/c_fc (weights; the fused
            # q/k/v bias stays whole in gptforge), row-parallel c_proj weights; norms and the row-parallel
            # output biases whole
            split = name.endswith(("c_attn.weight", "c_fc.weight", "c_fc.bias", "c_proj.weight"))
            out["tp_block"][i] += n / 2 if split else n
        elif name.startswith(("transformer.wte", "transformer.wpe")):
            out["embed"] += n
            if "wte" in name:
                out["wte"] = n
        elif name.startswith("transformer.ln_f"):
            out["final_norm"] += n
        else:  # an untied head would be here; GPT-2 ties it
            raise AssertionError(f"unexpected parameter {name}")
    out["N"] = out["embed"] + out["final_norm"] + sum(out["blocks"])
    return out


def _acts(cfg, blocks: int, tok: int, recompute: str = "none", tp: int = 1) -> float:
    return blocks * ACT_PER_C[recompute] * cfg.n_embd * tok / tp


def _scores(cfg, mb: int, tp: int) -> float:
    """The explicit (non-flash) attention's T x T probabilities per block and micro-batch: 6 bytes a score
    under bf16 autocast (the bf16 scores and their fp32 softmax)."""
    return 0.0 if cfg.flash else mb * cfg.n_head / tp * SEQ * SEQ * 6


def _hand(cfg, P, *, dp=1, tp=1, pp=1, mb=2, gb=32, shard="none", dp_shard=0, v=1, recompute="none",
          flash=True, fused_ce=None) -> dict:
    """The fuller stage's bytes, counted by hand."""
    m = gb // (dp * mb)
    tok = mb * SEQ
    per_stage = cfg.n_layer // pp
    block = (P["tp_block"][0] if tp == 2 else P["blocks"][0])
    assert tp in (1, 2)
    stages = []
    for s in sorted({0, pp - 1}):
        n = block * per_stage
        if s == 0:
            n += P["embed"] / tp
        if s == pp - 1:
            n += P["final_norm"]
            if pp > 1:
                n += P["wte"] / tp  # the tied table's copy for the head
        g = (dp_shard or dp) if shard == "fsdp" else 1
        weights = 4 * n / g + (2 * 2 * block if shard == "fsdp" and g > 1 else 0)  # two gathered bf16 blocks
        grads = 4 * n / g
        optim = 8 * n / (dp if shard == "zero1" else g)
        if pp == 1 or s != 0:
            inflight = 1
        elif v == 1:
            inflight = min(m, pp)  # 1F1B: the first stage holds p micro-batches' activations
        else:
            inflight = min(m, pp) * (1 + (pp - 1) / (pp * v))
        per_mb = _acts(cfg, per_stage, tok, recompute, tp)
        if recompute != "block":
            per_mb += per_stage * _scores(cfg, mb, tp)
        acts = per_mb * inflight
        if recompute == "block":  # one block's full activations (and scores) while it is recomputed
            acts += _acts(cfg, 1, tok, "none", tp) + _scores(cfg, mb, tp)
        if s == pp - 1:
            # training's rule on a CUDA GPU with triton: model.fused_ce auto (None) or true runs the fused
            # classifier unless TP or PP splits the head; it keeps one bf16 buffer, the logits and then their
            # gradient (2 bytes a row), the plain loss the logits, log-softmax and their gradients (16)
            fused = fused_ce is not False and tp == 1 and pp == 1
            acts += tok * (2 if fused else 16) * cfg.vocab_size / tp
        stages.append({"stage": s, "weights": weights, "grads": grads, "optimizer": optim, "activations": acts,
                       "total": weights + grads + optim + acts})
    return max(stages, key=lambda d: d["total"])


LAYOUTS = [
    dict(dp=4),
    dict(dp=4, shard="zero1"),
    dict(dp=8, shard="zero1", mb=1),
    dict(dp=4, shard="fsdp"),
    dict(dp=4, shard="fsdp", dp_shard=2),
    dict(tp=2),
    dict(dp=2, tp=2, shard="zero1"),
    dict(pp=2),
    dict(pp=4),
    dict(pp=4, dp=2, gb=64),
    dict(pp=2, v=2),
    dict(pp=4, recompute="block"),
    dict(pp=2, recompute="mlp", dp=2, shard="zero1"),
    dict(shard="fsdp"),  # one rank: nothing to shard or gather
    dict(dp=4, fused_ce=False),  # the plain head without TP or PP
    dict(dp=2, shard="zero1", fused_ce=True),
    dict(dp=2, tp=2, shard="fsdp"),
    dict(pp=2, flash=False),
    dict(pp=2, flash=False, tp=2, recompute="block"),
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_memory_per_layout_matches_a_hand_count(kw):
    cfg = dataclasses.replace(_cfg(), flash=kw.get("flash", True), fused_ce=kw.get("fused_ce"))
    P = _params(cfg)
    want = _hand(cfg, P, **kw)
    L = Layout(dp=kw.get("dp", 1), tp=kw.get("tp", 1), pp=kw.get("pp", 1), micro_batch=kw.get("mb", 2),
               recompute=kw.get("recompute", "none"), shard=kw.get("shard", "none"), interleave=kw.get("v", 1),
               dp_shard=kw.get("dp_shard", 0))
    got = memory(cfg, L, get_cluster("a100-80"), kw.get("gb", 32), SEQ)
    assert got["stage"] == want["stage"], (got, want)
    for k in ("weights", "grads", "optimizer", "activations", "total"):
        assert got[k] == pytest.approx(want[k], rel=1e-12), (k, got, want)


def test_first_stage_is_the_fuller_one_here():
    """The small vocabulary makes the in-flight micro-batches decide: a planner keeping one in flight on the
    first stage would name the last stage instead (so the per-layout test above sees the in-flight count)."""
    cfg = _cfg()
    P = _params(cfg)
    assert _hand(cfg, P, pp=4)["stage"] == 0 and _hand(cfg, P, pp=2)["stage"] == 0


@pytest.mark.parametrize("sharding,world", [("none", 4), ("zero1", 4), ("zero1", 2), ("fsdp", 4)])
def test_data_parallel_estimate_divides_what_it_shards(sharding, world):
    """plan/memory.estimate (the data-parallel planner): ZeRO-1 divides the moments by the world, FSDP
    divides weights, gradients and moments and adds its gathered copies (root + two blocks)."""
    m = dataclasses.replace(size_config("d2"), n_layer=4)
    cfg = Config(model=m)
    P = _params(m)
    N = P["N"]
    e = estimate(cfg, world, micro_batch=2, sharding=sharding, recompute="none", dtype="bfloat16", fused=True)
    shard = world if sharding == "fsdp" else 1
    gathered = 2 * (P["embed"] + P["final_norm"] + 2 * P["blocks"][0]) if sharding == "fsdp" else 0
    assert e.weights == pytest.approx(4 * N / shard + gathered)
    assert e.grads == pytest.approx(4 * N / shard)
    assert e.optimizer == pytest.approx(8 * N / (world if sharding != "none" else 1))
    unfused = estimate(cfg, world, micro_batch=2, sharding=sharding, recompute="none", fused=False)
    assert unfused.optimizer - e.optimizer == pytest.approx(4 * N / (world if sharding != "none" else 1))
