"""What the command modules share: the bad-input error, the model-source flags, number parsing, and the
one path from a command line to a run (fresh, resumed or started over) that train, sft and rl take."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

# the architectures the GGUF reader takes (gguf_config imports no torch: --help stays instant)
from gptforge.argparsing import count, finite  # noqa: F401 (the commands' argparse types, re-exported)
from gptforge.errors import flagged
from gptforge.interop.gguf_config import ARCHITECTURES as GGUF_ARCHITECTURES

if TYPE_CHECKING:  # torch: imported only when a command runs, so `gptforge --help` stays instant
    from gptforge.load import ModelSource


EXIT_PORT_BUSY = 4  # serve: the port (or host) cannot be listened on; said before the model loads

def add_help_config(p: argparse.ArgumentParser, command: str, defaults: Callable) -> None:
    """``--help-config`` for a recipe command: every config key with its value in the command's own
    defaults (``defaults()`` builds them), printed and exit 0 as ``--help`` does, so it needs neither
    ``--out`` nor ``--init-from``."""

    class HelpConfig(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            from gptforge.config_help import describe_keys

            print(f"Config keys of `gptforge {command}` (set with --section.key VALUE), with its defaults; the "
                  f"model section comes from --init-from:\n" + describe_keys(defaults()))
            parser.exit(0)

    p.add_argument("--help-config", nargs=0, action=HelpConfig,
                   help=f"list every config key with its type and its default under `gptforge {command}`, and exit")


class CliError(Exception):
    """Bad input: printed without a traceback, exit status 2."""


def show_defaults(p: argparse.ArgumentParser) -> None:
    """Every option of a command, and of its sub-commands (``prepare files``), says its default in --help
    (unless its help already does, or the default is "not set": None, or False for a switch). A default of 0
    is a value to show: ``0 in (None, False)`` is true in Python, which hid ``eval --limit``'s."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                show_defaults(sub)
            continue
        default = action.default
        if (action.help == argparse.SUPPRESS or any(default is v for v in (None, False, argparse.SUPPRESS))
                or not action.option_strings or "default" in (action.help or "").lower()):
            continue
        action.help = f"{action.help} (default %(default)s)" if action.help else "default %(default)s"


DEVICE_HELP = "auto (cuda, else mps, else cpu), cpu, cuda, cuda:N or mps"
# GGUF_ARCHITECTURES: the reader's own tuple, so the help cannot drift from what it takes
GGUF_HELP = f"a GGUF file (llama.cpp, Ollama, LM Studio; architecture {', '.join(GGUF_ARCHITECTURES)})"


def add_model_source(p: argparse.ArgumentParser, without: tuple[str, ...] = ()) -> None:
    """The same model flags wherever a command takes a model (less ``without``: those it could never use)."""
    p.add_argument("--ckpt", help="checkpoint directory, or a run directory (its newest checkpoint)")
    p.add_argument("--hf", help="Hugging Face hub name (online) or save_pretrained directory")
    if "--llmc" not in without:
        p.add_argument("--llmc", help="llm.c model file (gpt2_124M.bin, version 3 or 5)")
    if "--random" not in without:
        p.add_argument("--random", metavar="SIZE", help="random weights of a model size (d2, gpt2, ...): "
                                                       "benchmarks and smoke tests")
    p.add_argument("--gguf", metavar="FILE", help=f"{GGUF_HELP}: its weights dequantized to float32, its tokenizer "
                                                  "and chat template")


def article(kind: str) -> str:
    """``an sft`` / ``an rm`` (read as letters: an S-F-T), ``a dpo``, ``a pretrain``."""
    return "an" if kind in ("sft", "rm") or kind[:1] in tuple("aeiou") else "a"


