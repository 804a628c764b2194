"""What a checkpoint's files put back: the model's weights and the optimizer's state, read without
running code (safetensors, and ``torch.load(weights_only=True)``), each file verified against meta.json's
checksum first, and every mismatch with the model or optimizer one CheckpointError naming the file.

    >>> load_model_weights(model, "runs/exp1/checkpoints/step_000300")
    >>> load_optimizer(ckpt_dir, optimizer, model)

Writing and finding checkpoints is gptforge.run.checkpoint; a resume's whole order (weights, optimizer,
loader, RNG) is the Checkpointer's (gptforge.run.checkpointer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gptforge.errors import CheckpointError
from gptforge.run.checkpoint import tied_keys, verify_checkpoint
from gptforge.run.identity import TRUST_FLAG
from gptforge.storage.tensors import load_safetensors


def load_model_weights(model: torch.nn.Module, ckpt_dir: str | Path, prefix: str = "") -> None:
    """``model.safetensors`` into ``model`` (verified against meta.json's checksum, shapes checked
    first; a tied head may be absent). ``prefix``: only the weights under it (``policy.`` of a PPO
    checkpoint, which holds the policy and the value model). Never reads ``dcp/``: its metadata is a pickle."""
    path = Path(ckpt_dir) / "model.safetensors"
    if not path.exists() and (Path(ckpt_dir) / "dcp").is_dir():  # sharded (FSDP) checkpoint, old layout
        raise CheckpointError(
            f"{path} is missing: {ckpt_dir} holds only sharded (dcp/) weights, whose metadata is a pickle, so "
            f"they are not read here. Resume it once with `gptforge train --resume {ckpt_dir} {TRUST_FLAG}` "
            "if you trust it: every checkpoint written since also holds model.safetensors"
        )
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete")
    verify_checkpoint(ckpt_dir, only=("model.safetensors",))
    try:
        sd = load_safetensors(path)  # any path: a run folder whose name is not UTF-8 too
    except Exception as e:  # safetensors: a truncated or garbled file (old checkpoints have no checksum)
        raise CheckpointError(f"{path} cannot be read ({e}); the checkpoint is damaged") from e
    if prefix:
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    for k, v in sd.items():  # as the HF and GGUF readers refuse them: the loop never saves such weights, so
        # they are damage, a hand-made file or another tool's (an integer tensor was cast into the float
        # model without a word; a NaN weight sampled garbage without one)
        if not v.is_floating_point():
            raise CheckpointError(f"{path}: tensor {k} is {str(v.dtype).removeprefix('torch.')}; model weights are "
                                  "floats, refusing to cast integers into them (the checkpoint is damaged)")
        if not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{path}: tensor {k} holds NaN or infinite values; refusing a broken model (the "
                                  "checkpoint is damaged: resume or load an earlier one)")
    own = model.state_dict()
    wrong = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
             for k, v in sd.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise CheckpointError(
            f"{path} does not fit the model (shapes differ): {'; '.join(wrong[:3])}. Resume with the "
            "checkpoint's own model config (drop --model.* overrides) or start a new run"
        )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k not in tied_keys(own)]
    if getattr(model, "lora_state_keys", None) is not None:  # a LoRA checkpoint: the frozen base is not in it
        missing = [k for k in missing if k in model.lora_state_keys]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def load_optimizer(ckpt_dir: str | Path, optimizer: torch.optim.Optimizer,
                   model: torch.nn.Module | None = None) -> None:
    """``optimizer.pt`` into ``optimizer`` (tensors and plain types only: ``weights_only``). A state
    saved with one group over ``model.parameters()`` (``gptforge rl`` before RL shared the optimizer)
    is regrouped into ``optimizer``'s groups, parameter by parameter, when ``model`` is given."""
    opt_path = Path(ckpt_dir) / "optimizer.pt"
    if not opt_path.exists():
        raise CheckpointError(f"{opt_path} is missing; cannot resume training from a weights-only checkpoint")
    verify_checkpoint(ckpt_dir, only=("optimizer.pt",))
    saved = load_tensors(opt_path)
    state = saved.get("state") if isinstance(saved, dict) else None
    for index, values in (state.items() if isinstance(state, dict) else ()):
        for key, v in (values.items() if isinstance(values, dict) else ()):
            # as a weight's (load_model_weights): the loop never saves a step that is not finite, so this is damage;
            # loaded, it trained one step and then "diverged", told to lower the lr and resume into the same state
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise CheckpointError(f"{opt_path}: the optimizer's {key} of parameter {index} holds NaN or infinite "
                                      "values; refusing to train on it (the checkpoint is damaged: resume from an "
                                      "earlier one)")
    groups = saved.get("param_groups", []) if isinstance(saved, dict) else []
    if model is not None and len(groups) == 1 and len(optimizer.param_groups) > 1:
        saved = _one_group_to(saved, optimizer, model, opt_path)
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{opt_path} does not fit this run's optimizer ({e}); it was saved with other "
                              "optimizer settings (optim.name, optim.embed_lr, dist.shard)") from e


def settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Every group's settings (all but its parameters): what the run's config built (betas, eps, weight decay,
    base_lr, Muon's momentum ...), which a loaded state must not replace (:func:`keep_settings`)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def keep_settings(optimizer: torch.optim.Optimizer, built: list[dict]) -> None:
    """Put back the settings ``built`` from this run's config after a state was loaded into ``optimizer``:
    torch's load_state_dict takes every group's settings from the file, so ``--resume --optim.weight_decay 0``
    (beta1, beta2, eps, embed_lr, muon_lr, muon_momentum ...) was dropped in silence while the run's config and
    its next checkpoint recorded the new value. What a checkpoint carries is the state (moments, step counts)."""
    for group, mine in zip(optimizer.param_groups, built, strict=True):
        group.update(mine)


def _one_group_to(saved: dict, optimizer: torch.optim.Optimizer, model: torch.nn.Module, path: Path) -> dict:
    """A one-group state over ``model.parameters()`` in the order of ``optimizer``'s groups."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    flat = [p for g in optimizer.param_groups for p in g["params"]]
    if len(saved["param_groups"][0]["params"]) != len(flat) or any(id(p) not in position for p in flat):
        raise CheckpointError(f"{path}: one optimizer group of {len(saved['param_groups'][0]['params'])} parameters "
                              f"does not match this model's {len(flat)}")
    state = {j: saved["state"][position[id(p)]] for j, p in enumerate(flat) if position[id(p)] in saved["state"]}
    groups, start = [], 0
    for g in optimizer.param_groups:
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + len(g["params"])))})
        start += len(g["params"])
    return {"state": state, "param_groups": groups}


def load_tensors(path: Path) -> Any:
    """torch.load with weights_only=True (no code runs); a damaged file is named in a CheckpointError."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from None
    except Exception as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise CheckpointError(f"{path} holds objects that are not plain tensors/types; refusing to unpickle "
                                  "them (a checkpoint must not execute code)") from e
        raise CheckpointError(f"{path} cannot be read ({str(e).splitlines()[0]}); the checkpoint is damaged") from e
