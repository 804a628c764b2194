"""Post-training commands: ``sft`` (takes --section.key overrides) and ``rl``.

    gptforge sft --init-from runs/base --data conv.jsonl --out runs/sft [--section.key VALUE ...]
    gptforge rl --init-from runs/sft --task arithmetic --out runs/rl [--section.key VALUE ...]
    gptforge rl --init-from runs/sft --task compare --algo ppo --reward-model runs/rm --out runs/ppo

Both are recipes on the one training loop and take the same resume/force path as ``train``
(:func:`gptforge.cli.common.resolve_run`): flags given with ``--resume`` apply on top of the run's
settings, or are refused naming the key; nothing is silently dropped.
"""

from __future__ import annotations

import argparse

from gptforge.cli.common import (
    CliError,
    add_help_config,
    base_shape,
    finish,
    finite,
    flag_overrides,
    init_from,
    resolve_run,
    run_words,
)
from gptforge.cli.hints import GENERATED_TASKS
from gptforge.errors import flagged

# --- sft -------------------------------------------------------------------------------------------

SFT_FROZEN = ("sft.split", "sft.val_count", "sft.seed")  # they decide which conversations are held out
SFT_FLAGS = {"data": "sft.data", "split": "sft.split", "val_count": "sft.val_count", "seed": "sft.seed",
             "skip_bad": "sft.skip_bad", "steps": "train.max_steps"}  # flag (dest) -> the key it sets


def cmd_sft(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.data.chat import ChatFormatError
    from gptforge.data.sft import SFTDataError
    from gptforge.training.sft import run_sft

    flags = flag_overrides(args, SFT_FLAGS, overrides)
    if args.resume is not None and args.init_from is not None:
        raise CliError("--init-from starts a new SFT run; it cannot be combined with --resume")
    if args.resume is None and (args.init_from is None or args.data is None):
        raise CliError("give --init-from CKPT (the base model) and --data, or --resume to continue an SFT run")
    init_weights = None

    def fresh():
        nonlocal init_weights
        from gptforge.config import apply_overrides
        from gptforge.training.sft import sft_config

        cfg = sft_config(base_shape(args.init_from), args.out)
        init_weights = init_from(args.init_from, cfg)
        return apply_overrides(cfg, [*flags, *overrides, "--train.out_dir", args.out])

    try:
        cfg, resume, meta = resolve_run(args.out, args.resume, [*flags, *overrides], "sft", fresh,
                                        trusted=_trusted(args, overrides), frozen=SFT_FROZEN)
        tok, template = run_words(resume, meta, cfg, args.init_from)
        if args.dry_run:
            print(cfg.to_json())
            return 0
        result = run_sft(cfg, template, resume=resume, force=args.force, init_weights=init_weights,
                         base_loss=args.base_loss, tok=tok)
    except (SFTDataError, ChatFormatError) as e:
        raise CliError(str(e)) from e
    return finish(result, "sft", cfg, args.init_from)


def _trusted(args: argparse.Namespace, overrides: list[str]) -> bool:
    from gptforge.cli.common import trusted

    return trusted(args, overrides)


def add_trust_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow --resume from a sharded (FSDP, dcp/) checkpoint: its metadata is a pickle that can run "
                        "code, so only for checkpoints you trust (a checkpoint never vouches for itself)")


def _sft_defaults():
    from gptforge.models.gpt2 import GPTConfig
    from gptforge.training.sft import sft_config

    return sft_config(GPTConfig(), "RUN")


def _rl_defaults():
    from gptforge.training.grpo import rl_config

    return rl_config(None, "RUN", "SFT_CKPT")


