"""The worker side of ``prepare``: the tokenizer a worker loads, the function it runs on each chunk
of documents, and the process facts the summary reports (cores, peak memory).

Top-level functions only, so ``spawn``/``forkserver`` pools can pickle them by reference.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from gptforge.data.prepare.sources import SourceError
from gptforge.errors import flagged


def load_tokenizer(spec: str):
    """The tokenizer ``--tokenizer`` names (:func:`gptforge.data.tokenizer.load_tokenizer`: gpt2, a
    trained tokenizer's folder, a tokenizer.json, a Hugging Face directory, a tiktoken name)."""
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.data.tokenizer import load_tokenizer as load

    try:
        return load(spec)
    except (TokenizerError, FileNotFoundError) as e:
        raise SourceError(flagged("--tokenizer", e)) from None


# --- worker side: top-level functions, so spawn/forkserver can pickle them ----------------------------

_ENC = None
_DTYPE = None
_CPU_READY = 0.0  # CPU seconds a worker spent starting (imports, tokenizer), reported apart
_BEAT = None  # (the shared board, this worker's offset on it) where the parent watches it; None: unwatched
BEAT_FIELDS = 3  # per worker: the item number of the document it is on, its characters, since when (0 = none)

# --- the per-document deadline ------------------------------------------------------------------------
# A tokenizer read from a file is probed at load (split_bounds) but a pattern slow only after a prefix no
# probe run holds passes it, and a C-level regex call cannot be interrupted from its own thread: the parent
# watches each worker's heartbeat and stops the run when one document runs past this deadline.
# The numbers: a linear split costs 0.1-4 us of CPU a character on this loaded machine (split_bounds' measure),
# BPE merges about 1 us more; split_bounds refuses a pattern over PER_CHAR_S = 25 us a character. The budget
# is 100 us a character, 4x that refusal line and 20x the slowest linear tokenization measured, so a machine
# 10x slower still passes every linear tokenizer; a 1M-character document gets 100 s, where the quadratic
# ``a+b`` takes ~30 minutes. The floor (30 s) covers what is not the document: page faults, swap, a machine
# shared with other jobs. GPTFORGE_DOC_DEADLINE_S replaces the floor (a document that is only slow gets more
# time; tests use a fraction of a second).
DOC_DEADLINE_ENV = "GPTFORGE_DOC_DEADLINE_S"
DOC_DEADLINE_FLOOR_S = 30.0
DOC_BUDGET_S_PER_CHAR = 100e-6


def deadline_floor() -> float:
    """The deadline of a short document: GPTFORGE_DOC_DEADLINE_S where set (a positive number of seconds),
    else DOC_DEADLINE_FLOOR_S."""
    raw = os.environ.get(DOC_DEADLINE_ENV, "").strip(" \t\n\r\f\v")  # a no-break space: refused below
    if not raw:
        return DOC_DEADLINE_FLOOR_S
    from gptforge.numbers import parse_float

    try:  # the one number parser: '３０' and '3_0' refused, not read as 30
        v = parse_float(raw)
    except ValueError:
        v = float("nan")
    if not v > 0:
        raise SourceError(f"{DOC_DEADLINE_ENV}={raw!r}: expected a positive number of seconds (the least time one "
                          f"document may take to tokenize; default {DOC_DEADLINE_FLOOR_S:g})")
    return v


def doc_deadline(chars: int, floor: float = DOC_DEADLINE_FLOOR_S) -> float:
    """Seconds one document of ``chars`` characters may take to tokenize: the floor, or
    DOC_BUDGET_S_PER_CHAR a character where that is more."""
    return max(floor, chars * DOC_BUDGET_S_PER_CHAR)


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """A worker whose main process was killed (SIGKILL, OOM killer) would wait on its queue forever,
    and keep multiprocessing's resource tracker alive with it. Two guards, from the first line of the
    worker's initializer:

    * Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills the worker with its parent;
    * everywhere: a daemon thread that polls for the parent's pid. The parent is the pid the pool was
      started from (``multiprocessing.parent_process()``), not ``os.getppid()`` read now: a parent
      killed while the worker was still importing has already been replaced by init, and a watchdog
      that takes init for the parent never fires (the leak issue 21 found)."""
    import multiprocessing
    import threading

    parent_proc = multiprocessing.parent_process()
    parent = parent_proc.pid if parent_proc is not None and parent_proc.pid else os.getppid()
    _die_with_parent_linux()
    if os.getppid() != parent:  # it died before the guards were in place
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _die_with_parent_linux() -> None:
    """PR_SET_PDEATHSIG = SIGKILL through libc's prctl; a no-op where there is none."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG (linux/prctl.h)
    except (OSError, AttributeError):  # no libc symbol (static builds, musl variants): the thread remains
        pass


def init_worker(tokenizer: str, dtype: str, pool_worker: bool = False, beats=None, slots=None) -> None:
    """``beats``, ``slots``: the parent's heartbeat board (:class:`gptforge.data.prepare.watch.Watch`);
    this worker claims the next free slot on it and says there which document it is tokenizing since when."""
    global _ENC, _DTYPE, _CPU_READY, _BEAT
    if pool_worker:  # Ctrl-C is the main process's to handle: it stops the pool; the manifest is consistent
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _exit_with_parent()
    if pool_worker:  # processes are the parallelism here: no thread pool inside each (tokenizers' Rayon)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENC, _DTYPE = load_tokenizer(tokenizer), np.dtype(dtype)
    if beats is not None:
        with slots.get_lock():
            slot = slots.value
            slots.value += 1
        _BEAT = (beats, slot * BEAT_FIELDS)
    _CPU_READY = time.process_time()


def tokenize(texts: list[str], names: list[str] | None = None, ids: list[int] | None = None,
             heads: list[bool] | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Concatenated ``[EOT, *tokens]`` of each text, each document's length, and this process's
    stats (pid, CPU seconds so far, peak RSS) for the summary. ``heads``: whether each text starts a document
    (all of them when None); a text that goes on from the one before (a piece of a .txt file) has no EOT before
    it. ``names``: where each text came from
    ("file:row"), for a refusal that names the document. ``ids``: each text's item number, which a watched
    worker posts on its heartbeat before encoding the text (one document a call then, so the parent knows
    which one runs long).

    ``encode_batch_numpy`` gives ``encode_ordinary``'s ids (a literal "<|endoftext|>" in the text is
    plain text) straight into arrays: tiktoken's ``encode_to_numpy`` (no Python int per token), or
    the ``tokenizers`` library's batch encode.
    """
    from gptforge.data.tokenizer import TokenizerError

    enc = _ENC
    eot = np.array([enc.eot_token], dtype=_DTYPE)
    try:
        docs = enc.encode_batch_numpy(texts) if _BEAT is None or ids is None else _encode_watched(enc, texts, ids)
    except TokenizerError as e:  # a split pattern that gives up on one text: which document, and what to do
        raise SourceError(_failing_document(enc, texts, names, e)) from None
    heads = [True] * len(docs) if heads is None else heads
    lengths = np.fromiter((len(d) + h for d, h in zip(docs, heads, strict=True)), dtype=np.int64, count=len(docs))
    parts = [a for d, h in zip(docs, heads, strict=True) for a in ((eot, d) if h else (d,))]
    flat = np.concatenate(parts).astype(_DTYPE, copy=False) if parts else np.empty(0, dtype=_DTYPE)
    return flat, lengths, {"pid": os.getpid(), "cpu": time.process_time(), "startup_cpu": _CPU_READY,
                           "rss": peak_rss_mb()}


def _encode_watched(enc, texts: list[str], ids: list[int]) -> list[np.ndarray]:
    """Each text on its own, its item number, length and start time posted on this worker's heartbeat first
    (the start cleared while the other two change, so the parent never reads a new document with an old time)."""
    board, b = _BEAT
    docs: list[np.ndarray] = []
    try:
        for text, item in zip(texts, ids, strict=True):
            board[b + 2] = 0.0
            board[b], board[b + 1] = item, len(text)
            board[b + 2] = time.monotonic()  # system-wide on Linux, macOS and Windows: the parent's clock
            docs.extend(enc.encode_batch_numpy([text]))
    finally:
        board[b + 2] = 0.0
    return docs


# what a refused document's message tells: the source or the tokenizer changes, so the manifest no longer matches
# them and a plain rerun is refused (manifest.open_manifest): --force is the way on, not a resume
SLOW_FIX = ("Fix: remove or split this document, or fix the tokenizer's split pattern, then prepare again with "
            "--force (the source or tokenizer changed, so the shards written so far are made again)")


def _failing_document(enc, texts: list[str], names: list[str] | None, error: Exception) -> str:
    """The refusal of a chunk the tokenizer gave up on, naming the first document it gives up on alone
    (each encoded again: a give-up is the engine's limit, quick, so the search costs little)."""
    from gptforge.data.tokenizer import TokenizerError

    for k, text in enumerate(texts):
        try:
            enc.encode_batch_numpy([text])
        except TokenizerError as e:
            name = names[k] if names is not None and k < len(names) else f"document {k + 1} of its chunk"
            return f"{name}: {e}. {SLOW_FIX}"
    return str(error)


def available_cores() -> int:
    """Cores this process may run on (affinity mask where the OS has one; a container's may be fewer
    than os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB.

    Linux: VmHWM of /proc/self/status, because ru_maxrss survives fork+exec and would charge a spawned
    worker with its parent's peak. Elsewhere ru_maxrss (KiB on Linux/BSD, bytes on macOS).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource  # not on Windows

    scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 1024
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, 1)
