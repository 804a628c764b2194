"""The planner's time model (``plan.cost.estimate_cost``) and the traffic it charges
(``plan.cost.comm_volume``), pinned per layout against step times worked out by hand (issue 36).

Every number here is written out from first principles on a toy cluster with round numbers, not read
from the planner:

* FLOPs: Megatron-LM's count (Narayanan et al. 2021, section 5.1): a block's forward is
  ``24 C^2 + 4 T C`` FLOPs per token, the head's ``2 C V``; forward + backward is 3 forwards, block
  recomputation one more block forward, so an iteration is ``72 B T l C^2 (1 + T/6C + V/12lC)``
  FLOPs (``96 ... (1 + T/6C + V/16lC)`` with recomputation);
* ring collectives: a rank sends ``2 (g-1)/g`` of an all-reduced tensor, ``(g-1)/g`` of an
  all-gather's output or a reduce-scatter's input, and the whole of a point-to-point tensor;
* the parameters by part come from the built module (meta device), and the collectives per block and
  micro-batch are counted from the Megatron layout with sequence parallelism (2 all-gathers and 2
  reduce-scatters forward, the reverse backward);
* the model's stated costs (plan/cost.py's docstring): saved activations (38 C bytes per token per
  GPT-2 block under bf16, plan/memory.py's hand count) written and read 4 times (5 with ``recompute
  mlp``, 6 with ``block``) at HBM bandwidth, the head's 32 V bytes per token (12 with the fused
  classifier, which gptforge runs with neither TP nor PP), AdamW's 32 bytes per
  parameter, a link at ``link_eff`` of its rate (NVLink inside a node, the GPU's port across nodes), the
  1F1B step ``(m + (p-1)/v)`` micro-batch times of the slowest stage, FSDP's traffic hidden under
  compute (only the excess counts).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptforge.config import Config, ConfigError
from gptforge.models.registry import build_model, size_config
from gptforge.plan.cluster import Cluster
from gptforge.plan.cost import Layout, comm_volume, estimate_cost, memory
from gptforge.plan.memory import estimate

C, H, NL, V, T = 64, 4, 4, 256, 32
PEAK, MM_EFF, HBM, NVL, NIC, LINK_EFF = 1e12, 0.5, 1e11, 1e10, 1e9, 0.5
RATE = PEAK * MM_EFF
CFG = dataclasses.replace(size_config("d2"), n_layer=NL, n_head=H, n_embd=C, vocab_size=V, pad_vocab=False,
                          block_size=2 * T)  # a context longer than the planned sequences


def _toy(gpus_per_node: int = 2, **kw) -> Cluster:
    f = dict(name="toy", gpus_per_node=gpus_per_node, mem_gib=80.0, peak_flops=PEAK, hbm_bw=HBM, nvlink_bw=NVL,
             nic_bw=NIC, link_eff=LINK_EFF, matmul_eff=MM_EFF)
    f.update(kw)
    return Cluster(**f)


def _parts(cfg=CFG) -> dict:
    """Parameter counts by part, from the built module's names."""
    with torch.device("meta"):
        model = build_model(cfg)
    named = dict(model.blocks[0].named_parameters())
    block = sum(p.numel() for p in named.values())
    norms = sum(p.numel() for n, p in named.items() if n.startswith("ln_"))
    out_bias = sum(p.numel() for n, p in named.items() if n.endswith("c_proj.bias"))
    qkv_bias = named["attn.c_attn.bias"].numel()
    return dict(N=model.num_parameters(), block=block, norms=norms, tensors=len(named),
                # one of 2 TP ranks: matmul weights (and c_fc's column-parallel bias) halved; norms, the
                # row-parallel output biases and (gptforge) the fused q/k/v bias whole
                tp_block=(block - norms - out_bias - qkv_bias) / 2 + norms + out_bias + qkv_bias,
                tp_block_megatron=(block - norms - out_bias) / 2 + norms + out_bias,
                wte=V * C, wpe=2 * T * C, ln_f=2 * C)


P = _parts()
P_MEM = _parts(dataclasses.replace(CFG, vocab_size=200, pad_vocab=True))  # the table padded to 256 rows
P_MEM["embed"] = P_MEM["wte"] + P_MEM["wpe"]
FWD = 24 * C * C + 4 * T * C  # a block's forward FLOPs per token (Megatron-LM)
HEAD = 2 * C * V


def _block_s(tok, recompute="none", tp=1, flash=True):
    """One block's compute for ``tok`` tokens: matmuls at the achievable rate, activation traffic at HBM."""
    extra = {"none": 0, "mlp": 2 * (4 * C * C + 4 * C), "block": FWD}[recompute]  # c_fc (+bias) again / a block
    passes = {"none": 4, "mlp": 5, "block": 6}[recompute]
    act = 38 * C + (0 if flash else H * T * 6)  # + the T x T scores (bf16) and fp32 softmax per token
    return tok * ((3 * FWD + extra) / tp / RATE + passes * act / tp / HBM)


