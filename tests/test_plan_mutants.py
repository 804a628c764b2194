"""The planner outside its time model (issue 36, the `plan` mutation lane): the layout a training config
runs (``run_layout``, against the trainer's own mesh code and hand-written layouts), which layouts are
refused and with which words (``check``), the memoised family counts, link choice, days, the layout's
description, and ``plan.memory``'s micro-batch list, recommendation, table row and overrides. Every
expected value is written out by hand or comes from the code the trainer itself runs
(``parallel.mesh``, ``models.registry``); none is read back from the function under test."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from gptforge.config import Config, ConfigError
from gptforge.models import registry
from gptforge.models.registry import size_config
from gptforge.parallel import mesh
from gptforge.plan import cost
from gptforge.plan import memory as planmem
from gptforge.plan.cluster import Cluster
from gptforge.plan.cost import Cost, Layout, check, days, microbatches, run_layout
from gptforge.plan.memory import GIB, Estimate, plan_overrides, propose

# --- the layout a training config runs -------------------------------------------------------------


def _train_cfg(world_tokens: int = 1 << 15, seq: int = 64, micro: int = 2, recompute: str = "none", **dist) -> Config:
    c = Config()
    c.train.seq_len, c.train.total_batch_tokens, c.train.micro_batch = seq, world_tokens, micro
    c.model.recompute = recompute
    for k, v in dist.items():
        setattr(c.dist, k, v)
    return c


RUNS = [  # (world, config keys, the layout written out by hand)
    (8, dict(tp=2, pp=2, shard="fsdp", recompute="mlp", micro=4),
     Layout(dp=2, tp=2, pp=2, micro_batch=4, recompute="mlp", shard="fsdp", interleave=1, dp_shard=2)),
    (8, dict(pp=2, pp_schedule="interleaved1f1b", pp_virtual=3),
     Layout(dp=4, tp=1, pp=2, micro_batch=2, shard="none", interleave=3, dp_shard=0)),
    (8, dict(pp=2, pp_schedule="gpipe", pp_virtual=3), Layout(dp=4, pp=2, micro_batch=2)),
    (8, dict(shard="fsdp", dp_replicate=2, recompute="block"),  # HSDP: 2 replicas of 4 shards, no TP/PP
     Layout(dp=8, micro_batch=2, recompute="block", shard="fsdp", dp_shard=4)),
    (8, dict(tp=2, shard="fsdp"), Layout(dp=4, tp=2, micro_batch=2, shard="fsdp", dp_shard=4)),
    (4, dict(shard="fsdp"), Layout(dp=4, micro_batch=2, shard="fsdp", dp_shard=0)),  # plain FSDP2: all of dp
    (4, dict(shard="zero1"), Layout(dp=4, micro_batch=2, shard="zero1")),
    (4, dict(tp=2), Layout(dp=2, tp=2, micro_batch=2)),  # a mesh with shard none: replicas only
    (2, dict(pp=2), Layout(dp=1, pp=2, micro_batch=2)),
    (2, dict(shard="fsdp", dp_replicate=2), Layout(dp=2, micro_batch=2, shard="fsdp", dp_shard=1)),  # 2 replicas
    (4, dict(pp=2, shard="fsdp"), Layout(dp=2, pp=2, micro_batch=2, shard="fsdp", dp_shard=2)),  # a mesh by PP alone
    (1, dict(shard="fsdp"), Layout(dp=1, micro_batch=2, shard="fsdp")),
]


@pytest.mark.parametrize("world,keys,expected", RUNS, ids=lambda x: str(x) if isinstance(x, int) else None)
def test_run_layout_is_the_layout_written_out_by_hand(world, keys, expected):
    keys = dict(keys)
    kw = {k: keys.pop(k) for k in ("recompute", "micro") if k in keys}
    cfg = _train_cfg(**kw, **keys)
    layout, batch = run_layout(cfg, world)
    assert layout == expected
    assert layout.describe() == expected.describe()  # whole numbers: "DP 4", never "DP 4.0"
    assert batch == (1 << 15) // 64 == 512  # sequences per optimizer step


@pytest.mark.parametrize("world,keys,expected", [r for r in RUNS if r[0] > 1], ids=lambda x: str(x) if isinstance(x, int) else None)
def test_run_layout_agrees_with_the_trainers_mesh(world, keys, expected):
    """The trainer's own code (parallel.mesh) picks the same data-parallel size, FSDP shard group and
    number of micro-batches per step (its gradient accumulation) as the planner's layout."""
    keys = dict(keys)
    kw = {k: keys.pop(k) for k in ("recompute", "micro") if k in keys}
    cfg = _train_cfg(**kw, **keys)
    layout, batch = run_layout(cfg, world)
    accum = mesh.check_layout(cfg, world, local_world=8)
    assert microbatches(layout, batch) == accum
    shape = mesh.layout_of(cfg.dist, world)
    assert (layout.pp, layout.dp, layout.tp) == (shape.pp, shape.dp, shape.tp)
    if layout.shard == "fsdp":
        assert layout.shard_group == shape.dp_shard
        assert layout.dp // layout.shard_group == shape.dp_replicate


