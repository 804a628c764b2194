"""Preference commands: ``rm`` (a reward model) and ``dpo`` (DPO / IPO), recipes on the one loop.

    gptforge prepare preferences compare --n 2000 --out data/prefs.jsonl
    gptforge rm --init-from runs/sft --data data/prefs.jsonl --out runs/rm [--section.key VALUE ...]
    gptforge dpo --init-from runs/sft --data data/prefs.jsonl --out runs/dpo --dpo.beta 0.1 --dpo.loss_type ipo

Both take the resume/force path of ``train``/``sft``/``rl`` (:func:`gptforge.cli.common.resolve_run`):
``--resume`` continues bit-exactly; flags given with it apply on top (the held-out split's keys are
frozen); Ctrl-C saves a checkpoint and exits 130; bad input exits 2 naming the flag.
"""

from __future__ import annotations

import argparse

from gptforge.cli.common import (
    CliError,
    add_help_config,
    base_shape,
    finish,
    flag_overrides,
    init_from,
    resolve_run,
    run_words,
    trusted,
)
from gptforge.cli.hints import GENERATED_TASKS

PAIR_FLAGS = {"data": "{s}.data", "split": "{s}.split", "val_count": "{s}.val_count", "seed": "{s}.seed",
              "skip_bad": "{s}.skip_bad", "eval_every": "{s}.eval_every", "steps": "train.max_steps",
              "lr": "optim.lr", "micro_batch": "train.micro_batch", "ckpt_every": "train.ckpt_every",
              "device": "train.device"}
DPO_FLAGS = {"beta": "dpo.beta", "loss_type": "dpo.loss_type", "sft_coef": "dpo.sft_coef", "task": "dpo.task",
             "eval_n": "dpo.eval_n"}


def _frozen(section: str) -> tuple[str, ...]:
    held_out = (f"{section}.split", f"{section}.val_count", f"{section}.seed")  # they decide the held-out pairs
    return (*held_out, "dpo.init_from") if section == "dpo" else held_out  # and DPO's reference model


def _run_pairs(args: argparse.Namespace, overrides: list[str], section: str, lr: float, make_recipe) -> int:
    from gptforge.data.chat import ChatFormatError
    from gptforge.data.rows import DataError
    from gptforge.training.loop import train
    from gptforge.training.pairs import pair_config
    from gptforge.training.sft import prepare_chat_model

    keys = {k: v.format(s=section) for k, v in PAIR_FLAGS.items()}
    if section == "dpo":
        keys.update(DPO_FLAGS)
    flags = flag_overrides(args, keys, overrides)
    if args.resume is not None and args.init_from is not None:
        if section != "dpo":  # rm reads its starting model once, at step 0
            raise CliError(f"--init-from starts a new {section} run; it cannot be combined with --resume")
        flags += ["--dpo.init_from", args.init_from]  # the reference's new place: checked against the run's record
    if args.resume is None and (args.init_from is None or args.data is None):
        raise CliError(f"give --init-from CKPT (an SFT or base model) and --data PREFS.jsonl, or --resume to "
                       f"continue a {section} run")
    init = None

    def fresh():
        nonlocal init
        from gptforge.config import apply_overrides

        cfg = pair_config(base_shape(args.init_from), args.out, lr)
        init = init_from(args.init_from, cfg)
        extra = ["--dpo.init_from", args.init_from] if section == "dpo" else []
        return apply_overrides(cfg, [*flags, *extra, *overrides, "--train.out_dir", args.out])

    try:
        cfg, resume, meta = resolve_run(args.out, args.resume, [*flags, *overrides], section, fresh,
                                        trusted=trusted(args, overrides), frozen=_frozen(section),
                                        same_as=(("--init-from", args.init_from, "dpo.init_from"),) if section == "dpo"
                                        else ())
        tok, template = run_words(resume, meta, cfg, args.init_from)
        if resume is None:
            prepare_chat_model(cfg, template)
        elif template is None:
            raise CliError(f"{resume}/meta.json has no chat_template: the checkpoint is damaged")
        if args.dry_run:
            print(cfg.to_json())
            return 0
        recipe = make_recipe(cfg, template, tok)
        if section == "rm":
            from gptforge.training.rm import body_init

            init = body_init(init)
        result = train(cfg, recipe, resume=resume, force=args.force, init_weights=init)
    except (DataError, ChatFormatError) as e:
        raise CliError(str(e)) from e
    return finish(result, section, cfg, args.init_from)