def _head_s(tok, tp=1, *, fused):
    """The head for ``tok`` tokens: its matmuls, and the logits' traffic per token and vocabulary row.
    Plain head: the planner's stated 32 V bytes (plan/cost.py's docstring). Fused classifier (12 V): the matmul writes
    bf16 logits (2), the kernel reads each row twice (2 + 2) and writes d(logits) over them (2), the two
    backward matmuls read it (2 + 2). gptforge runs the fused classifier with neither TP nor PP
    (``model.fused_ce`` auto on a CUDA GPU with triton); Megatron-LM's and DeepSpeed's engines never."""
    return tok * (3 * HEAD / tp / RATE + (12 if fused else 32) * V / tp / HBM)


def _iteration_flops(gb, recompute="none"):
    """Megatron-LM's Eq. 3 (with the recomputation term for ``block``); ``recompute mlp`` runs c_fc again:
    2 FLOPs per parameter (4C^2 + 4C) per token and block."""
    if recompute == "block":
        return 96 * gb * T * NL * C * C * (1 + T / (6 * C) + V / (16 * NL * C))
    extra = gb * T * NL * 2 * (4 * C * C + 4 * C) if recompute == "mlp" else 0
    return 72 * gb * T * NL * C * C * (1 + T / (6 * C) + V / (12 * NL * C)) + extra


def _check(cost, *, step, compute, dp, world, gb, bubble=0.0, recompute="none"):
    assert cost.step_s == pytest.approx(step, rel=1e-12)
    assert cost.compute_s == pytest.approx(compute, rel=1e-12)
    assert cost.dp_comm_s == pytest.approx(dp, rel=1e-12, abs=1e-18)
    assert cost.bubble_frac == pytest.approx(bubble, rel=1e-12, abs=1e-18)
    assert cost.tflops == pytest.approx(_iteration_flops(gb, recompute) / world / step, rel=1e-12)
    assert cost.mfu == pytest.approx(_iteration_flops(gb) / world / step / PEAK, rel=1e-12)


@pytest.mark.parametrize("recompute,flash", [("none", True), ("mlp", True), ("block", True), ("none", False)])
def test_one_gpu_step_is_compute_plus_adamw(recompute, flash):
    cfg = dataclasses.replace(CFG, flash=flash)
    b, gb = 2, 8
    m = gb // b
    cost = estimate_cost(cfg, Layout(micro_batch=b, recompute=recompute), _toy(), gb, T)
    pipe = m * (NL * _block_s(b * T, recompute, flash=flash) + _head_s(b * T, fused=True))
    _check(cost, step=pipe + P["N"] * 32 / HBM, compute=pipe, dp=0.0, world=1, gb=gb, recompute=recompute)


@pytest.mark.parametrize("setting,fused", [(None, True), (True, True), (False, False)])
def test_the_head_is_charged_for_the_classifier_training_would_run(setting, fused):
    """``model.fused_ce`` auto (None) and true run the fused classifier on one CUDA GPU; false keeps the
    plain head: only the logits' traffic differs, (32 - 12) V bytes per token."""
    b, gb = 2, 8
    m = gb // b
    cost = estimate_cost(dataclasses.replace(CFG, fused_ce=setting), Layout(micro_batch=b), _toy(), gb, T)
    pipe = m * (NL * _block_s(b * T) + _head_s(b * T, fused=fused))
    _check(cost, step=pipe + P["N"] * 32 / HBM, compute=pipe, dp=0.0, world=1, gb=gb)


@pytest.mark.parametrize("dp,link", [(2, NVL), (4, NIC)])  # 2 GPUs per node: a group of 4 spans two nodes
@pytest.mark.parametrize("shard", ["none", "zero1"])
def test_ddp_and_zero1_add_their_gradient_traffic_after_the_last_micro_batch(dp, link, shard):
    b, gb = 1, 16
    m = gb // (dp * b)
    cost = estimate_cost(CFG, Layout(dp=dp, micro_batch=b, shard=shard), _toy(), gb, T)
    sent = 2 * (dp - 1) / dp * 4 * P["N"]  # fp32 gradients all-reduced
    if shard == "zero1":
        sent += (dp - 1) / dp * 4 * P["N"]  # the updated fp32 parameters all-gathered
    pipe = m * (NL * _block_s(b * T) + _head_s(b * T, fused=True))
    dp_s = sent / (link * LINK_EFF)
    _check(cost, step=pipe + dp_s + P["N"] * 32 / HBM, compute=pipe, dp=dp_s, world=dp, gb=gb)


