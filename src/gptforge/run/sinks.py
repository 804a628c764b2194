"""Metrics where people already look: TensorBoard and Weights & Biases, fed the same records as
``metrics.jsonl``. :class:`~gptforge.run.metrics.MetricsLog` fans every record out to the sinks
opened here, on rank 0 only; the training loop knows nothing about them.

    gptforge train --preset shakespeare-cpu --train.log_to tensorboard      # RUN/tensorboard/
    tensorboard --logdir runs/shakespeare-cpu/tensorboard
    WANDB_MODE=offline gptforge train --preset shakespeare-cpu --train.log_to tensorboard,wandb

Scalars: every number in a record except ``step`` and ``time``, tagged ``KIND/KEY`` (``train/loss``,
``val/val_loss``; eval records ``eval/TASK/acc``), at the record's step. A non-finite value (written
as ``null`` in metrics.jsonl) is skipped. Both are optional extras: ``pip install 'gptforge[tensorboard]'``
or ``'gptforge[wandb]'``. W&B reads its usual environment (``WANDB_MODE=offline`` writes the run under
``RUN/wandb/`` for a later ``wandb sync``; ``WANDB_PROJECT``, default ``gptforge``); a resumed run
continues the same W&B run (its id is kept in ``RUN/wandb_run_id``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Protocol

from gptforge.config import parse_log_to

_SKIP = {"kind", "step", "time"}


class MetricsSink(Protocol):
    """Receives every metrics.jsonl record (already JSON-safe) and is closed at the end of the run."""

    def write(self, rec: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(rec: dict[str, Any]) -> dict[str, float]:
    """The record's numbers as ``KIND/KEY`` (``KIND/TASK/KEY`` when the record names a task)."""
    if rec.get("kind") == "sample":
        return {}
    prefix = rec.get("kind", "metrics") + (f"/{rec['task']}" if isinstance(rec.get("task"), str) else "")
    out: dict[str, float] = {}

    def add(tag: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                add(f"{tag}/{k}", x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[tag] = float(v)

    for k, v in rec.items():
        if k not in _SKIP:
            add(f"{prefix}/{k}", v)
    return out


class TensorBoardSink:
    """Event files under ``log_dir``. ``purge_step``: a resumed run hides the events it replays."""

    def __init__(self, log_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, flush_secs=30)

    def write(self, rec: dict[str, Any]) -> None:
        for tag, value in scalars(rec).items():
            self.writer.add_scalar(tag, value, global_step=rec.get("step", 0))

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per run of a directory, resumed across ``--resume``; honours WANDB_MODE and friends.
    ``fresh`` (a run starting at step 0: the first, a ``--force`` start-over, or one that died before its
    first checkpoint) takes a new id: W&B drops what is logged at a step below its run's last one, so the
    old id would have swallowed the new run's curves."""

    def __init__(self, run_dir: Path, config: dict[str, Any], fresh: bool = True):
        import wandb

        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() and not fresh else secrets.token_hex(4)  # W&B's 8 chars
        run_dir.mkdir(parents=True, exist_ok=True)
        from gptforge.storage import write_text

        write_text(id_file, run_id + "\n")  # a torn id would start a second W&B run on resume
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "gptforge"), name=run_dir.name, id=run_id,
                              resume="allow", dir=str(run_dir), config=config)

    def write(self, rec: dict[str, Any]) -> None:
        values = scalars(rec)
        if values:
            self.run.log(values, step=int(rec.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


def check_available(names: list[str]) -> None:
    """Before any compute: a requested sink whose package is missing is one line naming its extra (gptforge.extras)."""
    from gptforge.extras import require

    for name in names:  # the extras have the sinks' names; MissingExtra is one line and exit 2 in the CLI
        require(name, extra=name, for_what=f"train.log_to={name}")


def open_sinks(log_to: str, run_dir: str | Path, start_step: int = 0,
               config: dict[str, Any] | None = None) -> list[MetricsSink]:
    """The sinks ``train.log_to`` names, for rank 0 of a run in ``run_dir`` starting at ``start_step``."""
    names = parse_log_to(log_to)
    check_available(names)
    run_dir = Path(run_dir)
    sinks: list[MetricsSink] = []
    for name in names:
        if name == "tensorboard":
            # A resumed run replays the steps after its checkpoint, and a fresh (or --force) run starts
            # over: TensorBoard hides older events from step start_step + 1 on.
            sinks.append(TensorBoardSink(run_dir / "tensorboard", purge_step=start_step + 1))
        else:
            sinks.append(WandbSink(run_dir, config or {}, fresh=start_step == 0))
    return sinks
