"""One invocation's hold on a run directory: set up in order, always torn down.

    with RunSession(cfg, resume="latest", force=False, extra_meta={...}) as run:
        ...                                   # run.info, run.log, run.checkpointer, run.stop
        metrics = run.open_metrics(start_step)  # config.json, env.json, metrics.jsonl (+ sinks)
        ...
    # metrics and sinks closed, the progress bar gone, signal handlers restored, the process group left

Entering joins the process group (torchrun), checks the run directory before any compute
(:mod:`gptforge.run.preflight`), locks it so no second run writes there (:mod:`gptforge.run.lock`),
resolves what to resume (the newest intact checkpoint; a torchrun
restart after a failure always resumes) and refuses to start over a run that holds checkpoints
unless ``force``; SIGINT/SIGTERM/SIGHUP from then on ask the loop to checkpoint and stop
(:mod:`gptforge.run.signals`). Leaving tears everything down whether the run finished, stopped or
raised: this is the one place that does, so no recipe can forget a piece.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from gptforge.config import Config, ConfigError
from gptforge.parallel.distributed import DistInfo, cleanup, init_distributed
from gptforge.reading import read_json
from gptforge.run import checkpoint as ckpt
from gptforge.run.checkpointer import Checkpointer
from gptforge.run.faults import elastic_restart
from gptforge.run.lock import RunLock
from gptforge.run.metrics import MetricsLog, environment, other_runs_records
from gptforge.run.preflight import check_run_dir
from gptforge.run.signals import StopFlag
from gptforge.run.sinks import open_sinks


class RunSession:
    """See the module docstring. Attributes after ``__enter__``: ``info`` (ranks and device),
    ``run_dir``, ``resume_dir`` (None for a fresh run), ``resume_step``, ``complete`` (a resumed run already at
    its ``train.max_steps``: said so, nothing to train, and the attributes after this one are not set),
    ``start_over`` (a fresh run over old checkpoints, allowed by ``force``), ``env`` (the environment record),
    ``checkpointer``, ``stop``."""

    def __init__(self, cfg: Config, resume: str | Path | None = None, force: bool = False,
                 extra_meta: dict[str, Any] | None = None):
        self.cfg, self.resume, self.force = cfg, resume, force
        self.extra_meta = dict(extra_meta or {})
        self.run_dir = Path(cfg.train.out_dir)
        self.info = DistInfo()
        self.metrics: MetricsLog | None = None
        self.progress: Progress | None = None
        self.stop: StopFlag | None = None
        self.lock: RunLock | None = None
        self.complete = False
        self.resume_step = 0

    def __enter__(self) -> RunSession:
        try:
            self._open()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _open(self) -> None:
        cfg, run_dir = self.cfg, self.run_dir
        self.info = init_distributed(cfg.train.device, cfg.dist)
        self.stop = StopFlag().__enter__()
        if self.info.is_main:
            check_run_dir(run_dir)  # a file or a read-only filesystem: refuse now, not at the first write
            self.lock = RunLock(run_dir).acquire()  # one run per directory: a second one fails here, naming us
            if self.lock.unsupported:  # a filesystem without flock: said once, the run goes on
                self.log(self.lock.unsupported)
        resume, force = self.resume, self.force
        if resume is None and elastic_restart() and ckpt.latest_checkpoint(run_dir) is not None:
            resume, force = "latest", False  # torchrun restarted us after a failure: continue, never wipe
        self.resume_dir = Checkpointer.find(run_dir, resume, warn=self.log)  # damaged ones named, skipped
        self.start_over = self.resume_dir is None and ckpt.latest_checkpoint(run_dir) is not None
        if self.start_over and not force:
            raise ConfigError(
                f"{run_dir} already holds checkpoints; pass --resume to continue that run, --force to start "
                "over (deletes its checkpoints and metrics), or choose another --out"
            )
        # what the resume will do, said before it does it, for every recipe alike: a changed length or LR
        # schedule, or a finished run (``complete``: nothing more is opened, no model is read or hashed, no
        # sharded checkpoint asks for trust; the loop trains nothing and the command exits 0, as train always did)
        if self.resume_dir is not None:
            from gptforge.run.resume import check_resume, saved_config

            meta = ckpt.read_meta(self.resume_dir)
            ckpt.check_resume_meta(meta, self.resume_dir / "meta.json")
            self.resume_step = int(meta["step"])
            self.complete = check_resume(saved_config(meta, str(self.resume_dir / "meta.json")), cfg,
                                         self.resume_step, self.resume_dir,
                                         str(self.extra_meta.get("recipe", "pretrain")))
            if self.complete:
                return
        if self.info.world == 1:  # every key that splits work across processes says it does nothing here
            idle = [f"dist.{k}={getattr(cfg.dist, k)}" for k, off in (("shard", "none"), ("tp", 1), ("pp", 1),
                                                                       ("dp_replicate", 1)) if getattr(cfg.dist, k) != off]
            if cfg.dist.pp > 1 and cfg.dist.pp_schedule == "interleaved1f1b":
                idle.append(f"dist.pp_virtual={cfg.dist.pp_virtual}")
            if idle:
                self.log(f"({', '.join(idle)} split{'s' * (len(idle) == 1)} the work across processes; on one process "
                         f"{'it has' if len(idle) == 1 else 'they have'} no effect: launch with torchrun "
                         "--nproc_per_node N to use them)")
        self.env = environment(self.info.device)
        self.checkpointer = Checkpointer(cfg, self.info, run_dir, self.resume_dir, self.log,
                                         extra_meta={"git_sha": self.env.get("git_sha"), **self.extra_meta},
                                         guard=self.lock.check if self.lock is not None else None)

    def log(self, msg: str) -> None:
        """A human line on rank 0 (above the progress bar when there is one)."""
        if self.info.is_main:
            write_line(msg)

    def open_metrics(self, start_step: int) -> MetricsLog:
        """Rank 0 writes config.json and env.json once, and opens metrics.jsonl (+ TensorBoard / W&B):
        wiped first under --force (only now that data and model are known to be good), repaired after
        a kill (a torn last line, records of steps that will be trained again)."""
        cfg, info, run_dir = self.cfg, self.info, self.run_dir
        sinks = open_sinks(cfg.train.log_to, run_dir, start_step, cfg.to_dict()) if info.is_main else None
        self.metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=info.is_main, sinks=sinks,
                                  guard=self.lock.check if self.lock is not None else None, note=self.log)
        if info.is_main:
            if self.start_over:
                ckpt.clear_checkpoints(run_dir)  # through a symlinked checkpoints/ too; refuses if any survive
                (run_dir / "metrics.jsonl").unlink(missing_ok=True)
            run_dir.mkdir(parents=True, exist_ok=True)
            if start_step and not self.metrics.path.exists():  # a resume whose metrics.jsonl was deleted
                self.log(f"{self.metrics.path}: not there; a new one starts at step {start_step} (the records of the "
                         "steps before it are gone; the run continues from its checkpoint)")
            torn, replayed = self.metrics.begin(start_step)
            # a resume's records before its step are the run's history: another run's among them were appended to
            # this run's file (cat a b > metrics.jsonl). (A fresh run's file may hold a dead first attempt's.)
            other = other_runs_records(self.metrics.path, self.checkpointer.extra_meta.get("run_id")) \
                if start_step else None
            if other:
                self.log(f"{self.metrics.path}: {other}; plot and the run's summary read them as this run's: move "
                         "them out of this file")
            done = ([f"cut a torn last line ({torn} bytes)"] if torn else []) + \
                ([f"marked {replayed} records after step {start_step} as replayed"] if replayed else [])
            if done:  # say only what was done: an intact file replayed is not "cut"
                self.log("metrics.jsonl: " + ", ".join(done))
            self._note_hand_edits(run_dir / "config.json")
            _write_text(run_dir / "config.json", cfg.to_json() + "\n")
            _write_text(run_dir / "env.json", json.dumps(self.env, indent=2) + "\n")
        self.progress = Progress(start_step, cfg.train.max_steps, info.is_main)
        return self.metrics

    def _note_hand_edits(self, path: Path) -> None:
        """config.json is a record of the config a run uses, rewritten at every start; a resumed run reads its
        checkpoint's config (and this command's flags), never the file. Keys edited there by hand since the
        checkpoint would be overwritten unread: name them and the flags that set them, once, before the rewrite."""
        meta = self.checkpointer.meta if self.resume_dir is not None else None
        saved = (meta or {}).get("config")
        if not isinstance(saved, dict):
            return
        try:  # the bounded reader: a file a user edited is data like any other
            on_disk = read_json(path)
        except (OSError, ValueError):  # missing, damaged or not an object: no edit to name (the rewrite repairs it)
            return
        edited = [f"{sec}.{k}" for sec, vals in on_disk.items() if isinstance(vals, dict)
                  for k, v in vals.items() if isinstance(saved.get(sec), dict) and k in saved[sec]
                  and saved[sec][k] != v]
        if not edited:
            return

        def flag(key: str) -> str:
            sec, k = key.split(".", 1)
            v = on_disk[sec][k]
            return f"--{key} {shlex.quote(v) if isinstance(v, str) else json.dumps(v)}"

        more = f" and {len(edited) - 3} more" if len(edited) > 3 else ""
        self.log(f"{path}: edited by hand ({', '.join(edited[:3])}{more}); a resumed run uses its checkpoint's config "
                 "and this command's flags, not this file (a record, rewritten now): to change them pass "
                 + " ".join(flag(k) for k in edited[:3]))

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.stop is not None:
            self.stop.__exit__(*exc)
        cleanup(self.info)
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _write_text(path: Path, text: str) -> None:
    """A small run file, through the one writer (temporary name, fsync, rename): a full disk or a
    read-only run directory is the same one-line error as a checkpoint's."""
    from gptforge.storage import write_text

    write_text(path, text)


_bar = None  # the live progress bar, so log lines print above it


def write_line(msg: str) -> None:
    if _bar is not None:
        _bar.write(msg)
    else:
        print(msg, flush=True)


class Progress:
    """A live tqdm bar with ETA on an interactive terminal; the log lines carry the ETA otherwise."""

    def __init__(self, start: int, total: int, enabled: bool):
        global _bar
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False)
            _bar = self.bar

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        global _bar
        if self.bar is not None:
            self.bar.close()
            self.bar = _bar = None
