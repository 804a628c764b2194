"""Memory per rank under data parallelism (DDP, ZeRO-1, FSDP): which micro-batch, recomputation and
sharding fit one GPU's memory? (``plan.cost`` adds tensor and pipeline parallelism and time.)

    gptforge plan --preset gpt2-1.5b --gpu-mem 80 --world 8
    gptforge plan --preset tiny --measure        # estimate vs measured peak for the preset as configured

The estimate adds up, per rank and in bytes:

* **weights**: 4N float32 master parameters (N from the model config), ``/world`` under FSDP, plus
  FSDP's all-gathered unsharded copies (the root's embeddings and two blocks, in the parameter dtype);
* **gradients**: 4N (DDP's buckets are the gradients: ``gradient_as_bucket_view``), ``/world`` under FSDP;
* **optimizer state**: AdamW's two moments, 8N, ``/world`` under ZeRO-1 or FSDP, plus the foreach
  kernels' temporaries during ``step()`` (4N; none with fused AdamW); with ``--lora.rank`` the base is
  frozen, so gradients and optimizer state are the adapters' (``models.lora.adapter_params``) and the
  weights gain them;
* **activations**: what autograd saves per token per layer, the family's ``layer_act_bytes`` (counted
  from ``models/gpt2.py`` / ``models/llama.py``); for GPT-2 in float32
  68·C bytes (LayerNorm inputs and outputs, q/k/v, attention output and its contiguous copy, the
  4C-wide MLP input and GELU output); under bf16 autocast 38·C; ``recompute mlp`` drops the c_fc output
  (52·C / 30·C), ``recompute block`` keeps only each block's input (4·C) plus one block recomputed;
  the explicit-attention path adds the T×T softmax; the head keeps the logits and log-softmax and
  needs as much again for their gradients, or, with the fused classifier (``model.fused_ce``), one
  (B·T, padded vocabulary) buffer in the compute dtype that holds the logits and then, overwritten in
  place, their gradient (``kernels/fused_ce.py``; float32 logits never exist).

Whether the fused classifier runs is decided by training's own resolver (``training.switches``) for the
plan's target, not for the planning machine: a CUDA GPU with triton for the table (``auto`` is on there
unless a logit soft-cap, ``lm_head_fp8``, tensor or pipeline parallelism stops it), the machine itself
under ``--measure``. :func:`head_path` says which path was assumed and why.

The peak is the larger of "backward" (weights + optimizer state + gradients + activations) and
"optimizer step" (weights + gradients + optimizer state + temporaries). ``--measure`` runs a few real
steps and reports the measured peak next to the estimate: on CUDA the allocator's peak, on CPU the
peak of live tensor storage (a dispatch-mode tracker counting every tensor the steps allocate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptforge.config import Config, ConfigError
from gptforge.models.registry import counts, layer_act_bytes

GIB = 2**30
SHARDINGS = ("none", "zero1", "fsdp")
RECOMPUTES = ("none", "mlp", "block")
# cheapest first: sharding costs communication, recomputation costs compute (~1/3 more for block)
PREFERENCE = [("none", "none"), ("zero1", "none"), ("zero1", "mlp"), ("fsdp", "none"), ("fsdp", "mlp"),
              ("zero1", "block"), ("fsdp", "block")]


def count_params(cfg: Config) -> int:
    """Parameters of the model in ``cfg.model`` (a tied embedding once), counted from the config by its
    family (``models/counting.py``): no model is built, any size answers at once."""
    return counts(cfg.model).params


@dataclass
class Estimate:
    micro_batch: int
    sharding: str
    recompute: str
    weights: float
    grads: float
    optimizer: float
    activations: float
    peak: float

    def row(self, unit: str = "GiB") -> str:
        scale = GIB if unit == "GiB" else 2**20
        g = lambda b: f"{b / scale:8.2f}"  # noqa: E731
        return (f"{self.sharding:<6} {self.recompute:<6} {self.micro_batch:>4} {g(self.weights)} {g(self.grads)} "
                f"{g(self.optimizer)} {g(self.activations)} {g(self.peak)}")


GPU_TARGET = (torch.device("cuda"), True)  # what the table plans for: a CUDA GPU with triton (torch's CUDA wheels)


def head_path(cfg: Config, device: torch.device, triton: bool | None = None) -> tuple[bool, str]:
    """(whether training ``cfg`` on ``device`` runs the fused classifier, why), decided by training's own
    resolver; ``triton``: whether that machine has triton (None: this one). ``model.fused_ce=true`` where it
    cannot run is refused (ConfigError) with training's own message, as training would refuse it."""
    from gptforge.training.switches import fused_ce_problem, fused_ce_refusal, resolve_model_switches

    refusal = fused_ce_refusal(cfg, device, triton)
    if refusal:
        raise ConfigError(refusal)
    m = cfg.model
    on = bool(getattr(resolve_model_switches(cfg, device, triton=triton), "fused_ce", False))
    setting = getattr(m, "fused_ce", False)
    if not hasattr(m, "fused_ce"):
        why = f"model.arch={m.arch} has no fused classifier"
    elif setting is not None:
        why = f"model.fused_ce={str(setting).lower()}"
    elif on:
        why = f"model.fused_ce=auto on a {device.type.upper()} GPU with triton"
    else:
        why = f"model.fused_ce=auto: {fused_ce_problem(cfg, device, triton) or 'off on ' + device.type}"
    return on, why