def flag_overrides(args: argparse.Namespace, keys: dict[str, str], overrides: list[str]) -> list[str]:
    """A command's own flags as --section.key overrides (only those given: None/False means not given).
    Which flag set which key is kept on ``args`` (``flag_keys``), so a refusal of the key also names
    the flag that was typed (:func:`name_flag`). A flag and its own key both given
    (``--steps 10 --train.max_steps 20``) are refused: one of them would silently lose."""
    typed = {a[2:].split("=", 1)[0] for a in overrides if a.startswith("--")}
    out: list[str] = []
    args.flag_keys = {}
    for flag, key in keys.items():
        v = getattr(args, flag, None)
        if v is not None and v is not False:
            name = f"--{flag.replace('_', '-')}"
            if key in typed:
                raise CliError(f"{name} and --{key} both set {key}: give one of them")
            out += [f"--{key}", str(v)]
            args.flag_keys[key] = f"{name} {v}"
    return out


def name_flag(msg: str, args: argparse.Namespace) -> str:
    """A refusal of a config key that one of the command's short flags set (``--steps -1`` sets
    ``train.max_steps``) starts with that flag as typed, unless it names it already: the user sees
    what they wrote, and the key in the message says where it goes."""
    import re

    typed = [t for key, t in getattr(args, "flag_keys", {}).items()
             if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", msg) and t.split()[0] not in msg]
    return f"{' '.join(typed)}: {msg}" if typed else msg


def model_source(args: argparse.Namespace) -> ModelSource:
    from gptforge.load import ModelSource

    src = ModelSource(ckpt=args.ckpt, hf=args.hf, llmc=getattr(args, "llmc", None), random=getattr(args, "random", None),
                      gguf=getattr(args, "gguf", None))
    if len(src.given()) != 1:
        flags = [f for f, dest in (("--ckpt DIR", "ckpt"), ("--hf NAME_OR_DIR", "hf"), ("--llmc FILE", "llmc"),
                                   ("--gguf FILE", "gguf"), ("--random SIZE", "random")) if hasattr(args, dest)]
        raise CliError(f"give exactly one of {', '.join(flags[:-1])} or {flags[-1]}")  # the ones this command has
    return src


def command_device(name: str):
    """The device a ``--device`` command runs on, with torch's CPU threads set as training sets them
    (``runtime.auto_threads``: ``OMP_NUM_THREADS`` when set, else one per process on CPU). torch's own
    default, one per core, made ``eval`` 2x and ``bench-generate`` 10x slower on a loaded 2-core machine."""
    from gptforge.runtime import resolve_device, set_threads

    device = resolve_device(name, flag="--device")
    set_threads(0, device)
    return device


def load(source: ModelSource, flag: str | None = None, announce_after: float | None = None):
    """``load.load_model`` with its bad-input errors as CliError; with ``flag`` (the command-line flag
    that named the model, e.g. ``--init-from``) every refusal of it, a missing or damaged checkpoint
    too, starts with that flag, so a command taking several models says which one is wrong."""
    from gptforge.errors import CheckpointError
    from gptforge.load import load_model

    try:
        return load_model(source, announce_after=announce_after)
    except ValueError as e:
        raise CliError(flagged(flag, e) if flag else str(e)) from e
    except (CheckpointError, FileNotFoundError) as e:
        if flag is None:
            raise
        raise CliError(flagged(flag, e)) from e


def base_shape(source: str):
    """The base model's config (the SFT config keeps its family and shape)."""
    from gptforge.load import ModelSource

    return load(ModelSource.from_path(source), "--init-from").config


def port(raw: str) -> int:
    """A TCP port number (argparse type): one line for 99999 instead of the server's tracebacks. 0 asks the
    system for a free port (the server prints the one it got), as a socket's bind does."""
    from gptforge.numbers import parse_int

    try:
        v = parse_int(raw)  # the one number parser: '８０００' and '80_00' refused as every numeric flag refuses them
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; not a port number") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{v} is not a TCP port; give 1 to 65535 (0: any free port)")
    return v


def chat_template_of(ckpt: str | None, tok=None):
    """The chat template a checkpoint (or run directory) carries, or None."""
    if ckpt is None:
        return None
    from gptforge.data.chat import ChatFormatError, template_from_meta
    from gptforge.run import checkpoint as ckpt_mod
    from gptforge.run.identity import resolve_checkpoint

    where = resolve_checkpoint(ckpt)
    try:
        return template_from_meta(ckpt_mod.read_meta(where), where=str(Path(where) / "meta.json"), tok=tok)
    except ChatFormatError as e:
        raise CliError(str(e)) from None