def test_run_layout_batch_is_total_tokens_over_sequence_length():
    layout, batch = run_layout(_train_cfg(world_tokens=3 * 96 + 5, seq=96), 1)
    assert batch == 3 and layout == Layout(micro_batch=2)


# --- layouts that cannot run -----------------------------------------------------------------------

GPT2 = size_config("gpt2")  # 12 layers, 12 heads
LLAMA = size_config("llama-tiny")  # 2 layers, 4 heads, 2 key/value heads
NAMES = ("recompute in ('none', 'mlp', 'block'), shard in ('none', 'zero1', 'fsdp'), "
         "engine in ('gptforge', 'megatron', 'deepspeed')")


@pytest.mark.parametrize("cfg,layout,batch,why", [
    *[(GPT2, Layout(**{k: 0}), 8, "every degree must be >= 1") for k in ("dp", "tp", "pp", "micro_batch", "interleave")],
    (GPT2, Layout(dp=-1), 8, "every degree must be >= 1"),
    (GPT2, Layout(tp=8), 8, "model.n_head=12 (key/value heads 12) not divisible by TP 8"),
    (LLAMA, Layout(tp=4), 8, "model.n_head=4 (key/value heads 2) not divisible by TP 4"),  # only the kv heads
    (GPT2, Layout(pp=5, micro_batch=1), 8, "model.n_layer=12 not divisible by PP 5 x virtual stages 1"),
    (GPT2, Layout(pp=4, interleave=2), 8, "model.n_layer=12 not divisible by PP 4 x virtual stages 2"),
    (GPT2, Layout(dp=3, micro_batch=2), 10, "global batch 10 not divisible by DP 3 x micro-batch 2"),
    (GPT2, Layout(micro_batch=2), 3, "global batch 3 not divisible by DP 1 x micro-batch 2"),
    (GPT2, Layout(pp=4, micro_batch=8), 16, "2 micro-batches is fewer than 4 pipeline stages"),
    (GPT2, Layout(pp=2), 1, "1 micro-batches is fewer than 2 pipeline stages"),
    (GPT2, Layout(pp=2, interleave=2), 3, "interleaving needs micro-batches (3) a multiple of PP 2"),
    (GPT2, Layout(dp=4, dp_shard=3), 12, "dp_shard 3 must divide DP 4"),
    (GPT2, Layout(recompute="all"), 8, NAMES),
    (GPT2, Layout(shard="zero3"), 8, NAMES),
    (GPT2, Layout(engine="nemo"), 8, NAMES),
])
def test_check_refuses_with_its_reason(cfg, layout, batch, why):
    assert check(cfg, layout, batch) == why