def head_words(on: bool, why: str) -> str:
    return f"fused classifier {'on' if on else 'off'} ({why})"


def estimate(cfg: Config, world: int = 1, *, micro_batch: int | None = None, sharding: str = "none",
             recompute: str | None = None, dtype: str = "bfloat16", fused: bool = True,
             fused_ce: bool | None = None) -> Estimate:
    """Per-rank peak memory in bytes for training ``cfg`` as described in the module docstring.
    ``fused_ce``: whether the fused classifier runs; None decides it as training would on the table's
    target, a CUDA GPU with triton (:func:`head_path`)."""
    if fused_ce is None:
        fused_ce = head_path(cfg, *GPU_TARGET)[0]
    m = cfg.model
    B = micro_batch or cfg.train.micro_batch
    T = cfg.train.seq_len
    rc = recompute or m.recompute
    c = counts(m, T)
    N, C, L, V, Vp = c.params, m.n_embd, m.n_layer, m.vocab_size, m.padded_vocab_size
    shard = world if sharding == "fsdp" else 1
    pbytes = 2 if dtype == "bfloat16" else 4
    weights = 4 * N / shard
    if sharding == "fsdp" and world > 1:  # gathered copies: root (embeddings, ln_f) and two blocks
        weights += pbytes * (c.embed_params + c.head_params + 2 * c.layer_params)
    trained = N
    if getattr(cfg, "lora", None) is not None and cfg.lora.rank:  # a frozen base: gradients and AdamW state
        from gptforge.config import ConfigError  # for the adapters only (activations stay: the gradient
        from gptforge.models.lora import LoRAError, adapter_params  # still flows through the base)

        try:
            trained = adapter_params(m, cfg.lora.rank, cfg.lora.target_names())
        except LoRAError as e:
            raise ConfigError(str(e)) from e
        weights += 4 * trained
    grads = 4 * trained / shard
    optim = 8 * trained / (world if sharding in ("zero1", "fsdp") else 1)
    temps = 0 if fused else 4 * trained / (world if sharding in ("zero1", "fsdp") else 1)
    tokens = B * T
    per_layer = layer_act_bytes(m, dtype, rc) * tokens
    acts = L * per_layer
    if rc == "block":  # one block's full activations exist again while it is recomputed
        acts += layer_act_bytes(m, dtype, "none") * tokens
    if not m.flash or getattr(m, "attn_softcap", 0):  # scores kept: the explicit path (a soft-cap takes it too)
        per_score = (4 if dtype == "float32" else 6) + (4 if getattr(m, "attn_softcap", 0) else 0)  # + tanh's
        acts += (L if rc != "block" else 1) * B * m.n_head * T * T * per_score
    if m.dropout > 0:
        acts += L * 3 * C * tokens  # boolean dropout masks
    acts += tokens * C * (8 if dtype == "float32" else 6)  # ln_f input and output
    if getattr(m, "logit_softcap", 0):  # tanh keeps its float32 output, and needs as much for the gradient
        acts += tokens * 4 * V * 2
    if fused_ce:  # one (tokens, Vp) buffer in the compute dtype: the logits, then d(logits) in place
        acts += tokens * Vp * (4 if dtype == "float32" else 2)
    elif dtype == "float32":
        acts += tokens * (4 * Vp + 4 * V) * 2  # logits + log-softmax, and their gradients
    else:
        acts += tokens * (2 * Vp + 4 * V + 8 * V + 2 * Vp)
    peak = max(weights + optim + grads + acts, weights + grads + optim + temps)
    return Estimate(B, sharding, rc, weights, grads, optim + temps, acts, peak)