def words(source: ModelSource, model=None, flag: str | None = None, fallback: bool = False):
    """(tokenizer, chat template or None) of ``source``'s model: the one way every text command
    gets them (see :func:`gptforge.load.load_tokenizer_of`). ``model``: check the tokenizer fits its
    logits. ``fallback``: a recipe choosing a template to tune with (the tokenizer's own, else
    gptforge's for GPT-2). A damaged tokenizer or template is a CliError naming the file (and ``flag``)."""
    from gptforge.data.chat import ChatFormatError
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.load import load_chat_template_of, load_tokenizer_of

    try:
        tok = load_tokenizer_of(source, model)
        return tok, load_chat_template_of(source, tok, fallback=fallback)
    except (TokenizerError, ChatFormatError, ValueError) as e:  # ValueError: a GGUF file's GGUFReadError
        raise CliError(flagged(flag, e) if flag else str(e)) from None


def run_words(resume, meta: dict | None, cfg, init_from_path: str | None, fallback: bool = True):
    """(tokenizer, chat template) of a fine-tuning run (sft, rl, rm, dpo): a resumed run's from its
    checkpoint; a fresh one's from ``--init-from`` (with ``fallback``, a base model gets the template
    its tokenizer brings, else gptforge's for GPT-2)."""
    from gptforge.data.chat import ChatFormatError, template_from_dict
    from gptforge.data.tokenizer import TokenizerError, tokenizer_from_meta
    from gptforge.load import ModelSource

    if resume is None:
        return words(ModelSource.from_path(init_from_path), flag="--init-from", fallback=fallback)
    from gptforge.run.resume import recipe_of

    d = meta.get("chat_template")
    if (d is None and recipe_of(meta) in ("sft", "rm", "dpo")) or ("chat_template" not in meta and "recipe" in meta):
        # every fine-tuning checkpoint records the template it was trained with (RL's is null under --raw)
        raise CliError(f"--resume: {resume}/meta.json has no chat_template, which every {recipe_of(meta)} checkpoint "
                       "records; the checkpoint is damaged: resume from an earlier one (--resume RUN/checkpoints/"
                       "step_N)")
    try:
        tok = tokenizer_from_meta(meta, resume)
        chat = template_from_dict(d, f"{resume}/meta.json", cfg.model.vocab_size, tok=tok) if d else None
    except (TokenizerError, ChatFormatError) as e:
        raise CliError(flagged("--resume", e)) from None
    return tok, chat


def text_encoder(tok, chat):
    """What a generation stream decodes with: the tokenizer, wrapped so gptforge's own chat ids (on
    GPT-2's padded rows) print by name."""
    if chat is None:
        return tok
    from gptforge.data.chat import ChatTokenizer

    return ChatTokenizer(tok, chat)


# --- the one resume / force path of train, sft and rl ----------------------------------------------

def override_text(overrides: list[str], key: str) -> str | None:
    """The value ``--key VALUE`` / ``--key=VALUE`` gives among ``overrides`` (the last one; the parser refuses two
    that differ), or None."""
    found = None
    for i, a in enumerate(overrides):
        if a == f"--{key}" and i + 1 < len(overrides):
            found = overrides[i + 1]
        elif a.startswith(f"--{key}="):
            found = a.split("=", 1)[1]
    return found


def refuse_flag_and_key(flag: str, value: object, key: str, overrides: list[str]) -> None:
    """A command's own flag and the config key it stands for (``--out`` and ``--train.out_dir``,
    ``--trust-checkpoint`` and ``--train.trust_checkpoint``) both on one command line with different values are
    refused naming both: the flag was applied after the overrides (or OR'ed with them) and silently won."""
    given = override_text(overrides, key)
    if value is None or value is False or given is None:
        return
    if isinstance(value, bool):
        from gptforge.config import ConfigError, parse_value

        try:
            same = parse_value(key, given, bool) is value
        except ConfigError:
            return  # not a boolean: apply_overrides names it
        shown = flag
    else:
        same, shown = given == str(value), f"{flag} {value!r}"
    if not same:
        raise CliError(f"{shown} and --{key} {given!r} both set {key}: give one of them")