@pytest.mark.parametrize("cfg,layout,batch", [
    (GPT2, Layout(), 1),
    (GPT2, Layout(dp=2, tp=4, pp=3, micro_batch=2), 24),
    (GPT2, Layout(tp=12, pp=12), 12),  # every head and every layer on its own rank
    (LLAMA, Layout(tp=2, pp=2), 2),
    (GPT2, Layout(pp=4, micro_batch=2), 8),  # as many micro-batches as stages
    (GPT2, Layout(pp=2), 3),  # 1F1B: any number of micro-batches >= the stages
    (GPT2, Layout(pp=2, interleave=2), 4),
    (GPT2, Layout(dp=4, dp_shard=2, shard="fsdp", recompute="block", engine="deepspeed"), 8),
    (GPT2, Layout(recompute="mlp", shard="zero1", engine="megatron"), 8),
])
def test_check_accepts_layouts_that_run(cfg, layout, batch):
    assert check(cfg, layout, batch) is None


# --- small pieces ----------------------------------------------------------------------------------


def test_layout_world_shard_group_and_description():
    assert Layout(dp=3, tp=5, pp=7).world == 105
    assert Layout(dp=8).shard_group == 8 and Layout(dp=8, dp_shard=2).shard_group == 2
    assert Layout().describe() == "DP 1 x TP 1 x PP 1, micro-batch 1, recompute none, shard none"
    assert Layout(dp=8, tp=2, pp=4, micro_batch=2, recompute="block", shard="fsdp", interleave=2,
                  dp_shard=2).describe() == ("DP 8 x TP 2 x PP 4 v 2, micro-batch 2, recompute block, "
                                             "shard fsdp (HSDP 2x4)")
    assert Layout(dp=4, dp_shard=4, shard="fsdp").describe() == ("DP 4 x TP 1 x PP 1, micro-batch 1, "
                                                                 "recompute none, shard fsdp")


def test_microbatches_per_pipeline():
    assert microbatches(Layout(dp=3, micro_batch=2, tp=4, pp=5), 60) == 10


def test_counts_are_the_familys_for_each_sequence_length():
    cfg = dataclasses.replace(size_config("d2"), block_size=128)
    for seq in (32, 64, None, 32):
        assert cost.counts(cfg, seq) == registry.counts(cfg, seq)
    assert cost.counts(cfg, 32) is cost.counts(cfg, 32)  # memoised
    other = dataclasses.replace(cfg, n_layer=cfg.n_layer + 1)
    assert cost.counts(other, 32) == registry.counts(other, 32)


def test_counts_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(cost, "_CACHE", {})
    cfg = size_config("d2")
    for seq in range(1, 300):
        assert cost.counts(cfg, seq).seq_len == (seq or cfg.block_size)
    assert 0 < len(cost._CACHE) <= 257


def test_layer_act_bytes_are_the_familys_for_each_dtype_and_recompute():
    cfg = size_config("d2")
    for dtype in ("bfloat16", "float32", "bfloat16"):
        for rc in ("none", "mlp", "block", "none"):
            assert cost.layer_act_bytes(cfg, dtype, rc) == registry.layer_act_bytes(cfg, dtype, rc)


def test_link_is_nvlink_inside_a_node_and_the_nic_across_nodes():
    cl = Cluster(name="toy", gpus_per_node=4, mem_gib=80, peak_flops=1e12, hbm_bw=1e11, nvlink_bw=300.0,
                 nic_bw=50.0, link_eff=0.5)
    assert [cost._link(cl, g) for g in (1, 4, 5, 8)] == [150.0, 150.0, 25.0, 25.0]


def test_days_count_whole_steps():
    c = Cost(Layout(), step_s=8640.0, compute_s=0.0, bubble_frac=0.0, dp_comm_s=0.0, tflops=0.0, mfu=0.0, mem={})
    assert days(c, tokens=1000, global_batch=3, seq_len=100) == pytest.approx(0.4)  # ceil(3.33) = 4 steps
    assert days(c, tokens=900, global_batch=3, seq_len=100) == pytest.approx(0.3)  # exactly 3 steps


