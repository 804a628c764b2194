"""What a ``--resume`` will do, said before it does it: a finished run, or a run being extended.

    gptforge train --preset shakespeare-cpu --resume                         # "run ... is complete"
    gptforge train --preset shakespeare-cpu --resume --train.max_steps 400   # extend it
    gptforge dpo --out runs/dpo --resume --train.max_steps 400               # every recipe's resume alike

Every recipe's resume says it (sft, rl, rm and dpo as train): :class:`gptforge.run.session.RunSession`
calls :func:`check_resume` once it knows the checkpoint, and the loop trains nothing on a complete run.

* **A finished run** (its newest checkpoint is at ``train.max_steps``) trains nothing: resuming it
  says so, how to extend it, and exits 0 (the default job re-runs ``--resume`` every time).
* **Extending** (``--resume --train.max_steps N`` with N above the checkpoint's): the LR schedule
  is a function of ``train.max_steps`` (:func:`gptforge.optim.schedule.lr_at`, llm.c's warmup +
  cosine), and the checkpoint stores no schedule of its own, so the cosine is **stretched** over the
  new length, as llm.c does when resumed with a larger ``-x``. The learning rate therefore jumps
  up at the resume step, from the end of the old decay to its point on the longer one (a warm
  restart). That is the documented choice: it keeps one schedule formula for fresh and resumed
  runs, and it still trains when ``optim.min_lr_frac`` is 0 (continuing at the old minimum would
  train at lr 0). The jump is printed with both values.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gptforge import environment
from gptforge.config import Config, ConfigError
from gptforge.optim import lr_at

COMMAND_OF = {"pretrain": "train", "sft": "sft", "grpo": "rl", "ppo": "rl", "rm": "rm", "dpo": "dpo"}  # recipe -> the command that continues it
# what a finished run of a recipe is for: a reward model does not generate text (sample/chat would refuse it)
USE_OF = {"pretrain": "gptforge sample --ckpt {run}", "rm": "gptforge eval --ckpt {run} --preferences PAIRS.jsonl"}


def resume_notice(saved: Config, cfg: Config, step: int, where: Path,
                  recipe: str = "pretrain") -> tuple[bool, str | None]:
    """(complete, message) for resuming the checkpoint ``where`` at ``step``, saved with config
    ``saved``, under ``cfg`` (the saved config with this command line's overrides), by ``recipe`` (its
    command is the one the message tells to extend the run with)."""
    run = where.parent.parent if where.parent.name == "checkpoints" else where
    new, old = cfg.train.max_steps, saved.train.max_steps
    if step >= new and cfg.model == saved.model:  # a changed model goes on to be checked against the weights
        suggest = max(2 * step, step + 1)
        use = USE_OF.get(recipe, "gptforge chat --ckpt {run}").format(run=run)
        return True, (
            f"run {run} is complete: its newest checkpoint ({where.name}) is at step {step} of "
            f"train.max_steps {new}; nothing to train. To train further: gptforge {COMMAND_OF.get(recipe, recipe)} "
            f"--out {run} --resume --train.max_steps {suggest} (the LR schedule is stretched to the new length). "
            f"To use it: {use}")
    if new != old:
        before = lr_at(step, saved.optim, old) if step < old else saved.optim.lr * saved.optim.min_lr_frac
        after = lr_at(step, cfg.optim, new)
        verb, how = ("extending", "stretched") if new > old else ("shortening", "compressed")
        shape = "warmup + cosine" if cfg.optim.schedule == "cosine" else "warmup, stable, linear cooldown"
        # the figures as the step log lines print them (``lr 5.50e-04`` on the line of step N + 1)
        return False, (
            f"{verb} the run from train.max_steps {old} to {new}: the LR schedule ({shape}) is "
            f"{how} over {new} steps, so the log's first line (step {step + 1}) shows lr {after:.2e} (the "
            f"old schedule had {before:.2e}); it decays to {cfg.optim.lr * cfg.optim.min_lr_frac:.2e} at step {new}")
    changed = schedule_changes(saved, cfg)
    if changed:  # the same length, another schedule: the lr jumps at the resume step, as when extending
        before = lr_at(step, saved.optim, old) if step < old else saved.optim.lr * saved.optim.min_lr_frac
        after = lr_at(step, cfg.optim, new)
        return False, (
            f"resuming at step {step} with a changed learning-rate schedule ({', '.join(changed)}; saved -> this run): "
            f"the log's first line (step {step + 1}) shows lr {after:.2e} where the saved schedule had {before:.2e}; "
            f"it decays to {cfg.optim.lr * cfg.optim.min_lr_frac:.2e} at step {new}")
    return False, None


# the settings the learning rate at a step is made of (optim.schedule.lr_at, and each group's base lr)
SCHEDULE_KEYS = ("lr", "warmup_steps", "schedule", "min_lr_frac", "cooldown_frac", "embed_lr", "muon_lr")


def schedule_changes(saved: Config, cfg: Config) -> list[str]:
    """``optim.KEY OLD -> NEW`` for each setting of the learning-rate schedule this run changes from the saved
    one; cooldown_frac only where a schedule is wsd, muon_lr only where the optimizer is Muon (elsewhere inert)."""
    a, b = saved.optim, cfg.optim
    out = []
    for key in SCHEDULE_KEYS:
        if key == "cooldown_frac" and "wsd" not in (a.schedule, b.schedule):
            continue
        if key == "muon_lr" and "muon" not in (a.name, b.name):
            continue
        old, new = getattr(a, key), getattr(b, key)
        if old != new:
            out.append(f"optim.{key} {old:g} -> {new:g}" if isinstance(old, (int, float)) else f"optim.{key} {old} -> {new}")
    return out


def check_resume(saved: Config, cfg: Config, step: int, where: Path, recipe: str = "pretrain") -> bool:
    """Print the notice (rank 0 only under torchrun); True when the run is complete and nothing is to be done.
    Every recipe's resume comes here, from :class:`gptforge.run.session.RunSession`."""
    complete, message = resume_notice(saved, cfg, step, where, recipe)
    if message and environment.number("RANK", 0) == 0:
        print(message, flush=True)
    return complete


