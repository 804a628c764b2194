"""The Checkpointer: one object that saves a run and restores it, bit for bit.

    ckpt = Checkpointer(cfg, info, run_dir, resume_from=Checkpointer.find(run_dir, "latest"))
    ckpt.restore_weights(model)        # before wrapping: full weights, before FSDP shards them
    ...                                # wrap (compile, DDP / FSDP2), build the optimizer
    state = TrainState(model, optimizer, train_loader)
    ckpt.restore(state)                # optimizer, loader position, step, every rank's RNG
    ckpt.save(state)                   # at a step boundary

It owns what torchtitan's and lingua's checkpointers own: where checkpoints live and which is
resumed (resolved once, here), the format a run writes (``dcp`` when FSDP shards the state, else
one ``model.safetensors`` + ``optimizer.pt``; ZeRO-1 consolidates onto rank 0 first), the RNG states
(rank 0's in ``rng.pt``/``meta.json``, every rank's stream gathered beside it) and the loader state.
The file-level work (atomic directories, safetensors, ``weights_only`` loads) is
:mod:`gptforge.run.checkpoint`; sharded DCP is :mod:`gptforge.run.dcp`.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptforge import __version__
from gptforge.config import ConfigError
from gptforge.errors import LoaderStateError
from gptforge.optim import build_optimizer
from gptforge.parallel.distributed import (
    DistInfo,
    barrier,
    from_main,
    gather_rng_states,
    once_per_machine,
    seed_rank,
)
from gptforge.run import checkpoint as files
from gptforge.run import dcp, identity, restore
from gptforge.run.weights import check_weights_fit


@dataclass
class TrainState:
    """What a resume restores besides the config: the raw (unwrapped) model, the optimizer, the
    train loader's position and the number of optimizer steps done."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any  # a loader with state_dict() / load_state_dict() (data.loader.ShardLoader)
    step: int = 0


