"""Self-describing checkpoint directories, written atomically, loaded without executing code.

    runs/NAME/checkpoints/step_000300/
        model.safetensors   weights of the unwrapped model (no _orig_mod./module. prefixes;
                            lm_head.weight is tied to transformer.wte.weight and stored once)
        optimizer.pt        optimizer.state_dict(), tensors and plain types (torch.load weights_only)
        rng.pt              torch CPU / CUDA RNG states
        meta.json           step, config, loader state, python RNG state, versions, git SHA, and
                            "files": {name: sha256} of every other file in the directory

A checkpoint is written to ``step_XXXXXX.tmp`` and renamed when complete, so a crash never leaves
a half-written directory that :func:`latest_checkpoint` would pick. Damage after that (a truncated
or flipped file) is caught by :func:`verify_checkpoint`; ``--resume`` uses
:func:`gptforge.run.identity.latest_intact_checkpoint`, which falls back past a damaged checkpoint and says so. A disk
that fills up mid-write gets one clear error, and the partial ``.tmp`` is deleted. Saving a step
again swaps the new folder in one step (Linux renameat2); where that is missing, two renames, and a kill
between them leaves ``step_XXXXXX.old`` whole, which lists as that step. The next save removes what a
killed save left (any ``.tmp``, an ``.old`` beside its complete step).

Nothing here unpickles: weights are safetensors, ``optimizer.pt``/``rng.pt`` load with
``weights_only=True``. A sharded (FSDP) checkpoint's ``dcp/.metadata`` *is* a pickle, so
:func:`gptforge.run.restore.load_model_weights` never reads ``dcp/`` (FSDP runs also write a consolidated
``model.safetensors``) and resuming from ``dcp/`` needs ``--trust-checkpoint``
(:func:`gptforge.run.identity.require_trust`). Which checkpoint of a folder is the run's own, and which
a command may read, is :mod:`gptforge.run.identity`'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gptforge.errors import CheckpointError  # noqa: F401  (re-exported: callers catch ckpt.CheckpointError)
from gptforge.reading import read_json
from gptforge.storage import fsync_dir, fsync_tree, ordinary_file_mode
from gptforge.storage.digest import sha256_file
from gptforge.storage.faults import (
    RESUME_HINT,
    dir_bytes,
    disk_full_message,
    is_disk_full,
    not_writable_reason,
    output_error,
    tensor_bytes,
    write_fault_message,
)

CKPT_PREFIX = "step_"
TIED = "lm_head.weight"  # an output head that may share its tensor with the input embedding


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


_STEP_DIR = re.compile(rf"{CKPT_PREFIX}(\d+)(\.old)?")


def folder_step(d: Path) -> int | None:
    """The step a checkpoint folder's name says (``step_000300`` or a killed re-save's ``step_000300.old``), or None."""
    m = _STEP_DIR.fullmatch(d.name)
    return int(m[1]) if m else None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first. A re-save of a step killed between its two renames
    (where the folders cannot be swapped in one step) leaves ``step_N.old`` whole and no ``step_N``: that
    folder is step N's checkpoint until a save of step N replaces it (read in place: a reader never renames)."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name)
        if m is None or not p.is_dir() or not (p / "meta.json").exists():
            continue
        if m[2] is None or int(m[1]) not in found and not (root / p.name[: -len(".old")]).exists():
            found[int(m[1])] = p
    return [found[s] for s in sorted(found)]


def clear_checkpoints(run_dir: str | Path) -> None:
    """``--force``: delete a run's checkpoints (``step_*`` entries, finished or ``.tmp``). A
    ``checkpoints/`` that is a symlink (to a bigger disk) is kept and emptied of gptforge's entries
    only, never followed further; anything that cannot be deleted is an error, so a later
    ``--resume`` can never pick the old run's checkpoints, nor ``keep_ckpts`` prune the new ones."""
    root = ckpt_root(run_dir)
    if not root.exists() and not root.is_symlink():
        return
    if not root.is_dir():  # a dangling link or a file: remove the entry itself
        root.unlink()
        return
    for entry in root.iterdir():
        if not entry.name.startswith(CKPT_PREFIX):
            continue
        try:
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
            else:
                shutil.rmtree(entry)
        except OSError as e:
            raise CheckpointError(f"--force: cannot delete {entry} ({e.strerror or e}); remove it by hand, "
                                  "or give this run another --out") from None
    if not root.is_symlink() and not any(root.iterdir()):
        root.rmdir()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to store: a tied output head (GPT-2's lm_head = wte) is stored once; an untied one
    (Llama's default) is stored like any weight."""
    full = model.state_dict()
    keep = getattr(model, "lora_state_keys", None)  # a LoRA run stores only what trains (training/lora.py)
    if keep is not None:
        full = {k: full[k] for k in keep}
    sd = {k: v.detach().cpu().contiguous() for k, v in full.items()}
    for key in tied_keys(full):  # "lm_head.weight", or "body.lm_head.weight" in a reward model
        sd.pop(key)
    return sd


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, Any],
    keep: int = 0,
    rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    then: str = RESUME_HINT,
) -> Path:
    """Write checkpoint ``step`` (the number of optimizer steps done) atomically; prune to ``keep``.
    ``rng``: (tensors for rng.pt, JSON for meta.json), given by training (a weights-only
    checkpoint has none). ``then``: how to continue after a full or read-only disk, in the words of the
    command that writes (training resumes with --resume; ``import`` has no --resume: it runs again)."""
    weights = model_state(model)
    opt_state = optimizer.state_dict() if optimizer is not None else None
    needed = tensor_bytes(weights) + tensor_bytes(opt_state) + tensor_bytes(rng)
    tmp = begin_checkpoint(run_dir, step, then)
    with cleanup_on_failure(tmp, step, needed, then):
        save_file(weights, str(tmp / "model.safetensors"), metadata=weights_metadata(meta))
        ordinary_file_mode(tmp / "model.safetensors")  # safetensors leaves it 0600
        if opt_state is not None:
            torch.save(opt_state, tmp / "optimizer.pt")
        return finalize_checkpoint(run_dir, tmp, meta, keep, rng)


