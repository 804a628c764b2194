"""Commands that use a model (``--ckpt``/``--hf``/``--llmc``/``--random`` everywhere): sample, eval,
export, import, serve, bench-generate."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptforge.cli.common import (
    DEVICE_HELP,
    GGUF_HELP,
    CliError,
    add_model_source,
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
    from gptforge.runtime import resolve_device

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
    model = load(source).to(resolve_device(args.device, flag="--device"))
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


# --- export / import ------------------------------------------------------------------------------

def args_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=["hf", "llmc", "gguf"], help="hf: safetensors + config.json (+ tokenizer); "
                                                                 "llmc: llm.c model .bin; gguf: one .gguf file for "
                                                                 "llama.cpp (tokenizer and chat template inside)")
    add_model_source(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: hf writes model.safetensors, config.json (+ tokenizer files); llmc writes "
                        "model.bin (+ tokenizer.bin, llm.c's tokenizer file); gguf writes model-<dtype>.gguf")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "f32", "bf16", "f16"],
                   help="the weights' type in the file written (hf: any; llmc: float32 or bfloat16, version 3 or "
                        "5; gguf: f32, f16 or bf16). Default: the model's own, as stored before loading (an HF "
                        "directory's torch_dtype, a GGUF's F16/BF16 matrices, an llm.c version, what `import` "
                        "recorded; else float32): the export says which and why")
    p.add_argument("--no-tokenizer", action="store_true", help="skip the tokenizer files")
    p.add_argument("--adapters-only", action="store_true",
                   help="hf, a LoRA run (--lora.rank): write only its adapters in peft's format (adapter_config.json + "
                        "adapter_model.safetensors; peft.PeftModel.from_pretrained loads them on the exported base); "
                        "without it a LoRA run is exported merged (W + alpha/r BA)")


def cmd_export(args: argparse.Namespace) -> int:
    """The whole export (weights, config, tokenizer files) is built in a temporary folder beside --out
    and renamed into place (storage.atomic_dir): a full disk or a kill leaves the earlier export whole."""
    from gptforge.storage import atomic_dir

    _refuse_own_source(args)
    final = args.out
    with atomic_dir(final, args.force, what=f"the {args.format} export") as tmp:
        args.out, args.out_final = str(tmp), final
        try:
            return _export(args)
        finally:
            args.out = final


def _refuse_own_source(args: argparse.Namespace) -> None:
    """--out may not be the model's own folder, lie inside it, or hold it: the export is swapped in over --out,
    so with --force it would replace the files it is read from (``export hf --hf D --out D --dtype float16``
    rewrote D's float32 weights as float16), as ``import`` refuses for its checkpoint. A run folder given to
    --ckpt is guarded by storage.check_output (only training writes one)."""
    out = Path(args.out).resolve()
    for flag, given in (("--hf", args.hf), ("--gguf", getattr(args, "gguf", None)), ("--llmc", getattr(args, "llmc", None))):
        if not given or not Path(given).exists():  # a hub name, or a missing path the loader names
            continue
        src = Path(given).resolve()
        how = "is" if out == src else "holds" if out in src.parents else "is inside" if src in out.parents else None
        if how:
            raise CliError(f"--out {args.out} {how} {flag} {given}: the export would be written into, or over, the "
                           "model it is read from; give --out a folder of its own (e.g. exports/NAME)")


def _export_adapters(args: argparse.Namespace) -> int:
    """``export hf --adapters-only``: a LoRA checkpoint's adapters in peft's format (interop/lora_export.py)."""
    from gptforge.interop.lora_export import write_peft_adapters

    if args.format != "hf" or args.ckpt is None:
        raise CliError("--adapters-only writes peft's format: give `export hf --ckpt RUN` (a LoRA run)")
    from gptforge.load import lora_merged
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.resume import saved_config

    try:
        where = ckpt.resolve_checkpoint(args.ckpt)
        meta = ckpt.read_meta(where)
        if not meta.get("lora"):
            raise ValueError(f"{where} holds no LoRA adapters (it is not a run with lora.rank > 0): export it whole "
                             "with `gptforge export hf` without --adapters-only")
        cfg = saved_config(meta, str(where / "meta.json"))
        files = write_peft_adapters(lora_merged(where, meta, cfg, merge=False), cfg, args.out)
    except ValueError as e:
        raise CliError(str(e)) from e
    print(json.dumps({"format": "peft", "files": [_final(args, f) for f in files]}))
    return 0


def _final(args: argparse.Namespace, f) -> str:
    """Where ``f``, written under the temporary export folder, is once the folder is renamed into place."""
    final = getattr(args, "out_final", None)
    return str(Path(final) / Path(f).relative_to(args.out)) if final is not None else str(f)


def _export(args: argparse.Namespace) -> int:
    import torch

    from gptforge.tokens import GPT2_VOCAB
    from gptforge.training.rm import checkpoint_is_reward_model

    if getattr(args, "adapters_only", False):
        return _export_adapters(args)
    if checkpoint_is_reward_model(args.ckpt):
        return _export_reward_model(args)
    dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}.get(args.dtype, args.dtype)
    if args.format == "llmc" and dtype == "float16":
        raise CliError("--dtype float16: llm.c model files are float32 or bfloat16")
    why = "--dtype"
    if args.format == "gguf":
        from gptforge.extras import require

        require("gguf", extra="gguf", for_what="gptforge export gguf")  # before the model is loaded
        if args.no_tokenizer:
            raise CliError("--no-tokenizer: a GGUF file must carry its tokenizer (llama.cpp reads it from the file)")
    source = model_source(args)
    if dtype is None:  # the model's own, as transformers' save_pretrained keeps it
        dtype, why = _own_dtype(source, args.format)
    args.dtype_said = f"as {dtype} ({why})"
    model = load(source)
    _refuse_before_writing(args.format, model)  # the format first: no tokenizer or dtype makes it hold the model
    _check_range(model, dtype, args.dtype_said)
    tok, chat = words(source, model)  # a chat checkpoint: the HF tokenizer gets its template
    if not tok.is_gpt2:  # the model's own tokenizer travels with it
        return _export_own_tokenizer(args, model, tok, chat, dtype)
    want = chat.vocab_size if chat else GPT2_VOCAB
    # never a silent export without a tokenizer (gguf checks its vocabulary itself, after what llama.cpp can run)
    if args.format != "gguf" and not args.no_tokenizer and model.config.vocab_size != want:
        what = f"the chat template's {want} (GPT-2's 50257 + chat tokens)" if chat else "GPT-2's 50257"
        raise CliError(f"model.vocab_size={model.config.vocab_size} is not {what}, so GPT-2's tokenizer does not "
                       "describe this model; pass --no-tokenizer to export the weights alone")
    tokenizer = not args.no_tokenizer
    _say_writing(args, model)
    try:
        if args.format == "hf":
            import inspect

            from gptforge.interop import hf_module

            export = hf_module(model.config.arch).export_hf
            if chat is not None and tokenizer and "chat_template" not in inspect.signature(export).parameters:
                raise CliError(f"export hf: the {model.config.arch} exporter does not write a chat template yet; "
                               "pass --no-tokenizer")
            kw = {"chat_template": chat.to_dict()} if chat is not None else {}
            files = export(model, args.out, force=args.force, tokenizer=tokenizer, dtype=getattr(torch, dtype), **kw)
        elif args.format == "gguf":
            from gptforge.interop.gguf import export_gguf

            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
            files = [export_gguf(model, args.out, dtype=short, force=args.force,
                                 chat_template=chat.to_dict() if chat is not None else None,
                                 name=_export_name(args))]
        else:
            files = _export_llmc(args, model, tok, dtype, tokenizer)
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from e
    print(json.dumps({"format": args.format, "files": [_final(args, f) for f in files]}))
    return 0


def _check_range(model, dtype: str, said: str) -> None:
    """Refuse, before anything is written, weights the chosen type cannot hold: a float16 export of a weight past
    65504 wrote inf without a word (hf; gguf printed numpy's overflow warning), a file that every reader,
    gptforge's included, then refuses or samples garbage from. bfloat16 has float32's range: nothing to check."""
    import torch

    if dtype != "float16":
        return
    for name, t in model.state_dict().items():
        if t.is_floating_point() and bool(torch.isinf(t.detach().to(torch.float16)).any()):
            big = t.detach().abs().max().item()
            raise CliError(f"writing {said}: {name} holds {big:.6g}, past float16's largest value 65504, so it would be "
                           "written as inf; export with --dtype bfloat16 (float32's range) or --dtype float32")


def _export_llmc(args: argparse.Namespace, model, tok, dtype: str, tokenizer: bool) -> list:
    """llm.c's model file, and its token table from the model's tokenizer (any byte-level one)."""
    from gptforge.interop import hf, llmc

    llmc.check_llmc_model(model)  # before the output folder is created
    out = hf.check_out_dir(args.out, args.force)
    files = [llmc.write_llmc_model(model, out / "model.bin", dtype=dtype)]
    if tokenizer:
        files.append(llmc.write_llmc_tokenizer(tok, out / "tokenizer.bin"))
    return files


def _export_own_tokenizer(args: argparse.Namespace, model, tok, chat, dtype: str) -> int:
    """Export of a model whose tokenizer is not GPT-2's: the weights as for any model, then the
    model's own tokenizer (its tokenizer.json and chat template; llm.c's token table; GGUF metadata)."""
    import torch

    from gptforge.interop import hf, hf_module

    tokenizer = not args.no_tokenizer
    _say_writing(args, model)
    try:
        if args.format == "hf":
            files = hf_module(model.config.arch).export_hf(model, args.out, force=args.force, tokenizer=False,
                                                           dtype=getattr(torch, dtype))
            if tokenizer:
                files += hf.write_model_tokenizer(Path(args.out), tok, chat, model.config.block_size)
        elif args.format == "gguf":
            from gptforge.interop.gguf import export_gguf

            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
            files = [export_gguf(model, args.out, dtype=short, force=args.force, name=_export_name(args),
                                 tokenizer=tok, chat=chat)]
        else:
            files = _export_llmc(args, model, tok, dtype, tokenizer)
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from e
    print(json.dumps({"format": args.format, "files": [_final(args, f) for f in files], "tokenizer": tok.describe()}))
    return 0


def _own_dtype(source, fmt: str) -> tuple[str, str]:
    """(dtype, why) an export writes without --dtype: the model's own (load.stored_dtype), where the format
    holds it (llm.c has no float16)."""
    from gptforge.load import stored_dtype

    try:
        own, why = stored_dtype(source)
    except (OSError, ValueError) as e:  # an unreadable source: its loader, next, says what is wrong
        return "float32", f"the source's dtype is unreadable ({e})"
    if fmt == "llmc" and own == "float16":
        return "float32", f"{why} float16, which llm.c files do not hold"
    return own, f"the model's own: {why}; --dtype to choose"


def _refuse_before_writing(fmt: str, model) -> None:
    """What ``fmt`` cannot hold of this model (llm.c a Llama, a family's config a field it lacks, llama.cpp an
    option it has not), refused before 'writing ...' is said: the refusal is the command's one line (each
    exporter checks again)."""
    from gptforge.interop import gguf, hf_llama, llmc

    try:
        if fmt == "llmc":
            llmc.check_llmc_model(model)
        elif getattr(model.config, "arch", "gpt2") == "llama":  # GPT-2's own checks are its exporters'
            if fmt == "hf":
                hf_llama.hf_llama_config(model.config)
            else:
                gguf.check_gguf_model(model, None, tokenizer=False)  # the tokenizer: the export checks it
    except ValueError as e:
        raise CliError(str(e)) from e


def _say_writing(args: argparse.Namespace, model) -> None:
    """Seconds for the larger models: not silent; the dtype written and why."""
    n = sum(p.numel() for p in model.parameters())
    print(f"gptforge export: writing {n / 1e6:.1f}M parameters {args.dtype_said} to "
          f"{getattr(args, 'out_final', args.out)} ...", file=sys.stderr, flush=True)


def _export_name(args: argparse.Namespace) -> str:
    """general.name of a GGUF: the run directory's name (the folder holding checkpoints/), else the source's."""
    from pathlib import Path

    src = args.ckpt or args.hf or args.llmc or args.random or "gptforge"
    p = Path(str(src))
    if p.parent.name == "checkpoints":
        p = p.parent.parent
    return p.name or "gptforge"


def _export_reward_model(args: argparse.Namespace) -> int:
    """`gptforge export hf --ckpt runs/rm`: a *ForSequenceClassification directory (one label)."""
    from gptforge.data.chat import ChatTemplate
    from gptforge.interop.hf_reward import export_reward_hf
    from gptforge.training.rm import load_reward_model

    if args.format != "hf":
        raise CliError("a reward model exports as a Hugging Face sequence classifier only: use `export hf`")
    if args.dtype not in (None, "float32", "f32"):  # the classifier is written in float32: a --dtype was dropped silently
        raise CliError(f"--dtype {args.dtype}: a reward model exports in float32 only (its scores are compared across "
                       "replies); leave --dtype out, or cast the exported folder with transformers")
    rm, chat = load_reward_model(args.ckpt)
    chat = chat or ChatTemplate.gpt2()
    tok = getattr(chat, "tok", None)  # a Jinja template's tokenizer: the model's own
    try:
        if tok is not None and not tok.is_gpt2:
            from gptforge.interop.hf import write_model_tokenizer

            files = export_reward_hf(rm, args.out, pad=chat.bos, force=args.force, tokenizer=False)
            if not args.no_tokenizer:
                files += write_model_tokenizer(Path(args.out), tok, chat, rm.config.block_size)
        else:
            files = export_reward_hf(rm, args.out, pad=chat.bos, force=args.force, tokenizer=not args.no_tokenizer,
                                     chat_template=chat.to_dict())
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from e
    print(json.dumps({"format": "hf", "kind": "reward_model", "files": [_final(args, f) for f in files]}))
    return 0


def args_import(p: argparse.ArgumentParser) -> None:
    p.description = ("Make a gptforge checkpoint of another program's model: its weights, its tokenizer and chat "
                     "template (carried in the checkpoint like any run's), and where it came from.")
    p.add_argument("format", choices=["llmc", "gguf", "hf"],
                   help=f"llmc: an llm.c model file (GPT-2's tokenizer); gguf: {GGUF_HELP} (weights dequantized "
                        "to float32, the file's tokenizer and template); hf: a Hugging Face "
                        "directory or hub name (its tokenizer.json and chat template)")
    p.add_argument("--model", required=True, help="the model file (llmc, gguf) or directory / hub name (hf)")
    p.add_argument("--out", required=True, help="run directory; the checkpoint is RUN/checkpoints/step_000000")
    p.add_argument("--force", action="store_true", help="add step_000000 to a run directory holding checkpoints")


def cmd_import(args: argparse.Namespace) -> int:
    """Another program's model -> a weights-only gptforge checkpoint (sample, chat, eval, export, serve,
    and --init-from of every recipe), carrying the model's tokenizer and chat template."""
    from gptforge.config import Config
    from gptforge.load import ModelSource
    from gptforge.run import checkpoint as ckpt

    if ckpt.latest_checkpoint(args.out) is not None and not args.force:
        raise CliError(f"--out {args.out} already holds checkpoints; pass --force to add step_000000 there")
    model_dir, out = Path(args.model).resolve(), Path(args.out).resolve()
    if args.format == "hf" and model_dir.is_dir() and (out == model_dir or model_dir in out.parents):  # a file model (gguf, llmc): its own errors
        raise CliError(f"--out {args.out} is inside --model {args.model}: the checkpoint would be written into the "
                       "model it is read from; give --out a folder of its own (e.g. runs/NAME)")
    source = ModelSource(**{args.format: args.model})
    model = load(source, "--model")
    tok, chat = words(source, model, flag="--model")
    meta = {"config": Config(model=model.config).to_dict(), "source": str(args.model), "tokenizer": tok}
    from gptforge.load import stored_dtype

    dtype, why = stored_dtype(source)  # what `export` writes by default: the model's own, not float32
    meta["source_dtype"] = {"dtype": dtype, "why": why}
    if chat is not None:
        meta["chat_template"] = chat.to_dict()
    where = ckpt.save_checkpoint(args.out, 0, model, None, meta,  # advice from import's own options (no --resume)
                                 then=f"run the same `gptforge import {args.format} --model {args.model} --out "
                                      f"{args.out}` again")
    print(json.dumps({"checkpoint": str(where), "params": model.num_parameters(), "tokenizer": tok.describe(),
                      "chat_template": chat.to_dict().get("name") if chat is not None else None}))
    return 0


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
                                                          "is refused before the model loads, exit 4")
    p.add_argument("--metrics", help="metrics.jsonl for the loss curve (default: the checkpoint's run directory)")
    p.add_argument("--max-new-tokens-cap", type=int, default=512, help="largest max_new_tokens a request may ask")
    p.add_argument("--max-batch", type=int, default=8, help="most prompts in one request")
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting for the model before 429")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def cmd_serve(args: argparse.Namespace) -> int:
    from gptforge.extras import require
    from gptforge.runtime import resolve_device

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
        from gptforge.run import checkpoint as ckpt

        where = ckpt.resolve_checkpoint(args.ckpt)
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
        model = load(source, announce_after=0).to(resolve_device(args.device, flag="--device"))
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
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
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
