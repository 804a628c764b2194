"""Which checkpoints are a run's own, and which a command may read: the run's identity.

    gptforge sample --ckpt runs/exp1       # the newest checkpoint that is exp1's own save of its step

A run folder names its newest checkpoint that is the run's own save of its step
(:func:`resolve_checkpoint`): a step folder copied in from another run (meta.json's ``run_id``, drawn when a
run starts and kept by its resumes, against its siblings': :func:`check_same_run`) or another step's save
under a newer name is skipped and said. ``--resume`` takes the newest that also verifies
(:func:`latest_intact_checkpoint`); :func:`read_newest` reads a live run whose older checkpoints are pruned
under it. Trust comes only from the command line: a sharded checkpoint's ``dcp/.metadata`` is a pickle, read
only with ``--trust-checkpoint`` (:func:`require_trust`). The folder itself (writing, reading, verifying,
listing, pruning) is :mod:`gptforge.run.checkpoint`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptforge.errors import CheckpointError
from gptforge.parallel.distributed import layout_words
from gptforge.reading import not_a_file
from gptforge.run.checkpoint import (
    ckpt_root,
    damaged_note,
    folder_step,
    list_checkpoints,
    read_meta_json,
    verify_checkpoint,
)
from gptforge.run.metrics import last_start_run

TRUST_FLAG = "--trust-checkpoint"


def resolve_checkpoint(path: str | Path, warn: Callable[[str], None] | None = None) -> Path:
    """Accept a checkpoint dir or a run dir, meaning the newest checkpoint that is the run's own save of its
    step (:func:`not_this_runs`): a step folder copied in from another run, or another step's save under a
    newer name, was read silently by sample, export, eval, serve and --init-from as the run's newest. Each one
    skipped is said once through ``warn`` (stderr by default). Damage to the files is the reader's to name
    (it verifies what it loads)."""
    p = Path(path)
    if not p.exists():  # a link to nothing or a loop is said as what it is (reading.not_a_file)
        raise CheckpointError(f"checkpoint {p} {'is ' + not_a_file(p) if p.is_symlink() else 'does not exist'}")
    if not p.is_dir():  # a file, a device or a pipe: say what it is, not that it holds nothing
        what = "a file" if p.is_file() else "a device or other special file"
        raise CheckpointError(f"checkpoint {p} is {what}, not a folder: give a run folder (runs/NAME) or one "
                              "checkpoint's folder (runs/NAME/checkpoints/step_000300)")
    if (p / "meta.json").exists():
        return p
    ckpts = list_checkpoints(p)
    if not ckpts:
        raise CheckpointError(f"{p} holds no complete checkpoint (looked in {ckpt_root(p)}){damaged_note(p)}")
    for d in reversed(ckpts):  # a run directory means its newest checkpoint that is its own (as --resume takes)
        why = not_this_runs(d)
        if why is None:
            return d
        if warn is not None:
            warn(f"{p}: skipping checkpoint {d.name}: {why}")
        elif (str(p), d.name) not in _said_skipped:  # a reader resolves its path several times: said once
            _said_skipped.add((str(p), d.name))
            print(f"{p}: skipping checkpoint {d.name}: {why}", file=sys.stderr, flush=True)
    raise CheckpointError(f"{p} holds no checkpoint of its own run (looked in {ckpt_root(p)}: "
                          f"{', '.join(d.name for d in ckpts)}, each skipped above)")


_said_skipped: set[tuple[str, str]] = set()  # (run directory, step folder) already said: once a process


def not_this_runs(d: Path) -> str | None:
    """Why step folder ``d`` of a run's checkpoints/ is not that run's save of that step, or None: another
    step's save under its name (renamed or copied), or another run's (:func:`check_same_run`). A meta.json
    that cannot be read is not judged here: the reader names it."""
    try:
        step = read_meta_json(d).get("step")
    except (CheckpointError, OSError, ValueError, AttributeError):
        return None
    if not (isinstance(step, int) and not isinstance(step, bool) and folder_step(d) == step):
        return (f"{d / 'meta.json'}: step = {step!r}, but the checkpoint directory is {d.name} (a save renamed or "
                "copied under another step's name)")
    try:
        check_same_run(d)
    except CheckpointError as e:
        return str(e)
    return None


READ_TRIES = 5


def read_newest(path: str | Path, read: Callable[[Path], Any]) -> Any:
    """``read(where)`` on the checkpoint ``path`` names (a run directory: its newest, see
    :func:`resolve_checkpoint`). A run still training there prunes its older checkpoints
    (``train.keep_ckpts``) and may do so while one is being read: when the read fails and the checkpoint
    has since gone, or a newer one has appeared, the run's newest is resolved and read again (up to
    :data:`READ_TRIES` times), so reading a live run never fails with a false "missing, the checkpoint is
    damaged". A checkpoint named directly, or one still there and newest, fails as it would."""
    p = Path(path)
    for attempt in range(READ_TRIES):
        where = resolve_checkpoint(p)
        try:
            return read(where)
        except Exception:  # whatever the reader says of a file pruned under it (CheckpointError, OSError, ...)
            if (where == p or attempt == READ_TRIES - 1
                    or ((where / "meta.json").is_file() and _still_newest(p, where))):
                raise
    raise AssertionError("unreachable")