# --- the one path from a command line to a resumed run's config -----------------------------------

_LEGACY_RL_KEYS = {  # flat RLConfig fields of checkpoints written before rl became a Config section
    "steps": ("train", "max_steps"), "lr": ("optim", "lr"), "warmup_steps": ("optim", "warmup_steps"),
    "weight_decay": ("optim", "weight_decay"), "grad_clip": ("optim", "grad_clip"),
    "ckpt_every": ("train", "ckpt_every"), "keep_ckpts": ("train", "keep_ckpts"), "seed": ("train", "seed"),
    "device": ("train", "device"), "micro_batch": ("train", "micro_batch"), "out_dir": ("train", "out_dir"),
}


def recipe_of(meta: dict) -> str:
    """The recipe that wrote a checkpoint: pretrain, sft or grpo (older checkpoints by their keys)."""
    if isinstance(meta.get("recipe"), str):
        return meta["recipe"]
    return "grpo" if "rl" in meta else "sft" if "sft" in meta else "pretrain"


def saved_config(meta: dict, where: str = "meta.json") -> Config:
    """The config a checkpoint was trained with; SFT and RL checkpoints written before ``sft`` and ``rl``
    became sections of the config (their settings sat beside it in meta.json) are read into today's keys.
    A damaged config (not an object, a section that is not one, a value of the wrong type or range) is a
    ConfigError naming ``where`` (the meta.json) and the field, never a TypeError from inside."""
    conf = meta.get("config")
    if not isinstance(conf, dict):
        raise ConfigError(f"{where}: config = {conf!r:.80}: expected an object (the saved config is damaged)")
    sections = {f.name for f in dataclasses.fields(Config)}
    for k, v in conf.items():
        if k in sections and not isinstance(v, dict):
            raise ConfigError(f"{where}: config.{k} = {v!r:.80}: expected an object (the saved config is damaged)")
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in conf.items()}
    for legacy in ("sft", "rl"):  # read below only where the config lacks the section: refused there if damaged
        if meta.get(legacy) is not None and legacy not in d and not isinstance(meta[legacy], dict):
            raise ConfigError(f"{where}: {legacy} = {meta[legacy]!r:.80}: expected an object (an older checkpoint's "
                              f"{legacy} settings; the saved config is damaged)")
    if isinstance(meta.get("sft"), dict) and "sft" not in d:
        d["sft"] = dict(meta["sft"])
    if isinstance(meta.get("rl"), dict) and "rl" not in d:
        rl = dict(meta["rl"])
        for old, (section, key) in _LEGACY_RL_KEYS.items():
            if old in rl:
                d.setdefault(section, {})[key] = rl.pop(old)
        d["rl"] = rl
    try:
        return Config.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e


# config keys that name other models (comma-separated checkpoint paths): saved as absolute paths, and on
# resume compared by the models' weights (the sha256 meta.json records for model.safetensors), not spelling
MODEL_PATH_KEYS = ("rl.reward_model", "rl.init_from", "dpo.init_from", "lora.base")


