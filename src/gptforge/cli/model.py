"""Commands that use a model (``--ckpt``/``--hf``/``--llmc``/``--random`` everywhere): sample, serve,
bench-generate. Moving a model between formats (export, import) is cli/interop.py."""

from __future__ import annotations

import argparse
import sys

from gptforge.cli.common import (
    DEVICE_HELP,
    CliError,
    add_model_source,
    command_device,
    load,
    model_source,
    port,
    text_encoder,
    words,
)

# --- sample ---------------------------------------------------------------------------------------

SAMPLE_NEW_TOKENS = 32  # sample's default --max-new-tokens (clamped to a small model's context)
MAX_SAMPLE_ROWS = 1024  # --num-samples x prompts: one batch, so this bounds the KV cache and the logits


def args_sample(p: argparse.ArgumentParser) -> None:
    add_model_source(p)
    p.add_argument("--prompt", action="append", help="prompt (repeat for a batch of prompts); default "
                                                     "\"Hello, I'm a language model,\"")
    p.add_argument("--num-samples", type=int, default=None,
                   help="samples per prompt (default 5; 1 under --temperature 0, where every sample is the same; "
                        "one sample streams live)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens to generate (default {SAMPLE_NEW_TOKENS}, fewer where the context is shorter)")
    p.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
    p.add_argument("--stop", action="append", help="stop sequence (repeatable); not included in the output")
    p.add_argument("--stop-at-eot", action="store_true", help="end a sample at the tokenizer's end-of-text token "
                                                              "(GPT-2's <|endoftext|>)")
    p.add_argument("--seed", type=int, default=42, help="sampling seed: the same samples again")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def cmd_sample(args: argparse.Namespace) -> int:
    from gptforge.generation import stream_text

    source = model_source(args)
    if args.num_samples is None:
        args.num_samples = 1 if args.temperature == 0 else 5
    elif args.temperature == 0 and args.num_samples > 1:  # greedy decoding gives one text per prompt
        print(f"gptforge sample: --temperature 0 is greedy, so the {args.num_samples} samples per prompt would "
              "be identical: printing one", file=sys.stderr)
        args.num_samples = 1
    rows = args.num_samples * len(args.prompt or [None])
    if not 1 <= args.num_samples or rows > MAX_SAMPLE_ROWS:  # every sample is a row of one batch (KV cache)
        raise CliError(f"--num-samples {args.num_samples} x {len(args.prompt or [None])} prompt(s): give 1 to "
                       f"{MAX_SAMPLE_ROWS} rows in all (each is a row of one batch); run the command again for more")
    params = _sampling_params(args)
    model = load(source).to(command_device(args.device))
    tok, chat = words(source, model)
    enc = text_encoder(tok, chat)  # a chat model may emit its role/end ids
    params.stop_token = tok.eos_token_id if args.stop_at_eot else None
    prompts = [p for p in (args.prompt or ["Hello, I'm a language model,"]) for _ in range(args.num_samples)]
    ids = [enc.encode(p, allowed_special={"<|endoftext|>"}) or [enc.eot_token] for p in prompts]
    params.max_new_tokens = _fit(ids, model.config, args.max_new_tokens, SAMPLE_NEW_TOKENS)
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


def _fit(ids, model_cfg, requested: int | None, default: int) -> int:
    """generation.fit_new_tokens with its refusal as a CliError naming the flag."""
    from gptforge.generation import PromptError, fit_new_tokens

    try:
        return fit_new_tokens(ids, model_cfg, requested, default, flag="--max-new-tokens")
    except PromptError as e:
        raise CliError(str(e)) from None


def _sampling_params(args: argparse.Namespace):
    from gptforge.generation import SamplingParams
    from gptforge.tokens import EOT

    n = args.max_new_tokens
    p = SamplingParams(max_new_tokens=SAMPLE_NEW_TOKENS if n is None else n, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                       stop=tuple(args.stop or ()), stop_token=EOT if args.stop_at_eot else None)
    try:
        p.check()
    except ValueError as e:
        raise CliError(f"--{str(e).replace('_', '-')}") from e
    return p


# --- serve ----------------------------------------------------------------------------------------