def trusted(args: argparse.Namespace, overrides: list[str]) -> bool:
    """--trust-checkpoint (or --train.trust_checkpoint true) on this command line: never from a checkpoint. The
    flag with ``--train.trust_checkpoint false`` is refused, not trusted."""
    from gptforge.config import parse_value

    flag = bool(getattr(args, "trust_checkpoint", False))  # rm and dpo have only the key
    refuse_flag_and_key("--trust-checkpoint", flag, "train.trust_checkpoint", overrides)
    given = override_text(overrides, "train.trust_checkpoint")
    return flag or (given is not None and bool(parse_value("train.trust_checkpoint", given, bool)))


def resolve_run(out: str | None, resume: str | None, overrides: list[str], recipe: str | tuple[str, ...], fresh: Callable[[], object],
                trusted: bool = False, frozen: tuple[str, ...] = (), default_out: str | None = None,
                same_as: tuple[tuple[str, object, str], ...] = ()):
    """(config, checkpoint to resume or None, its meta or None) for ``gptforge train|sft|rl``.

    A fresh run is ``fresh()`` (a preset or the recipe's defaults with this command line applied). A
    resumed run is the checkpoint's own config with this command line's overrides on top, all of them
    applied (``frozen`` keys refused if changed), written to ``out``, else to the run the ``--resume``
    path names, else to ``default_out``; never where the checkpoint says it came from. It must be a run
    of the same recipe (or one of a tuple: ``rl`` continues GRPO and PPO). Trust comes only from this command line. ``--force`` (start over) is the
    loop's, after data and model are known to be good. An override the run would ignore (another command's
    section, or a key that acts only under a setting this run lacks) is refused here, for every command, and so are
    a flag and the key it stands for with different values (``--out`` and ``train.out_dir``; ``same_as``: the
    command's others, as (flag, value, key))."""
    from gptforge.config_inert import refuse_inert_overrides
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.checkpointer import Checkpointer
    from gptforge.run.identity import resolve_checkpoint
    from gptforge.run.resume import COMMAND_OF, absolute_model_paths, check_models_present, recipe_of, resume_config
    from gptforge.run.weights import check_weights_fit

    # --out is applied last, a recipe's --init-from beside its key: with the key given too, one would lose silently
    for flag, value, key in (("--out", out, "train.out_dir"), *same_as):
        refuse_flag_and_key(flag, value, key, overrides)
    if resume is None:
        cfg = fresh()
        kind = recipe if isinstance(recipe, str) else recipe[0]
        refuse_inert_overrides(cfg, overrides, kind, COMMAND_OF[kind])
        cfg.train.trust_checkpoint = trusted
        absolute_model_paths(cfg)  # so a resume from another directory finds the reward/reference models
        return cfg, None, None
    run_dir = out
    if run_dir is None and resume != "latest":  # --resume PATH: the run that PATH is in
        where = resolve_checkpoint(resume)
        run_dir = str(where.parent.parent if where.parent.name == "checkpoints" else where)
    run_dir = run_dir or default_out
    if not run_dir:
        raise CliError("--resume needs --out RUN_DIR (or the checkpoint itself: --resume RUN/checkpoints/step_N)")
    found = Checkpointer.find(run_dir, resume, warn=lambda m: print(m, file=sys.stderr))
    meta = ckpt.read_meta(found)
    ckpt.check_resume_meta(meta, found / "meta.json")  # the step, world and RNG it will continue from
    kind = recipe_of(meta)
    if kind not in ((recipe,) if isinstance(recipe, str) else recipe):
        name = recipe if isinstance(recipe, str) else COMMAND_OF[recipe[0]]
        raise CliError(f"--resume: {found} is {article(kind)} {kind} checkpoint; continue it with `gptforge {COMMAND_OF[kind]} "
                       f"--out {run_dir} --resume`, or start a new {name} run from it with --init-from")
    cfg = resume_config(meta, overrides, run_dir, frozen, where=str(found / "meta.json"))
    refuse_inert_overrides(cfg, overrides, kind, COMMAND_OF[kind])
    absolute_model_paths(cfg)  # a model given anew on this command line (--init-from NEWPATH), as a fresh run's
    check_models_present(cfg, str(found / "meta.json"))  # the reference, reward models, a LoRA base are there: before
    # any work (their weights are the Checkpointer's to check, hashed once a machine when the process group exists)
    check_weights_fit(found, cfg.model)  # meta.json's shape against the weights file, before anything else
    cfg.train.trust_checkpoint = trusted
    return cfg, found, meta