def _micro_batches(cfg: Config, world: int) -> list[int]:
    """Micro-batch sizes (largest first) that divide the total batch at this world size."""
    T, total = cfg.train.seq_len, cfg.train.total_batch_tokens
    out = []
    b = 1
    while b * T * world <= total:
        if total % (b * T * world) == 0:
            out.append(b)
        b *= 2
    return sorted(out, reverse=True)


def asked_row(cfg: Config, world: int) -> tuple[str, str]:
    """The (shard, recompute) the config asks for at ``world``: on one GPU sharding does nothing, so a preset's
    ``dist.shard zero1`` is shard none there (it hid llama3-1b's ``--model.recompute block`` at ``--world 1``)."""
    return ("none" if world == 1 else cfg.dist.shard, cfg.model.recompute)


def propose(cfg: Config, gpu_mem_gib: float, world: int, reserve_gib: float = 2.0,
            dtype: str = "bfloat16", fused: bool = True) -> tuple[list[Estimate], Estimate | None]:
    """For each (sharding, recompute), the largest micro-batch that fits ``gpu_mem_gib`` less a reserve
    (CUDA context, allocator fragmentation); and the recommendation: the cheapest combination (see
    PREFERENCE) reaching the largest micro-batch any combination reaches, capped at 16. The fused
    classifier as training decides it on a CUDA GPU with triton (:func:`head_path`)."""
    budget = (gpu_mem_gib - reserve_gib) * GIB
    fused_ce = head_path(cfg, *GPU_TARGET)[0]
    batches = _micro_batches(cfg, world)
    if not batches:
        T, total = cfg.train.seq_len, cfg.train.total_batch_tokens
        if total < T * world:
            raise ConfigError(f"train.total_batch_tokens={total} is smaller than one sequence per rank "
                              f"(seq_len {T} x world {world}); raise it or lower the world size")
        raise ConfigError(f"train.total_batch_tokens={total} is not a multiple of one sequence per rank "
                          f"(seq_len {T} x world {world} = {T * world}), so no micro-batch divides it: use a "
                          f"world size that divides {total // T} sequences, or a total batch that "
                          f"{T * world} divides")
    rows: list[Estimate] = []
    # the cheapest-first candidates, then the combination the config asks for (--model.recompute block on one
    # GPU was planned as one "recomp none" row: the user's own choice must be a row of its own)
    asked = asked_row(cfg, world)
    for sharding, rc in PREFERENCE + ([asked] if asked not in PREFERENCE else []):
        if sharding != "none" and world == 1:
            continue
        fit = next((e for b in batches
                    if (e := estimate(cfg, world, micro_batch=b, sharding=sharding, recompute=rc, dtype=dtype,
                                      fused=fused, fused_ce=fused_ce)).peak <= budget), None)
        rows.append(fit or estimate(cfg, world, micro_batch=batches[-1], sharding=sharding, recompute=rc,
                                    dtype=dtype, fused=fused, fused_ce=fused_ce))
    fitting = [r for r in rows if r.peak <= budget]
    if not fitting:
        return rows, None
    target = min(16, max(r.micro_batch for r in fitting))
    best = next(r for r in fitting if r.micro_batch >= target)
    return rows, best


def plan_overrides(cfg: Config, est: Estimate, world: int) -> list[str]:
    accum = cfg.train.total_batch_tokens // (est.micro_batch * cfg.train.seq_len * world)
    out = [f"--train.micro_batch {est.micro_batch}", f"--model.recompute {est.recompute}"]
    out.append(f"--dist.shard {est.sharding}")
    return out + [f"# gradient accumulation {accum}"]