def absolute_model_paths(cfg: Config) -> None:
    """A fresh run's model-path keys as absolute paths, so a resume from another directory finds them."""
    for key in MODEL_PATH_KEYS:
        section, name = key.split(".", 1)
        sec = getattr(cfg, section, None)
        value = getattr(sec, name, "") if sec is not None else ""
        if value:
            setattr(sec, name, ",".join(os.path.abspath(p.strip()) if p.strip() else p for p in value.split(",")))


def model_identity(path: str) -> str | None:
    """The sha256 of the weights a model path holds, for every kind ``--init-from`` takes: a gptforge checkpoint
    (or a run directory's newest) by the checksum its meta.json records for model.safetensors; a GGUF or llm.c
    file, and a Hugging Face folder (its config.json and the safetensors files its loader reads), by their bytes
    (:func:`files_digest`). None when it cannot be read (then only the spelling can be compared)."""
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.identity import resolve_checkpoint

    p = Path(path)
    try:
        if p.is_file():  # GGUF or llm.c: the one file that is loaded
            return files_digest([p], str(p))
        if (p / "config.json").is_file() and not (p / "meta.json").exists() and not ckpt.ckpt_root(p).is_dir():
            from gptforge.interop.hf_folder import safetensors_files  # what load.ModelSource.from_path calls hf

            return files_digest([p / "config.json", *safetensors_files(p)], str(p))
        where = resolve_checkpoint(path)
        files = ckpt.read_meta(where).get("files") or {}
        return files.get("model.safetensors") or files_digest([where / "model.safetensors"], str(where))
    except (ckpt.CheckpointError, OSError, ValueError):  # HFModelError is a CheckpointError
        return None


MIB = 1 << 20
SAY_AFTER_S = 1.0  # a hash still running after this long says what it reads, then shows a bar (GBs take a while)
RACY_NS = 2_000_000_000  # the coarsest file clock's tick (FAT's 2 s)
_digests: dict[tuple, str] = {}  # the files' (path, size, mtime, ctime, inode) -> digest: each model hashed once


