"""What ``gptforge plan`` prints: the data-parallel memory table (or estimate against a measured peak),
and with ``--gpu`` the parallel layout, memory per GPU, step time, MFU and days to a token budget.

    gptforge plan --preset gpt2-1.5b --gpu-mem 80 --world 8
    gptforge plan --preset gpt3-175b --gpus 1024 --gpu h100-80
"""

from __future__ import annotations

from gptforge.config import Config
from gptforge.plan.cluster import get_cluster
from gptforge.plan.cost import days
from gptforge.plan.cost import head_path as layout_head
from gptforge.plan.memory import (
    GIB,
    GPU_TARGET,
    asked_row,
    count_params,
    estimate,
    head_path,
    head_words,
    plan_overrides,
    propose,
)
from gptforge.plan.search import search


def resolved_dtype(cfg: Config, for_gpu: bool) -> str:
    if cfg.train.dtype == "auto":
        return "bfloat16" if for_gpu else "float32"
    return cfg.train.dtype


def fmt_gib(b: float) -> str:
    return f"{b / GIB:.2f} GiB" if b >= GIB / 10 else f"{b / 2**20:.1f} MiB"


def run_plan(cfg: Config, preset: str, *, gpu_mem: float = 80.0, world: int = 8, measure: bool = False,
             steps: int = 2, json_out: str | None = None, reserve: float = 2.0) -> int:
    """``gptforge plan``: print the estimate table and the recommendation (or, with ``measure``, the
    estimate against a measured peak for the config as given); exit status 1 when nothing fits."""
    columns = f"{'shard':<6} {'recomp':<6} {'B':>4} {'weights':>8} {'grads':>8} {'optim':>8} {'activ':>8} {'peak':>8}"
    report: dict = {"preset": preset, "params": count_params(cfg)}
    if measure:  # the config as given, on this machine, one process
        from gptforge.runtime import resolve_device

        device = resolve_device(cfg.train.device)
        dtype = resolved_dtype(cfg, device.type == "cuda")
        head = head_path(cfg, device)  # this machine, as the measured steps decide it
        est = estimate(cfg, 1, dtype=dtype, fused=True, fused_ce=head[0])
        from gptforge.plan.measure import measure_peak  # imports the training step

        peak, kind = measure_peak(cfg, steps=steps)
        unit = "GiB" if est.peak >= GIB else "MiB"
        print(f"{preset}: {report['params'] / 1e6:.2f}M params, B {cfg.train.micro_batch} T {cfg.train.seq_len}, "
              f"{dtype}, recompute {cfg.model.recompute}, device {device}, {head_words(*head)}\n"
              f"{columns}  ({unit})\n{est.row(unit)}")
        print(f"measured peak ({kind}): {fmt_gib(peak)}; estimate {fmt_gib(est.peak)} "
              f"({est.peak / peak:.2f}x measured)")
        report.update(device=str(device), dtype=dtype, estimate=vars(est), measured_peak=peak, measured_kind=kind,
                      ratio=est.peak / peak, config=cfg.to_dict(), fused_ce={"on": head[0], "why": head[1]})
    else:
        head = head_path(cfg, *GPU_TARGET)  # the GPU the table plans for, not this machine
        rows, best = propose(cfg, gpu_mem, world, reserve_gib=reserve)
        print(f"{preset}: {report['params'] / 1e6:.0f}M params, T {cfg.train.seq_len}, "
              f"{cfg.train.total_batch_tokens:,} tokens/step, world {world}, {gpu_mem:g} GiB per GPU "
              f"(bf16, {reserve:g} GiB reserved)" + _lora_note(cfg) + f"\n{head_words(*head)}\n"
              f"{columns}  (GiB per rank)")
        asked = asked_row(cfg, world)
        for r in rows:
            mine = ", as configured" if (r.sharding, r.recompute) == asked else ""
            print(r.row() + (f"  <- fits{mine}" if r.peak <= (gpu_mem - reserve) * GIB else f"  (does not fit{mine})"))
        report.update(world=world, gpu_mem_gib=gpu_mem, rows=[vars(r) for r in rows],
                      recommended=vars(best) if best else None, fused_ce={"on": head[0], "why": head[1]})
        if best is None:
            recompute = ("recomputed activations (--model.recompute mlp or block: plan shows its row), "
                         if world == 1 and cfg.model.recompute == "none" else "")
            print("nothing fits: use more GPUs (FSDP shards weights, gradients and optimizer state by world "
                  f"size), {recompute}a shorter --train.seq_len, or a GPU with more memory")
        else:
            print("recommended: " + " ".join(plan_overrides(cfg, best, world)))
    if json_out:
        from gptforge import storage

        storage.write_json(json_out, report)  # temporary name, fsync, rename
    return 0 if measure or best is not None else 1


def layout_overrides(lay) -> list[str]:
    """The ``--section.key`` overrides that train with ``lay`` (the ``dist.tp``/``pp``/``pp_schedule``/
    ``pp_virtual``/``dp_replicate`` keys of issue 23's model parallelism)."""
    out = [f"--train.micro_batch {lay.micro_batch}", f"--model.recompute {lay.recompute}", f"--dist.shard {lay.shard}"]
    if lay.tp > 1:
        out.append(f"--dist.tp {lay.tp}")
    if lay.pp > 1:
        out.append(f"--dist.pp {lay.pp}")
        out += ([f"--dist.pp_schedule interleaved1f1b --dist.pp_virtual {lay.interleave}"] if lay.interleave > 1
                else ["--dist.pp_schedule 1f1b"])
    if lay.shard == "fsdp" and lay.shard_group < lay.dp:
        out.append(f"--dist.dp_replicate {lay.dp // lay.shard_group}")
    return out