# meta.json is not checksummed by itself (it holds the checksums): the part of it that decides what the model
# computes, its config.model and chat_template, is also written into model.safetensors' header (whose sha256
# meta.json records), and every reader compares the two (run/weights.py), so an edited or damaged meta.json can
# never build another model over the same weights. Settings of how a model trains or runs, not of what it
# computes, are left out: a resume may change them (--model.dropout ...).
MODEL_RECORD = "gptforge.model"
RUN_KNOBS = ("dropout", "recompute", "flash", "attn_backend", "fused_ce", "lm_head_fp8", "fused_ln_residual",
             "fused_bias_gelu", "doc_mask")


def model_record(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What meta.json says the model is: {"model": config.model less RUN_KNOBS, "chat_template": ...} as
    meta.json holds them (JSON values), and a LoRA checkpoint's ``"lora"``: config.lora's LORA_RECORD; None when
    its config has no model object."""
    conf = meta.get("config")
    model = conf.get("model") if isinstance(conf, dict) else None
    if not isinstance(model, dict):
        return None
    record = {"model": {k: v for k, v in model.items() if k not in RUN_KNOBS}, "chat_template": meta.get("chat_template")}
    lora = conf.get("lora")
    if meta.get("lora") and isinstance(lora, dict):  # adapters: how they fold in (alpha / rank scales them) is the
        record["lora"] = {k: lora.get(k) for k in LORA_RECORD}  # model too (lora.base is checked by its sha256)
    return json.loads(json.dumps(record, default=str))


LORA_RECORD = ("rank", "alpha", "targets")


def weights_metadata(meta: dict[str, Any]) -> dict[str, str]:
    """model.safetensors' header metadata: the format, and :func:`model_record` of ``meta``."""
    record = model_record(meta)
    out = {"format": "pt"}
    if record is not None:
        out[MODEL_RECORD] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return out


class cleanup_on_failure:
    """Around the writes into ``tmp``: on any failure delete the partial directory (it would eat the
    space the next attempt needs); a full disk becomes one CheckpointError saying so. The previous
    checkpoint is never touched: it is replaced only by the final rename."""

    def __init__(self, tmp: Path, step: int, needed: int, then: str = RESUME_HINT):
        self.tmp, self.step, self.needed, self.then = tmp, step, needed, then

    def __enter__(self) -> cleanup_on_failure:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            return False
        written = dir_bytes(self.tmp) if self.tmp.exists() else 0
        fault = (write_fault_message(exc, self.tmp.parent, f"checkpoint step {self.step}", self.then, self.tmp)
                 if isinstance(exc, Exception) else None)  # judged before the partial files go
        shutil.rmtree(self.tmp, ignore_errors=True)
        if fault is not None:  # a file past `ulimit -f`, an I/O error: one line too
            raise CheckpointError(fault) from exc
        if isinstance(exc, Exception) and is_disk_full(exc, self.tmp.parent, self.needed, written):
            raise CheckpointError(disk_full_message(f"checkpoint step {self.step}", self.needed,
                                                    self.tmp.parent, then=self.then)) from exc
        reason = not_writable_reason(exc) if isinstance(exc, Exception) else None
        if reason is not None:  # a read-only run directory: as one line as a full one
            raise CheckpointError(f"cannot write checkpoint step {self.step} to {self.tmp.parent}: {reason}. Point "
                                  f"--out at a folder this user can write, then {self.then}") from exc
        return False


_LEFTOVER = re.compile(rf"{CKPT_PREFIX}(\d+)\.(tmp|old)")


def begin_checkpoint(run_dir: str | Path, step: int, then: str = RESUME_HINT) -> Path:
    """Create the empty temporary directory ``step_XXXXXX.tmp`` that a checkpoint is written into, first
    removing what killed saves left (the run's lock makes this process the run's one writer): any step's
    ``.tmp``, and a ``step_N.old`` beside a complete ``step_N`` (a lone one is step N's checkpoint). A
    ``checkpoints`` that cannot be made or written (a file put there mid-run, a full or read-only disk) is
    one CheckpointError naming it and how to continue (``then``)."""
    root = ckpt_root(run_dir)
    try:
        return _begin(root, step)
    except OSError as e:
        err = output_error(e, root / f"{CKPT_PREFIX}{step:06d}.tmp", f"checkpoint step {step}", then=then)
        if err is not None:
            raise CheckpointError(str(err)) from e
        why = "it is a file, not a folder" if root.exists() and not root.is_dir() else (e.strerror or str(e))
        raise CheckpointError(f"cannot write checkpoint step {step} in {root}: {why}. Make it a folder this run can "
                              f"write, then {then}") from e


def _begin(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for p in root.iterdir():
        m = _LEFTOVER.fullmatch(p.name)
        if m is not None and p.is_dir() and not p.is_symlink() and (
                m[2] == "tmp" or (root / f"{CKPT_PREFIX}{m[1]}" / "meta.json").is_file()):
            shutil.rmtree(p, ignore_errors=True)
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
    if hasattr(meta.get("tokenizer"), "fingerprint"):  # a Tokenizer: every checkpoint carries its words
        from gptforge.data.tokenizer import save_tokenizer

        meta["tokenizer"] = save_tokenizer(meta["tokenizer"], tmp)
    # sharded checkpoints keep their shards in a subfolder
    meta["files"] = {f.relative_to(tmp).as_posix(): sha256_file(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
    with open(tmp / "meta.json", "w") as fh:
        fh.write(json.dumps(meta, indent=2, default=str))
    fsync_tree(tmp)  # every file's bytes and every name in the folder, as storage.atomic_dir's outputs
    old = root / f"{final.name}.old"
    if final.exists():  # re-saving the same step (e.g. interrupt right after a periodic save)
        from gptforge import storage

        if old.exists():
            shutil.rmtree(old)
        # a kill between two renames (no exchange here) leaves step_N.old whole, which list_checkpoints reads
        shutil.rmtree(storage.swap_dirs(tmp, final, old), ignore_errors=True)
    else:
        os.replace(tmp, final)
        if old.exists():  # a killed re-save's earlier folder: the new save replaces it
            shutil.rmtree(old, ignore_errors=True)
    fsync_dir(root)  # the rename itself
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


META_KEYS = ("config", "step")  # every checkpoint's meta.json: enough to build and load the model
RESUME_META_KEYS = (*META_KEYS, "loader", "rng")  # and to continue training exactly


def read_meta(ckpt_dir: str | Path, required: tuple[str, ...] = META_KEYS) -> dict[str, Any]:
    """meta.json as a dict; a missing required key is a CheckpointError naming it (not a KeyError later)."""
    meta = read_meta_json(ckpt_dir)
    missing = [k for k in required if k not in meta]
    if missing:
        raise CheckpointError(
            f"{Path(ckpt_dir) / 'meta.json'}: missing key(s) {', '.join(map(repr, missing))}; the checkpoint's "
            "meta.json is incomplete or was not written by gptforge (re-save it, or use another checkpoint)"
        )
    if not isinstance(meta.get("config", {}), dict):
        raise CheckpointError(f"{Path(ckpt_dir) / 'meta.json'}: 'config' is not an object; the checkpoint is damaged")
    if meta.get("lora") and not isinstance(meta["lora"], dict):  # a LoRA run's record (base, fingerprint): read by .get
        raise CheckpointError(f"{Path(ckpt_dir) / 'meta.json'}: 'lora' is {type(meta['lora']).__name__}, not an "
                              "object (a LoRA run's base and its fingerprint); the checkpoint is damaged")
    return meta


def check_resume_meta(meta: dict[str, Any], meta_path: Path) -> None:
    """What a resume reads from meta.json besides the config and the loader state (each loader checks its
    own): the step (which must be the one the checkpoint directory is named by), the world it was saved
    at and the Python RNG state, by type and range; LoaderStateError naming the file and the field, so a
    damaged value is refused before anything reads it, instead of surfacing as a traceback or a silently
    different run. Every ``--resume`` goes through it (``cli.common.resolve_run``, ``Checkpointer``)."""
    import random

    from gptforge.errors import LoaderStateError, saved_int

    try:
        step = saved_int(meta, "step", 0, section="")
        named = re.fullmatch(r"step_(\d+)", meta_path.parent.name)  # a checkpoint directory is named by its step
        if named and int(named.group(1)) != step:
            raise LoaderStateError(f"step = {step}, but the checkpoint directory is {meta_path.parent.name}")
        if "world" in meta:
            saved_int(meta, "world", 1, section="")
        if "tokens_seen" in meta:  # the training tokens before this step (the metrics' "tokens")
            saved_int(meta, "tokens_seen", 0, section="")
        rng = meta.get("rng", {})
        if not isinstance(rng, dict):
            raise LoaderStateError(f"rng = {rng!r}: not an object")
        if "python" in rng:
            py = rng["python"]
            ok = (isinstance(py, list) and len(py) == 3 and isinstance(py[1], list)
                  and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in py[1])
                  and (py[2] is None or isinstance(py[2], float)))
            if not ok:
                raise LoaderStateError("rng.python: not Python's random.getstate() (version, 625 integers, gauss)")
            random.Random().setstate((py[0], tuple(py[1]), py[2]))  # Python's own check of the state
    except LoaderStateError as e:
        raise LoaderStateError(f"{meta_path}: {e}; the checkpoint is damaged (resume from another one)") from e
    except (TypeError, ValueError) as e:
        raise LoaderStateError(f"{meta_path}: rng.python: not a Python random state ({e}); the checkpoint is "
                               "damaged (resume from another one)") from e


def read_meta_json(ckpt_dir: str | Path) -> dict[str, Any]:
    ckpt_dir = Path(ckpt_dir)
    meta_path = ckpt_dir / "meta.json"
    if not meta_path.exists():
        raise CheckpointError(
            f"{ckpt_dir} is not a gptforge checkpoint (no meta.json). "
            "Give a checkpoint directory such as runs/NAME/checkpoints/step_000300, or a run directory."
        )
    return read_json(meta_path, CheckpointError, "checkpoint's meta.json", then="the checkpoint is damaged")


_verified: dict[str, tuple] = {}  # dir -> (name, size, mtime, ctime, inode) of what was verified: hash each file once


def verify_checkpoint(ckpt_dir: str | Path, only: tuple[str, ...] | None = None) -> None:
    """Check every file recorded in meta.json ("files": name -> sha256), or just those in ``only``;
    raise CheckpointError naming the first damaged or missing one. A checkpoint written before
    checksums were recorded (no "files") passes: its files are still checked as they load."""
    ckpt_dir = Path(ckpt_dir)
    recorded = read_meta(ckpt_dir).get("files")
    if not isinstance(recorded, dict):
        return
    names = [n for n in recorded if only is None or n in only]
    stamp = []
    for name in names:
        f = ckpt_dir / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (meta.json lists it); the checkpoint is damaged")
        st = f.stat()
        stamp.append((name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))  # ctime: a copy with cp -p
    key = str(ckpt_dir.resolve())
    if key in _verified and set(stamp) <= set(_verified[key]):
        return
    for name in names:
        f = ckpt_dir / name
        sha = sha256_file(f)
        if sha != recorded[name]:
            other = _saved_by_another(ckpt_dir, name, sha)
            why = (f"it is {other}'s {name}: a file from another save" if other else "truncated or corrupted")
            raise CheckpointError(f"{f} does not match the sha256 recorded in {ckpt_dir / 'meta.json'} "
                                  f"({why}); the checkpoint is damaged")
    _verified[key] = tuple(set(stamp) | set(_verified.get(key, ())))


def _saved_by_another(ckpt_dir: Path, name: str, sha: str) -> str | None:
    """The sibling checkpoint whose meta.json records ``sha`` for ``name`` (a file copied over from another
    save: a mix of two saves), or None."""
    try:
        siblings = sorted(p for p in ckpt_dir.parent.iterdir() if p.is_dir() and p != ckpt_dir)
    except OSError:
        return None
    for p in siblings:
        try:
            files = read_meta_json(p).get("files")
        except (CheckpointError, OSError, ValueError):
            continue
        if isinstance(files, dict) and files.get(name) == sha:
            return p.name
    return None


def damaged_note(run_dir: str | Path) -> str:
    """For the "nothing to resume" error: whether checkpoints exist but all failed verification, or the
    checkpoints folder is a file or a broken link."""
    root = ckpt_root(run_dir)
    if root.is_symlink() and not root.exists():
        return f" (it is a link to {os.readlink(root)}, which does not exist: a disk not mounted?)"
    if root.exists() and not root.is_dir():
        return " (it is a file, not the folder of a run's checkpoints)"
    n = len(list_checkpoints(run_dir))
    return f" that verifies ({n} damaged, named above)" if n else ""


def is_head_key(key: str) -> bool:
    """An output head's weight at any depth: ``lm_head.weight``, ``body.lm_head.weight`` (a reward or value
    model's family model), ``policy.lm_head.weight`` (PPO's)."""
    return key == TIED or key.endswith("." + TIED)


def tied_keys(sd: dict[str, torch.Tensor]) -> list[str]:
    """Every output head (``lm_head.weight`` at any depth: a reward or value model holds its family
    model as ``body``) that is another entry's tensor: shared storage, not equal values (an untied head that
    equals its embedding is kept). A sharded save, whose gathered copies share no storage, asks the live
    model before the gather (``gptforge.run.dcp.tied_heads``)."""
    ptr = {}
    for k, v in sd.items():
        ptr.setdefault(v.data_ptr(), []).append(k)
    return [k for k, v in sd.items() if is_head_key(k) and len(ptr[v.data_ptr()]) > 1]
