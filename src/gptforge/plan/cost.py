"""What one training step costs under a parallel layout: communication volume, time, memory per GPU.

    >>> from gptforge.models.registry import size_config
    >>> from gptforge.plan.cost import Layout, comm_volume
    >>> vol = comm_volume(size_config("gpt2"), Layout(dp=2, tp=2, pp=2), global_batch=8, seq_len=1024)

A layout is (data ``dp``, tensor ``tp``, pipeline ``pp``) ranks with ``dp * tp * pp`` GPUs, ranks
ordered TP innermost, then data, then pipeline (Megatron-LM's order: a TP group is consecutive GPUs,
inside one node when ``tp`` <= GPUs per node), plus the micro-batch ``b``, recomputation, the data
dimension's sharding and the pipeline's virtual stages ``v``. ``m = global_batch / (dp * b)``
micro-batches go through each pipeline per step.

The communication model (every collective is a ring; the bytes a rank *sends*):

* **all-reduce** of S bytes over g ranks: ``2 (g-1)/g * S``; **all-gather** whose result is S bytes:
  ``(g-1)/g * S``; **reduce-scatter** of an S-byte input: ``(g-1)/g * S``; **point-to-point**: S.
* **time** = bytes sent / the group's link: NVLink (``nvlink_bw * link_eff``) when the whole group is
  inside one node, else the GPU's own network port (``nic_bw * link_eff``). A group with several ranks
  per node could in principle send each byte out of a node once (NCCL's rings over 8 rails); the model
  charges the per-GPU port instead, which is exact for Megatron's data-parallel and pipeline groups (one
  rank per node) and is what the measured ZeRO-3 rows of Megatron-LM's Table 2 show (their step time
  stays at ~67 s from 768 to 1536 GPUs, ~1.4 TB per GPU at ~21 GB/s). Latency is not modelled.
* **tensor parallelism** (Megatron layout with sequence parallelism): per block and micro-batch the
  forward all-gathers the sequence-sharded norm output before attention and before the MLP (2 AG,
  fp32 under autocast) and reduce-scatters the row-parallel outputs (2 RS, bf16), S = b*T*C
  activations each; the backward does the reverse (2 RS + 2 AG of the gradients). Without sequence
  parallelism these are Megatron's 4 all-reduces per block (an all-reduce = RS + AG: the same
  bytes). ``recompute block`` runs the forward again: +2 AG + 2 RS under Megatron-LM, +2 AG + 1 RS
  under gptforge (torch's checkpoint stops once every saved tensor is back, before the MLP's output;
  +2 RS with Gemma's post-norms, whose norm on the MLP's output saves it). The first stage
  reduce-scatters the vocabulary-parallel embedding and GPT-2's row-split position table (fwd RS,
  bwd AG), the last all-gathers the final norm's output for the vocabulary-parallel head (fwd AG,
  bwd RS), and ``loss_parallel`` all-reduces three fp32 statistics per position (max, sum of
  exponentials, target logit). The norms' weights are whole on every rank but see one sequence shard,
  so their fp32 gradients are all-reduced: once per step, or by FSDP2 every micro-batch when it
  reduces every micro-batch; GPT-2's fused q/k/v bias is whole too and all-gathers its gradient
  (3C per block and micro-batch; Megatron-LM splits it, so nothing to gather); torch's gradient norm
  all-reduces one fp32 per parameter tensor.
  (Row-parallel output biases need nothing: their gradient comes from the gathered output gradient.)
* **pipeline**: each micro-batch crosses every stage boundary forward (activations) and backward
  (their gradients): b*T*C/tp elements each way (sequence-parallel shards of the fp32 residual
  stream: Megatron's scatter/gather optimisation); with ``v`` virtual stages a rank sends up to v
  times as often (the first step also sends shapes). The **bubble** of 1F1B is (p-1)/m of the ideal time, interleaved (p-1)/(m*v):
  step = (m + (p-1)/v) micro-batch times. Tied embeddings on both end stages all-reduce their
  gradient between them once per step (its FSDP shard, when FSDP2 shards the data dimension).
* **data parallelism** (gptforge): without TP/PP, DDP all-reduces the fp32 gradients once per step
  (``no_sync`` before the last micro-batch); ZeRO-1 (``zero1``) does that and all-gathers the updated
  fp32 parameters; FSDP2 (``fsdp``, ZeRO-3) all-gathers the bf16 parameters in every micro-batch's
  forward and again in its backward (the last block stays gathered) and reduce-scatters fp32
  gradients every micro-batch (behind a pipeline, which keeps parameters gathered after a backward
  until the last micro-batch, a unit is gathered m + 1 times a step). Under a TP/PP mesh the data dimension is always FSDP2 over (replicas x
  shards): shard groups of ``dp_shard`` (HSDP when < ``dp``) with ``fsdp``, of 1 with ``none`` (then
  only the replicas' all-reduce); it reduces every micro-batch without a pipeline, once after the
  last micro-batch with one (torch's pipeline stages turn gradient sync off until then); the
  all-reduce across replicas carries the shard, ``N / dp_shard``.
* **Megatron-LM and DeepSpeed** (the ``megatron`` and ``deepspeed`` engines, for checking against the
  paper): fp16 activations; Megatron all-reduces fp32 gradients once after the pipeline flush;
  DeepSpeed's ZeRO-3 gathers fp16 parameters in the forward, again for the recomputed forward and for
  the backward, and reduce-scatters fp16 gradients.
* **overlap**: FSDP2's and ZeRO-3's gathers (and their per-micro-batch reductions) are prefetched
  under compute, so that part of a step takes the longer of the two; everything else (TP collectives,
  pipeline sends, the reduction after a pipeline's flush, DDP's all-reduce after the last micro-batch,
  the optimizer step) adds to the step time.

Compute per micro-batch and stage: forward matmul FLOPs per token from the family (``Counts``), x3 for
forward + backward, +1 block forward under ``recompute block`` (+ the MLP's input projections under
``recompute mlp``), divided by ``tp``, at ``peak_flops * matmul_eff``; plus the memory-bound work:
the family's saved-activation bytes, written and read four times over forward and backward (six with
recomputation), at ``hbm_bw``. The last stage adds the output head (never recomputed): its matmuls, and
the logits' traffic per token and vocabulary row: 32 bytes on the plain head (bf16 logits written, a
float32 copy, log-softmax forward and backward over it, the float32 gradient cast back to bf16, the two
backward matmuls reading it), 12 with the fused classifier (``HEAD_BYTES``: the matmul writes bf16
logits, the kernel reads each row twice and writes d(logits) in place, the two backward matmuls read it).

Memory per GPU (gptforge's engine: fp32 master weights, fp32 gradients, AdamW's two fp32 moments):
16 bytes per parameter on the GPU's stage and TP shard (ZeRO-1 divides the moments by ``dp``; FSDP
divides all of it by ``dp_shard`` and adds two gathered bf16 blocks), plus activations: the family's
bytes per token per block / ``tp`` (sequence parallelism shards all of them) for the stage's blocks,
times the micro-batches in flight on the first stage (1F1B: ``min(m, p)``; interleaved a little more).
The last stage adds the head for one micro-batch: the logits, log-softmax and their gradients (16 bytes
per token and vocabulary row, / ``tp``), or with the fused classifier one bf16 buffer holding the
logits and then their gradient (2 bytes). Whether a layout runs the fused classifier is what training's
resolver decides for a CUDA GPU with triton (``model.fused_ce`` auto: on without TP and PP, unless a
logit soft-cap or ``lm_head_fp8`` stops it; ``plan.memory.head_path``); a layout that
``model.fused_ce=true`` cannot run is refused by :func:`check`, as training refuses it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gptforge.models.registry import counts as family_counts
from gptforge.models.registry import layer_act_bytes as family_act_bytes
from gptforge.plan.cluster import Cluster

RECOMPUTES = ("none", "mlp", "block")
HEAD_BYTES = {False: 32.0, True: 12.0}  # logits' HBM traffic per token and vocabulary row: plain head, fused classifier
SHARDS = ("none", "zero1", "fsdp")
ENGINES = ("gptforge", "megatron", "deepspeed")


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    recompute: str = "none"  # none | mlp | block
    shard: str = "none"  # none (DDP) | zero1 | fsdp (ZeRO-3)
    interleave: int = 1  # virtual pipeline stages per rank (1 = 1F1B)
    dp_shard: int = 0  # FSDP group size (HSDP when < dp); 0 = all of dp
    engine: str = "gptforge"  # whose traffic: gptforge | megatron (2021 PTD-P) | deepspeed (ZeRO-3)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def shard_group(self) -> int:
        return self.dp_shard or self.dp

    def describe(self) -> str:
        extra = f" v {self.interleave}" if self.interleave > 1 else ""
        hsdp = f" (HSDP {self.shard_group}x{self.dp // self.shard_group})" if self.shard_group != self.dp else ""
        return (f"DP {self.dp} x TP {self.tp} x PP {self.pp}{extra}, micro-batch {self.micro_batch}, "
                f"recompute {self.recompute}, shard {self.shard}{hsdp}")


_CACHE: dict = {}


def counts(model_cfg, seq_len: int | None = None):
    """The family's counts, memoised on the config's value (the search asks thousands of times)."""
    key = ("counts", repr(model_cfg), seq_len)
    if len(_CACHE) > 256:  # a long-lived process planning many configs
        _CACHE.clear()
    if key not in _CACHE:
        _CACHE[key] = family_counts(model_cfg, seq_len)
    return _CACHE[key]


def layer_act_bytes(model_cfg, dtype: str, recompute: str) -> float:
    key = ("act", repr(model_cfg), dtype, recompute)
    if key not in _CACHE:
        _CACHE[key] = family_act_bytes(model_cfg, dtype, recompute)
    return _CACHE[key]


def head_path(model_cfg, layout: Layout) -> tuple[bool, str] | str:
    """(whether gptforge trains ``layout`` with the fused classifier, why), as ``plan.memory.head_path``
    decides it for a CUDA GPU with triton; the refusal (a str) where ``model.fused_ce=true`` cannot run.
    Megatron-LM's and DeepSpeed's engines (the papers' systems) keep their own head: off."""
    if layout.engine != "gptforge":
        return False, f"engine {layout.engine}"
    key = ("head", repr(model_cfg), layout.tp, layout.pp)  # the degrees: the reason names them
    if key not in _CACHE:
        from gptforge.config import Config, ConfigError
        from gptforge.plan.memory import GPU_TARGET
        from gptforge.plan.memory import head_path as decide

        cfg = Config(model=model_cfg)
        cfg.dist.tp, cfg.dist.pp = layout.tp, layout.pp
        try:
            _CACHE[key] = decide(cfg, *GPU_TARGET)
        except ConfigError as e:
            _CACHE[key] = str(e)
    return _CACHE[key]


def microbatches(layout: Layout, global_batch: int) -> int:
    return global_batch // (layout.dp * layout.micro_batch)


def check(model_cfg, layout: Layout, global_batch: int) -> str | None:
    """Why ``layout`` cannot run ``model_cfg`` at ``global_batch`` sequences, or None."""
    c = counts(model_cfg)
    L = layout
    if min(L.dp, L.tp, L.pp, L.micro_batch, L.interleave) < 1:
        return "every degree must be >= 1"
    if c.n_head % L.tp or c.kv_heads % L.tp:
        return f"model.n_head={c.n_head} (key/value heads {c.kv_heads}) not divisible by TP {L.tp}"
    from gptforge.parallel.mesh import parallel_refusal  # what check_layout refuses

    refused = parallel_refusal(model_cfg, L.tp, L.pp) if L.engine == "gptforge" else None
    if refused:
        return refused[1]
    if c.n_layer % (L.pp * L.interleave):
        return f"model.n_layer={c.n_layer} not divisible by PP {L.pp} x virtual stages {L.interleave}"
    if global_batch % (L.dp * L.micro_batch):
        return f"global batch {global_batch} not divisible by DP {L.dp} x micro-batch {L.micro_batch}"
    m = microbatches(L, global_batch)
    if L.pp > 1 and m < L.pp:
        return f"{m} micro-batches is fewer than {L.pp} pipeline stages"
    if L.interleave > 1 and m % L.pp:
        return f"interleaving needs micro-batches ({m}) a multiple of PP {L.pp}"
    if L.dp % L.shard_group:
        return f"dp_shard {L.dp_shard} must divide DP {L.dp}"
    if L.recompute not in RECOMPUTES or L.shard not in SHARDS or L.engine not in ENGINES:
        return f"recompute in {RECOMPUTES}, shard in {SHARDS}, engine in {ENGINES}"
    head = head_path(model_cfg, L)
    if isinstance(head, str):  # model.fused_ce=true under TP or PP: training refuses it
        return head
    return None


def _tp_layer(c, L: Layout) -> float:
    """One block's parameters on one TP rank: the matmul weights split, norms and row-parallel output
    biases whole, and under gptforge's engine GPT-2's fused q/k/v bias whole too (Megatron splits it)."""
    whole = c.layer_replicated + (c.qkv_bias if L.engine == "gptforge" else 0)
    return (c.layer_params - whole) / L.tp + whole


def _stage_params(c, L: Layout, stage: int) -> tuple[float, float]:
    """(parameters on one rank of ``stage``, the tied table's copy among them): TP splits the matmul
    weights, the vocabulary and the position table; norms and row-parallel output biases stay whole."""
    layer = _tp_layer(c, L)
    n = layer * c.n_layer / L.pp
    tied = 0.0
    if stage == 0:
        n += c.embed_params / L.tp  # token (and position) tables split by rows
    if stage == L.pp - 1:
        n += (c.head_params - c.final_norm) / L.tp + c.final_norm
        if c.tied and L.pp > 1:  # the last stage holds a copy of the tied table for the head
            tied = c.vocab * c.n_embd / L.tp
            n += tied
    return n, tied


def _stage_tensors(c, L: Layout, stage: int) -> int:
    """Parameter tensors whose gradients the norm sees on one rank of ``stage`` (a tied table held by
    both end stages is counted on the first)."""
    n = c.layer_tensors * c.n_layer // L.pp
    if stage == 0:
        n += c.embed_tensors
    if stage == L.pp - 1:
        n += c.head_tensors
    return n


def comm_volume(model_cfg, layout: Layout, global_batch: int, seq_len: int, stage: int | None = None,
                precision: str = "bf16") -> dict:
    """Bytes one rank moves in one training step, by ``"dim.kind"`` (dim: tp, pp, dp; kind: all_reduce,
    all_gather, reduce_scatter, send), each ``{"payload": P, "sent": S, "group": g}``, plus
    ``"detail"``: the same bytes item by item, ``(dim, kind, what, payload per step)``:

    * ``payload``: the sum of the logical tensor sizes handed to the collective calls (an all-reduce's
      tensor, an all-gather's gathered output, a reduce-scatter's full input, a send's tensor): what a
      process-group wrapper or DTensor's CommDebugMode sees;
    * ``sent``: what the rank puts on the wire under ring algorithms (module docstring): what the time
      model charges.

    ``stage`` picks the pipeline stage (default: the last, which holds the head); every rank of a stage
    sees the same volume. ``precision``: ``bf16`` (gptforge on CUDA: autocast, so the residual stream,
    norm outputs, embeddings and gradients are fp32 and matmul outputs bf16; FSDP gathers bf16
    parameters) or ``float32`` (everything 4 bytes: a CPU run). The ``megatron`` and ``deepspeed``
    engines move fp16 activations and parameters (gradients: fp32 and fp16).

    Not counted: scalar all-reduces (the loss, the gradient norm, a stop flag: latency, not bandwidth).
    For a float32 run every entry is what ``dist.count_comm`` counts, byte for byte
    (tests/training/test_model_parallel.py: TP, PP with GPipe, 1F1B and interleaving, TP x PP, FSDP x
    TP, HSDP, PP x FSDP with 1F1B and interleaving; GPipe x FSDP checked once by hand)."""
    c = counts(model_cfg, seq_len)
    L = layout
    stage = L.pp - 1 if stage is None else stage
    m = microbatches(L, global_batch)
    out: dict = {"detail": []}

    def add(dim: str, kind: str, what: str, payload: float, group: int) -> None:
        if group <= 1 or payload <= 0:
            return
        f = {"all_reduce": 2 * (group - 1) / group, "send": 1.0}.get(kind, (group - 1) / group)
        e = out.setdefault(f"{dim}.{kind}", {"payload": 0.0, "sent": 0.0, "group": group})
        e["payload"] += payload
        e["sent"] += payload * f
        out["detail"].append((dim, kind, what, payload))

    ours = L.engine == "gptforge"
    wide = 4 if (precision == "float32" or ours) else 2  # residual stream, norm outputs, embeddings
    narrow = 4 if precision == "float32" else 2  # matmul outputs (autocast / fp16)
    tokens = L.micro_batch * seq_len * c.n_embd  # one micro-batch's b x T x C elements
    blocks = c.n_layer // L.pp
    passes = 3 if L.recompute == "block" else 2  # forward, backward (+ recomputed forward)
    if L.tp > 1:
        fwd = passes - 1  # forward passes per micro-batch
        # torch's checkpoint stops recomputing once every saved tensor is back: a block's last
        # reduce-scatter (the MLP's output) is not run again (Megatron-LM reruns the whole forward),
        # unless a norm on the MLP's output (Gemma's post-norms) saved it as its input
        stops_early = L.recompute == "block" and ours and not getattr(model_cfg, "post_norms", False)
        rs_fwd = 2 * fwd - (1 if stops_early else 0)
        # per block: the two norm outputs gathered (forward), their gradients reduce-scattered (backward);
        # the two row-parallel outputs reduce-scattered (forward), their gradients gathered (backward)
        add("tp", "all_gather", "block inputs (norm outputs)", m * blocks * 2 * fwd * tokens * wide, L.tp)
        add("tp", "reduce_scatter", "block inputs' gradients", m * blocks * 2 * tokens * wide, L.tp)
        add("tp", "reduce_scatter", "row-parallel outputs", m * blocks * rs_fwd * tokens * narrow, L.tp)
        add("tp", "all_gather", "row-parallel outputs' gradients", m * blocks * 2 * tokens * narrow, L.tp)
        if stage == 0:
            add("tp", "reduce_scatter", "vocabulary-parallel embedding", m * tokens * wide, L.tp)
            add("tp", "all_gather", "embedding output's gradient", m * tokens * wide, L.tp)
            if c.positions:
                add("tp", "reduce_scatter", "position table (T x C)", m * seq_len * c.n_embd * wide, L.tp)
                add("tp", "all_gather", "position rows' gradient", m * seq_len * c.n_embd * wide, L.tp)
        if stage == L.pp - 1:
            add("tp", "all_gather", "final norm output -> head", m * tokens * wide, L.tp)
            add("tp", "reduce_scatter", "head input's gradient", m * tokens * wide, L.tp)
            # loss_parallel: each position's max logit, sum of exponentials and target logit (fp32)
            add("tp", "all_reduce", "vocabulary-parallel loss statistics", m * 3 * L.micro_batch * seq_len * 4, L.tp)
        # gptforge holds a fused q/k/v bias whole; each rank adds its heads' rows, so its gradient is
        # gathered (Megatron-LM splits it with the column-parallel weight: each rank's gradient is local)
        if ours:
            add("tp", "all_gather", "fused q/k/v bias gradient", m * blocks * c.qkv_bias * 4, L.tp)
        # the norms' weights are whole on every rank but see only their sequence shard: their gradients
        # (fp32) are partial sums, all-reduced once per step (gptforge.parallel.grads; Megatron-LM the
        # same), or by FSDP2 before each of its reductions (every micro-batch without a pipeline)
        norms = blocks * c.layer_norms + (c.final_norm if stage == L.pp - 1 else 0)
        fsdp_syncs = m if (ours and L.dp > 1 and L.pp == 1) else 1
        add("tp", "all_reduce", "gradients of the norms", fsdp_syncs * norms * 4, L.tp)
        if ours:  # torch's gradient norm all-reduces the stacked per-tensor norms (one fp32 per tensor)
            add("tp", "all_reduce", "per-tensor gradient norms", _stage_tensors(c, L, stage) * 4, L.tp)
    if L.pp > 1:
        v = L.interleave
        sends = (v - (stage == L.pp - 1)) + (v - (stage == 0))
        add("pp", "send", "activations forward, their gradients backward", m * sends * tokens / L.tp * wide, 2)
        if c.tied and stage in (0, L.pp - 1):
            # FSDP2 has reduce-scattered it by then: the two stages sum their shard
            shard = L.shard_group if L.shard == "fsdp" else 1
            add("pp", "all_reduce", "tied embedding's gradient", c.vocab * c.n_embd / L.tp / shard * 4, 2)
    n_rank, _ = _stage_params(c, L, stage)
    grad_b = 2 if L.engine == "deepspeed" else 4
    param_b = 4 if precision == "float32" and ours else 2
    mesh = L.tp > 1 or L.pp > 1
    if L.shard == "fsdp" or (ours and mesh):
        # FSDP2 over (replicas x shards); under a mesh gptforge's data dimension is always FSDP2, with
        # shard groups of 1 when dist.shard is none. Without a pipeline it reduces every micro-batch;
        # torch's pipeline stages reduce after the last micro-batch only
        g = L.shard_group if L.shard == "fsdp" else 1
        syncs = 1 if (L.pp > 1 or not ours) else m
        if g > 1:
            gathers = 2 + (L.engine == "deepspeed" and L.recompute == "block")
            kept = 0 if not ours else _tp_layer(c, L)  # the rank's last block: not resharded after forward
            ag = m * (gathers * n_rank - kept)
            if ours and L.pp > 1:
                # torch's stages keep parameters gathered after a backward until the last micro-batch: a unit
                # resharded after its forward is gathered m + 1 times a step (every forward until the first
                # backward, then every backward that follows a forward), the last block once
                ag = (m + 1) * (n_rank - kept) + kept
            add("dp", "all_gather", "parameters (forward, backward)", ag * param_b, g)
            add("dp", "reduce_scatter", "gradients", syncs * n_rank * grad_b, g)
            if ours:  # the gradient norm's per-tensor norms, partial over the shards
                add("dp", "all_reduce", "per-tensor gradient norms", _stage_tensors(c, L, stage) * 4, g)
        if L.dp > g:
            add("dp", "all_reduce", "gradient shards across replicas", syncs * n_rank / g * grad_b, L.dp // g)
    else:
        add("dp", "all_reduce", "gradients", n_rank * grad_b, L.dp)
        if L.shard == "zero1":  # ZeroRedundancyOptimizer broadcasts each rank's updated shard: an all-gather
            add("dp", "all_gather", "updated parameters", n_rank * 4, L.dp)
    return out


def _link(cluster: Cluster, group_span: int) -> float:
    """Bytes/s for a group whose ranks span ``group_span`` consecutive GPUs."""
    bw = cluster.nvlink_bw if group_span <= cluster.gpus_per_node else cluster.nic_bw
    return bw * cluster.link_eff


@dataclass
class Cost:
    layout: Layout
    step_s: float
    compute_s: float  # pipeline time (compute, TP, sends, bubble) without data-parallel traffic
    bubble_frac: float  # (p-1)/(m v)
    dp_comm_s: float
    tflops: float  # achieved hardware FLOP/s per GPU, recomputation included (Megatron-LM's convention)
    mfu: float  # model FLOPs (no recomputation, PaLM's count) / peak
    mem: dict  # bytes per GPU: weights, grads, optimizer, activations, total

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = asdict(self.layout)
        return d


def estimate_cost(model_cfg, layout: Layout, cluster: Cluster, global_batch: int, seq_len: int,
                  mem: dict | None = None) -> Cost:
    """Step time, FLOP/s and memory per GPU of ``layout`` (see the module docstring); ``mem``: the
    layout's :func:`memory`, when the caller has it already."""
    c = counts(model_cfg, seq_len)
    L = layout
    m = microbatches(L, global_batch)
    tok = L.micro_batch * seq_len
    rate = cluster.peak_flops * cluster.matmul_eff
    extra = {"block": c.layer_flops, "mlp": 2.0 * c.mlp_in_params}.get(L.recompute, 0.0)
    scores = 0.0 if model_cfg.flash else c.n_head * seq_len * 6.0  # T x T probabilities (+ dropout) per token
    traffic = (layer_act_bytes(model_cfg, "bfloat16", "none") + scores) * (
        4 + (2 if L.recompute == "block" else 1 if L.recompute == "mlp" else 0))
    blocks = c.n_layer // L.pp
    layer_s = tok * ((3 * c.layer_flops + extra) / L.tp / rate + traffic / L.tp / cluster.hbm_bw)
    head = head_path(model_cfg, L)  # a refusal (str) never reaches here from the search: check() drops it
    fused = isinstance(head, tuple) and head[0]
    head_s = tok * (3 * c.head_flops / L.tp / rate + HEAD_BYTES[fused] * c.vocab / L.tp / cluster.hbm_bw)
    vols = {s: comm_volume(model_cfg, L, global_batch, seq_len, stage=s) for s in {0, L.pp - 1}}
    tp_bw = _link(cluster, L.tp)
    pp_bw = _link(cluster, L.world if L.pp > 1 else 1)
    dp_span = L.tp * L.dp
    stage_s = []
    for s, vol in vols.items():
        tp_s = sum(vol.get(f"tp.{k}", {}).get("sent", 0.0) for k in ("all_gather", "reduce_scatter", "all_reduce"))
        pp_s = vol.get("pp.send", {}).get("sent", 0.0)
        stage_s.append(blocks * layer_s + (head_s if s == L.pp - 1 else 0.0) + (tp_s / tp_bw + pp_s / pp_bw) / m)
    mb_s = max(stage_s)
    bubble = (L.pp - 1) / (m * L.interleave)
    pipe_s = (m + (L.pp - 1) / L.interleave) * mb_s
    vol = vols[L.pp - 1]
    n_rank, _ = _stage_params(c, L, L.pp - 1)
    ours = L.engine == "gptforge"
    if L.shard == "fsdp" or (ours and (L.tp > 1 or L.pp > 1)):  # FSDP2 (see comm_volume)
        shard_bw = _link(cluster, L.tp * L.shard_group)
        gather_s = vol.get("dp.all_gather", {}).get("sent", 0.0) / shard_bw
        reduce_s = (vol.get("dp.reduce_scatter", {}).get("sent", 0.0) / shard_bw
                    + vol.get("dp.all_reduce", {}).get("sent", 0.0) / _link(cluster, dp_span))
        if ours and L.pp > 1:  # gathers under compute; the one reduction after the pipeline's flush
            dp_s = max(0.0, gather_s - pipe_s) + reduce_s
        else:  # gathers and per-micro-batch reductions prefetched / overlapped under compute
            dp_s = max(0.0, gather_s + reduce_s - pipe_s)
        opt_params = n_rank / (L.shard_group if L.shard == "fsdp" else 1)
    else:  # DDP / ZeRO-1 (and Megatron's): the gradient all-reduce after the last micro-batch
        dp_s = sum(e["sent"] for k, e in vol.items() if k.startswith("dp.")) / _link(cluster, dp_span)
        opt_params = n_rank
    dp_s += vol.get("pp.all_reduce", {}).get("sent", 0.0) / pp_bw
    opt_s = opt_params * 32.0 / cluster.hbm_bw  # AdamW reads and writes param, grad and two moments (fp32)
    step = pipe_s + dp_s + opt_s
    tokens = global_batch * seq_len
    hw = tokens * (c.n_layer * (3 * c.layer_flops + extra) + 3 * c.head_flops)
    model = tokens * (c.n_layer * 3 * c.layer_flops + 3 * c.head_flops)
    mem = mem or memory(model_cfg, L, cluster, global_batch, seq_len)
    return Cost(L, step, pipe_s, bubble, dp_s, hw / L.world / step, model / L.world / step / cluster.peak_flops, mem)


def memory(model_cfg, layout: Layout, cluster: Cluster, global_batch: int, seq_len: int) -> dict:
    """Bytes per GPU on the fuller end stage (module docstring)."""
    c = counts(model_cfg, seq_len)
    L = layout
    m = microbatches(L, global_batch)
    tok = L.micro_batch * seq_len
    worst = None
    for s in {0, L.pp - 1}:
        n, _ = _stage_params(c, L, s)
        g = L.shard_group if L.shard == "fsdp" else 1
        weights = 4 * n / g
        if L.shard == "fsdp" and g > 1:
            weights += 2 * 2 * _tp_layer(c, L)  # two gathered bf16 blocks, as one TP rank holds them
        grads = 4 * n / g
        optim = 8 * n / (L.dp if L.shard == "zero1" else g)
        blocks = c.n_layer // L.pp
        scores = L.micro_batch * c.n_head / L.tp * seq_len**2 * 6 if not model_cfg.flash else 0.0
        per_mb = blocks * layer_act_bytes(model_cfg, "bfloat16", L.recompute) * tok / L.tp
        working = 0.0  # once, not per micro-batch in flight: the block being recomputed
        if L.recompute == "block":
            working = layer_act_bytes(model_cfg, "bfloat16", "none") * tok / L.tp + scores
        else:
            per_mb += blocks * scores
        inflight = 1 if L.pp == 1 else min(m, L.pp) if s == 0 else 1
        if L.interleave > 1 and s == 0:
            inflight = min(m, L.pp) * (1 + (L.pp - 1) / (L.pp * L.interleave))
        acts = per_mb * inflight + working
        if s == L.pp - 1:  # one micro-batch's head: logits, log-softmax and their gradients, or the fused buffer
            head = head_path(model_cfg, L)  # a refusal (str) never reaches here from the search: check() drops it
            fused = isinstance(head, tuple) and head[0]
            acts += tok * (2.0 if fused else 16.0) * c.vocab / L.tp
        total = weights + grads + optim + acts
        if worst is None or total > worst["total"]:
            worst = {"stage": s, "weights": weights, "grads": grads, "optimizer": optim, "activations": acts,
                     "total": total}
    assert worst is not None
    return worst


def days(cost: Cost, tokens: float, global_batch: int, seq_len: int) -> float:
    """Days to train on ``tokens`` tokens at this step time."""
    return math.ceil(tokens / (global_batch * seq_len)) * cost.step_s / 86400


def run_layout(cfg, world: int) -> tuple[Layout, int]:
    """(the planner's :class:`Layout`, the global batch in sequences) of a training config run on
    ``world`` ranks: what ``dist.*``, ``train.micro_batch`` and ``model.recompute`` select."""
    d = cfg.dist
    dp = world // (d.tp * d.pp)
    mesh = world > 1 and (d.tp > 1 or d.pp > 1 or d.dp_replicate > 1)
    layout = Layout(dp=dp, tp=d.tp, pp=d.pp, micro_batch=cfg.train.micro_batch, recompute=cfg.model.recompute,
                    shard=d.shard, interleave=d.pp_virtual if d.pp_schedule == "interleaved1f1b" else 1,
                    dp_shard=dp // d.dp_replicate if (mesh and d.shard == "fsdp") else 0)
    return layout, cfg.train.total_batch_tokens // cfg.train.seq_len
