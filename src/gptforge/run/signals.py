"""Stopping a run politely: SIGINT/SIGTERM/SIGHUP ask the loop to checkpoint at the next step boundary.

    with StopFlag() as stop:
        for step in ...:
            ...
            if stop.stop: save(); break

The first signal sets the flag and prints one acknowledgement line. Repeats are common and are not a
request to abort: ``timeout``, process-group kills, schedulers and launchers often deliver SIGTERM
twice in quick succession, and a terminal sends SIGINT to every process of the group. So:

* any signal that *arrives* within ``grace_s`` (2 s) of the first is ignored: the checkpoint is still
  written;
* after that, a second Ctrl-C (SIGINT) aborts at once without saving (KeyboardInterrupt);
* a repeated SIGTERM never aborts; it is reported and the run still saves (whoever must stop the
  process at once sends SIGKILL).

The first signal's line names the signal and how to force the stop (:func:`force_words`): Ctrl-C again after a
Ctrl-C; after SIGTERM or SIGHUP (no terminal left) ``kill -INT PID`` past the window or ``kill -KILL PID``.

Arrival, not handling: Python runs a signal handler only between bytecodes of the main thread, so a
long backward pass (one C++ call) can delay the second handler by seconds, past the window, although
the two signals were 0.3 s apart. So the window is measured where the signal lands:
``signal.set_wakeup_fd`` makes CPython's C-level handler write each signal's number to a pipe at once,
and a reader thread (torch releases the GIL inside its ops) stamps and judges it. A deliberate second
Ctrl-C reaches the main thread as KeyboardInterrupt through ``signal.pthread_kill``. Where no wakeup
fd can be had (not the main thread, another owner such as an asyncio loop), handling time is used.

After the ``with`` block of a run that was stopped by a signal, the handler stays until the grace
window has passed (a duplicate that arrives while the process is exiting is still ignored); a later
signal gets the previous handler's behaviour.

SIGHUP (the terminal or the ssh session closed) is SIGTERM's twin: a polite stop, never an abort. Where it is
ignored when the run starts (``nohup``), it is left ignored and the run goes on. While a run is in progress its
prints cannot stop it (gptforge.environment: a terminal gone, a full or closed stdout), so the checkpoint after
a hangup is written although every line said about it is lost.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gptforge import environment

GRACE_S = 2.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


def _say_on_stderr(msg: str) -> None:
    try:
        print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a terminal that hung up (EIO), a closed stderr: nobody to tell
        pass


def force_words(signum: int, grace_s: float) -> str:
    """How to stop without the checkpoint, in the words that fit the signal that came: Ctrl-C again for a
    Ctrl-C; for SIGTERM (a repeat never aborts) and SIGHUP (no terminal left to press Ctrl-C in), the kill
    commands that do, naming this process. ``grace_s``: how long a second signal counts as a duplicate."""
    after = f" after {grace_s:g} s" if grace_s > 0 else ""
    if signum == signal.SIGINT:
        return f"press Ctrl-C again{after} to abort without saving"
    pid = os.getpid()
    why = ("the terminal is gone" if signum == getattr(signal, "SIGHUP", None)
           else f"another {signal.Signals(signum).name} does not abort")
    return f"{why}; to abort without saving: kill -INT {pid}{after}, or kill -KILL {pid} at once"


class StopFlag:
    """SIGINT/SIGTERM/SIGHUP set ``stop``; see the module docstring for what a second signal does."""

    def __init__(self, grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None) -> None:
        self.stop = False
        self.grace_s = grace_s
        self._clock = clock
        self._first: float | None = None
        self._say = say or _say_on_stderr
        self._old: dict[int, Any] = {}
        self._exited = False
        self._abort = False  # the reader thread judged a signal a deliberate abort
        self._reader: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._lock = threading.Lock()

    def __enter__(self) -> StopFlag:
        environment.run_started(self.request_stop)  # from here on a failing stdout cannot kill the run unsaved
        for sig in _SIGNALS:
            if sig != signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:  # nohup: the user's choice
                continue
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        if self._old:
            self._start_reader()
        return self

    def request_stop(self, reason: str) -> None:
        """A stop asked from inside the process (stdout's reader left): as a first signal, saved at the step
        boundary; said on stderr, which may still reach someone."""
        with self._lock:
            first = self._first is None
            if first:
                self._first = self._clock()
            self.stop = True
        if first:
            self._say(f"[gptforge] {reason}: finishing this step, saving a checkpoint, then exiting")

    # --- arrival times: the wakeup fd and its reader thread ---------------------------------------

    def _start_reader(self) -> None:
        try:
            r, w = os.pipe()
        except OSError:
            return
        try:
            os.set_blocking(w, False)  # the C handler must never block
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r), os.close(w)
            return
        if old != -1:  # someone else listens (an event loop): leave it theirs, judge by handling time
            signal.set_wakeup_fd(old)
            os.close(r), os.close(w)
            return
        self._pipe = (r, w)
        self._reader = threading.Thread(target=self._read, args=(r,), name="gptforge-signals", daemon=True)
        self._reader.start()

    def _read(self, r: int) -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            now = self._clock()
            for signum in data:
                if signum == 0:  # our own sentinel: the run is over
                    return
                if signum in _SIGNALS:
                    self._arrived(signum, now, None)

    def _stop_reader(self) -> None:
        if self._reader is None or self._pipe is None:
            return
        r, w = self._pipe
        signal.set_wakeup_fd(self._old_wakeup)
        try:
            os.write(w, b"\0")
        except OSError:
            pass
        self._reader.join(timeout=5)
        os.close(r), os.close(w)
        self._reader = self._pipe = None

    # --- the decision ---------------------------------------------------------------------------

    def _handle(self, signum: int, frame: Any) -> None:
        """The Python-level handler (main thread, possibly seconds after arrival)."""
        if self._reader is None:  # no wakeup fd: the handling time is the best arrival time there is
            self._arrived(signum, self._clock(), frame)
            return
        if self._abort:
            raise KeyboardInterrupt
        self.stop = True  # the first signal always means stop; the reader thread prints and judges

    def _arrived(self, signum: int, now: float, frame: Any) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            first = self._first
            if first is None:
                self._first = now
                self.stop = True
        if first is None:
            self._say(f"\n[gptforge] got {name}: finishing this step, saving a checkpoint, then exiting "
                      f"({force_words(signum, self.grace_s)})")
            return
        if now - first < self.grace_s:  # a duplicate delivery, not a decision: keep saving
            return
        if self._exited:  # the run is over: the signal means what it meant before the run
            old = self._old.get(signum)
            self._restore()
            if callable(old):
                old(signum, frame)
            elif old != signal.SIG_IGN:
                os.kill(os.getpid(), signum)  # default action, now that the default is back
            return
        if signum == signal.SIGINT:
            if threading.current_thread() is threading.main_thread():
                raise KeyboardInterrupt
            if not self._abort:  # (interrupt_main's own wakeup byte arrives here too: once is enough)
                self._abort = True  # the reader thread: the main thread raises it in _handle
                # a real signal to the main thread: it also wakes a blocking call (interrupt_main would not)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return
        self._say(f"[gptforge] got {name} again: still saving the checkpoint ({force_words(signum, 0)})")

    def __exit__(self, *exc: Any) -> None:
        environment.run_ended(self.request_stop)
        self._stop_reader()  # from here on, handling time (nothing long runs while the process exits)
        self._exited = True
        if self._first is None or self._clock() - self._first >= self.grace_s:
            self._restore()

    def _restore(self) -> None:
        for sig, old in self._old.items():
            if old is not None:  # None: a handler installed outside Python, which cannot be put back
                signal.signal(sig, old)
        self._old = {}
