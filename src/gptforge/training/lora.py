"""LoRA on the run stack: the base frozen, adapters on, only they train and are checkpointed.

    gptforge sft --init-from runs/base --data conv.jsonl --out runs/lora --lora.rank 8 --lora.targets q_proj,v_proj

The loop calls :func:`attach_lora` once the model holds its starting weights and before any wrapping
(compile, DDP): it loads the base when there is no ``init_weights`` (a resume: checkpoints hold only the
adapters), fingerprints the frozen base (sha256 of its weights), refuses a resume whose base is another
model (naming both), puts the adapters on (:mod:`gptforge.models.lora`), freezes everything but the
adapters and any head that is not the family model's (a reward model's ``score``), and says how many
parameters train. ``model.lora_state_keys`` then tells the checkpoint writer and reader to keep only the
trained tensors; meta.json's ``lora`` records the base path and fingerprint.

PPO (``rl.algo ppo``) as TRL's ``PPOTrainer(peft_config=...)``: the policy takes the adapters, and the
value model (its own body and score head, started from the policy or the reward model) trains in full
and is checkpointed whole beside them; a run module names such parts in ``trains_whole``. The KL's
reference is the base itself, the policy with its adapters off (:class:`gptforge.models.lora.BaseOf`),
not a second copy of the weights.
"""

from __future__ import annotations

import os
from typing import Any

import torch.nn as nn

from gptforge.config import Config, ConfigError
from gptforge.models.lora import LoRAError, add_lora, resolve_targets, weights_fingerprint


def _under(name: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in prefixes)


