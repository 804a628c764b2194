"""Self-describing checkpoint directories, written atomically, loaded without executing code.

    runs/NAME/checkpoints/step_000300/
        model.safetensors   weights of the unwrapped model (no _orig_mod./module. prefixes;
                            lm_head.weight is tied to transformer.wte.weight and stored once)
        optimizer.pt        optimizer.state_dict(), tensors and plain types (torch.load weights_only)
        rng.pt              torch CPU / CUDA RNG states
        meta.json           step, config, loader state, python RNG state, versions, git SHA

A checkpoint is written to ``step_XXXXXX.tmp`` and renamed when complete, so a crash never leaves
a half-written directory that :func:`latest_checkpoint` would pick.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gptforge.errors import CheckpointError  # noqa: F401  (re-exported: callers catch ckpt.CheckpointError)

CKPT_PREFIX = "step_"
TIED = "lm_head.weight"  # an output head that may share its tensor with the input embedding


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    out = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX)
           and not p.name.endswith(".tmp") and (p / "meta.json").exists()]
    return sorted(out, key=lambda p: int(p.name[len(CKPT_PREFIX):]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to store: a tied output head (GPT-2's lm_head = wte) is stored once; an untied one
    (Llama's default) is stored like any weight."""
    full = model.state_dict()
    sd = {k: v.detach().cpu().contiguous() for k, v in full.items()}
    if _tied(full):
        sd.pop(TIED)
    return sd


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, Any],
    keep: int = 0,
    rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
) -> Path:
    """Write checkpoint ``step`` (the number of optimizer steps done) atomically; prune to ``keep``.
    ``rng``: (tensors for rng.pt, JSON for meta.json), given by training (a weights-only
    checkpoint has none)."""
    tmp = begin_checkpoint(run_dir, step)
    save_file(model_state(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    return finalize_checkpoint(run_dir, tmp, meta, keep, rng)


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """Create the empty temporary directory ``step_XXXXXX.tmp`` that a checkpoint is written into."""
    root = ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{CKPT_PREFIX}{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def finalize_checkpoint(run_dir: str | Path, tmp: Path, meta: dict[str, Any], keep: int = 0,
                        rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> Path:
    """Add RNG state and meta.json to ``tmp``, fsync, rename it into place and prune to ``keep``."""
    root = tmp.parent
    final = root / tmp.name[: -len(".tmp")]
    step = int(final.name[len(CKPT_PREFIX):])
    meta = {**meta, "step": step}
    if rng is not None:
        torch.save(rng[0], tmp / "rng.pt")
        meta["rng"] = rng[1]
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    for f in tmp.rglob("*"):  # sharded checkpoints keep their shards in a subfolder
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. interrupt right after a periodic save)
        old = root / f"{final.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


META_KEYS = ("config", "step")  # every checkpoint's meta.json: enough to build and load the model
RESUME_META_KEYS = (*META_KEYS, "loader", "rng")  # and to continue training exactly


def read_meta(ckpt_dir: str | Path, required: tuple[str, ...] = META_KEYS) -> dict[str, Any]:
    """meta.json as a dict; a missing required key is a CheckpointError naming it (not a KeyError later)."""
    meta = _read_meta_json(ckpt_dir)
    missing = [k for k in required if k not in meta]
    if missing:
        raise CheckpointError(
            f"{Path(ckpt_dir) / 'meta.json'}: missing key(s) {', '.join(map(repr, missing))}; the checkpoint's "
            "meta.json is incomplete or was not written by gptforge (re-save it, or use another checkpoint)"
        )
    if not isinstance(meta.get("config", {}), dict):
        raise CheckpointError(f"{Path(ckpt_dir) / 'meta.json'}: 'config' is not an object; the checkpoint is damaged")
    return meta


def _read_meta_json(ckpt_dir: str | Path) -> dict[str, Any]:
    ckpt_dir = Path(ckpt_dir)
    meta_path = ckpt_dir / "meta.json"
    if not meta_path.exists():
        raise CheckpointError(
            f"{ckpt_dir} is not a gptforge checkpoint (no meta.json). "
            "Give a checkpoint directory such as runs/NAME/checkpoints/step_000300, or a run directory."
        )
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta_path}: not valid JSON ({e}); the checkpoint is damaged") from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path}: not a JSON object; the checkpoint is damaged")
    return meta


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint dir or a run dir (meaning its newest checkpoint)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist")
    if (p / "meta.json").exists():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise CheckpointError(f"{p} holds no complete checkpoint (looked in {ckpt_root(p)})")
    return latest


def load_model_weights(model: torch.nn.Module, ckpt_dir: str | Path) -> None:
    """``model.safetensors`` into ``model`` (shapes checked first; a tied head may be absent)."""
    path = Path(ckpt_dir) / "model.safetensors"
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete")
    sd = load_file(str(path))
    own = model.state_dict()
    wrong = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
             for k, v in sd.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise CheckpointError(
            f"{path} does not fit the model (shapes differ): {'; '.join(wrong[:3])}. Resume with the "
            "checkpoint's own model config (drop --model.* overrides) or start a new run"
        )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (k == TIED and _tied(own))]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def _tied(sd: dict[str, torch.Tensor]) -> bool:
    """The head is another entry's tensor: GPT-2's transformer.wte, a tied Llama's model.embed_tokens."""
    return TIED in sd and any(k != TIED and v.data_ptr() == sd[TIED].data_ptr() for k, v in sd.items())


def load_optimizer(ckpt_dir: str | Path, optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.pt`` into ``optimizer`` (tensors and plain types only: ``weights_only``)."""
    opt_path = Path(ckpt_dir) / "optimizer.pt"
    if not opt_path.exists():
        raise CheckpointError(f"{opt_path} is missing; cannot resume training from a weights-only checkpoint")
    optimizer.load_state_dict(torch.load(opt_path, map_location="cpu", weights_only=True))