def run_parallel(cfg: Config, preset: str, *, gpus: int, gpu: str, gpu_mem: float | None = None,
                 gpus_per_node: int | None = None, tokens: float = 300e9, reserve: float = 2.0,
                 json_out: str | None = None) -> int:
    """``gptforge plan --gpu NAME``: choose (DP, TP, PP, micro-batch, recompute, shard) for ``gpus`` GPUs
    of that kind and print it with memory per GPU, step time, MFU and days to ``tokens``; the runners-up
    below. Exit status 1 when no layout fits."""
    cluster = get_cluster(gpu, mem_gib=gpu_mem, gpus_per_node=gpus_per_node)
    T = cfg.train.seq_len
    batch = cfg.train.total_batch_tokens // T
    if batch < 1 or cfg.train.total_batch_tokens % T:
        from gptforge.config import ConfigError

        raise ConfigError(f"train.total_batch_tokens={cfg.train.total_batch_tokens} must be a multiple of "
                          f"train.seq_len={T}")
    n = count_params(cfg)
    best, tried = search(cfg.model, gpus, cluster, batch, T, reserve_gib=reserve)
    if tried == 0:
        from gptforge.config import ConfigError

        raise ConfigError(f"no layout of {gpus} GPUs runs this model: the data-parallel degree must divide the global "
                          f"batch ({batch} sequences = train.total_batch_tokens / train.seq_len), TP the heads "
                          f"({cfg.model.n_head}) and PP the layers ({cfg.model.n_layer}); choose another --gpus or "
                          "--train.total_batch_tokens")
    print(f"{preset}: {n / 1e9:.2f}B params ({cfg.model.arch}), T {T}, global batch {batch} sequences "
          f"({batch * T:,} tokens), {gpus} x {gpu} ({cluster.gpus_per_node} per node, {cluster.mem_gib:g} GiB, "
          f"{cluster.peak_flops / 1e12:g} TFLOP/s bf16); {tried} layouts costed")
    report: dict = {"preset": preset, "params": n, "gpus": gpus, "cluster": cluster.as_dict(), "global_batch": batch,
                    "seq_len": T, "tokens": tokens, "layouts_costed": tried,
                    "best": [dict(c.as_dict(), days=days(c, tokens, batch, T), overrides=layout_overrides(c.layout),
                                  fused_ce=dict(zip(("on", "why"), layout_head(cfg.model, c.layout), strict=True)))
                             for c in best]}
    if not best:
        print(f"nothing fits in {cluster.mem_gib - reserve:g} GiB per GPU: use more GPUs, a smaller global batch "
              "or a GPU with more memory")
    else:
        c = best[0]
        m = c.mem
        print(f"layout: {c.layout.describe()}; {head_words(*layout_head(cfg.model, c.layout))}")
        print(f"memory per GPU (stage {m['stage']}): {m['total'] / GIB:.1f} GiB = weights {m['weights'] / GIB:.1f} "
              f"+ grads {m['grads'] / GIB:.1f} + optimizer {m['optimizer'] / GIB:.1f} + activations "
              f"{m['activations'] / GIB:.1f}")
        print(f"step {c.step_s:.2f} s (bubble {c.bubble_frac:.1%}, data-parallel exposed {c.dp_comm_s:.2f} s), "
              f"{c.tflops / 1e12:.0f} TFLOP/s per GPU (counting recomputed FLOPs, as Megatron-LM does), MFU {c.mfu:.1%}")
        print(f"days to {tokens / 1e9:g}B tokens: {days(c, tokens, batch, T):.1f}")
        print("run with: " + " ".join(layout_overrides(c.layout)))
        if batch % gpus and c.layout.dp < gpus:
            print(data_parallel_note(gpus, batch, T))
        if len(best) > 1:
            print("runners-up:")
            for r in best[1:]:
                print(f"  {r.step_s:7.2f} s  {r.mem['total'] / GIB:5.1f} GiB  {r.layout.describe()}")
    if json_out:
        from gptforge import storage

        storage.write_json(json_out, report)  # temporary name, fsync, rename
    return 0 if best else 1


def data_parallel_note(gpus: int, batch: int, seq_len: int) -> str:
    """Why the search split the model rather than the batch: every GPU a data-parallel rank needs the global
    batch (sequences) to divide by the GPU count; the nearest batches that do, as the override to give."""
    lower, upper = batch - batch % gpus, batch - batch % gpus + gpus
    sizes = " or ".join(f"--train.total_batch_tokens {n * seq_len}" for n in (lower, upper) if n > 0)
    return (f"note: data parallelism over all {gpus} GPUs is not possible: the global batch of {batch} sequences "
            f"does not divide by {gpus}, so the model is split instead; {sizes} would allow it")


def _lora_note(cfg) -> str:
    """", LoRA rank r on ...: N adapter parameters train" when ``--lora.rank`` is set (the base is frozen)."""
    if not cfg.lora.rank:
        return ""
    from gptforge.models.lora import adapter_params, resolve_targets

    n = adapter_params(cfg.model, cfg.lora.rank, cfg.lora.target_names())
    targets = ",".join(resolve_targets(cfg.model.arch, cfg.lora.target_names()))
    return f", LoRA rank {cfg.lora.rank} on {targets}: {n / 1e6:.2f}M adapter parameters train, the base is frozen"