def init_from(source: str, cfg) -> Callable:
    """Fine-tuning: take the model's family and shape from a gptforge checkpoint, a Hugging Face
    directory or an llm.c model file (so it overrides the preset's) and return a function that copies
    its weights in."""
    from gptforge.load import ModelSource

    src = load(ModelSource.from_path(source), "--init-from")
    knobs = {k: getattr(cfg.model, k) for k in ("dropout", "recompute", "flash")  # training knobs stay the preset's
             if hasattr(cfg.model, k) and hasattr(src.config, k)}
    cfg.model = dataclasses.replace(src.config, **knobs)
    sd = src.state_dict()

    def init_weights(model) -> None:
        model.load_state_dict(sd)

    init_weights.source = os.path.abspath(source)  # type: ignore[attr-defined]  # a LoRA run's lora.base
    return init_weights


_COMMAND_T0: float | None = None  # perf_counter() when cli.main began this command


def mark_command_start() -> None:
    """Called first thing by ``cli.main``: a run's summary times the whole command from here (loading the
    model, preparing the data, a reference pass, the steps and the last checkpoint), not only its loop.
    What comes before it is the interpreter's start and ``import gptforge.cli``: a quarter of a second."""
    global _COMMAND_T0
    import time

    _COMMAND_T0 = time.perf_counter()


def command_seconds() -> float | None:
    """Seconds since :func:`mark_command_start`; None outside ``cli.main`` (a library caller)."""
    import time

    return None if _COMMAND_T0 is None else time.perf_counter() - _COMMAND_T0


def finish(result, command: str, cfg=None, start: str | None = None) -> int:
    """The end of a training command: the run's summary on rank 0 (:func:`summary`), then the exit
    status: 3 diverged (nothing saved past the last good checkpoint), 130 stopped by a signal (0 under
    torchrun; see run.faults.exit_status), 0 done."""
    import os

    from gptforge.run.faults import exit_status

    if result.complete:  # a finished run resumed: its notice said so and how to extend it; nothing to sum up
        return 0
    if os.environ.get("RANK", "0") == "0" and result.diverged_at is None:
        print(summary(result, command, cfg, start, whole=command_seconds()), flush=True)
    if result.diverged_at is not None:
        print(f"gptforge {command}: the run diverged (not finite) at step {result.diverged_at} (see the log line above); "
              f"nothing was saved past the last checkpoint: lower --optim.lr or check the data or reward, then "
              f"resume with --resume", file=sys.stderr)
        return 3
    return exit_status(result.interrupted)


