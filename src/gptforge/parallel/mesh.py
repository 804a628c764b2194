"""The device mesh: which layouts can work, and the named DeviceMesh a run trains on.

    torchrun --nproc_per_node 4 -m gptforge train --preset tiny --dist.tp 2 --dist.pp 2

A run's ranks form a 4-D mesh ``("pp", "dp_replicate", "dp_shard", "tp")``, laid out row-major by
``init_device_mesh`` so that tensor-parallel ranks are neighbours (the same node when
``--nproc-per-node`` >= tp). The data dimension is what is left of the world: ``world / (tp * pp)``
ranks, ``dist.dp_replicate`` of them replicas (HSDP) and the rest FSDP shards (``dist.shard
fsdp``), or all replicas (``dist.shard none``). :func:`check_layout` refuses a layout that cannot
work before any data or model is touched (a :class:`ConfigError`, exit 2, naming the key).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gptforge import environment
from gptforge.config import Config, ConfigError

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def wants_mesh(dist_cfg, world: int) -> bool:
    """True when this run needs the device mesh (model parallelism or HSDP) rather than plain DDP /
    ZeRO-1 / FSDP over the whole world. At world 1 every degree is accepted and has no effect, so a
    checkpoint written under a mesh resumes on one process."""
    return world > 1 and (dist_cfg.tp > 1 or dist_cfg.pp > 1 or dist_cfg.dp_replicate > 1)


@dataclass(frozen=True)
class Layout:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)


def layout_of(dist_cfg, world: int) -> Layout:
    """The mesh shape for ``world`` ranks (call after :func:`check_layout`)."""
    dp = world // (dist_cfg.tp * dist_cfg.pp)
    if dist_cfg.shard == "fsdp":
        return Layout(dist_cfg.pp, dist_cfg.dp_replicate, dp // dist_cfg.dp_replicate, dist_cfg.tp)
    return Layout(dist_cfg.pp, dp, 1, dist_cfg.tp)  # every data-parallel rank a full replica


# The family fields (``LlamaConfig.features()``: Qwen3, Mistral, Phi-3, Gemma 2/3, Granite, OLMo 2) that tensor and
# pipeline parallelism run, each trained under TP2 and PP2 against one process (tests/training/test_model_parallel.py's
# "family" and "olmo" jobs). Under TP a rank holds whole heads, so what acts per head (head_size, the scores' scale
# or multiplier, soft-cap, window and local rope) runs on its heads; the norms act per position on sequence shards
# (Gemma's and OLMo 2's post-norms are in tensor.py's plan; without input norms, pre_norms false, the attention and
# MLP gather the residual's sequence shards themselves); embed_scale multiplies the embedding's shard,
# residual_scale each branch's sequence shard, and logits_scaling divides the vocabulary-sharded logits. Under PP a
# stage takes its layers' window and rope by their index in the whole model (the family's layer_args). A field not
# named here or in PIPELINE_ONLY is not checked.
MODEL_PARALLEL_FEATURES = frozenset({
    "model.head_size", "model.sliding_window", "model.layer_types", "model.attn_softcap", "model.query_pre_attn_scalar",
    "model.embed_scale", "model.norm_plus_one", "model.post_norms", "model.rope_local_theta", "model.mlp=geglu",
    "model.attn_scale", "model.residual_scale", "model.logits_scaling", "model.pre_norms",
})
# Fields pipeline parallelism runs (a stage runs its blocks whole; trained under PP2 against one process) and tensor
# parallelism refuses, each with why.
PIPELINE_ONLY = {
    "model.qk_norm_full": "normalises q and k over every head's channels at once, and a tensor-parallel rank holds "
                          "only its own heads (it would need a reduction across ranks in every layer)",
}
UNCHECKED_WHY = ("do not run under tensor or pipeline parallelism yet (no sharding plan or stage is checked against "
                 "one process for them)")


def parallel_refusal(model_cfg, tp: int, pp: int) -> tuple[str, str] | None:
    """(the dist key, why and what to use instead) when ``model_cfg`` sets a family field that tensor (``tp`` > 1)
    or pipeline (``pp`` > 1) parallelism does not run, naming the fields; None when they run them all. The one
    list both ``check_layout`` and the planner (``plan/cost.py``'s ``check``) read."""
    if tp <= 1 and pp <= 1:
        return None
    features = model_cfg.features() if hasattr(model_cfg, "features") else []
    unchecked = [f for f in features if f not in MODEL_PARALLEL_FEATURES and f not in PIPELINE_ONLY]
    if unchecked:
        key = "dist.tp" if tp > 1 else "dist.pp"
        return key, f"{', '.join(unchecked)} {UNCHECKED_WHY}; use data parallelism or FSDP"
    whole_heads = [f for f in features if f in PIPELINE_ONLY]
    if whole_heads and tp > 1:
        return "dist.tp", "; ".join(f"{f} {PIPELINE_ONLY[f]}" for f in whole_heads) + (
            ", so it does not run under tensor parallelism; use pipeline or data parallelism")
    return None


def _fail(key: str, msg: str) -> None:
    raise ConfigError(f"{key}: {msg}")


def check_layout(cfg: Config, world: int, local_world: int | None = None) -> int:
    """Refuse a mesh that cannot work for this model and world; returns the gradient-accumulation
    steps (micro-batches per step of each data-parallel rank). ``local_world`` defaults to
    torchrun's LOCAL_WORLD_SIZE when set (ranks per node)."""
    d, m = cfg.dist, cfg.model
    if not wants_mesh(d, world):
        return cfg.validate(world)
    if local_world is None and "LOCAL_WORLD_SIZE" in os.environ:
        local_world = int(environment.number("LOCAL_WORLD_SIZE", 1))
    if world % (d.tp * d.pp):
        _fail("dist.tp", f"world {world} is not divisible by dist.tp * dist.pp = {d.tp} * {d.pp}; "
              "choose degrees whose product divides the number of processes")
    dp = world // (d.tp * d.pp)
    if d.dp_replicate > 1 and d.shard != "fsdp":
        _fail("dist.dp_replicate", f"{d.dp_replicate} (HSDP) needs --dist.shard fsdp; with dist.shard "
              f"{d.shard} every data-parallel rank is already a replica")
    if dp % d.dp_replicate:
        _fail("dist.dp_replicate", f"{d.dp_replicate} does not divide the data dimension world/(tp*pp) = {dp}")
    if d.shard == "zero1":
        _fail("dist.shard", "zero1 does not combine with dist.tp/dist.pp; use --dist.shard fsdp (or none)")
    if local_world is not None and d.tp > local_world:
        _fail("dist.tp", f"{d.tp} is more than the {local_world} processes per node: tensor parallelism "
              "all-reduces every layer and must stay inside a node; lower dist.tp or raise --nproc-per-node")
    refused = parallel_refusal(m, d.tp, d.pp)
    if refused:
        _fail(*refused)
    if d.tp > 1:
        _check_tp(cfg, d.tp)
        if cfg.train.compile:
            # measured on CPU, torch 2.13: per-block compile under DTensor TP crashes in Llama's backward
            # (a plain tensor reaches DTensor's redistribute backward) and makes inductor give up on
            # GPT-2's strided q/k/v bias; pipeline stages and FSDP2 compile fine
            _fail("train.compile", "torch.compile does not work under tensor parallelism yet (dist.tp > 1); set "
                  "--train.compile false (compile is off by default under dist.tp)")
    if d.pp > 1:
        _check_pp(cfg, dp, d)
    if (d.tp > 1 or d.pp > 1) and getattr(cfg.eval, "every", 0):
        _fail("eval.every", "in-loop evaluation tasks do not run on a tensor- or pipeline-parallel model yet; "
              "set eval.every 0 and evaluate the checkpoint (`gptforge eval --ckpt`)")
    fused_block = [k for k in ("fused_ln_residual", "fused_bias_gelu") if getattr(m, k, False)]
    if fused_block and d.tp > 1:
        _fail("dist.tp", f"model.{fused_block[0]} runs a Triton kernel on whole tensors, and tensor parallelism "
              f"shards them; set --model.{fused_block[0]} false under dist.tp")
    if getattr(m, "fused_ce", False) is True and d.pp > 1:  # auto (None) is switched off, with its reason, at the start
        _fail("dist.pp", "model.fused_ce=true computes the loss inside the model's head, but the pipeline schedule "
              "computes it from the last stage's logits; set --model.fused_ce auto or false")
    if getattr(m, "fused_ce", False) is True or getattr(m, "lm_head_fp8", False):
        if d.tp > 1:
            _fail("dist.tp", "model.fused_ce / model.lm_head_fp8 need the whole output head on one rank; "
                  "switch them off under tensor parallelism (the loss is vocabulary-parallel instead)")
    return cfg.validate(dp)


def _check_tp(cfg: Config, tp: int) -> None:
    m = cfg.model
    kv = getattr(m, "kv_heads", m.n_head)
    for key, value in (("model.n_head", m.n_head), ("model.n_kv_head", kv),
                       ("padded vocabulary", m.padded_vocab_size), ("train.seq_len", cfg.train.seq_len)):
        if value % tp:
            _fail("dist.tp", f"{key} = {value} is not divisible by dist.tp = {tp} (each rank takes whole "
                  "heads, an equal slice of the vocabulary and of the sequence)")
    hidden = getattr(m, "hidden_dim", 4 * m.n_embd)
    if hidden % tp:
        _fail("dist.tp", f"the MLP width {hidden} is not divisible by dist.tp = {tp}")
    from gptforge.parallel.tensor import PLAN_DIVIDES  # the family's own plan's constraints

    for key, why in PLAN_DIVIDES.get(m.arch, ()):
        value = getattr(m, key.split(".", 1)[1])
        if value % tp:
            _fail("dist.tp", f"{key} = {value} is not divisible by dist.tp = {tp} ({why})")


def _check_pp(cfg: Config, dp: int, d) -> None:
    stages = d.pp * (d.pp_virtual if d.pp_schedule == "interleaved1f1b" else 1)
    if cfg.model.n_layer % stages:
        _fail("dist.pp", f"model.n_layer = {cfg.model.n_layer} is not divisible by the {stages} pipeline stages "
              f"(dist.pp {d.pp}" + (f" x dist.pp_virtual {d.pp_virtual})" if stages != d.pp else ")"))
    accum = cfg.train.grad_accum(dp)
    if accum < d.pp:
        _fail("dist.pp", f"{accum} micro-batch(es) per step is fewer than the {d.pp} pipeline stages: the pipeline "
              "would never fill; raise train.total_batch_tokens or lower train.micro_batch")
    if d.pp_schedule == "interleaved1f1b" and accum % d.pp:
        _fail("dist.pp_schedule", f"interleaved1f1b needs the micro-batches per step ({accum}) to be a multiple "
              f"of dist.pp = {d.pp}")
    if cfg.train.batch_warmup_steps:  # the ramp: a schedule per micro-batch count (parallel/pipeline.py)
        first = cfg.train.accum_at(0, dp)  # the smallest: the ramp only grows
        if first < d.pp:
            _fail("dist.pp", f"the batch-size ramp starts at {first} micro-batch(es) per step, fewer than the {d.pp} "
                  "pipeline stages; raise train.batch_warmup_start or train.total_batch_tokens")
        if d.pp_schedule == "interleaved1f1b":
            _fail("dist.pp_schedule", "interleaved1f1b needs a multiple of dist.pp micro-batches in every step; "
                  "a batch-size ramp (train.batch_warmup_steps) changes them: use 1f1b or gpipe with it")
    if getattr(cfg.model, "attention", "causal") != "causal":
        _fail("dist.pp", "model.attention=document is not carried through pipeline stages yet; use causal")


def build_mesh(device_type: str, dist_cfg, world: int):
    """The named DeviceMesh for this run (every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, layout_of(dist_cfg, world).shape, mesh_dim_names=DIMS)


def data_coordinate(mesh) -> tuple[int, int]:
    """(dp_rank, dp_world): this rank's place in the data dimension (the loader's rank and world)."""
    coord = dict(zip(DIMS, mesh.get_coordinate(), strict=True))
    shape = dict(zip(DIMS, mesh.shape, strict=True))
    return coord["dp_replicate"] * shape["dp_shard"] + coord["dp_shard"], shape["dp_replicate"] * shape["dp_shard"]