@pytest.mark.parametrize("engine,grad_bytes", [("megatron", 4), ("deepspeed", 2)])
def test_other_engines_ddp_gradient_bytes(engine, grad_bytes):
    b, gb, dp = 1, 16, 4
    cost = estimate_cost(CFG, Layout(dp=dp, micro_batch=b, engine=engine), _toy(), gb, T)
    dp_s = 2 * (dp - 1) / dp * grad_bytes * P["N"] / (NIC * LINK_EFF)
    pipe = gb // dp * (NL * _block_s(b * T) + _head_s(b * T, fused=False))
    _check(cost, step=pipe + dp_s + P["N"] * 32 / HBM, compute=pipe, dp=dp_s, world=dp, gb=gb)


def _fsdp_sent(m, g, replicas=1):
    """FSDP2 over ``g`` shards (x ``replicas``), no mesh: bytes a rank sends per step, (gathers, reductions
    over the shard group, all-reduces across replicas and of the gradient norm's per-tensor norms)."""
    N = P["N"]
    gather = m * (2 * N - P["block"]) * 2 * (g - 1) / g  # bf16, forward and backward, the last block kept
    reduce = m * N * 4 * (g - 1) / g  # fp32 gradients reduce-scattered every micro-batch
    tensors = NL * P["tensors"] + 2 + 2  # blocks, wte and wpe, ln_f's weight and bias
    allred = tensors * 4 * 2 * (g - 1) / g  # one fp32 norm per tensor, partial over the shards
    if replicas > 1:
        allred += m * N / g * 4 * 2 * (replicas - 1) / replicas  # each micro-batch's shard across replicas
    return gather, reduce, allred


@pytest.mark.parametrize("nic", [1e9, 1e13])  # traffic longer than compute, then hidden under it
def test_fsdp_traffic_counts_only_beyond_compute(nic):
    b, gb, dp = 1, 16, 4
    m = gb // (dp * b)
    cl = _toy(nic_bw=nic)
    cost = estimate_cost(CFG, Layout(dp=dp, micro_batch=b, shard="fsdp"), cl, gb, T)
    pipe = m * (NL * _block_s(b * T) + _head_s(b * T, fused=True))
    gather, reduce, allred = _fsdp_sent(m, dp)
    dp_s = max(0.0, (gather + reduce + allred) / (nic * LINK_EFF) - pipe)
    if nic == 1e9:
        assert dp_s > 0
    else:
        assert dp_s == 0
    _check(cost, step=pipe + dp_s + P["N"] / dp * 32 / HBM, compute=pipe, dp=dp_s, world=dp, gb=gb)