def files_digest(files: list[Path], what: str) -> str:
    """sha256 over ``files`` (one file: its own sha256; several: over each one's name and sha256, in order).
    Read once per process while the files are unchanged (the record, the resume check and DPO's reference
    cache ask for the same model). A hash that runs past ``SAY_AFTER_S`` says on stderr what it is reading
    and how big, then shows a progress bar over the bytes (rank 0 only)."""
    import hashlib
    import sys
    import time

    from gptforge.storage.digest import sha256_file

    stats = [(f, f.stat()) for f in files]
    key = tuple((str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for f, st in stats)
    if key in _digests:
        return _digests[key]
    # a file written within a timestamp tick of now may change again with the same stamp (git's "racily
    # clean"): hashed, but not remembered
    stamped_before = time.time_ns() - RACY_NS
    total, done, bar, t0 = sum(st.st_size for _, st in stats), 0, None, time.perf_counter()
    shown = environment.number("RANK", 0) == 0

    def on_block(n: int) -> None:
        nonlocal done, bar
        done += n
        if bar is None and shown and time.perf_counter() - t0 >= SAY_AFTER_S:
            from gptforge.progress import progress_bar

            print(f"hashing {what} ({total / 1e9:.2f} GB): the run's meta.json names the weights it uses "
                  "by their sha256, and a resume checks them ...", file=sys.stderr, flush=True)
            bar = progress_bar(-(-total // MIB), f"sha256 {Path(what).name}", "MiB")
        if bar is not None:
            bar.update(-(-done // MIB) - bar.n)  # whole MiB read so far (the last one partly)

    try:
        shas = [sha256_file(f, on_block) for f, _ in stats]
    finally:
        if bar is not None:
            bar.close()
    if len(files) == 1:
        digest = shas[0]
    else:
        digest = hashlib.sha256("".join(f"{f.name}|{s}|" for f, s in zip(files, shas, strict=True)).encode()).hexdigest()
    if all(max(st.st_mtime_ns, st.st_ctime_ns) < stamped_before for _, st in stats):
        _digests[key] = digest
    return digest


# what each model-path key is to the run, for the one line that names it; and the flag that gives it anew
MODEL_ROLE = {"rl.init_from": ("the run's starting model and its frozen reference (the KL penalty's)", "--init-from"),
              "dpo.init_from": ("the run's starting model and its frozen reference", "--init-from"),
              "rl.reward_model": ("a reward model the run scores with", "--reward-model"),
              "lora.base": ("the frozen base model its adapters are trained on", "--lora.base")}


def split_paths(value: str) -> list[str]:
    return [p.strip() for p in value.split(",")] if value else []


def model_paths(cfg: Config, key: str) -> list[str]:
    """The paths a model-path key (``rl.reward_model``: comma-separated) names in ``cfg``; [] where it is unset."""
    section, name = key.split(".", 1)
    return split_paths(getattr(getattr(cfg, section, None), name, "") or "")


def recorded_models(cfg: Config, meta: dict | None = None) -> dict[str, list[str | None]]:
    """meta.json's ``models``: {key: [sha256 of each model's weights]} for the run's model-path keys, so a
    resume can check a model given anew (``--init-from NEWPATH`` after a move) against the one the run was
    trained with even when that path is gone. Carried from the resumed checkpoint (``meta``) where it holds
    one for the same key; read from the models themselves otherwise (a fresh run, or a model a run recorded
    none for: a Hugging Face folder or GGUF file before they had one)."""
    old = meta.get("models") if isinstance(meta, dict) and isinstance(meta.get("models"), dict) else {}
    out: dict[str, list[str | None]] = {}
    for key in MODEL_PATH_KEYS:
        paths = model_paths(cfg, key)
        if not paths:
            continue
        kept = old.get(key)
        if not (isinstance(kept, list) and len(kept) == len(paths)):
            kept = [None] * len(paths)
        out[key] = [k if isinstance(k, str) else model_identity(p) for k, p in zip(kept, paths, strict=True)]
    return out


def same_models(old: str, new: str, key: str, recorded: list | None = None, where: str = "meta.json") -> bool:
    """Whether two comma-separated model-path lists name the same weights in the same order; the run's own
    record (``recorded``: meta.json's ``models``, one sha256 a path) stands for the old path where it holds one
    (the path may be gone, moved, or hold something else now), else the old path is read. Refuses (ConfigError
    naming both) when a path cannot be read and nothing stands in for it."""
    a, b = split_paths(old), split_paths(new)
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        iy = model_identity(y)
        if isinstance(recorded, list) and len(recorded) == len(a) and isinstance(recorded[i], str):
            ix = recorded[i]  # what the run trained with, whatever the old path holds now: no second model hashed
        else:
            ix = model_identity(x)
        if iy is None:
            raise ConfigError(f"--{key} {y!r}: no readable checkpoint there to compare with the run's {x!r}")
        if ix is None:
            raise ConfigError(f"--{key}: this run was trained with {x!r}, which cannot be read any more, so {y!r} "
                              "cannot be checked to be the same model; put it back, or start a new run")
        if ix != iy:
            return False
    return True


def check_models_present(cfg: Config, where: str) -> None:
    """Before a resume builds anything: every model the resumed run reads again (its reference, reward models,
    a LoRA base) is where its config says, else one line naming the key, where it was recorded, and what to
    do (put it back, or give its new place with the flag, checked against the weights sha256 the run recorded).
    Reads no file: every rank of a job may run it before the process group exists. That a model holds the
    weights the run recorded is :func:`changed_model`'s, once a machine, after the group is joined."""
    for key, paths in _read_again(cfg):
        role, flag = MODEL_ROLE[key]
        for p in paths:
            if p and not os.path.exists(p):
                raise ConfigError(
                    f"--resume: {key} = {p!r} does not exist any more (deleted, moved, or a disk not mounted); it "
                    f"is {role}, recorded in {where} (config.{key}). Put it back, or give its new place with "
                    f"{flag} NEWPATH (checked to hold the same weights the run recorded)")


def changed_model(cfg: Config, where: str, meta: dict | None) -> str | None:
    """The refusal of a resume whose model (its reference, reward models, a LoRA base) holds other weights than
    the run recorded in ``meta``'s ``models``: a model replaced or edited in place, whatever its kind, or one
    named anew on this command line (``--init-from NEWPATH``) that is another model or cannot be read. One line
    naming the key and the path; None when each is the same or nothing was recorded. Hashes the models (GBs):
    the Checkpointer asks it once a machine (``parallel.distributed.once_per_machine``), not once a rank."""
    recorded = meta.get("models") if isinstance(meta, dict) and isinstance(meta.get("models"), dict) else {}
    try:
        saved = saved_config(meta or {}, where)
    except ConfigError:
        saved = None
    reread = {key for key, _ in _read_again(cfg)}
    for key in MODEL_PATH_KEYS:
        paths, olds = model_paths(cfg, key), model_paths(saved, key) if saved is not None else []
        role, flag = MODEL_ROLE[key]
        shas = recorded.get(key) if isinstance(recorded.get(key), list) and len(recorded[key]) == len(paths) else []
        for i, p in enumerate(paths):
            old = olds[i] if len(olds) == len(paths) else p
            if not (p and shas and isinstance(shas[i], str)) or (p == old and key not in reread):
                continue
            now = model_identity(p)
            if p != old and now is None:
                return f"--{key} {p!r}: no readable checkpoint there to compare with the run's {old!r}"
            if p != old and now != shas[i]:
                return other_weights(key, p, old, where)
            if now is not None and now != shas[i]:
                return (f"--resume: {key} = {p!r} holds other weights than this run was trained with (sha256 "
                        f"{now[:12]}, but {where} records {shas[i][:12]}: replaced or changed since); it is {role}, "
                        f"which a resume cannot change: put that model back as it was, or start a new run with --out "
                        f"elsewhere")
    return None


def other_weights(key: str, new: str, old: str, where: str) -> str:
    """The refusal of a model named anew on a resume that holds other weights than the run's."""
    role, flag = MODEL_ROLE.get(key, ("a model the run uses", f"--{key}"))
    return (f"--{key} {new!r}: other weights than {old!r}, which this run was trained with (their sha256 is in "
            f"{where}); it is {role}, which a resume cannot change: give that model ({flag} PATH where it is now), "
            "or start a new run with --out elsewhere")


def _read_again(cfg: Config) -> list[tuple[str, list[str]]]:
    """(key, its paths) of every model a resumed run reads again. RL reads ``rl.init_from`` only for its KL
    reference (``rl.kl_coef`` > 0, no LoRA: a LoRA run's is its base)."""
    out = []
    for key in MODEL_PATH_KEYS:
        if key == "rl.init_from" and (cfg.rl.kl_coef <= 0 or cfg.lora.rank):
            continue
        out.append((key, model_paths(cfg, key)))
    return out


def resume_config(meta: dict, overrides: list[str], out_dir: str, frozen: tuple[str, ...] = (),
                  where: str = "meta.json") -> Config:
    """A resumed run's config: the checkpoint's own, with this command line's overrides on top; every
    override applies (none is silently dropped), and a key in ``frozen`` (one whose change would make
    the run another run, e.g. which conversations are held out) is refused naming it. Every model the run read
    is frozen so, whatever ``frozen`` says: named anew (``--init-from NEWPATH``), it must hold the weights the
    run recorded, which :func:`changed_model` checks once the process group exists. The run is
    written where this command line says (``out_dir``), never where the checkpoint says it came from;
    trust (``train.trust_checkpoint``) is never taken from the checkpoint. ``where``: the meta.json, named
    by a damaged config's refusal."""
    from gptforge.config import apply_overrides

    saved = saved_config(meta, where)
    cfg = apply_overrides(saved_config(meta, where), overrides)
    # every model the run read is frozen too, whatever the command (a LoRA base was not): named anew, it must
    # hold the weights the run recorded
    read = tuple(k for k in MODEL_PATH_KEYS if model_paths(saved, k))
    for key in dict.fromkeys((*frozen, *read)):
        section, name = key.split(".", 1)
        old, new = getattr(getattr(saved, section), name), getattr(getattr(cfg, section), name)
        models = meta.get("models") if isinstance(meta.get("models"), dict) else {}
        if key in MODEL_PATH_KEYS and old != new:
            shas = models.get(key)
            if (isinstance(shas, list) and len(shas) == len(split_paths(old)) == len(split_paths(new))
                    and all(isinstance(x, str) for x in shas) and all(map(os.path.exists, split_paths(new)))):
                continue  # compared with the run's record once the process group exists: hashed once a machine
                # (changed_model, from the Checkpointer), not here on every rank
            if same_models(old, new, key, shas, where):  # no record (older checkpoints): the old path is read
                continue  # the same model(s) named another way (relative vs absolute, moved): identity is the weights
            raise ConfigError(other_weights(key, new, old, where))
        if old != new:
            raise ConfigError(f"--{key} {new!r}: this run was trained with {old!r}, and a resume cannot change it "
                              "(start a new run with --out elsewhere, or resume without it)")
    cfg.train.out_dir = out_dir
    cfg.train.trust_checkpoint = False  # a checkpoint never vouches for itself; the caller sets the flag
    return cfg
