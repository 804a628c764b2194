"""What a run records about itself: environment, MFU, the metrics.jsonl stream, human log lines.

MFU (model FLOPs utilization) = achieved model FLOP/s / device peak FLOP/s, with model FLOPs per
token counted two ways (both reported by the bench command):

* **llm.c**: ``6*N + 6*L*C*T`` — N all parameters (tied embedding once, wpe included), L layers,
  C width, T sequence length; the attention term is halved for causality. The training log uses it.
* **PaLM / nanoGPT**: ``6*N' + 12*L*C*T`` with N' = parameters without position embeddings.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

# Dense peak FLOP/s by (GPU name fragment, precision): NVIDIA datasheets (SXM parts).
PEAK_FLOPS = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "A10G": {"bfloat16": 70e12, "float16": 70e12, "tf32": 35e12, "float32": 31.2e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "tf32": 60e12, "float32": 30.3e12},
    "4090": {"bfloat16": 165e12, "float16": 165e12, "tf32": 82.6e12, "float32": 82.6e12},
}


def flops_per_token(model_cfg, n_params: int, seq_len: int, formula: str = "llmc") -> float:
    """Training FLOPs per token: 6 per matmul parameter plus attention. An untied input embedding
    (Llama's default) is a lookup, not a matmul, so its rows are left out; GPT-2's is the head too."""
    from gptforge.models.registry import flops_per_token as family_flops  # the family counts (models/counting.py)

    return family_flops(model_cfg, seq_len, formula, n_params=n_params)


def peak_flops(device: torch.device, precision: str, override: float = 0.0) -> float | None:
    """Peak FLOP/s for MFU: the override if given, else a datasheet lookup by GPU name, else None."""
    if override > 0:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for frag, table in PEAK_FLOPS.items():
        if frag in name:
            return table.get(precision)
    return None


def git_sha() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        sha = out.stdout.strip()
        if out.returncode == 0 and sha:
            dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
            return sha + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def environment(device: torch.device) -> dict[str, Any]:
    """Versions, device and git SHA: a log is evidence."""
    import numpy

    from gptforge import allocator

    env: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "git_sha": git_sha(),
        "argv": sys.argv,
        "allocator": allocator.describe(),  # glibc keeping large blocks, or the system's (issue 35)
    }
    try:
        import tiktoken

        env["tiktoken"] = tiktoken.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["gpu_count"] = torch.cuda.device_count()
        try:
            env["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            pass
    else:
        env["torch_threads"] = torch.get_num_threads()
    return env


def _finite_or_null(fields: dict[str, Any]) -> dict[str, Any]:
    """Standard JSON has no NaN/Infinity: a non-finite float becomes ``null`` and a sibling
    ``<key>_str`` keeps what it was ("nan", "inf" or "-inf"), at any nesting depth."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if isinstance(v, dict):
            v = _finite_or_null(v)
        elif isinstance(v, (list, tuple)):  # no room for a sibling: non-finite entries become null
            v = [x if not isinstance(x, float) or math.isfinite(x) else None for x in v]
        elif isinstance(v, float) and not math.isfinite(v):
            out[f"{k}_str"] = str(v)  # "nan", "inf", "-inf"
            v = None
        out[k] = v
    return out


STEP_KINDS = ("train", "val", "eval", "sample", "rl")  # records that describe the model at a step


class _RecordClock:
    """A record's ``time``: the wall clock (Unix seconds) read once, when the log opens, plus the time since
    on a clock no one sets (Linux CLOCK_BOOTTIME, which counts a suspend too; else the monotonic one). The
    wall clock set back (or forward) mid-run, by hand or by NTP stepping it, made the records' times go
    backwards, and what subtracts them (race's wall_seconds) came out negative; within one invocation the
    difference of two records' times is now always the time that passed."""

    def __init__(self) -> None:
        boot = getattr(time, "CLOCK_BOOTTIME", None)
        self._since = (lambda: time.clock_gettime(boot)) if boot is not None else time.monotonic
        self._wall0, self._t0 = time.time(), self._since()

    def __call__(self) -> float:
        return self._wall0 + (self._since() - self._t0)


class MetricsLog:
    """Append-only JSON lines: one object per event, each with ``kind`` and ``step``.

    Every line is standard JSON (``allow_nan=False``): a diverged loss is written as
    ``"loss": null, "loss_str": "nan"``, so strict parsers (jq, JavaScript, pandas) read it too.
    ``sinks`` (TensorBoard, W&B; :mod:`gptforge.run.sinks`) receive the same records.

    After a kill the file may end in a torn line, and a resumed run trains again the steps after
    its checkpoint. :meth:`begin` (called once per run, before the first write) repairs both: the
    torn tail is cut back to the last complete record, and the abandoned attempt's records of steps
    after the resume point get ``"replayed": true`` (kept as evidence, never deleted).
    :func:`read_metrics` leaves marked records out unless asked for them."""

    def __init__(self, path: str | Path, enabled: bool = True, sinks: list | None = None,
                 guard: Callable[[str], None] | None = None, note: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self.sinks = list(sinks or []) if enabled else []
        self.guard = guard  # before each record: the run directory is still the run's (run/lock.py)
        self.note = note  # says once what happened to the file between two records (deleted, cut)
        self._left: tuple[int, int] | None = None  # (inode, size) the last record left the file at
        self._clock = _RecordClock()

    def begin(self, start_step: int) -> tuple[int, int]:
        """Repair the file for a run starting at ``start_step``: returns (bytes of torn tail
        removed, records marked replayed)."""
        if not self.enabled or not self.path.exists():
            return 0, 0
        torn = repair_torn_tail(self.path)
        return torn, mark_replayed(self.path, start_step)

    def write(self, kind: str, step: int, **fields: Any) -> None:
        if not self.enabled:
            return
        rec = _finite_or_null({"kind": kind, "step": step, "time": round(self._clock(), 3), **fields})
        from gptforge.storage.faults import RESUME_HINT

        if self.guard is not None:
            self.guard(f"a metrics.jsonl record (step {step})")
        self._check_left(step)
        append_line(self.path, json.dumps(rec, allow_nan=False) + "\n", "a metrics.jsonl record", then=RESUME_HINT)
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            self._left = (st.st_ino, st.st_size)
        for sink in self.sinks:
            sink.write(rec)

    def _check_left(self, step: int) -> None:
        """The file as the last record left it, else one line saying what happened (this run is its one
        writer, so someone else did it) and a file that reads whole again: a record cut in two by a
        truncation is removed, or the next record would be glued to it and both lost."""
        if self._left is None:
            return
        ino, size = self._left
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino == ino and st.st_size >= size:
            return
        self._left = None
        if st is None or st.st_ino != ino:
            said = "was deleted or replaced while the run trained; the records before this step are not in it"
        else:
            cut = repair_torn_tail(self.path)
            said = (f"was cut from {size:,} to {st.st_size:,} bytes while the run trained"
                    + (f" (the {cut} bytes of a record it cut in two removed)" if cut else ""))
        if self.note is not None:
            self.note(f"{self.path}: {said}; writing on from step {step} (the checkpoints keep the run)")

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def append_line(path: Path, line: str, what: str, then: str = "run the same command again") -> None:
    """Append ``line`` whole or not at all: a write that fails part-way (a full disk) is cut back to
    where it started, so the file never ends in a torn record, and a full disk is a
    :class:`~gptforge.storage.faults.DiskFullError` (exit 2, one line), as for checkpoints; a read-only disk, a file
    past ``ulimit -f`` or an I/O error is the same kind of one line. ``then``: how to continue."""
    from gptforge.storage.faults import output_error

    data = line.encode()
    try:  # the file or its folder made read-only (chmod -R, a remount) is the same one line as a refused write
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        err = output_error(e, path, what, len(data), then=then)
        if err is not None:
            raise err from e
        raise
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as e:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            err = output_error(e, path, what, len(data), then=then)  # full, read-only, too large, I/O error
            if err is not None:
                raise err from e
            raise
    finally:
        os.close(fd)


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that a kill left unfinished (no newline, or not a JSON object); bytes removed."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
        body = tail[:-1] if tail.endswith(b"\n") else tail
        cut = body.rfind(b"\n") + 1  # start of the last line, within tail
        if cut == 0 and size > len(tail):
            return 0  # a last line over 1 MiB: not ours to judge
        last = body[cut:]
        ok = tail.endswith(b"\n")
        if ok:
            try:
                ok = isinstance(json.loads(last), dict) if last.strip() else True
            except (json.JSONDecodeError, UnicodeDecodeError):
                ok = False
        if ok:
            return 0
        keep = size - len(tail) + cut
        f.truncate(keep)
        return size - keep


def mark_replayed(path: Path, start_step: int) -> int:
    """Add ``"replayed": true`` to step records after ``start_step`` (a resumed run writes them
    again); rewrites the file atomically. Returns the number of records newly marked."""
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    marked = 0
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (isinstance(rec, dict) and rec.get("kind") in STEP_KINDS and isinstance(rec.get("step"), int)
                and rec["step"] > start_step and not rec.get("replayed")):
            rec["replayed"] = True
            lines[i] = json.dumps(rec) + "\n"
            marked += 1
    if marked:  # through the one writer: fsynced, its temporary removed on a failure, a full disk in one line
        from gptforge.storage import write_text

        write_text(path, "".join(lines), what="the run's metrics.jsonl")
    return marked


def last_start_run(path: Path) -> str | None:
    """The run id the last "start" record of metrics.jsonl ``path`` names (the run that last trained in its
    folder: a resume keeps the id), or None (no file, no start record naming one, an unreadable file)."""
    last = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if '"start"' not in line:  # cheap: most lines are step records
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("kind") == "start" and isinstance(rec.get("run"), str):
                    last = rec["run"]
    except OSError:
        return None
    return last


def other_runs_records(path: Path, run_id: str | None) -> str | None:
    """Where metrics.jsonl holds step records of another run than ``run_id`` (a "start" record naming another
    run, and records after it not marked replayed, before this run's next start): "lines A-B are run X's
    records" in words, or None. Files written before start records named their run are not judged."""
    if not isinstance(run_id, str) or not path.is_file():
        return None
    current, first, last, count = None, 0, 0, 0
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("kind") == "start":
                current = rec.get("run") if isinstance(rec.get("run"), str) else None
                continue
            if (current is not None and current != run_id and rec.get("kind") in STEP_KINDS
                    and not rec.get("replayed")):
                first, last, count = first or n, n, count + 1
                other = current
    if not count:
        return None
    return f"lines {first}-{last} hold {count} records of another run (run {other}), not this one ({run_id})"


def read_metrics(path: str | Path, replayed: bool = False,
                 warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (or a run directory holding one), in order, as a list: for the short
    files of tests and tools; a reader of a whole run's file (a million lines is 200 MB) walks
    :func:`iter_metrics` and keeps what it needs (:class:`StepSeries`)."""
    return list(iter_metrics(path, replayed, warn))


def iter_metrics(path: str | Path, replayed: bool = False,
                 warn: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """The records of a metrics.jsonl (or a run directory holding one), in order, one at a time. A line
    that is not a JSON object is skipped and reported through ``warn`` (default: a warning) with its line
    number; records marked ``replayed`` (superseded by a resume) are left out unless ``replayed``."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if warn is None:
        def warn(msg: str) -> None:
            warnings.warn(msg, stacklevel=4)
    with open(p, errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                warn(f"{p}:{lineno}: not a JSON record ({e.msg}); skipped")
                continue
            if not isinstance(rec, dict):
                warn(f"{p}:{lineno}: not a JSON object; skipped")
                continue
            if replayed or not rec.get("replayed"):
                yield rec


def finite_number(v: Any) -> float | None:
    """``v`` as a finite float, or None: a hand-edited or foreign metrics file may hold a string, a list,
    a bool, NaN/Infinity (which json reads) or an integer past float's range where a number belongs; such
    a point is left off a curve (as a missing one is) instead of failing the whole figure or answer."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def whole_step(v: Any) -> int | None:
    """``v`` as a record's step on a curve's axis, or None: a whole number within float's range (not a bool,
    a string or 10**400, which a hand-edited or foreign file may hold)."""
    if isinstance(v, bool) or not isinstance(v, int) or finite_number(v) is None:
        return None
    return v


class StepSeries:
    """A curve's records keyed by step, at most ``cap`` of them plus the latest, whatever the file's length:
    a record is kept when its step is at least ``gap`` from the last one kept, and when more than ``cap`` are
    held the gap doubles and the held ones are thinned by the same rule. A record at a step already held
    replaces it (the last one wins, as for files from before replayed records were marked); the latest
    record is always kept, so a curve ends where its run did. ``cap`` points are more than a figure's or a
    page's width in pixels."""

    def __init__(self, cap: int = 4096):
        self.cap, self.gap = max(2, int(cap)), 1
        self._held: dict[int, Any] = {}
        self._prev: int | None = None
        self._last: tuple[int, Any] | None = None

    def add(self, step: int, rec: Any) -> None:
        self._last = (step, rec)
        if step in self._held or self._prev is None or abs(step - self._prev) >= self.gap:
            self._held[step] = rec
            self._prev = step
        while len(self._held) > self.cap:
            self.gap *= 2
            kept: dict[int, Any] = {}
            prev = None
            for s in sorted(self._held):
                if prev is None or s - prev >= self.gap:
                    kept[s] = self._held[s]
                    prev = s
            self._held, self._prev = kept, prev

    def __len__(self) -> int:
        return len(self.items())

    def __bool__(self) -> bool:
        return self._last is not None

    def items(self) -> dict[int, Any]:
        """step -> record, the held ones and the latest."""
        out = dict(self._held)
        if self._last is not None:
            out[self._last[0]] = self._last[1]
        return out


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