def test_hsdp_shards_on_nvlink_and_all_reduces_across_nodes():
    b, gb, dp, g = 1, 16, 4, 2  # 2 GPUs per node: the shard group inside a node, the replicas across
    m = gb // (dp * b)
    cost = estimate_cost(CFG, Layout(dp=dp, micro_batch=b, shard="fsdp", dp_shard=g), _toy(), gb, T)
    pipe = m * (NL * _block_s(b * T) + _head_s(b * T, fused=True))
    gather, reduce, allred = _fsdp_sent(m, g, replicas=dp // g)
    dp_s = max(0.0, (gather + reduce) / (NVL * LINK_EFF) + allred / (NIC * LINK_EFF) - pipe)
    assert dp_s > 0
    _check(cost, step=pipe + dp_s + P["N"] / g * 32 / HBM, compute=pipe, dp=dp_s, world=dp, gb=gb)


def _tp_sent_per_microbatch(b, blocks, first, last, recompute="none", megatron=False):
    """Bytes one of 2 TP ranks sends per micro-batch (and, separately, once per step) under sequence
    parallelism: gathers and reduce-scatters send half their tensor; all-reduces all of it (2 (g-1)/g = 1)."""
    x = b * T * C
    wide = 2 if megatron else 4  # residual stream and norm outputs: fp32 under autocast, fp16 in Megatron
    narrow = 2  # the row-parallel matmul outputs: bf16 / fp16
    fwd = 2 if recompute == "block" else 1
    rs_fwd = 2 * fwd - (1 if (recompute == "block" and not megatron) else 0)
    per_block = (2 * fwd * x * wide + 2 * x * wide + rs_fwd * x * narrow + 2 * x * narrow) / 2
    if not megatron:
        per_block += 3 * C * 4 / 2  # the fused q/k/v bias's gradient gathered
    mb = blocks * per_block
    if first:
        mb += (2 * x * wide + 2 * T * C * wide) / 2  # embedding RS + its gradient's AG; position rows
    if last:
        mb += 2 * x * wide / 2 + 3 * b * T * 4  # head input AG + RS; loss_parallel's 3 fp32 statistics
    norms = blocks * P["norms"] + (P["ln_f"] if last else 0)
    once = norms * 4
    if not megatron:  # torch's gradient norm: one fp32 per parameter tensor of the stage
        once += (blocks * P["tensors"] + (2 if first else 0) + (2 if last else 0)) * 4
    return mb, once


@pytest.mark.parametrize("recompute", ["none", "block"])
def test_tensor_parallel_collectives_add_to_the_step(recompute):
    b, gb, tp = 2, 8, 2
    m = gb // b
    cost = estimate_cost(CFG, Layout(tp=tp, micro_batch=b, recompute=recompute), _toy(), gb, T)
    mb, once = _tp_sent_per_microbatch(b, NL, True, True, recompute)
    pipe = m * (NL * _block_s(b * T, recompute, tp=tp) + _head_s(b * T, tp=tp, fused=False)) + (m * mb + once) / (NVL * LINK_EFF)
    n_rank = NL * P["tp_block"] + (P["wte"] + P["wpe"]) / tp + P["ln_f"]
    _check(cost, step=pipe + n_rank * 32 / HBM, compute=pipe, dp=0.0, world=tp, gb=gb, recompute=recompute)
    # a TP group of 2 on nodes of one GPU runs over the network port
    slow = estimate_cost(CFG, Layout(tp=tp, micro_batch=b, recompute=recompute), _toy(1), gb, T)
    assert slow.compute_s - cost.compute_s == pytest.approx((m * mb + once) * (1 / NIC - 1 / NVL) / LINK_EFF)


def test_tensor_x_data_parallel_reduces_every_micro_batch_across_replicas():
    """gptforge under a TP mesh: the data dimension is FSDP2 with shard groups of 1, so the replicas
    all-reduce the fp32 gradients (and TP the norms' gradients) every micro-batch, under compute."""
    b, gb, tp, dp = 1, 16, 2, 2
    m = gb // (dp * b)
    cl = _toy(2)  # TP inside a node; the data group spans TP x DP = 4 GPUs: two nodes
    cost = estimate_cost(CFG, Layout(dp=dp, tp=tp, micro_batch=b), cl, gb, T)
    mb, once = _tp_sent_per_microbatch(b, NL, True, True)
    once += (m - 1) * (NL * P["norms"] + P["ln_f"]) * 4  # the norms' gradients every micro-batch
    pipe = m * (NL * _block_s(b * T, tp=tp) + _head_s(b * T, tp=tp, fused=False)) + (m * mb + once) / (NVL * LINK_EFF)
    n_rank = NL * P["tp_block"] + (P["wte"] + P["wpe"]) / tp + P["ln_f"]
    dp_s = max(0.0, m * n_rank * 4 * 2 * (dp - 1) / dp / (NIC * LINK_EFF) - pipe)
    assert dp_s > 0
    _check(cost, step=pipe + dp_s + n_rank * 32 / HBM, compute=pipe, dp=dp_s, world=tp * dp, gb=gb)


def test_megatron_tensor_x_data_parallel():
    """Megatron-LM: fp16 activations, the q/k/v bias split, one fp32 gradient all-reduce after the flush."""
    b, gb, tp, dp = 1, 16, 2, 2
    m = gb // (dp * b)
    cost = estimate_cost(CFG, Layout(dp=dp, tp=tp, micro_batch=b, engine="megatron"), _toy(2), gb, T)
    mb, once = _tp_sent_per_microbatch(b, NL, True, True, megatron=True)
    pipe = m * (NL * _block_s(b * T, tp=tp) + _head_s(b * T, tp=tp, fused=False)) + (m * mb + once) / (NVL * LINK_EFF)
    n_rank = NL * P["tp_block_megatron"] + (P["wte"] + P["wpe"]) / tp + P["ln_f"]
    dp_s = n_rank * 4 * 2 * (dp - 1) / dp / (NIC * LINK_EFF)
    _check(cost, step=pipe + dp_s + n_rank * 32 / HBM, compute=pipe, dp=dp_s, world=tp * dp, gb=gb)
    # each rank's slice of the split q/k/v bias has a local gradient: nothing gathered (gptforge gathers)
    vol = comm_volume(CFG, Layout(dp=dp, tp=tp, micro_batch=b, engine="megatron"), gb, T)
    assert [d for d in vol["detail"] if "q/k/v" in d[2]] == []


@pytest.mark.parametrize("v", [1, 2])
def test_pipeline_step_is_m_plus_bubble_times_the_slower_stage(v):
    b, gb, pp = 1, 4, 2
    m = gb // b
    cl = _toy(1)  # one GPU per node: the stages talk over the network port
    cost = estimate_cost(CFG, Layout(pp=pp, micro_batch=b, interleave=v), cl, gb, T)
    x = b * T * C * 4  # the fp32 residual stream crossing a boundary
    # 2 ranks, 2v chunks round robin: a rank sends forward from every chunk but the last, backward from
    # every chunk but the first: 2v - 1 sends per micro-batch on either rank
    send_s = (2 * v - 1) * x / (NIC * LINK_EFF)
    first = NL // pp * _block_s(b * T) + send_s
    last = NL // pp * _block_s(b * T) + _head_s(b * T, fused=False) + send_s
    assert last > first
    pipe = (m + (pp - 1) / v) * last
    tied = P["wte"] * 4 * 2 * (pp - 1) / pp / (NIC * LINK_EFF)  # the tied table's gradient, end stages
    n_last = NL // pp * P["block"] + P["ln_f"] + P["wte"]
    _check(cost, step=pipe + tied + n_last * 32 / HBM, compute=pipe, dp=tied, world=pp, gb=gb,
           bubble=(pp - 1) / (m * v))


@pytest.mark.parametrize("nvl", [1e10, 1e7])  # the gathers hidden under the pipeline, then not
def test_pipeline_x_fsdp_reduces_once_after_the_flush(nvl):
    b, gb, pp, dp = 1, 8, 2, 2
    m = gb // (dp * b)
    cl = _toy(2, nvlink_bw=nvl)  # FSDP's pairs inside a node; the pipeline across nodes
    cost = estimate_cost(CFG, Layout(dp=dp, pp=pp, micro_batch=b, shard="fsdp"), cl, gb, T)
    x = b * T * C * 4
    send_s = x / (NIC * LINK_EFF)
    last = NL // pp * _block_s(b * T) + _head_s(b * T, fused=False) + send_s
    pipe = (m + pp - 1) * last
    n_last = NL // pp * P["block"] + P["ln_f"] + P["wte"]
    blk = P["block"]
    # torch's stages keep a unit gathered from a backward until the last micro-batch: gathered m + 1 times,
    # the last block (never resharded) once; bf16, half of it sent
    gather = ((m + 1) * (n_last - blk) + blk) * 2 / 2
    reduce = n_last * 4 / 2 + (NL // pp * P["tensors"] + 2) * 4  # fp32 RS once; per-tensor norms (ln_f's 2)
    tied = P["wte"] / dp * 4 / (NIC * LINK_EFF)  # the end stages sum their FSDP shard of the table
    dp_s = max(0.0, gather / (nvl * LINK_EFF) - pipe) + reduce / (nvl * LINK_EFF) + tied
    assert (gather / (nvl * LINK_EFF) > pipe) == (nvl == 1e7)
    _check(cost, step=pipe + dp_s + n_last / dp * 32 / HBM, compute=pipe, dp=dp_s, world=pp * dp, gb=gb,
           bubble=(pp - 1) / m)



def test_tp_x_pp_step_follows_the_slower_first_stage():
    """TP and PP both over the network port: the first stage's embedding and position-row collectives
    outweigh the last stage's small head, so the first stage sets the pipeline's pace."""
    b, gb, tp, pp = 1, 4, 2, 2
    m = gb // b
    cost = estimate_cost(CFG, Layout(tp=tp, pp=pp, micro_batch=b), _toy(1), gb, T)
    x = b * T * C
    send_s = x / tp * 4 / (NIC * LINK_EFF)  # one sequence shard of the fp32 residual stream each way
    stage = {}
    for s, (first, last) in {0: (True, False), 1: (False, True)}.items():
        mb, once = _tp_sent_per_microbatch(b, NL // pp, first, last)
        stage[s] = (NL // pp * _block_s(b * T, tp=tp) + (_head_s(b * T, tp=tp, fused=False) if last else 0.0)
                    + (mb + once / m) / (NIC * LINK_EFF) + send_s)
    assert stage[0] > stage[1]
    pipe = (m + pp - 1) * stage[0]
    tied = P["wte"] / tp * 4 / (NIC * LINK_EFF)  # the end stages' copies of the tied table (one TP shard)
    n_last = NL // pp * P["tp_block"] + P["ln_f"] + P["wte"] / tp
    _check(cost, step=pipe + tied + n_last * 32 / HBM, compute=pipe, dp=tied, world=tp * pp, gb=gb,
           bubble=(pp - 1) / m)


def test_comm_volume_item_by_item():
    """Every collective of both end stages of DP 2 x TP 2 x PP 2 (bf16 autocast), written out."""
    b, gb = 1, 8
    lay = Layout(dp=2, tp=2, pp=2, micro_batch=b)
    m, x, blocks = gb // (2 * b), b * T * C, NL // 2
    block_items = [("tp", "all_gather", "block inputs (norm outputs)", m * blocks * 2 * x * 4),
                   ("tp", "reduce_scatter", "block inputs' gradients", m * blocks * 2 * x * 4),
                   ("tp", "reduce_scatter", "row-parallel outputs", m * blocks * 2 * x * 2),
                   ("tp", "all_gather", "row-parallel outputs' gradients", m * blocks * 2 * x * 2)]
    first = block_items + [
        ("tp", "reduce_scatter", "vocabulary-parallel embedding", m * x * 4),
        ("tp", "all_gather", "embedding output's gradient", m * x * 4),
        ("tp", "reduce_scatter", "position table (T x C)", m * T * C * 4),
        ("tp", "all_gather", "position rows' gradient", m * T * C * 4),
        ("tp", "all_gather", "fused q/k/v bias gradient", m * blocks * 3 * C * 4),
        ("tp", "all_reduce", "gradients of the norms", blocks * P["norms"] * 4),
        ("tp", "all_reduce", "per-tensor gradient norms", (blocks * P["tensors"] + 2) * 4),
        ("pp", "send", "activations forward, their gradients backward", m * x / 2 * 4),
        ("pp", "all_reduce", "tied embedding's gradient", V * C / 2 * 4),
        ("dp", "all_reduce", "gradient shards across replicas",
         (blocks * P["tp_block"] + (P["wte"] + P["wpe"]) / 2) * 4)]
    last = block_items + [
        ("tp", "all_gather", "final norm output -> head", m * x * 4),
        ("tp", "reduce_scatter", "head input's gradient", m * x * 4),
        ("tp", "all_reduce", "vocabulary-parallel loss statistics", m * 3 * b * T * 4),
        ("tp", "all_gather", "fused q/k/v bias gradient", m * blocks * 3 * C * 4),
        ("tp", "all_reduce", "gradients of the norms", (blocks * P["norms"] + P["ln_f"]) * 4),
        ("tp", "all_reduce", "per-tensor gradient norms", (blocks * P["tensors"] + 2) * 4),
        ("pp", "send", "activations forward, their gradients backward", m * x / 2 * 4),
        ("pp", "all_reduce", "tied embedding's gradient", V * C / 2 * 4),
        ("dp", "all_reduce", "gradient shards across replicas",
         (blocks * P["tp_block"] + P["ln_f"] + P["wte"] / 2) * 4)]
    for stage, want in [(0, first), (1, last), (None, last)]:
        got = comm_volume(CFG, lay, gb, T, stage=stage)
        assert [d[:3] for d in got["detail"]] == [w[:3] for w in want], stage
        assert [d[3] for d in got["detail"]] == pytest.approx([w[3] for w in want], rel=1e-12), stage
        for key in {f"{w[0]}.{w[1]}" for w in want}:  # every group here has 2 ranks
            items = [w[3] for w in want if f"{w[0]}.{w[1]}" == key]
            share = {"all_reduce": 1.0, "send": 1.0}.get(key.split(".")[1], 0.5)
            assert got[key] == pytest.approx({"payload": sum(items), "sent": share * sum(items), "group": 2})
    assert set(got) == {"detail", "tp.all_gather", "tp.reduce_scatter", "tp.all_reduce", "pp.send", "pp.all_reduce",
                        "dp.all_reduce"}


def test_comm_volume_leaves_out_what_is_not_sent():
    """One GPU sends nothing; a data group of one sends nothing; a model without biases gathers no
    q/k/v bias; the Megatron engine's activations are 4 bytes in a float32 run."""
    assert comm_volume(CFG, Layout(micro_batch=2), 8, T) == {"detail": []}
    assert set(comm_volume(CFG, Layout(tp=2, micro_batch=2), 8, T)) == {
        "detail", "tp.all_gather", "tp.reduce_scatter", "tp.all_reduce"}
    nobias = comm_volume(dataclasses.replace(CFG, bias=False), Layout(tp=2, micro_batch=2), 8, T)
    assert [d for d in nobias["detail"] if "q/k/v" in d[2]] == []
    x = 2 * T * C
    for precision, act in [("float32", 4), ("bf16", 2)]:
        meg = comm_volume(CFG, Layout(tp=2, micro_batch=2, engine="megatron"), 8, T, precision=precision)
        assert meg["detail"][0] == ("tp", "all_gather", "block inputs (norm outputs)", 4 * NL * 2 * x * act)



@pytest.mark.parametrize("engine,recompute,gathers", [("deepspeed", "block", 3), ("deepspeed", "none", 2)])
def test_zero3_gathers_of_deepspeed(engine, recompute, gathers):
    """DeepSpeed's ZeRO-3 (one micro-batch, as in Megatron-LM's Table 2): fp16 parameters gathered for the
    forward and the backward, and again for a recomputed forward; nothing kept gathered; fp16 gradients."""
    dp = 4
    vol = comm_volume(CFG, Layout(dp=dp, shard="fsdp", engine=engine, recompute=recompute), dp, T)
    N = P["N"]
    assert vol["dp.all_gather"] == pytest.approx({"payload": gathers * N * 2, "sent": gathers * N * 2 * 3 / 4,
                                                  "group": dp})
    assert vol["dp.reduce_scatter"]["payload"] == pytest.approx(N * 2)
    assert set(vol) == {"detail", "dp.all_gather", "dp.reduce_scatter"}


def test_fsdp_gathers_float32_parameters_in_a_float32_run():
    dp, b, gb = 4, 1, 8
    m = gb // (dp * b)
    vol = comm_volume(CFG, Layout(dp=dp, shard="fsdp", micro_batch=b), gb, T, precision="float32")
    assert vol["dp.all_gather"]["payload"] == pytest.approx(m * (2 * P["N"] - P["block"]) * 4)


def test_cost_carries_the_memory_model():
    lay, cl = Layout(dp=2, pp=2, micro_batch=1), _toy()
    cost = estimate_cost(CFG, lay, cl, 8, T)
    assert cost.mem == memory(CFG, lay, cl, 8, T)
    given = {"total": 1.0}
    assert estimate_cost(CFG, lay, cl, 8, T, mem=given).mem is given



def test_data_parallel_items_by_name():
    """The data dimension's collectives, item by item: DDP, ZeRO-1, FSDP, and a pipeline's replicas."""
    N, b, gb = P["N"], 1, 8
    items = lambda lay: [d[:3] for d in comm_volume(CFG, lay, gb, T)["detail"]]  # noqa: E731
    assert items(Layout(dp=2)) == [("dp", "all_reduce", "gradients")]
    zero1 = comm_volume(CFG, Layout(dp=2, shard="zero1"), gb, T)
    assert [d[:3] for d in zero1["detail"]] == [("dp", "all_reduce", "gradients"),
                                                 ("dp", "all_gather", "updated parameters")]
    assert zero1["dp.all_gather"]["payload"] == N * 4  # the fp32 parameters, each rank's shard gathered
    assert items(Layout(dp=2, shard="fsdp", micro_batch=b)) == [
        ("dp", "all_gather", "parameters (forward, backward)"), ("dp", "reduce_scatter", "gradients"),
        ("dp", "all_reduce", "per-tensor gradient norms")]
    # a pipeline makes a mesh: its data dimension is FSDP2 with shard groups of 1, replicas all-reduced
    assert [i for i in items(Layout(dp=2, pp=2)) if i[0] == "dp"] == [
        ("dp", "all_reduce", "gradient shards across replicas")]


def test_only_the_end_stages_of_a_tied_model_sum_the_table():
    gb = 8
    four = {s: comm_volume(CFG, Layout(pp=4), gb, T, stage=s) for s in range(4)}
    assert [("pp.all_reduce" in four[s]) for s in range(4)] == [True, False, False, True]
    untied = size_config("llama-tiny")  # its own head: nothing shared between the end stages
    for s in (0, 1):
        assert "pp.all_reduce" not in comm_volume(untied, Layout(pp=2), gb, 64, stage=s)


# --- plan.memory.estimate (the data-parallel planner): activations by hand, per tensor ------------------


def _mem_cfg(seq=32, mb=2, **model_kw):
    m = dataclasses.replace(size_config("d2"), n_layer=NL, n_head=H, n_embd=C, vocab_size=200, block_size=64,
                            **model_kw)  # vocabulary 200, padded to 256 rows
    cfg = Config(model=m)
    cfg.train.seq_len, cfg.train.micro_batch = seq, mb
    return cfg


def _acts_by_hand(cfg, B, dtype, recompute, fused_ce=True):
    """Bytes autograd keeps for one micro-batch of B sequences, written out tensor by tensor. ``fused_ce``:
    the fused classifier (the default, auto, on the plan's CUDA target; tests/test_plan_fused_ce.py)."""
    m = cfg.model
    T_, V_, Vp = cfg.train.seq_len, m.vocab_size, m.padded_vocab_size
    assert Vp == 256 and V_ == 200
    tok = B * T_
    f32 = dtype == "float32"
    # per block and token, in units of C (plan/memory.py's hand count of models/gpt2.py)
    per_c = {("none", False): 38, ("mlp", False): 30, ("block", False): 4,
             ("none", True): 68, ("mlp", True): 52, ("block", True): 4}[(recompute, f32)]
    acts = NL * per_c * C * tok
    if recompute == "block":  # the one block being recomputed holds everything again
        acts += (68 if f32 else 38) * C * tok
    if not m.flash:  # the T x T probabilities: fp32, or bf16 scores + their fp32 softmax
        acts += (1 if recompute == "block" else NL) * B * H * T_ * T_ * (4 if f32 else 6)
    if m.dropout > 0:  # three boolean C-wide masks per block (attention output, MLP output, residual)
        acts += NL * 3 * C * tok
    acts += tok * C * (4 + 4 if f32 else 4 + 2)  # ln_f: its fp32 input, its output
    if fused_ce:  # one buffer of padded rows in the compute dtype: the logits, then their gradient in place
        acts += tok * Vp * (4 if f32 else 2)
    elif f32:  # logits (padded rows) and log-softmax (real rows), and their gradients
        acts += tok * (4 * Vp + 4 * V_) * 2
    else:  # bf16 logits and their gradient; the fp32 upcast of the real rows, its log-softmax and gradient
        acts += tok * (2 * Vp + 2 * Vp + 4 * V_ + 8 * V_)
    return acts


@pytest.mark.parametrize("fused_ce", [None, False])  # auto (on for the plan's CUDA target), and the plain loss
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("recompute,flash,dropout", [("none", True, 0.0), ("mlp", True, 0.0), ("block", True, 0.0),
                                                     ("none", False, 0.1), ("block", False, 0.0)])
def test_estimate_activations_by_hand(dtype, recompute, flash, dropout, fused_ce):
    cfg = _mem_cfg(flash=flash, dropout=dropout)
    e = estimate(cfg, 1, micro_batch=3, recompute=recompute, dtype=dtype, fused_ce=fused_ce)
    assert (e.micro_batch, e.recompute, e.sharding) == (3, recompute, "none")
    assert e.activations == pytest.approx(_acts_by_hand(cfg, 3, dtype, recompute, fused_ce is None), rel=1e-12)
    N = P_MEM["N"]
    assert (e.weights, e.grads, e.optimizer) == (4 * N, 4 * N, 8 * N)
    assert e.peak == pytest.approx(16 * N + e.activations, rel=1e-12)


def test_estimate_defaults_come_from_the_config():
    cfg = _mem_cfg(mb=2)
    cfg.model.recompute = "mlp"
    e = estimate(cfg)
    assert (e.micro_batch, e.recompute, e.sharding) == (2, "mlp", "none")
    assert e.activations == pytest.approx(_acts_by_hand(cfg, 2, "bfloat16", "mlp"), rel=1e-12)


def test_estimate_logit_softcap_keeps_tanh_output_and_its_gradient():
    cfg = _mem_cfg()
    cfg.model.logit_softcap = 30.0
    plain = _mem_cfg()
    with_cap, without = (estimate(c, 1, micro_batch=2, fused_ce=False) for c in (cfg, plain))
    assert with_cap.activations - without.activations == 2 * 32 * 4 * 200 * 2  # fp32 tanh output + gradient
    assert estimate(cfg, 1, micro_batch=2).activations == with_cap.activations  # auto: a cap keeps the plain loss


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pdtype,pbytes", [("bfloat16", 2), ("float32", 4)])
def test_fsdp_gathers_root_and_two_blocks_in_the_parameter_dtype(pdtype, pbytes, world):
    cfg = _mem_cfg()
    e = estimate(cfg, world, micro_batch=2, sharding="fsdp", dtype=pdtype)
    N, root = P_MEM["N"], P_MEM["embed"] + P_MEM["ln_f"]
    assert e.weights == pytest.approx(4 * N / world + pbytes * (root + 2 * P_MEM["block"]))
    assert (e.grads, e.optimizer) == (pytest.approx(4 * N / world), pytest.approx(8 * N / world))
    one = estimate(cfg, 1, micro_batch=2, sharding="fsdp", dtype=pdtype)  # one rank: nothing gathered
    assert (one.weights, one.grads, one.optimizer) == (4 * N, 4 * N, 8 * N)
    default = estimate(cfg, micro_batch=2, sharding="fsdp", dtype=pdtype)  # the world defaults to one rank
    assert (default.weights, default.grads, default.optimizer) == (4 * N, 4 * N, 8 * N)


def test_peak_is_the_optimizer_step_when_its_temporaries_outgrow_the_activations():
    cfg = _mem_cfg(seq=8, mb=1)
    N = P_MEM["N"]
    e = estimate(cfg, 1, micro_batch=1, fused=False)  # foreach AdamW: 4N of temporaries during step()
    assert e.activations < 4 * N
    assert e.optimizer == 12 * N and e.peak == 4 * N + 4 * N + 8 * N + 4 * N
    z = estimate(cfg, 2, micro_batch=1, sharding="zero1", fused=False)
    assert z.optimizer == 12 * N / 2 and z.peak == 4 * N + 4 * N + 12 * N / 2


def test_lora_trains_only_the_adapters():
    """--lora.rank r on GPT-2's c_attn (peft's default): A (r x C) and B (3C x r) per block."""
    cfg = _mem_cfg()
    cfg.lora.rank = 4
    N, ad = P_MEM["N"], NL * 4 * (C + 3 * C)
    for world, sharding in [(1, "none"), (2, "zero1")]:
        e = estimate(cfg, world, micro_batch=2, sharding=sharding)
        assert e.weights == 4 * N + 4 * ad and e.grads == 4 * ad and e.optimizer == 8 * ad / world
        assert e.activations == pytest.approx(_acts_by_hand(cfg, 2, "bfloat16", "none"), rel=1e-12)
    cfg.lora.targets = "nonexistent"
    with pytest.raises(ConfigError, match="nonexistent"):
        estimate(cfg, 1)