def args_sft(s: argparse.ArgumentParser) -> None:
    s.description = ("Supervised fine-tuning: render conversations with the chat template, train on assistant "
                     "tokens only, report val loss on held-out conversations. Accepts --section.key overrides "
                     "like train (list them with --help-config).")
    s.add_argument("--init-from", metavar="MODEL", help="base model: a gptforge checkpoint or run dir, a Hugging Face "
                                                      "directory, a GGUF file or an llm.c file (trained with "
                                                      "model.pad_vocab true)")
    s.add_argument("--data", help="FILE.jsonl with one {\"messages\": [...]} per line, or a Hugging "
                                                 "Face chat dataset with a messages column: a Hub name (online), a "
                                                 "save_to_disk directory, a local dataset folder or a .parquet file")
    s.add_argument("--out", required=True, help="run directory")
    s.add_argument("--val-count", type=int, help="held-out conversations for val loss (default 200; sft.val_count)")
    s.add_argument("--split", help="HF dataset split (default train, e.g. train_sft; sft.split)")
    s.add_argument("--seed", type=int, help="held-out split and conversation order (default 0; sft.seed)")
    s.add_argument("--skip-bad", action="store_true", help="count and skip bad conversations instead of stopping")
    s.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue the SFT run in --out (or from CKPT); --data only if the file moved; other flags apply on top")
    s.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    add_trust_flag(s)
    s.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    s.add_argument("--steps", type=int, help=f"optimizer steps (train.max_steps, default "
                                             f"{_sft_defaults().train.max_steps}; like rl and dpo)")
    add_help_config(s, "sft", _sft_defaults)
    s.add_argument("--base-loss", action="store_true", help="first score the base model on the held-out "
                                                            "conversations (CPU; kept in meta.json)")


# --- rl ----------------------------------------------------------------------------------------------

RL_FLAGS = {  # the short flags of `gptforge rl` -> the config keys they set (any --section.key works too)
    "task": "rl.task", "prompts": "rl.prompts", "group": "rl.group", "max_new_tokens": "rl.max_new_tokens",
    "temperature": "rl.temperature", "top_k": "rl.top_k", "kl_coef": "rl.kl_coef", "clip_eps": "rl.clip_eps",
    "updates_per_batch": "rl.updates_per_batch", "eval_every": "rl.eval_every", "eval_n": "rl.eval_n",
    "steps": "train.max_steps", "lr": "optim.lr", "warmup_steps": "optim.warmup_steps",
    "micro_batch": "train.micro_batch", "ckpt_every": "train.ckpt_every", "keep_ckpts": "train.keep_ckpts",
    "seed": "train.seed", "device": "train.device", "raw": "rl.raw", "reward": "rl.reward",
    "algo": "rl.algo", "reward_model": "rl.reward_model", "gamma": "rl.gamma", "lam": "rl.lam",
    "vf_coef": "rl.vf_coef", "clip_value": "rl.clip_value", "kl_target": "rl.kl_target",
    "reward_norm": "rl.reward_norm",
}
RL_FROZEN = ("rl.task", "rl.eval_n", "rl.init_from", "rl.raw", "rl.algo",  # they decide what is trained
             "rl.reward_model", "rl.reward_reduce",  # and held out, and which recipe continues the run
             "rl.reward_norm")  # (the whitening is set on step 1 and kept in the checkpoint)