def _still_newest(run: Path, where: Path) -> bool:
    try:
        return resolve_checkpoint(run, warn=lambda msg: None) == where
    except CheckpointError:
        return True


def latest_intact_checkpoint(run_dir: str | Path, warn: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint of a run that passes :func:`verify_checkpoint` and is the run's own
    (:func:`check_same_run`); each one that is skipped is reported through ``warn``, by name and with
    what is wrong."""
    for d in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(d)
        except CheckpointError as e:
            warn(f"skipping damaged checkpoint {d.name}: {e}")
            continue
        why = not_this_runs(d)
        if why is None:
            return d
        damaged = "damaged " if why.startswith(str(d / "meta.json")) else ""  # another step's save under this name
        warn(f"skipping {damaged}checkpoint {d.name}: {why}")
    return None


def check_same_run(ckpt_dir: str | Path, then: str = "") -> None:
    """A checkpoint to resume must be of the run whose checkpoints/ holds it: meta.json's ``run_id`` (drawn
    when a run starts, kept by its resumes) against its siblings'. A step folder copied in from another run
    (the same names, another model) passed every check of its own files and was resumed as this run's.
    CheckpointError naming it and both runs; nothing to compare (no siblings, or checkpoints from before
    run ids were recorded) passes, and so does the id of the run that last trained in the folder (its
    metrics.jsonl's last start record): with one own save and one copied in, siblings alone cannot tell.
    ``then``: what to do after moving it out, in the words of the command that refuses it (a reader that
    skips it, sample or export, has nothing to add: it reads the run's own)."""
    ckpt_dir = Path(ckpt_dir)
    mine = read_meta_json(ckpt_dir).get("run_id")
    if not isinstance(mine, str) or ckpt_dir.parent.name != "checkpoints":
        return
    theirs: dict[str, list[str]] = {}
    for p in list_checkpoints(ckpt_dir.parent.parent):
        if p.resolve() == ckpt_dir.resolve():
            continue
        try:
            rid = read_meta_json(p).get("run_id")
        except (CheckpointError, OSError, ValueError):
            continue
        if isinstance(rid, str):
            theirs.setdefault(rid, []).append(p.name)
    if theirs and mine not in theirs:
        if mine == last_start_run(ckpt_dir.parent.parent / "metrics.jsonl"):
            return  # no sibling shares its id, but the run that last trained here is its run: one own save beside
            # copied-in ones (a tie the siblings alone cannot break: each would call the other foreign)
        rid, names = max(theirs.items(), key=lambda kv: len(kv[1]))
        raise CheckpointError(
            f"{ckpt_dir}: a checkpoint of another run (its meta.json run_id is {mine}; this run's {', '.join(names[:3])} "
            f"are run {rid}): copied in from elsewhere? Move it out of {ckpt_dir.parent}"
            + (f", then {then}" if then else ""))


def require_trust(ckpt_dir: str | Path, trusted: bool) -> None:
    """Reading a sharded (dcp/) checkpoint unpickles its .metadata: only with the user's say-so."""
    if not trusted:
        try:
            layout = layout_words(str(read_meta_json(ckpt_dir).get("sharding", "fsdp")))
        except (CheckpointError, OSError, ValueError):
            layout = "FSDP"
        raise CheckpointError(
            f"{ckpt_dir} is a sharded (DCP) checkpoint of a {layout} run: resuming it reads dcp/.metadata, a pickle that can "
            f"run code. If you trust where it came from, pass {TRUST_FLAG} (config: train.trust_checkpoint "
            "true); weights alone load safely from its model.safetensors (sample, eval, export, --init-from)"
        )