class Checkpointer:
    def __init__(self, cfg, info: DistInfo, run_dir: str | Path, resume_from: Path | None = None,
                 log=lambda msg: None, extra_meta: dict[str, Any] | None = None,
                 guard: Callable[[str], None] | None = None):
        self.cfg, self.info, self.run_dir, self.log = cfg, info, Path(run_dir), log
        self.guard = guard  # before each save, on rank 0: the run directory is still the run's (run/lock.py)
        self.resume_from = resume_from
        self.format = "dcp" if info.fsdp else "file"  # the format this run writes
        self.extra_meta = dict(extra_meta or {})  # written into every meta.json (git SHA, ...)
        self.meta = None
        if resume_from is not None:
            self.meta = files.read_meta(resume_from)
            # `gptforge rl` before RL shared this stack saved no loader or RNG state (its problems and
            # sampling seeds are functions of the step); every other checkpoint must carry both
            if not ("rl" in self.meta and "recipe" not in self.meta):
                self.meta = files.read_meta(resume_from, files.RESUME_META_KEYS)
            files.check_resume_meta(self.meta, Path(resume_from) / "meta.json")
        self.sharded = resume_from is not None and dcp.is_sharded(resume_from)  # the format it reads
        self.trusted = bool(getattr(cfg.train, "trust_checkpoint", False))
        if self.sharded:  # dcp/.metadata is a pickle: refused here, before any data or compute
            identity.require_trust(resume_from, self.trusted)
        if resume_from is not None:  # the model's shape against the weights file's header, before it is built
            check_weights_fit(resume_from, cfg.model)
        if resume_from is not None and cfg is not None and hasattr(cfg, "train"):
            from gptforge.run.resume import changed_model

            # the models the run reads again hold the weights it recorded: hashed (GBs) once a machine, each
            # machine's own copy, and every rank refuses alike
            where = str(Path(resume_from) / "meta.json")
            for why in once_per_machine(lambda: changed_model(cfg, where, self.meta), info):
                if why is not None:
                    raise ConfigError(why)
        self._carried_optim: dict | None = None
        rid = (self.meta or {}).get("run_id")  # which run this is: drawn at its start, kept by its resumes
        self.extra_meta["run_id"] = rid if isinstance(rid, str) else secrets.token_hex(8)
        # the newest step this run has in checkpoints/ (resumed from or saved): a folder gone since is said
        self._last_saved: int | None = self.start_step if resume_from is not None else None
        if cfg is not None and hasattr(cfg, "train"):  # the weights of the models the run names (run/resume.py)
            from gptforge.run.resume import recorded_models

            # read (a multi-GB model hashed) by rank 0, which writes meta.json; the others get its record
            models = from_main(recorded_models(cfg, self.meta) if info.is_main else None, info)
            if models:
                self.extra_meta["models"] = models

    def _record_models(self) -> None:
        """meta.json's ``models`` for every model-path key of the config it is written with, by construction: one
        named after the run started (a setting derived in the loop) is hashed now instead of left out, so a resume
        checks its weights like the rest; those already recorded are carried, never hashed again. Rank 0."""
        from gptforge.run.resume import recorded_models

        models = recorded_models(self.cfg, {"models": self.extra_meta.get("models") or {}})
        if models:
            self.extra_meta["models"] = models

    # --- where ------------------------------------------------------------------------------------
    @staticmethod
    def find(run_dir: str | Path, resume: str | Path | None, warn: Callable[[str], None] = print) -> Path | None:
        """The checkpoint to resume: None (a fresh run), the newest of ``run_dir`` that verifies
        ("latest"; each damaged one skipped is reported through ``warn``), or the checkpoint or run
        directory given, which must verify (see ``checkpoint.verify_checkpoint``)."""
        if resume is None:
            return None
        if str(resume) == "latest":
            latest = identity.latest_intact_checkpoint(run_dir, warn=warn)
            if latest is None:
                raise files.CheckpointError(
                    f"--resume: no complete checkpoint in {files.ckpt_root(run_dir)}{files.damaged_note(run_dir)}; "
                    "start without --resume, or point --out at the run to continue"
                )
            return latest
        where = identity.resolve_checkpoint(resume)
        files.verify_checkpoint(where)
        identity.check_same_run(where, then="resume (or --resume without a path: the run's own newest)")
        return where

    @property
    def start_step(self) -> int:
        return int(self.meta["step"]) if self.meta is not None else 0

    # --- restore ------------------------------------------------------------------------------------
    def restore_weights(self, model: torch.nn.Module) -> None:
        """Before wrapping: full-file weights go into the plain module (FSDP then shards them); a
        full-file optimizer state is read now too when FSDP will shard it. DCP loads after wrapping."""
        if self.resume_from is None or self.sharded:
            return
        restore.load_model_weights(model, self.resume_from)
        if self.info.fsdp:
            plain = build_optimizer(model, self.cfg.optim, self.info.device.type)
            restore.load_optimizer(self.resume_from, plain)
            self._carried_optim = dcp.full_optimizer_state(model, plain)

    def restore(self, state: TrainState) -> None:
        """After wrapping and building the optimizer: optimizer, loader, step and RNG."""
        if self.resume_from is None:
            return
        where, info = self.resume_from, self.info
        built = restore.settings(state.optimizer)  # this run's config's, whatever the file's groups say
        if self.sharded and info.zero:  # DCP reads into a plain AdamW; ZeRO then takes its share
            plain = build_optimizer(state.model, self.cfg.optim, info.device.type)
            dcp.load_sharded(state.model, plain, where, trusted=self.trusted)
            state.optimizer.load_state_dict(plain.state_dict())
        elif self.sharded:
            dcp.load_sharded(state.model, state.optimizer, where, trusted=self.trusted)
        elif self._carried_optim is not None:
            dcp.set_full_optimizer_state(state.model, state.optimizer, self._carried_optim)
            self._carried_optim = None
        else:
            restore.load_optimizer(where, state.optimizer, state.model)
        restore.keep_settings(state.optimizer, built)
        self._restore_loader(state.loader, Path(where) / "meta.json")
        state.step = self.start_step
        self._restore_rng()
        self.log(f"resumed from {where} at step {state.step} (saved at world {self.meta.get('world', 1)}, "
                 f"now {info.world})")
        changed = changed_numerics(self.meta, info.device.type)
        if changed:
            self.log(f"(saved with {' and '.join(a for a, _ in changed)}, resumed with "
                     f"{' and '.join(b for _, b in changed)}: the run continues, but its numbers will not be bit for "
                     "bit those of a run never stopped)")

    def _restore_loader(self, loader: Any, meta_path: Path) -> None:
        """The run's position (meta.json ``loader``) into ``loader``, which checks each field it reads
        (:func:`gptforge.errors.saved_int`). Any loader, including one written later, is covered: a field
        it reads without checking (missing, or of another type) is refused here too, naming the file,
        rather than escaping as a traceback."""
        plain = (KeyError, TypeError, ValueError, IndexError, AttributeError)
        try:
            loader.load_state_dict(self.meta.get("loader", {}))
        except LoaderStateError as e:
            raise LoaderStateError(f"{meta_path}: {e}; the checkpoint is damaged or not this run's (resume from "
                                   "another checkpoint)") from e
        except plain as e:
            if type(e) not in plain:  # the loader's own error (ShardError, ...) already says what to do
                raise
            raise LoaderStateError(f"{meta_path}: the saved run position ('loader') is damaged ({type(e).__name__}: "
                                   f"{e}); resume from another checkpoint") from e

    def _restore_rng(self) -> None:
        """Rank 0's saved state everywhere, then each rank its own saved stream when the world is
        unchanged (an exact continuation), or fresh distinct ones when it changed."""
        if "rng" not in self.meta:  # an RL checkpoint from before the run stack (see __init__)
            return
        tensors = restore.load_tensors(self.resume_from / "rng.pt")  # weights_only; a damaged file is named
        set_rng_state(tensors, self.meta["rng"])
        info = self.info
        if not info.enabled:
            return
        if int(self.meta.get("world", 1)) != info.world or f"rank{info.rank}.cpu" not in tensors:
            seed_rank(self.cfg.train.seed, info, self.start_step)
            return
        torch.set_rng_state(tensors[f"rank{info.rank}.cpu"])
        if info.device.type == "cuda" and f"rank{info.rank}.cuda" in tensors:
            torch.cuda.set_rng_state(tensors[f"rank{info.rank}.cuda"], info.device)

    # --- save ---------------------------------------------------------------------------------------
    def save(self, state: TrainState, **meta: Any) -> Path | None:
        """Collective: write checkpoint ``state.step`` in this run's format, keep the newest
        ``train.keep_ckpts``. Returns the directory on rank 0 (None on other ranks)."""
        info, keep = self.info, self.cfg.train.keep_ckpts
        if self.guard is not None and info.is_main:  # never a new checkpoints/ in a folder that replaced the run's
            self.guard(f"checkpoint step {state.step}")
        root = files.ckpt_root(self.run_dir)
        if info.is_main and self._last_saved is not None and not root.exists() and not root.is_symlink():
            self.log(f"{root}: deleted while the run trained, and with it every checkpoint up to step "
                     f"{self._last_saved}; making it again for step {state.step}, the earliest a --resume can now "
                     "continue from")
        if info.is_main and hasattr(self.cfg, "train"):  # meta.json's record is of the config it holds
            self._record_models()
        meta = {"config": self.cfg.to_dict(), "loader": state.loader.state_dict(), "gptforge": __version__,
                "torch": torch.__version__, "threads": torch.get_num_threads(), "world": info.world,
                "sharding": info.sharded,
                **self.extra_meta, **meta}
        rngs = gather_rng_states(info)  # every rank's stream, for an exact continuation at this world
        path = None
        if self.format == "dcp":  # every rank writes its shards; resumable at any world size
            path = dcp.save_sharded(self.run_dir, state.step, state.model, state.optimizer, meta, keep,
                                    info.is_main, _rng_files(rngs))
        else:
            if info.zero:  # gather the optimizer shards on rank 0: an ordinary single-file checkpoint
                state.optimizer.consolidate_state_dict(to=0)
            if info.is_main:
                path = files.save_checkpoint(self.run_dir, state.step, state.model, state.optimizer, meta,
                                             keep=keep, rng=_rng_files(rngs))
        if path is not None:
            self.log(f"checkpoint -> {path}")
            self._last_saved = state.step
        barrier(info)
        return path


