"""Commands that move a model between formats: ``export`` (a model -> a Hugging Face directory, a GGUF
file or an llm.c model file) and ``import`` (one of those -> a gptforge checkpoint).

    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/hf
    gptforge import gguf --model model.gguf --out runs/imported
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptforge.cli.common import (
    GGUF_HELP,
    CliError,
    add_model_source,
    load,
    model_source,
    words,
)


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
    --ckpt is guarded by storage.guards.check_output (only training writes one)."""
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
    from gptforge.run.identity import resolve_checkpoint
    from gptforge.run.resume import saved_config

    try:
        where = resolve_checkpoint(args.ckpt)
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
        return _write_export(args, model, tok, chat, dtype)
    want = chat.vocab_size if chat else GPT2_VOCAB
    # never a silent export without a tokenizer (gguf checks its vocabulary itself, after what llama.cpp can run)
    if args.format != "gguf" and not args.no_tokenizer and model.config.vocab_size != want:
        what = f"the chat template's {want} (GPT-2's 50257 + chat tokens)" if chat else "GPT-2's 50257"
        raise CliError(f"model.vocab_size={model.config.vocab_size} is not {what}, so GPT-2's tokenizer does not "
                       "describe this model; pass --no-tokenizer to export the weights alone")
    return _write_export(args, model, tok, chat, dtype)


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
    from gptforge.interop import hf_folder, llmc

    llmc.check_llmc_model(model)  # before the output folder is created
    out = hf_folder.check_out_dir(args.out, args.force)
    files = [llmc.write_llmc_model(model, out / "model.bin", dtype=dtype)]
    if tokenizer:
        files.append(llmc.write_llmc_tokenizer(tok, out / "tokenizer.bin"))
    return files


def _write_export(args: argparse.Namespace, model, tok, chat, dtype: str) -> int:
    """The end of every export, whichever tokenizer the model has: 'writing ...' said, the format's writer
    (hf, gguf or llmc), its refusals as the command's one line, the files written printed as JSON. GPT-2's
    tokenizer goes with the exporters' own tokenizer files and template; a model's own tokenizer (not
    GPT-2's) is written after the weights (its tokenizer.json and chat template; llm.c's token table; GGUF
    metadata) and described in the JSON line."""
    import torch

    from gptforge.interop import hf_module, hf_tokenizer

    own = not tok.is_gpt2
    tokenizer = not args.no_tokenizer
    _say_writing(args, model)
    try:
        if args.format == "hf":
            export = hf_module(model.config.arch).export_hf
            if own:
                files = export(model, args.out, force=args.force, tokenizer=False, dtype=getattr(torch, dtype))
                if tokenizer:
                    files += hf_tokenizer.write_model_tokenizer(Path(args.out), tok, chat, model.config.block_size)
            else:
                import inspect

                if chat is not None and tokenizer and "chat_template" not in inspect.signature(export).parameters:
                    raise CliError(f"export hf: the {model.config.arch} exporter does not write a chat template yet; "
                                   "pass --no-tokenizer")
                kw = {"chat_template": chat.to_dict()} if chat is not None else {}
                files = export(model, args.out, force=args.force, tokenizer=tokenizer, dtype=getattr(torch, dtype),
                               **kw)
        elif args.format == "gguf":
            from gptforge.interop.gguf import export_gguf

            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
            words_kw = (dict(tokenizer=tok, chat=chat) if own else
                        dict(chat_template=chat.to_dict() if chat is not None else None))
            files = [export_gguf(model, args.out, dtype=short, force=args.force, name=_export_name(args), **words_kw)]
        else:
            files = _export_llmc(args, model, tok, dtype, tokenizer)
    except (FileExistsError, ValueError) as e:
        raise CliError(str(e)) from e
    said = {"format": args.format, "files": [_final(args, f) for f in files]}
    if own:
        said["tokenizer"] = tok.describe()
    print(json.dumps(said))
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
            from gptforge.interop.hf_tokenizer import write_model_tokenizer

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