def cmd_rl(args: argparse.Namespace, overrides: list[str]) -> int:
    from gptforge.data.chat import ChatFormatError
    from gptforge.training.grpo import GRPO, rl_config
    from gptforge.training.loop import train
    from gptforge.training.rewards import RewardError, load_reward
    from gptforge.training.rl_state import RLError

    flags = flag_overrides(args, RL_FLAGS, overrides)
    if args.resume is not None and args.init_from is not None:  # the reference model's new place (moved): checked
        flags += ["--rl.init_from", args.init_from]  # on resume to hold the weights the run recorded (run/resume.py)
    if args.resume is None and args.init_from is None:
        raise CliError("give --init-from CKPT (an SFT checkpoint), or --resume to continue an RL run")

    def fresh():
        from gptforge.config import apply_overrides

        cfg = rl_config(base_shape(args.init_from), args.out, args.init_from)
        return apply_overrides(cfg, [*flags, *overrides, "--train.out_dir", args.out])

    try:
        cfg, resume, meta = resolve_run(args.out, args.resume, [*flags, *overrides], ("grpo", "ppo"), fresh,
                                        trusted=_trusted(args, overrides), frozen=RL_FROZEN,
                                        same_as=(("--init-from", args.init_from, "rl.init_from"),))
        given_reward = args.reward is not None or any(o.startswith("--rl.reward") for o in overrides)
        if ":" in cfg.rl.reward and not given_reward:  # code is named only by this command line
            raise CliError(f"this run was trained with the reward function {cfg.rl.reward!r}, which is code: a "
                           f"checkpoint never decides what code runs. Pass --reward {cfg.rl.reward} to run it again")
        source = str(resume) if resume is not None else args.init_from
        tok, template = run_words(resume, meta, cfg, args.init_from, fallback=False)
        template = None if cfg.rl.raw else template
        if template is None and not cfg.rl.raw:
            raise CliError(f"{source} has no chat template (meta.json chat_template): fine-tune it with `gptforge "
                           "sft` first, or pass --raw to prompt it with plain 'Question: ...\\nAnswer:' text")
        if args.dry_run:
            print(cfg.to_json())
            return 0
        reward = load_reward(cfg.rl.reward)
        rm = _reward_model(cfg.rl.reward_model, template, cfg.rl.reward_reduce)
        init = init_from(args.init_from, cfg) if resume is None else None
        if cfg.rl.algo == "ppo":
            from gptforge.training.ppo import PPO

            base, recipe = init, PPO(cfg, template, tok, reward, reward_model=rm)
            if cfg.rl.value_init == "reward_model" and rm is None:
                raise CliError("rl.value_init reward_model needs --reward-model RUN (or use rl.value_init policy)")
            value_rm = rm if cfg.rl.value_init in ("auto", "reward_model") else None

            def init_ppo(m):  # the policy from --init-from; the value model from the reward model (TRL) or the policy
                base(m.policy)
                if value_rm is None:
                    base(m.value.body)
                else:
                    m.value.start_from_reward_model(value_rm)

            if base is not None:  # a LoRA run's lora.base: the policy's starting model
                init_ppo.source = getattr(base, "source", "")  # type: ignore[attr-defined]
            init = None if base is None else init_ppo
        else:
            recipe = GRPO(cfg, template, tok, reward, reward_model=rm)
        result = train(cfg, recipe, resume=resume, force=args.force, init_weights=init)
    except (RLError, RewardError, ChatFormatError) as e:
        raise CliError(str(e)) from e
    return finish(result, "rl", cfg, args.init_from)


def _reward_model(path: str, template, reduce: str = "mean"):
    """``--reward-model RUN[,RUN...]``: a `gptforge rm` checkpoint (or an ensemble of them, read with
    ``reduce``) that scores the replies (same chat template); None without one."""
    from gptforge.run.checkpoint import CheckpointError
    from gptforge.training.rm import RewardEnsemble, load_reward_model

    rm = None
    if path:
        try:
            rm, rm_template = load_reward_model(path)
        except (ValueError, FileNotFoundError, CheckpointError) as e:
            raise CliError(flagged("--reward-model", e)) from e
        if (rm_template.to_dict() if rm_template else None) != (template.to_dict() if template else None):
            raise CliError(f"--reward-model {path}: its chat template differs from the policy's; the reward model "
                           "must read the replies as the policy writes them (train it from the same SFT checkpoint)")
    if isinstance(rm, RewardEnsemble):
        rm.reduce = reduce
    elif reduce != "mean":
        raise CliError(f"rl.reward_reduce {reduce} reads an ensemble: give --reward-model RUN1,RUN2[,...]")
    return rm


