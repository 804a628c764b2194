"""Memory planning: will this model fit, and with which micro-batch, recomputation and sharding?

    gptforge plan --preset gpt2-1.5b --gpu-mem 80 --world 8
    gptforge plan --preset tiny --measure        # estimate vs measured peak for the preset as configured

The estimate adds up, per rank and in bytes:

* **weights**: 4N float32 master parameters (N from the model config), ``/world`` under FSDP, plus
  FSDP's all-gathered unsharded copies (the root's embeddings and two blocks, in the parameter dtype);
* **gradients**: 4N (DDP's buckets are the gradients: ``gradient_as_bucket_view``), ``/world`` under FSDP;
* **optimizer state**: AdamW's two moments, 8N, ``/world`` under ZeRO-1 or FSDP, plus the foreach
  kernels' temporaries during ``step()`` (4N; none with fused AdamW);
* **activations**: what autograd saves per token per layer, counted from ``models/gpt2.py``: in float32
  68·C bytes (LayerNorm inputs and outputs, q/k/v, attention output and its contiguous copy, the
  4C-wide MLP input and GELU output); under bf16 autocast 38·C; ``recompute mlp`` drops the c_fc output
  (52·C / 30·C), ``recompute block`` keeps only each block's input (4·C) plus one block recomputed;
  the explicit-attention path adds the T×T softmax; the head keeps the logits and log-softmax and
  needs as much again for their gradients.

The peak is the larger of "backward" (weights + optimizer state + gradients + activations) and
"optimizer step" (weights + gradients + optimizer state + temporaries). ``--measure`` runs a few real
steps and reports the measured peak next to the estimate: on CUDA the allocator's peak, on CPU the
peak of live tensor storage (a dispatch-mode tracker counting every tensor the steps allocate).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch

from gptforge.config import Config, ConfigError
from gptforge.models.registry import build_model

GIB = 2**30
SHARDINGS = ("none", "zero1", "fsdp")
RECOMPUTES = ("none", "mlp", "block")
# cheapest first: sharding costs communication, recomputation costs compute (~1/3 more for block)
PREFERENCE = [("none", "none"), ("zero1", "none"), ("zero1", "mlp"), ("fsdp", "none"), ("fsdp", "mlp"),
              ("zero1", "block"), ("fsdp", "block")]
ACT_BYTES = {  # bytes per token per layer, in units of n_embd (see the module docstring)
    ("float32", "none"): 68, ("float32", "mlp"): 52, ("float32", "block"): 4,
    ("bfloat16", "none"): 38, ("bfloat16", "mlp"): 30, ("bfloat16", "block"): 4,
}


def layer_act_bytes(m, dtype: str, rc: str) -> float:
    """Bytes autograd keeps per token per layer: GPT-2 from ACT_BYTES, Llama counted from
    ``models/llama.py`` (g = kv heads / heads, h = MLP width / C). float32: two RMSNorms keep input,
    normalised and output (6C); q, k, v, attention output and one copy ((3 + 2g)C); SwiGLU keeps gate,
    SiLU, up and product (4hC), ReLU² two (2hC), ``recompute mlp`` only the product (hC). bf16
    autocast: each projection keeps its own bf16 copy of the normalised input (q/k/v: three, gate/up:
    two), q/k/v and the attention output are bf16, the MLP's H-wide tensors bf16. QK-norm adds its
    inputs and normalised values (8(1 + g)C bytes)."""
    C = m.n_embd
    if m.arch != "llama":
        return ACT_BYTES[(dtype, rc)] * C
    if rc == "block":
        return 4 * C
    g, h, swiglu = m.kv_heads / m.n_head, m.hidden_dim / C, m.mlp == "swiglu"
    qk = 8 * (1 + g) if m.qk_norm else 0
    if dtype == "float32":
        mlp = h if rc == "mlp" else (4 * h if swiglu else 2 * h)
        return (4 * (6 + 3 + 2 * g + mlp) + qk) * C
    norm2 = 8 + (4 if rc == "mlp" or swiglu else 2)
    mlp = 2 * h if rc == "mlp" else (8 * h if swiglu else 4 * h)
    return (14 + 2 * (2 + 2 * g) + norm2 + mlp + qk) * C


def count_params(cfg: Config) -> int:
    """Parameters of the model in ``cfg.model`` (a tied embedding once), built on the meta device:
    shapes only, no memory, any model family."""
    with torch.device("meta"):
        return build_model(cfg.model).num_parameters()


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


def estimate(cfg: Config, world: int = 1, *, micro_batch: int | None = None, sharding: str = "none",
             recompute: str | None = None, dtype: str = "bfloat16", fused: bool = True) -> Estimate:
    """Per-rank peak memory in bytes for training ``cfg`` as described in the module docstring."""
    m = cfg.model
    B = micro_batch or cfg.train.micro_batch
    T = cfg.train.seq_len
    rc = recompute or m.recompute
    N, C, L, V, Vp = count_params(cfg), m.n_embd, m.n_layer, m.vocab_size, m.padded_vocab_size
    shard = world if sharding == "fsdp" else 1
    pbytes = 2 if dtype == "bfloat16" else 4
    weights = 4 * N / shard
    if sharding == "fsdp" and world > 1:  # gathered copies: root (embeddings, ln_f) and two blocks
        weights += pbytes * (Vp * C + m.block_size * C + 2 * (12 * C * C + 13 * C))
    grads = 4 * N / shard
    optim = 8 * N / (world if sharding in ("zero1", "fsdp") else 1)
    temps = 0 if fused else 4 * N / (world if sharding in ("zero1", "fsdp") else 1)
    tokens = B * T
    per_layer = layer_act_bytes(m, dtype, rc) * tokens
    acts = L * per_layer
    if rc == "block":  # one block's full activations exist again while it is recomputed
        acts += layer_act_bytes(m, dtype, "none") * tokens
    if not m.flash:
        acts += (L if rc != "block" else 1) * B * m.n_head * T * T * (4 if dtype == "float32" else 6)
    if m.dropout > 0:
        acts += L * 3 * C * tokens  # boolean dropout masks
    acts += tokens * C * (8 if dtype == "float32" else 6)  # ln_f input and output
    if getattr(m, "logit_softcap", 0):  # tanh keeps its float32 output, and needs as much for the gradient
        acts += tokens * 4 * V * 2
    if dtype == "float32":
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


def propose(cfg: Config, gpu_mem_gib: float, world: int, reserve_gib: float = 2.0,
            dtype: str = "bfloat16", fused: bool = True) -> tuple[list[Estimate], Estimate | None]:
    """For each (sharding, recompute), the largest micro-batch that fits ``gpu_mem_gib`` less a reserve
    (CUDA context, allocator fragmentation); and the recommendation: the cheapest combination (see
    PREFERENCE) reaching the largest micro-batch any combination reaches, capped at 16."""
    budget = (gpu_mem_gib - reserve_gib) * GIB
    batches = _micro_batches(cfg, world)
    if not batches:
        raise ConfigError(
            f"train.total_batch_tokens={cfg.train.total_batch_tokens} is smaller than one sequence per rank "
            f"(seq_len {cfg.train.seq_len} x world {world}); raise it or lower the world size"
        )
    rows: list[Estimate] = []
    for sharding, rc in PREFERENCE:
        if sharding != "none" and world == 1:
            continue
        fit = next((e for b in batches
                    if (e := estimate(cfg, world, micro_batch=b, sharding=sharding, recompute=rc, dtype=dtype,
                                      fused=fused)).peak <= budget), None)
        rows.append(fit or estimate(cfg, world, micro_batch=batches[-1], sharding=sharding, recompute=rc,
                                    dtype=dtype, fused=fused))
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


# --- measurement ------------------------------------------------------------------------------------

class LiveTensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Tracks bytes of live CPU tensor storage and its peak: every op's outputs are seen once, and a
    weakref finalizer subtracts a storage when autograd or Python frees it."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.weak import WeakIdKeyDictionary

        self.live = 0
        self.peak = 0
        self._seen = WeakIdKeyDictionary()

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                if st not in self._seen:
                    n = st.nbytes()
                    self._seen[st] = n
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, n)
        return out


def measure_peak(cfg: Config, steps: int = 2) -> tuple[float, str]:
    """Run ``steps`` training steps of ``cfg`` on one process (model and optimizer built inside the
    measurement) on random tokens; return (peak bytes, what was measured)."""
    from gptforge.optim import build_optimizer
    from gptforge.parallel.distributed import DistInfo
    from gptforge.runtime import resolve_device, set_precision
    from gptforge.training.step import train_step

    device = resolve_device(cfg.train.device)
    cfg = copy.deepcopy(cfg)
    cfg.train.compile = False
    accum = cfg.validate()
    autocast, _, _ = set_precision(cfg, device)
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    gen = torch.Generator().manual_seed(0)

    class _Random:
        def next_batch(self):
            buf = torch.randint(0, cfg.model.vocab_size, (B, T + 1), generator=gen)
            return buf[:, :-1], buf[:, 1:]

    def run() -> None:
        model = build_model(cfg.model).to(device)
        opt = build_optimizer(model, cfg.optim, device.type)
        model.train()
        for _ in range(steps):
            train_step(model, model, opt, _Random(), accum, autocast, DistInfo(device=device), cfg.optim.grad_clip)

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        return torch.cuda.max_memory_allocated(device) - base, "cuda_max_memory_allocated"
    tracker = LiveTensorBytes()
    with tracker:
        run()
    return tracker.peak, "cpu_live_tensor_peak"


def resolved_dtype(cfg: Config, for_gpu: bool) -> str:
    if cfg.train.dtype == "auto":
        return "bfloat16" if for_gpu else "float32"
    return cfg.train.dtype


def fmt_gib(b: float) -> str:
    return f"{b / GIB:.2f} GiB" if b >= GIB / 10 else f"{b / 2**20:.1f} MiB"


def run_plan(cfg: Config, preset: str, *, gpu_mem: float = 80.0, world: int = 8, measure: bool = False,
             steps: int = 2, json_out: str | None = None) -> int:
    """``gptforge plan``: print the estimate table and the recommendation (or, with ``measure``, the
    estimate against a measured peak for the config as given); exit status 1 when nothing fits."""
    import json
    from pathlib import Path

    head = f"{'shard':<6} {'recomp':<6} {'B':>4} {'weights':>8} {'grads':>8} {'optim':>8} {'activ':>8} {'peak':>8}"
    report: dict = {"preset": preset, "params": count_params(cfg)}
    if measure:  # the config as given, on this machine, one process
        from gptforge.runtime import resolve_device

        device = resolve_device(cfg.train.device)
        dtype = resolved_dtype(cfg, device.type == "cuda")
        est = estimate(cfg, 1, dtype=dtype, fused=True)
        peak, kind = measure_peak(cfg, steps=steps)
        unit = "GiB" if est.peak >= GIB else "MiB"
        print(f"{preset}: {report['params'] / 1e6:.2f}M params, B {cfg.train.micro_batch} T {cfg.train.seq_len}, "
              f"{dtype}, recompute {cfg.model.recompute}, device {device}\n{head}  ({unit})\n{est.row(unit)}")
        print(f"measured peak ({kind}): {fmt_gib(peak)}; estimate {fmt_gib(est.peak)} "
              f"({est.peak / peak:.2f}x measured)")
        report.update(device=str(device), dtype=dtype, estimate=vars(est), measured_peak=peak, measured_kind=kind,
                      ratio=est.peak / peak, config=cfg.to_dict())
    else:
        rows, best = propose(cfg, gpu_mem, world)
        print(f"{preset}: {report['params'] / 1e6:.0f}M params, T {cfg.train.seq_len}, "
              f"{cfg.train.total_batch_tokens:,} tokens/step, world {world}, {gpu_mem:g} GiB per GPU "
              f"(bf16, {2:g} GiB reserved)\n{head}  (GiB per rank)")
        for r in rows:
            print(r.row() + ("  <- fits" if r.peak <= (gpu_mem - 2) * GIB else "  (does not fit)"))
        report.update(world=world, gpu_mem_gib=gpu_mem, rows=[vars(r) for r in rows],
                      recommended=vars(best) if best else None)
        if best is None:
            print("nothing fits: use more GPUs (FSDP shards weights, gradients and optimizer state by world "
                  "size), a shorter --train.seq_len, or a GPU with more memory")
        else:
            print("recommended: " + " ".join(plan_overrides(cfg, best, world)))
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if measure or best is not None else 1
