"""Post-training commands: ``sft`` (takes --section.key overrides) and ``rl``.

    gptforge sft --init-from runs/base --data conv.jsonl --out runs/sft [--section.key VALUE ...]
    gptforge rl --init-from runs/sft --task arithmetic --out runs/rl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gptforge.cli.common import CliError, chat_template_of, load
from gptforge.load import ModelSource

# --- sft -------------------------------------------------------------------------------------------

def cmd_sft(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.config import Config, apply_overrides
    from gptforge.data.chat import ChatFormatError, ChatTemplate
    from gptforge.data.sft import SFTDataError
    from gptforge.training import checkpoint as ckpt
    from gptforge.training.checkpointer import Checkpointer
    from gptforge.training.sft import SFTData, run_sft, sft_config

    sft = SFTData(data=args.data, val_count=args.val_count, split=args.split, seed=args.seed, skip_bad=args.skip_bad)
    init_weights, resume = None, None
    try:
        if args.resume is not None:
            if args.init_from is not None:
                raise CliError("--init-from starts a new SFT run; it cannot be combined with --resume")
            where = Checkpointer.find(args.out, args.resume)  # the newest intact one, as train resumes
            meta = ckpt.read_meta(where)
            if "sft" not in meta:
                raise CliError(f"--resume: {where} is not an SFT checkpoint; resume it with `gptforge train`")
            cfg = Config.from_dict(meta["config"])
            cfg.train.out_dir = args.out  # the run continues where it is now (it may have been moved or copied)
            cfg = apply_overrides(cfg, overrides)
            sft = SFTData(**{**meta["sft"], "data": args.data})
            template = ChatTemplate.from_dict(meta["chat_template"], f"{where}/meta.json", cfg.model.vocab_size)
            resume = str(where)
        else:
            if args.init_from is None:
                raise CliError("give --init-from CKPT (the base model), or --resume to continue an SFT run")
            from gptforge.cli.run import _init_from

            cfg = sft_config(_base_shape(args.init_from), args.out)
            init_weights = _init_from(args.init_from, cfg)
            cfg.train.out_dir = args.out
            apply_overrides(cfg, overrides)
            template = chat_template_of(args.init_from) if Path(args.init_from).is_dir() else None
            template = template or ChatTemplate.gpt2()
        if args.dry_run:
            print(cfg.to_json())
            return 0
        result = run_sft(cfg, sft, template, resume=resume, force=args.force, init_weights=init_weights,
                         base_loss=args.base_loss)
    except (SFTDataError, ChatFormatError) as e:
        raise CliError(str(e)) from e
    return 130 if result.interrupted else 0


def _base_shape(source: str):
    """The base model's config (the SFT config keeps its family and shape)."""
    return load(ModelSource.from_path(source)).config


def args_sft(s: argparse.ArgumentParser) -> None:
    s.description = ("Supervised fine-tuning: render conversations with the chat template, train on assistant "
                     "tokens only, report val loss on held-out conversations. Accepts --section.key overrides "
                     "like train (see `gptforge train --help-config`).")
    s.add_argument("--init-from", metavar="CKPT_OR_LLMC_FILE", help="base model: gptforge checkpoint/run dir or "
                                                                    "llm.c file (trained with model.pad_vocab true)")
    s.add_argument("--data", required=True, help="FILE.jsonl with one {\"messages\": [...]} per line, or a Hugging "
                                                 "Face chat dataset with a messages column: a Hub name (online), a "
                                                 "save_to_disk directory, a local dataset folder or a .parquet file")
    s.add_argument("--out", required=True, help="run directory")
    s.add_argument("--val-count", type=int, default=200, help="held-out conversations for val loss (default 200)")
    s.add_argument("--split", default="train", help="HF dataset split (default train; e.g. train_sft)")
    s.add_argument("--seed", type=int, default=0, help="held-out split and conversation order")
    s.add_argument("--skip-bad", action="store_true", help="count and skip bad conversations instead of stopping")
    s.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue the SFT run in --out (or from CKPT); give the same --data")
    s.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    s.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    s.add_argument("--base-loss", action="store_true", help="first score the base model on the held-out "
                                                            "conversations (CPU; kept in meta.json)")


# --- rl ----------------------------------------------------------------------------------------------