def test_cost_as_dict_spells_out_the_layout():
    lay = Layout(dp=2, tp=2, pp=2, micro_batch=4, recompute="mlp", shard="fsdp", interleave=2, dp_shard=1)
    c = Cost(lay, step_s=1.5, compute_s=1.0, bubble_frac=0.25, dp_comm_s=0.5, tflops=7.0, mfu=0.4,
             mem={"total": 3.0})
    assert c.as_dict() == {
        "layout": {"dp": 2, "tp": 2, "pp": 2, "micro_batch": 4, "recompute": "mlp", "shard": "fsdp",
                   "interleave": 2, "dp_shard": 1, "engine": "gptforge"},
        "step_s": 1.5, "compute_s": 1.0, "bubble_frac": 0.25, "dp_comm_s": 0.5, "tflops": 7.0, "mfu": 0.4,
        "mem": {"total": 3.0}}


def test_an_untied_heads_rows_are_split_by_tensor_parallelism():
    """llama-tiny (untied head) on 2 TP ranks: every matrix and both vocabulary tables split in half, the
    RMSNorm weights whole (counted from the built module's names); ``memory`` holds 4 bytes of each."""
    cfg = size_config("llama-tiny")
    with torch.device("meta"):
        model = registry.build_model(cfg)
    per_rank = sum(p.numel() if n.endswith("norm.weight") else p.numel() / 2 for n, p in model.named_parameters())
    assert not cost.counts(cfg).tied and per_rank < model.num_parameters() / 2 + 1000
    cl = Cluster(name="toy", gpus_per_node=8, mem_gib=80, peak_flops=1e12, hbm_bw=1e11, nvlink_bw=1e10, nic_bw=1e9)
    assert cost.memory(cfg, Layout(tp=2), cl, 1, 16)["weights"] == 4 * per_rank


# --- plan.memory: micro-batches, the recommendation, the table, the overrides -----------------------


def _mem_cfg(total: int, seq: int = 32) -> Config:
    c = Config(model=dataclasses.replace(size_config("d2"), block_size=seq))
    c.train.seq_len, c.train.total_batch_tokens = seq, total
    return c


@pytest.mark.parametrize("total,world,batches", [
    (32 * 24, 2, [4, 2, 1]),  # 64-token rank-steps: b = 8 leaves 256 over
    (32 * 8, 2, [4, 2, 1]),  # b = 4 is the whole batch (<=)
    (32 * 2, 2, [1]),
    (32 * 64, 1, [64, 32, 16, 8, 4, 2, 1]),
    (32 * 6, 1, [2, 1]),  # powers of two only
])
def test_micro_batches_divide_the_total_batch(total, world, batches):
    assert planmem._micro_batches(_mem_cfg(total), world) == batches


# a stand-in memory model in GiB: a sharding's fixed bytes plus a recompute's bytes per sequence
FIXED = {"none": 10.0, "zero1": 6.0, "fsdp": 4.0}
PER_SEQ = {"none": 1.0, "mlp": 0.75, "block": 0.25}


@pytest.fixture
def fake_estimate(monkeypatch):
    calls = []

    def fake(cfg, world, *, micro_batch, sharding, recompute, dtype, fused, fused_ce):  # fused_ce: test_plan_fused_ce
        calls.append((world, dtype, fused))
        peak = (FIXED[sharding] + PER_SEQ[recompute] * micro_batch) * GIB
        return Estimate(micro_batch, sharding, recompute, 0.0, 0.0, 0.0, 0.0, peak)

    monkeypatch.setattr(planmem, "estimate", fake)
    return calls


def _rows(rows):
    return [(r.sharding, r.recompute, r.micro_batch) for r in rows]


def test_propose_takes_the_cheapest_combination_reaching_micro_batch_16(fake_estimate):
    cfg = _mem_cfg(32 * 128)  # world 2: micro-batches 64 .. 1
    rows, best = propose(cfg, gpu_mem_gib=22.0, world=2, dtype="float32", fused=False)  # 20 GiB after the reserve
    # largest b with FIXED + PER_SEQ * b <= 20, by hand
    assert _rows(rows) == [("none", "none", 8), ("zero1", "none", 8), ("zero1", "mlp", 16), ("fsdp", "none", 16),
                           ("fsdp", "mlp", 16), ("zero1", "block", 32), ("fsdp", "block", 64)]
    assert (best.sharding, best.recompute, best.micro_batch) == ("zero1", "mlp", 16)  # not fsdp/block's 64: capped
    assert {c[1:] for c in fake_estimate} == {("float32", False)} and {c[0] for c in fake_estimate} == {2}