def summary(result, command: str, cfg=None, start: str | None = None, whole: float | None = None) -> str:
    """What a finished (or stopped) train/sft/rl/dpo/rm run did and what to do next: steps, tokens, time
    (``whole``: the command's, from :func:`command_seconds`, with the steps' share beside it),
    best and final val loss, held-out rates with their interval and chance level (eval.stats.fmt_rate),
    rewards with their scale, the checkpoint, and next commands built from the run's own settings."""
    from gptforge.eval.stats import GENERATIVE_CHANCE, fmt_rate
    from gptforge.run.metrics import fmt_duration, iter_metrics

    run = str(result.run_dir)
    lines = [f"--- {command} summary: {run}"]
    steps = f"{result.steps_done}"
    if result.train_losses:
        steps += f" (this invocation trained {min(result.train_losses)}-{max(result.train_losses)})"
    lines.append(f"steps       {steps}")
    if result.tokens:
        lines.append(f"tokens      {result.tokens:,}")
    if whole is None:
        lines.append(f"time        {fmt_duration(result.seconds)}")
    else:  # the wait the user had, then the steps' part of it (the rest: loading, data, reference pass, saving)
        lines.append(f"time        {fmt_duration(whole)} (the whole command; {fmt_duration(result.seconds)} in the "
                     f"training loop)")
    if result.val_losses:
        best = min(result.val_losses, key=result.val_losses.get)
        last = max(result.val_losses)
        unit = {"rm": "Bradley-Terry, nats/pair; 0.6931 = guessing", "dpo": "nats/pair; 0.6931 = the reference"}
        lines.append(f"val loss    best {result.val_losses[best]:.4f} (step {best}), final "
                     f"{result.val_losses[last]:.4f} (step {last}) ({unit.get(command, 'nats/token')})")
    from gptforge.cli.hints import next_commands, q, run_hints

    hints = run_hints(command, cfg, start)
    try:
        evals = [r for r in iter_metrics(result.run_dir, warn=lambda m: None) if r.get("kind") == "eval"]
    except OSError:
        evals = []
    if command == "rl":
        if "reward" in result.last_stats:
            lines.append("reward      " + reward_words(cfg, result.last_stats["reward"], result.steps_done))
        if evals:
            first, last_eval = evals[0], evals[-1]
            task = last_eval.get("task") or hints["task"]
            hints["task"] = task
            n = int(last_eval.get("n", 0) or 0)
            chance = GENERATIVE_CHANCE.get(task)
            if n:
                lines.append(f"held-out    {task}: " + fmt_rate(f"accuracy (step {first['step']})", first["acc"], n, chance))
                lines.append(f"held-out    {task}: " + fmt_rate(f"accuracy (step {last_eval['step']})", last_eval["acc"],
                                                                  n, chance))
    elif command == "train" and evals:  # the in-loop task evals (eval.every): each task's last
        for name in dict.fromkeys(r.get("task") for r in evals if r.get("task")):
            r = [e for e in evals if e.get("task") == name][-1]
            key = "acc_norm" if "acc_norm" in r else "acc"
            if r.get(key) is not None and r.get("n"):
                lines.append(f"eval        {name}: " + fmt_rate(f"{key} (step {r['step']})", r[key], int(r["n"]),
                                                                r.get("chance")))
    elif command in ("rm", "dpo") and evals:
        last_eval = evals[-1]
        n = int(last_eval.get("n", 0) or 0)
        acc = last_eval.get("accuracy", last_eval.get("rewards/accuracies"))
        what = "reward model scores chosen above rejected" if command == "rm" else "implicit reward ranks chosen first"
        if acc is not None and n:
            lines.append("held-out    " + fmt_rate(f"pair accuracy ({what})", acc, n, chance=0.5,
                                                   hint="the model prefers the rejected replies: check the pairs' "
                                                        "chosen/rejected order, or lower the learning rate"))
        task = cfg.dpo.task if command == "dpo" and cfg is not None else ""
        if task and f"{task}_acc" in last_eval and last_eval.get("task_n"):
            lines.append(f"held-out    {task}: " + fmt_rate("greedy accuracy", last_eval[f"{task}_acc"],
                                                            int(last_eval["task_n"]), GENERATIVE_CHANCE.get(task)))
    ckpt = result.last_checkpoint
    lines.append(f"checkpoint  {ckpt if ckpt is not None else '(none written by this invocation)'}")
    if result.stop_reason in ("signal", "stop_at_step"):
        lines.append(f"continue    gptforge {command} --out {q(run)} --resume")
    lines.append("next:")
    lines += [f"  {c}" for c in next_commands(command, run, **hints)]
    return "\n".join(lines)


def reward_words(cfg, value: float, step: int) -> str:
    """The final RL reward with its scale: a reward model's logit score, or the reward function's value."""
    from gptforge.eval.stats import RM_SCORE_SCALE, fmt_score

    if cfg is not None and cfg.rl.reward_model:
        return fmt_score("final", value, f"step {step}, training problems; mean {RM_SCORE_SCALE}")
    fn = (cfg.rl.reward if cfg is not None else "") or "the task's exact match, 1 right and 0 wrong"
    return fmt_score("final", value, f"step {step}, training problems; reward function: {fn}; mean per reply")