def cmd_rl(args: argparse.Namespace) -> int:
    import dataclasses

    from gptforge.data.chat import ChatFormatError
    from gptforge.data.tokenizer import get_tokenizer
    from gptforge.rl.grpo import RLConfig, RLError, train_rl
    from gptforge.rl.rewards import RewardError, load_reward
    from gptforge.runtime import resolve_device
    from gptforge.training import checkpoint as ckpt
    from gptforge.training.checkpointer import Checkpointer

    resume_dir = None
    try:
        if args.resume is not None:
            resume_dir = Checkpointer.find(args.out, args.resume)  # the newest intact one, as train resumes
            meta = ckpt.read_meta(resume_dir)
            if "rl" not in meta:
                raise CliError(f"--resume: {resume_dir} is not an RL checkpoint")
            cfg = RLConfig(**{**meta["rl"], "out_dir": args.out})
            if args.steps is not None:
                cfg.steps = args.steps
            source = str(resume_dir)
        else:
            if args.init_from is None:
                raise CliError("give --init-from CKPT (an SFT checkpoint), or --resume to continue an RL run")
            known = {f.name for f in dataclasses.fields(RLConfig)}
            given = {k: v for k, v in vars(args).items() if k in known and v is not None}
            cfg = RLConfig(**{**given, "out_dir": args.out, "init_from": args.init_from})
            if ckpt.latest_checkpoint(args.out) is not None and not args.force:
                raise CliError(f"{args.out} already holds checkpoints; pass --resume to continue, --force to start over")
            if args.force:
                import shutil

                shutil.rmtree(ckpt.ckpt_root(args.out), ignore_errors=True)
                (Path(args.out) / "metrics.jsonl").unlink(missing_ok=True)
            source = args.init_from
        cfg.check()
        template = chat_template_of(source)
        raw = args.raw or (args.resume is not None and meta.get("chat_template") is None)
        if template is None and not raw:
            raise CliError(f"{source} has no chat template (meta.json chat_template): fine-tune it with `gptforge "
                             "sft` first, or pass --raw to prompt it with plain 'Question: ...\\nAnswer:' text")
        if raw:
            template = None
        reward = load_reward(cfg.reward)
        model = load(ModelSource(ckpt=source)).to(resolve_device(cfg.device))
        train_rl(cfg, model, template, get_tokenizer(), reward, resume_dir=resume_dir)
    except (RLError, RewardError, ChatFormatError) as e:
        raise CliError(str(e)) from e
    return 0


def args_rl(r: argparse.ArgumentParser) -> None:
    from gptforge.rl.grpo import RLConfig

    d = RLConfig()
    r.description = ("Sample a group of replies per problem, score them, group-relative advantages, clipped ratio "
                     "and a KL penalty to the starting model. Logs reward, KL, reply length and accuracy per step "
                     "to RUN/metrics.jsonl; checkpoints resume.")
    r.add_argument("--init-from", help="SFT checkpoint or run directory (must carry a chat template)")
    r.add_argument("--out", required=True, help="run directory")
    r.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT")
    r.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    r.add_argument("--task", choices=["arithmetic", "compare", "gsm8k"])
    r.add_argument("--reward", help="exact_match (default), exact_match_with_format, numeric_closeness, or "
                                    "module:function taking (problem, reply) -> float")
    for name, tp, help_ in [
        ("steps", int, "optimizer steps"), ("prompts", int, "problems per step"), ("group", int, "replies per problem"),
        ("max_new_tokens", int, "reply length cap"), ("temperature", float, "sampling temperature"),
        ("top_k", int, "0 = off"), ("lr", float, "learning rate"), ("warmup_steps", int, "linear LR warmup"),
        ("kl_coef", float, "KL penalty to the starting model"), ("clip_eps", float, "ratio clip"),
        ("updates_per_batch", int, "optimizer steps per sampled batch"), ("micro_batch", int, "replies per forward"),
        ("eval_every", int, "steps between held-out evals (0 = start and end)"), ("eval_n", int, "held-out problems"),
        ("ckpt_every", int, "steps between checkpoints"), ("keep_ckpts", int, "newest checkpoints kept"),
        ("seed", int, "problems and sampling"),
    ]:
        r.add_argument("--" + name.replace("_", "-"), dest=name, type=tp,
                       help=f"{help_} (default {getattr(d, name)})")
    r.add_argument("--raw", action="store_true", help="no chat template: plain 'Question: ...\\nAnswer:' prompts")
    r.add_argument("--device", default=None)