def args_rl(r: argparse.ArgumentParser) -> None:
    from gptforge.config import Config

    d = Config(train=rl_train_defaults(), optim=rl_optim_defaults())
    r.description = ("GRPO (or PPO with --algo ppo; a learned reward with --reward-model): sample a group of replies per problem, score them, group-relative advantages, clipped "
                     "ratio and a KL penalty to the starting model. Logs reward, KL, reply length and accuracy per "
                     "step to RUN/metrics.jsonl; checkpoints resume; runs under torchrun (rollouts split by rank). "
                     "Every config key can be set as --section.key VALUE (list them with --help-config: "
                     "the rl.* and optim.* sections); the flags below are short names for the common ones.")
    r.add_argument("--init-from", metavar="MODEL", help="a chat model: an SFT checkpoint or run directory, or a "
                                                        "GGUF file or Hugging Face directory with a chat template; with --resume: where the "
                                                        "run's model went if it was moved (it must hold the same weights)")
    r.add_argument("--out", required=True, help="run directory")
    r.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue the RL run in --out (or from CKPT); flags given now apply on top of its settings")
    r.add_argument("--force", action="store_true", help="start over in a run directory that holds checkpoints")
    add_trust_flag(r)
    r.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    add_help_config(r, "rl", _rl_defaults)
    r.add_argument("--task", choices=[*GENERATED_TASKS, "gsm8k"], help=f"the verifiable task whose problems are sampled and scored (default {d.rl.task})")
    r.add_argument("--reward", help="exact_match (default), exact_match_with_format, numeric_closeness, digit_match, or "
                                    "module:function taking (problem, reply) -> float (code: never read back from "
                                    "a checkpoint, give it again on --resume)")
    for name, tp, help_ in [
        ("steps", int, "optimizer steps (train.max_steps)"), ("prompts", int, "problems per step, all ranks"),
        ("group", int, "replies per problem"), ("max_new_tokens", int, "reply length cap"),
        ("temperature", float, "sampling temperature"), ("top_k", int, "0 = off"), ("lr", float, "learning rate"),
        ("warmup_steps", int, "linear LR warmup"),
        ("kl_coef", float, "KL penalty to the starting model (with --kl-target: its start)"),
        ("kl_target", float, "adaptive KL (Ziegler et al.): move the KL coefficient each step toward this logged "
                             "kl, by at most 20%% per rl.kl_horizon replies (0 = off)"),
        ("clip_eps", float, "ratio clip"), ("updates_per_batch", int, "optimizer steps per sampled batch"),
        ("micro_batch", int, "replies per forward"), ("eval_every", int, "steps between held-out evals (0 = start and end)"),
        ("eval_n", int, "held-out problems"), ("ckpt_every", int, "steps between checkpoints"),
        ("keep_ckpts", int, "newest checkpoints kept"), ("seed", int, "problems and sampling"),
    ]:
        key = RL_FLAGS[name]
        section, field = key.split(".")
        r.add_argument("--" + name.replace("_", "-"), dest=name, type=finite if tp is float else tp,
                       help=f"{help_}; --{key} (default {getattr(getattr(d, section), field)})")
    r.add_argument("--algo", choices=["grpo", "ppo"], help="grpo (default): group-relative advantages; ppo: a "
                                                          "value model, GAE, clipped policy and value losses, "
                                                          "the KL penalty in the per-token reward")
    r.add_argument("--reward-model", metavar="RUN", help="a `gptforge rm` run or checkpoint that scores the replies "
                                                         "instead of --reward (accuracy stays the true task's); "
                                                         "RUN1,RUN2,... = an ensemble, their mean score (or min: "
                                                         "--rl.reward_reduce min)")
    for name, help_ in [("gamma", "PPO discount (rl.gamma, default 1)"), ("lam", "PPO GAE lambda (rl.lam, default 0.95)"),
                        ("vf_coef", "PPO value-loss weight (rl.vf_coef, default 0.1)"),
                        ("clip_value", "PPO value clip (rl.clip_value, default 0.2)")]:
        r.add_argument("--" + name.replace("_", "-"), dest=name, type=float, help=help_)
    r.add_argument("--reward-norm", action="store_true", help="whiten the reward model's score (each ensemble "
                   "member's): shifted and scaled so the starting policy's replies of step 1 score mean 0, std 1, "
                   "which makes --kl-coef mean the same for any reward model (rl.reward_norm)")
    r.add_argument("--raw", action="store_true", help="no chat template: plain 'Question: ...\\nAnswer:' prompts")
    r.add_argument("--device", default=None, help="train.device (default auto)")


def rl_train_defaults():
    from gptforge.training.grpo import rl_config

    return rl_config(None, "runs/rl", "").train


def rl_optim_defaults():
    from gptforge.training.grpo import rl_config

    return rl_config(None, "runs/rl", "").optim