def changed_numerics(meta: dict[str, Any], device_type: str) -> list[tuple[str, str]]:
    """What a checkpoint recorded of how its numbers were computed that differs now: [(then, now)] for the
    torch version and, on the CPU (where the threads split every reduction), the number of threads."""
    out = []
    if isinstance(meta.get("torch"), str) and meta["torch"] != torch.__version__:
        out.append((f"torch {meta['torch']}", f"torch {torch.__version__}"))
    threads = meta.get("threads")
    if (device_type == "cpu" and isinstance(threads, int) and not isinstance(threads, bool)
            and threads != torch.get_num_threads()):
        out.append((f"{threads} CPU thread{'s' * (threads != 1)}", f"{torch.get_num_threads()}"))
    return out


# --- RNG state ------------------------------------------------------------------------------------

def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensor states for rng.pt, JSON-able states for meta.json)."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = s
    v, st, gauss = random.getstate()
    return tensors, {"python": [v, list(st), gauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], meta_rng: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if "python" in meta_rng:
        v, st, gauss = meta_rng["python"]
        random.setstate((v, tuple(st), gauss))


def _rng_files(other_ranks: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(rng.pt contents, meta.json "rng"): this process's states plus the other ranks' streams."""
    tensors, js = rng_state()
    return {**tensors, **other_ranks}, js