def args_serve(p: argparse.ArgumentParser) -> None:
    p.description = ("Serve a page where you type a prompt, set the sampling knobs and watch tokens stream in, "
                     "plus the run's loss curve. JSON API under /api (see /docs).")
    add_model_source(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s: this machine only; "
                                                       "another address needs --api-key)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /api and /v1 (OpenAI clients: api_key=KEY); "
                        "default: $GPTFORGE_API_KEY, else none")
    p.add_argument("--port", type=port, default=8000, help="TCP port, 1-65535 (default %(default)s); a port in use "
                                                          "is refused before the model loads, exit 4; 0: any free "
                                                          "port, the URL printed names it")
    p.add_argument("--metrics", help="metrics.jsonl for the loss curve (default: the checkpoint's run directory)")
    p.add_argument("--max-new-tokens-cap", type=int, default=512, help="largest max_new_tokens a request may ask")
    p.add_argument("--max-batch", type=int, default=8, help="most prompts in one request")
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting for the model before 429")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def cmd_serve(args: argparse.Namespace) -> int:
    from gptforge.extras import require

    for module in ("fastapi", "uvicorn"):  # before anything is loaded: one line naming the extra
        require(module, extra="serve", for_what="gptforge serve")
    from gptforge.serve.app import ServeSettings, run_server

    source = model_source(args)
    settings = ServeSettings(max_new_tokens_cap=args.max_new_tokens_cap, max_batch=args.max_batch,
                             max_queue=args.max_queue)
    try:
        settings.check()
    except ValueError as e:
        raise CliError(str(e)) from e
    import os

    api_key = args.api_key if args.api_key is not None else os.environ.get("GPTFORGE_API_KEY") or None
    if args.api_key == "":
        raise CliError("--api-key: the key must not be empty")
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        raise CliError(f"--host {args.host} would expose the model beyond this machine without a key: pass "
                       "--api-key KEY (or set GPTFORGE_API_KEY), or keep the default 127.0.0.1")
    metrics = args.metrics
    if metrics is None and args.ckpt is not None:  # the run's metrics.jsonl sits in the run directory
        from gptforge.run.identity import resolve_checkpoint

        where = resolve_checkpoint(args.ckpt)
        found = [p / "metrics.jsonl" for p in (where, *where.parents[:3]) if (p / "metrics.jsonl").exists()]
        metrics = str(found[0]) if found else None
    from gptforge.cli.common import EXIT_PORT_BUSY
    from gptforge.serve.app import PortBusy, bind_port
    from gptforge.serve.describe import describe_served

    try:
        sock = bind_port(args.host, args.port)  # before the model loads and the URL is printed
    except PortBusy as e:
        print(f"gptforge serve: {e}", file=sys.stderr)
        return EXIT_PORT_BUSY
    try:
        # what it loads, said before it loads (a GGUF file takes tens of seconds); the URL follows when it serves
        model = load(source, announce_after=0).to(command_device(args.device))
        tok, chat = words(source, model)  # a chat checkpoint: the page opens in chat mode
    except BaseException:
        sock.close()
        raise
    run_server(model, settings, host=args.host, port=args.port, metrics_path=metrics,
               served=describe_served(model, args.ckpt, args.hf, args.llmc, args.random, args.gguf),
               chat_template=chat.to_dict() if chat else None, api_key=api_key, enc=tok, sock=sock)
    return 0


# --- bench-generate -------------------------------------------------------------------------------

def args_bench_generate(p: argparse.ArgumentParser) -> None:
    p.description = "Same random GPT-2 weights in both, same prompt, greedy; warm-up, repeats, JSON."
    p.add_argument("--size", default="gpt2", help="model size name (gpt2, d4, llama-tiny, ...; default %(default)s)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes to time, each in turn")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per timed run")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats after the warm-up (the median is reported)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default 0: OMP_NUM_THREADS when set, else "
                   "one on CPU, as train.threads 0)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights of both models")
    p.add_argument("--json", help="write results to this JSON file")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")


def cmd_bench_generate(args: argparse.Namespace) -> int:
    import torch

    from gptforge.bench.generate import run_bench_generate
    from gptforge.numbers import MAX_THREADS

    if (args.new_tokens < 1 or args.repeats < 1 or any(b < 1 for b in args.batch) or args.prompt_tokens < 1
            or not 0 <= args.threads <= MAX_THREADS):
        raise CliError(f"--prompt-tokens, --new-tokens, --repeats and every --batch must be >= 1, --threads in "
                       f"[0, {MAX_THREADS}]")
    try:
        run_bench_generate(size=args.size, batches=args.batch, prompt_tokens=args.prompt_tokens,
                           new_tokens=args.new_tokens, repeats=args.repeats, device=args.device, out=args.json,
                           threads=args.threads, dtype=getattr(torch, args.dtype))
    except ValueError as e:
        raise CliError(str(e)) from e
    return 0
