"""Commands that take a run config (a preset plus ``--section.key VALUE`` overrides): train, bench, plan, race."""

from __future__ import annotations

import argparse
import sys

from gptforge.cli.common import CliError, finish, finite, init_from, refuse_flag_and_key, resolve_run, trusted


def build_config(args: argparse.Namespace, overrides: list[str]):
    """The preset with ``--out`` and the overrides applied."""
    from gptforge.config import apply_overrides
    from gptforge.presets import get_preset

    cfg = get_preset(args.preset)
    out = getattr(args, "out", None)  # plan has none: it writes no run directory
    refuse_flag_and_key("--out", out, "train.out_dir", overrides)  # appended last below: it would win silently
    if out is not None:  # --out '' is refused by train.out_dir's check, not replaced by the preset's
        overrides = [*overrides, f"--train.out_dir={out}"]
    apply_overrides(cfg, overrides)
    return cfg, overrides


# --- train ----------------------------------------------------------------------------------------

def args_train(p: argparse.ArgumentParser) -> None:
    p.description = ("Train from a preset. Any config key can be overridden as --section.key VALUE "
                     "(list them with --help-config), e.g. --optim.lr 3e-4 --train.max_steps 100.")
    p.add_argument("--preset", default="shakespeare-cpu", help="named run (see `gptforge presets`); default %(default)s")
    p.add_argument("--out", help="run directory (same as --train.out_dir; default the preset's, e.g. runs/shakespeare-cpu)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue from the newest checkpoint in the run directory, or from CKPT")
    p.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow --resume from a sharded (FSDP, dcp/) checkpoint: its metadata is a pickle that can "
                        "run code, so only for checkpoints you trust (same as --train.trust_checkpoint true)")
    p.add_argument("--init-from", metavar="MODEL",
                   help="fine-tune: start from these weights (gptforge checkpoint/run dir, Hugging Face "
                        "save_pretrained dir, GGUF file or llm.c model file)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    add_preset_help_config(p)


def add_preset_help_config(p: argparse.ArgumentParser) -> None:
    """``--help-config`` of every command that takes a preset and ``--section.key`` overrides (train, bench,
    plan, race): without it the flag parsed as an override key with no value ("--help-config needs a value")."""
    p.add_argument("--help-config", action="store_true",
                   help="list every config key with its type and its value in this preset (with overrides), and exit")


def help_config(args: argparse.Namespace, overrides: list[str], preset: str) -> int:
    """Print what ``--help-config`` promises: every key with its value in ``preset`` with the overrides."""
    from gptforge.config_help import describe_keys

    cfg, _ = build_config(argparse.Namespace(**{**vars(args), "preset": preset}), overrides)
    print(f"Config keys (set with --section.key VALUE), values of preset {preset!r}:\n" + describe_keys(cfg))
    return 0


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.runtime import launched_world
    from gptforge.training.evaluate import check_tasks

    if args.help_config:
        return help_config(args, overrides, args.preset)
    cfg, resume, meta = resolve_run(args.out, args.resume, overrides, "pretrain",
                                    lambda: build_config(args, overrides)[0], trusted(args, overrides),
                                    default_out=_default_out(args.preset, overrides))
    init_weights = None
    if args.init_from is not None:
        if resume is not None:
            raise CliError("--init-from starts a new run from other weights; it cannot be combined with --resume")
        init_weights = init_from(args.init_from, cfg)
    if resume is None:  # the model speaks its shards' tokenizer (resumes are checked in the loop)
        _fit_data_tokenizer(cfg, args.init_from)
    # fail on a mesh or a batch that cannot divide before touching data or devices
    from gptforge.parallel.mesh import check_layout

    check_layout(cfg, launched_world())
    check_tasks(cfg)
    if args.dry_run:
        print(cfg.to_json())
        return 0
    from gptforge.training.loop import train

    return finish(train(cfg, resume=resume, force=args.force, init_weights=init_weights), "train", cfg)


def _fit_data_tokenizer(cfg, init_from: str | None) -> None:
    """A fresh run's model takes the vocabulary of the tokenizer its shards were made with; weights
    from ``--init-from`` must speak that same tokenizer."""
    from gptforge.data.tokenizer import TokenizerError, shard_tokenizer
    from gptforge.training.pretrain import fit_vocab

    try:
        tok = shard_tokenizer(cfg.data.dir)
        if init_from is not None:
            from gptforge.load import ModelSource, load_tokenizer_of

            theirs = load_tokenizer_of(ModelSource.from_path(init_from))
            if theirs.fingerprint != tok.fingerprint:
                raise CliError(f"--init-from {init_from} speaks the {theirs.describe()}, but the shards in "
                               f"{cfg.data.dir} were made with the {tok.describe()}: prepare the data with the "
                               f"model's tokenizer (gptforge prepare ... --tokenizer {init_from})")
        fit_vocab(cfg, tok, log=lambda _: None)
    except TokenizerError as e:
        raise CliError(str(e)) from None


def _default_out(preset: str, overrides: list[str]) -> str:
    """Where a run of ``preset`` lives unless --out says otherwise (--train.out_dir, or the preset's)."""
    from gptforge.presets import get_preset

    for i, a in enumerate(overrides):
        if a == "--train.out_dir" and i + 1 < len(overrides):
            return overrides[i + 1]
        if a.startswith("--train.out_dir="):
            return a.split("=", 1)[1]
    return get_preset(preset).train.out_dir


# --- bench ----------------------------------------------------------------------------------------

def args_bench(p: argparse.ArgumentParser) -> None:
    p.description = ("Warm up, then time training steps (synchronized) and write JSON. "
                     "Accepts the same --section.key overrides as train.")
    p.add_argument("--preset", default="tiny", help="named run to time (`gptforge presets` lists them)")
    p.add_argument("--out", help="run directory of the timed steps (same as --train.out_dir)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default %(default)s)")
    p.add_argument("--json", help="write results to this JSON file")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    p.add_argument("--ladder", action="store_true",
                   help="run the speed ladder fp32 -> tf32 -> bf16 -> compile -> flash -> pad vocab -> fused AdamW")
    p.add_argument("--sweep-micro-batch", metavar="B1,B2,...", help="time the preset at each micro-batch size")
    p.add_argument("--trace", help="write a torch.profiler Chrome trace of the timed steps (of the last config "
                   "timed) to this file (.gz: compressed), and print where those steps went by kernel family "
                   "(GPU kernel time, or CPU self time) with each family's heaviest names")
    p.add_argument("--switch", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="also time the config with this change (repeatable), e.g. model.fused_ce=true")
    add_preset_help_config(p)


def cmd_bench(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.bench.train import run_bench
    from gptforge.config_inert import refuse_inert_overrides

    if args.help_config:
        return help_config(args, overrides, args.preset)
    cfg, _ = build_config(args, overrides)
    refuse_inert_overrides(cfg, overrides, "bench", "bench")  # it times pretraining steps, never LoRA
    try:
        from gptforge.numbers import parse_int

        sweep = [parse_int(b) for b in args.sweep_micro_batch.split(",")] if args.sweep_micro_batch else None
    except ValueError as e:
        raise CliError(f"--sweep-micro-batch {args.sweep_micro_batch!r}: expected integers like 8,16,32 ({e})") from None
    if sweep and min(sweep) < 1:  # each is a train.micro_batch: sequences per forward, at least one
        raise CliError(f"--sweep-micro-batch {args.sweep_micro_batch!r}: {min(sweep)} is not a micro-batch size; "
                       "give sizes >= 1 like 8,16,32")
    if args.steps < 1 or args.warmup < 0:
        raise CliError("--steps must be >= 1 and --warmup >= 0")
    run_bench(cfg, steps=args.steps, warmup=args.warmup, out=args.json, ladder=args.ladder, trace=args.trace,
              sweep_micro_batch=sweep, switches=args.switch)
    return 0


# --- plan -----------------------------------------------------------------------------------------

def args_plan(p: argparse.ArgumentParser) -> None:
    p.description = ("Estimate weights, gradients, optimizer state and activations per rank for a preset, and "
                     "propose micro-batch, recomputation and sharding that fit a GPU memory size at a world size. "
                     "With --gpu, choose a parallel layout (data, tensor, pipeline, micro-batch, recompute, shard) "
                     "for --gpus GPUs of that kind and predict memory per GPU, step time, MFU and days to --tokens. "
                     "--measure compares the estimate with a measured peak for the preset as configured. "
                     "Accepts --section.key overrides.")
    p.add_argument("--preset", default="gpt2-124m", help="named run to plan (`gptforge presets` lists them)")
    p.add_argument("--gpu-mem", type=finite, default=None, help="GiB per GPU (default 80, or the --gpu preset's)")
    p.add_argument("--world", "--gpus", dest="world", type=int, default=8, help="number of GPUs (default %(default)s)")
    p.add_argument("--gpu", help="plan a parallel layout for this GPU: a100-40, a100-80, h100-80, h200")
    p.add_argument("--gpus-per-node", type=int, default=None, help="with --gpu: GPUs per node (default 8)")
    p.add_argument("--tokens", type=float, default=300e9, help="with --gpu: training tokens for the days estimate "
                   "(default %(default).0f)")
    p.add_argument("--reserve", type=float, default=2.0, help="GiB per GPU kept free (default %(default)s)")
    p.add_argument("--measure", action="store_true", help="run a few steps here and compare with the estimate")
    p.add_argument("--steps", type=int, default=2, help="steps for --measure (default %(default)s)")
    p.add_argument("--json", help="write the plan to this JSON file")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    add_preset_help_config(p)


def cmd_plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge import plan
    from gptforge.config_inert import refuse_inert_overrides

    if args.help_config:
        return help_config(args, overrides, args.preset)
    cfg, _ = build_config(args, overrides)
    refuse_inert_overrides(cfg, overrides, "plan", "plan")
    if args.world < 1 or (args.gpu_mem is not None and args.gpu_mem <= 0) or args.steps < 1:
        raise CliError("--world/--gpus and --steps must be >= 1 and --gpu-mem > 0 (GiB)")
    if args.gpus_per_node is not None and args.gpus_per_node < 1 or args.tokens <= 0 or args.reserve < 0:
        raise CliError("--gpus-per-node must be >= 1, --tokens > 0 and --reserve >= 0")
    if cfg.train.seq_len > cfg.model.block_size:
        raise CliError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
    if args.gpu is not None:
        if args.gpu not in plan.CLUSTERS:
            raise CliError(f"--gpu {args.gpu!r} is not a known GPU; known: {', '.join(plan.CLUSTERS)}")
        if args.measure:
            raise CliError("--measure runs the preset here; it does not combine with --gpu")
    mem = args.gpu_mem or (plan.CLUSTERS[args.gpu].mem_gib if args.gpu is not None else 80.0)
    if args.reserve >= mem:  # nothing left to plan in: not "use more GPUs", which no count of them changes
        given = "--gpu-mem" if args.gpu_mem else f"--gpu {args.gpu}'s" if args.gpu else "the default --gpu-mem"
        raise CliError(f"--reserve {args.reserve:g} GiB leaves nothing of the {mem:g} GiB per GPU ({given}) to plan "
                       "in; give a --reserve below it")
    if args.gpu is not None:
        return plan.run_parallel(cfg, args.preset, gpus=args.world, gpu=args.gpu, gpu_mem=args.gpu_mem,
                                 gpus_per_node=args.gpus_per_node, tokens=args.tokens, reserve=args.reserve,
                                 json_out=args.json)
    return plan.run_plan(cfg, args.preset, gpu_mem=args.gpu_mem or 80.0, world=args.world, measure=args.measure,
                         steps=args.steps, json_out=args.json, reserve=args.reserve)


# --- race -----------------------------------------------------------------------------------------

def args_race(p: argparse.ArgumentParser) -> None:
    p.description = ("Train each preset on the same data until the target val loss (default: the first preset's "
                     "final val loss); --section.key overrides apply to every preset, PRESET,key=value,... to one.")
    p.add_argument("presets", nargs="*", metavar="PRESET", help="named runs to race (`gptforge presets` lists them); "
                   "PRESET,key=value,... overrides one")
    p.add_argument("--target", type=float, help="val loss to reach (default: the first preset's final val loss)")
    p.add_argument("--evals", type=int, default=20, help="validations per run (default %(default)s)")
    p.add_argument("--out", default="runs/race", help="folder for the runs, race.json and race.png")
    p.add_argument("--no-plot", action="store_true", help="skip race.png (no matplotlib needed)")
    add_preset_help_config(p)


def cmd_race(args: argparse.Namespace, overrides: list[str]) -> int:
    import math
    from pathlib import Path

    from gptforge.bench.race import format_race, run_race

    if args.help_config:  # the keys every preset shares, with the first one's values (PRESET,key=value applied)
        if not args.presets:
            raise CliError("--help-config lists a preset's values: name it first (gptforge race PRESET --help-config)")
        name, *own = args.presets[0].split(",")
        return help_config(args, [*overrides, *(f"--{kv}" for kv in own)], name)
    if args.target is not None and not (math.isfinite(args.target) and args.target > 0):
        raise CliError(f"--target {args.target}: expected a finite val loss > 0")
    if not args.out.strip() or args.evals < 1:
        raise CliError("--out must name a folder and --evals be >= 1")
    try:
        summary = run_race(args.presets, overrides, out_dir=args.out, target=args.target, evals=args.evals,
                           plot=not args.no_plot)
    except KeyboardInterrupt as e:
        print(f"gptforge race: {e}", file=sys.stderr)
        return 130
    print(format_race(summary))
    print(f"race.json -> {Path(args.out) / 'race.json'}" + (f", plot -> {summary['plot']}" if "plot" in summary else ""))
    return 0