def family_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each family model inside the trained module that takes adapters: the module
    itself (sft, dpo, grpo), a reward model's ``body``, PPO's ``policy`` (not the value model's body: the
    module's ``trains_whole`` parts train in full)."""
    from gptforge.models.registry import FAMILIES

    classes = tuple(f.model_cls for f in FAMILIES.values())
    whole = tuple(getattr(model, "trains_whole", ()))
    return [(n, m) for n, m in model.named_modules() if isinstance(m, classes) and not _under(n, whole)]


def load_base(fams: list[tuple[str, nn.Module]], base: str) -> None:
    """The base's weights (any model source: checkpoint, HF directory, GGUF, llm.c) into each family model."""
    from gptforge.errors import CheckpointError
    from gptforge.load import ModelSource, load_model

    if not base:
        raise ConfigError("lora.base is empty: a LoRA run needs its base model (start it with --init-from, or "
                          "give --lora.base CKPT_OR_HF_DIR_OR_GGUF)")
    try:
        sd = load_model(ModelSource.from_path(base)).state_dict()
    except (OSError, ValueError, CheckpointError) as e:  # a damaged llm.c file, HF directory or checkpoint
        raise ConfigError(f"lora.base {base!r} cannot be read: {str(e).splitlines()[0]}") from e
    for name, m in fams:
        try:
            m.load_state_dict(sd)
        except RuntimeError as e:
            raise ConfigError(f"lora.base {base!r} does not fit this run's model{' ' + name if name else ''}: "
                              f"{str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e}") from e


def check_lora_run(cfg: Config, info: Any, recipe: str) -> None:
    """What LoRA does not cover yet, refused before any compute."""
    if info.world > 1 and (info.fsdp or cfg.dist.tp > 1 or cfg.dist.pp > 1):
        raise ConfigError(f"lora.rank={cfg.lora.rank} runs on one process or under DDP (dist.shard none, dist.tp 1, "
                          "dist.pp 1); FSDP, tensor and pipeline parallelism do not take adapters yet")


def resolve_base(cfg: Config, init_weights: Any, fresh: bool) -> None:
    """``lora.base``: the starting model (``init_weights.source``, absolute) where none is given, so a resume,
    sample or export finds the base again; a given one that names another model than the start is refused.
    The loop calls it before the run records the models it reads (meta.json's ``models``), so the base is
    hashed there with the rest, when it is read; :func:`attach_lora` again (a no-op by then)."""
    lc = cfg.lora
    source = str(getattr(init_weights, "source", "") or "")
    if fresh and lc.base and source and os.path.abspath(lc.base) != source:
        raise ConfigError(f"lora.base {lc.base!r} and --init-from {source!r} name different models: the adapters' "
                          "base is the starting model (leave lora.base out)")
    if not lc.base:
        lc.base = source


def attach_lora(model: nn.Module, cfg: Config, info: Any, recipe: str, resume_meta: dict | None,
                init_weights: Any, log: Any) -> dict[str, Any]:
    """See the module docstring; returns meta.json's ``lora`` record. ``resume_meta``: the resumed
    checkpoint's meta.json (None on a fresh run)."""
    lc = cfg.lora
    check_lora_run(cfg, info, recipe)
    resolve_base(cfg, init_weights, fresh=resume_meta is None)
    if resume_meta is not None:  # the adapters' shape and scale are the run's: another value is another run
        old = (resume_meta.get("config") or {}).get("lora") or {}
        for key in ("rank", "alpha", "targets"):
            if key in old and old[key] != getattr(lc, key):
                raise ConfigError(f"--lora.{key} {getattr(lc, key)!r}: this run was trained with {old[key]!r}, and a "
                                  "resume cannot change it (start a new run with --out elsewhere)")
    fams = family_models(model)
    if not fams:
        raise ConfigError(f"lora.rank={lc.rank}: the {recipe} model holds no family model to adapt")
    if resume_meta is not None or init_weights is None:
        load_base(fams, lc.base)  # the checkpoint holds only the adapters
    fingerprint = weights_fingerprint(fams[0][1])
    saved = (resume_meta or {}).get("lora") or {}
    if resume_meta is not None and saved.get("base_sha256") != fingerprint:
        raise ConfigError(f"lora.base: this run was trained on {saved.get('base')!r} (weights sha256 "
                          f"{str(saved.get('base_sha256'))[:12]}), but {lc.base!r} has weights sha256 {fingerprint[:12]}: "
                          "resume on the same base model (--lora.base PATH), or start a new run")
    trained_before = {n for n, p in model.named_parameters() if p.requires_grad}  # (an unused head stays frozen)
    model.requires_grad_(False)
    heads = [p for n, p in model.named_parameters() if n in trained_before and not _under(n, [f for f, _ in fams])]
    if any(f == "" for f, _ in fams):
        heads = []  # the module is the family model itself: no extra head
    try:
        layers = [n for _, m in fams for n in add_lora(m, cfg.model.arch, lc.rank, lc.alpha, lc.dropout,
                                                       lc.target_names())]
    except LoRAError as e:
        raise ConfigError(str(e)) from e
    for p in heads:
        p.requires_grad_(True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    model.lora_state_keys = sorted(trainable)  # what checkpoints hold (run/checkpoint.py)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    targets = ",".join(resolve_targets(cfg.model.arch, lc.target_names()))
    whole = list(getattr(model, "trains_whole", ()))
    if whole:  # PPO: say the adapted policy's share, then the value model that trains in full (TRL's choice)
        n_whole = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and _under(n, whole))
        n_fam = sum(p.numel() for _, m in fams for p in m.parameters())
        said = (f"{_m(n_train - n_whole)} of the {_m(n_fam)} {' and '.join(f for f, _ in fams)} parameters train "
                f"({100 * (n_train - n_whole) / n_fam:.2f}%), and the {' and '.join(whole)} model trains in full "
                f"({_m(n_whole)}, as TRL's PPO with peft): {_m(n_train)} of {_m(total)} in all")
    else:
        said = f"{_m(n_train)} of {_m(total)} parameters train ({100 * n_train / total:.2f}%)"
    log(f"LoRA rank {lc.rank} (alpha {lc.alpha:g}) on {targets} ({len(layers)} layer{'s' * (len(layers) != 1)}): {said}; "
        f"base {lc.base or '(given weights)'} sha256 {fingerprint[:12]}")
    return {"base": lc.base, "base_sha256": fingerprint, "layers": len(layers), "trainable": n_train, "total": total}


def _m(n: int) -> str:
    return f"{n:,}" if n < 100_000 else f"{n / 1e6:.2f}M" if n < 1e9 else f"{n / 1e9:.2f}B"

