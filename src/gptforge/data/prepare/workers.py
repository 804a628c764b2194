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


def load_tokenizer(spec: str):
    """The tokenizer ``--tokenizer`` names (:func:`gptforge.data.tokenizer.load_tokenizer`: gpt2, a
    trained tokenizer's folder, a tokenizer.json, a Hugging Face directory, a tiktoken name)."""
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.data.tokenizer import load_tokenizer as load

    try:
        return load(spec)
    except (TokenizerError, FileNotFoundError) as e:
        raise SourceError(f"--tokenizer: {e}") from None


# --- worker side: top-level functions, so spawn/forkserver can pickle them ----------------------------

_ENC = None
_DTYPE = None
_CPU_READY = 0.0  # CPU seconds a worker spent starting (imports, tokenizer), reported apart


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


def init_worker(tokenizer: str, dtype: str, pool_worker: bool = False) -> None:
    global _ENC, _DTYPE, _CPU_READY
    if pool_worker:  # Ctrl-C is the main process's to handle: it stops the pool; the manifest is consistent
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _exit_with_parent()
    if pool_worker:  # processes are the parallelism here: no thread pool inside each (tokenizers' Rayon)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENC, _DTYPE = load_tokenizer(tokenizer), np.dtype(dtype)
    _CPU_READY = time.process_time()


def tokenize(texts: list[str], names: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Concatenated ``[EOT, *tokens]`` of each text, each document's length, and this process's
    stats (pid, CPU seconds so far, peak RSS) for the summary. ``names``: where each text came from
    ("file:row"), for a refusal that names the document.

    ``encode_batch_numpy`` gives ``encode_ordinary``'s ids (a literal "<|endoftext|>" in the text is
    plain text) straight into arrays: tiktoken's ``encode_to_numpy`` (no Python int per token), or
    the ``tokenizers`` library's batch encode.
    """
    from gptforge.data.tokenizer import TokenizerError

    enc = _ENC
    eot = np.array([enc.eot_token], dtype=_DTYPE)
    try:
        docs = enc.encode_batch_numpy(texts)
    except TokenizerError as e:  # a split pattern that gives up on one text: which document, and what to do
        raise SourceError(_failing_document(enc, texts, names, e)) from None
    lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    parts = [a for d in docs for a in (eot, d)]
    flat = np.concatenate(parts).astype(_DTYPE, copy=False) if parts else np.empty(0, dtype=_DTYPE)
    return flat, lengths, {"pid": os.getpid(), "cpu": time.process_time(), "startup_cpu": _CPU_READY,
                           "rss": peak_rss_mb()}


def _failing_document(enc, texts: list[str], names: list[str] | None, error: Exception) -> str:
    """The refusal of a chunk the tokenizer gave up on, naming the first document it gives up on alone
    (each encoded again: a give-up is the engine's limit, quick, so the search costs little)."""
    from gptforge.data.tokenizer import TokenizerError

    for k, text in enumerate(texts):
        try:
            enc.encode_batch_numpy([text])
        except TokenizerError as e:
            name = names[k] if names is not None and k < len(names) else f"document {k + 1} of its chunk"
            return (f"{name}: {e}. Fix: remove or split this document (or fix the tokenizer's split pattern), "
                    "then run the same command again: finished shards are kept")
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