def cmd_rm(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.training.rm import RM

    return _run_pairs(args, overrides, "rm", 1e-5, RM)


def cmd_dpo(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.training.dpo import DPO

    return _run_pairs(args, overrides, "dpo", 5e-6, DPO)


def _pair_defaults(section: str):
    from gptforge.training.pairs import pair_config

    return pair_config(None, "RUN", 1e-5 if section == "rm" else 5e-6)


def _common(p: argparse.ArgumentParser, section: str) -> None:
    from gptforge.config import Config

    d = getattr(Config(), section)
    run = _pair_defaults(section)  # the recipe's own train/optim defaults, which --help-config lists too
    p.add_argument("--init-from", metavar="CKPT", help="starting model: an SFT (chat) checkpoint or run directory, a "
                                                        "base checkpoint, a Hugging Face directory, a GGUF file or an llm.c file; dpo "
                                                        "--resume: where the run's reference went if it was moved (the "
                                                        "same weights)")
    p.add_argument("--data", help="preference pairs: FILE.jsonl of {\"prompt\", \"chosen\", \"rejected\"} (TRL's "
                                  "conversational or string form; `gptforge prepare preferences` writes one), or a "
                                  "Hugging Face dataset (Hub name, save_to_disk folder, .parquet)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help=f"continue the {section} run in --out (or from CKPT); flags given now apply on top")
    p.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    add_help_config(p, section, lambda: _pair_defaults(section))
    p.add_argument("--val-count", type=int, help=f"held-out pairs ({section}.val_count, default {d.val_count})")
    p.add_argument("--split", help=f"HF dataset split ({section}.split, default {d.split})")
    p.add_argument("--seed", type=int, help=f"held-out split and pair order ({section}.seed, default {d.seed})")
    p.add_argument("--skip-bad", action="store_true", help="count and skip bad rows instead of stopping")
    p.add_argument("--eval-every", type=int, help=f"steps between held-out evals ({section}.eval_every; 0 = start and "
                                                  f"end; default {d.eval_every})")
    p.add_argument("--steps", type=int, help=f"optimizer steps (train.max_steps, default {run.train.max_steps})")
    p.add_argument("--lr", type=float, help=f"learning rate (optim.lr, default {run.optim.lr:g})")
    p.add_argument("--micro-batch", type=int, help=f"pairs per forward (train.micro_batch, default {run.train.micro_batch}); "
                                                   f"{section}.grad_accum of them make a step")
    p.add_argument("--ckpt-every", type=int, help=f"steps between checkpoints (train.ckpt_every, default "
                                                  f"{run.train.ckpt_every})")
    p.add_argument("--device", help="train.device (default auto)")


def args_rm(p: argparse.ArgumentParser) -> None:
    p.description = ("Reward model: a base or SFT model with a scalar head read at the reply's last token, trained "
                     "on preference pairs with the Bradley-Terry loss (a row's \"margin\" is subtracted when "
                     "present); logs pair accuracy and reward margin, on held-out pairs too. Accepts "
                     "--section.key overrides (the rm.*, optim.* and train.* sections).")
    _common(p, "rm")


def args_dpo(p: argparse.ArgumentParser) -> None:
    p.description = ("DPO: learn from preference pairs against the frozen starting model (reference log-probs "
                     "computed once and cached in the run directory), sigmoid or IPO loss; logs TRL's "
                     "rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/*. Accepts "
                     "--section.key overrides (the dpo.*, optim.* and train.* sections).")
    from gptforge.config import Config

    _common(p, "dpo")
    d = Config().dpo
    p.add_argument("--beta", type=float, help=f"dpo.beta (default {d.beta:g})")
    p.add_argument("--loss-type", choices=["sigmoid", "ipo"], help=f"dpo.loss_type (default {d.loss_type})")
    p.add_argument("--sft-coef", type=float, help="dpo.sft_coef: add this weight times the chosen replies' NLL "
                                                  "(RPO; default 0 = plain DPO)")
    p.add_argument("--task", choices=GENERATED_TASKS, help="dpo.task: held-out greedy accuracy as eval (default "
                                                           "none: pair accuracy only)")
    p.add_argument("--eval-n", type=int, help=f"held-out task problems (dpo.eval_n, default {d.eval_n})")