def test_propose_below_16_takes_the_largest_any_combination_reaches(fake_estimate):
    rows, best = propose(_mem_cfg(32 * 128), gpu_mem_gib=14.0, world=2)  # 12 GiB: 10 + b fits b = 2 exactly
    assert _rows(rows) == [("none", "none", 2), ("zero1", "none", 4), ("zero1", "mlp", 8), ("fsdp", "none", 8),
                           ("fsdp", "mlp", 8), ("zero1", "block", 16), ("fsdp", "block", 32)]
    assert (best.sharding, best.recompute, best.micro_batch) == ("zero1", "block", 16)
    assert {c[1:] for c in fake_estimate} == {("bfloat16", True)}
    _, best = propose(_mem_cfg(32 * 8), gpu_mem_gib=14.0, world=2)  # micro-batches 4, 2, 1 only
    assert (best.sharding, best.recompute, best.micro_batch) == ("zero1", "none", 4)


def test_propose_reserve_and_one_gpu(fake_estimate):
    rows, best = propose(_mem_cfg(32 * 16), gpu_mem_gib=15.0, world=1, reserve_gib=3.0)  # 12 GiB
    assert _rows(rows) == [("none", "none", 2)]  # one GPU: nothing to shard
    assert (best.sharding, best.micro_batch) == ("none", 2)


def test_propose_when_nothing_fits_lists_the_smallest_micro_batch(fake_estimate):
    rows, best = propose(_mem_cfg(32 * 16), gpu_mem_gib=6.0, world=2, dtype="float32", fused=False)  # 4 GiB
    assert best is None  # fsdp's fixed 4 GiB + anything is over
    assert {c for c in fake_estimate} == {(2, "float32", False)}  # the rows shown are estimated as asked
    assert _rows(rows) == [(s, r, 1) for s, r in planmem.PREFERENCE]
    assert [r.peak / GIB for r in rows] == [FIXED[s] + PER_SEQ[r] for s, r in planmem.PREFERENCE]


def test_propose_refuses_a_batch_no_micro_batch_divides():
    with pytest.raises(ConfigError) as e:
        propose(_mem_cfg(32 * 3), gpu_mem_gib=80, world=4)
    assert str(e.value) == ("train.total_batch_tokens=96 is smaller than one sequence per rank (seq_len 32 x world 4); "
                            "raise it or lower the world size")
    with pytest.raises(ConfigError) as e:
        propose(_mem_cfg(32 * 6), gpu_mem_gib=80, world=4)
    assert str(e.value) == ("train.total_batch_tokens=192 is not a multiple of one sequence per rank (seq_len 32 x "
                            "world 4 = 128), so no micro-batch divides it: use a world size that divides 6 sequences, "
                            "or a total batch that 128 divides")


def test_estimate_row_and_overrides_are_spelled_out():
    e = Estimate(4, "zero1", "mlp", 1.5 * GIB, 0.25 * GIB, 3 * GIB, 10.125 * GIB, 14.875 * GIB)
    assert e.row() == "zero1  mlp       4     1.50     0.25     3.00    10.12    14.88"
    assert e.row("MiB") == "zero1  mlp       4  1536.00   256.00  3072.00 10368.00 15232.00"
    cfg = _mem_cfg(32 * 96)
    assert plan_overrides(cfg, e, world=3) == ["--train.micro_batch 4", "--model.recompute mlp", "--dist.shard zero1",
                                               "# gradient accumulation 8"]


def test_estimate_row_of_a_real_estimate_adds_up():
    est = planmem.estimate(_mem_cfg(32 * 8), 1, micro_batch=2)
    cols = est.row().split()
    assert cols[:3] == ["none", "none", "2"]
    assert float(cols[7]) == pytest.approx(round(est.peak / GIB, 2))
    assert math.isclose(est.peak, est.weights + est.grads + est.optimizer + est.activations)
