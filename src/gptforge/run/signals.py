"""Stopping a run politely: SIGINT/SIGTERM ask the loop to checkpoint at the next step boundary.

    with StopFlag() as stop:
        for step in ...:
            ...
            if stop.stop: save(); break

The first signal sets the flag and prints one acknowledgement line. Repeats are common and are not a
request to abort: ``timeout``, process-group kills, schedulers and launchers often deliver SIGTERM
twice in quick succession, and a terminal sends SIGINT to every process of the group. So:

* any signal within ``grace_s`` (2 s) of the first is ignored: the checkpoint is still written;
* after that, a second Ctrl-C (SIGINT) aborts at once without saving (KeyboardInterrupt);
* a repeated SIGTERM never aborts; it is reported and the run still saves (whoever must stop the
  process at once sends SIGKILL).

After the ``with`` block of a run that was stopped by a signal, the handler stays until the grace
window has passed (a duplicate that arrives while the process is exiting is still ignored); a later
signal gets the previous handler's behaviour.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

GRACE_S = 2.0


class StopFlag:
    """SIGINT/SIGTERM set ``stop``; see the module docstring for what a second signal does."""

    def __init__(self, grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None) -> None:
        self.stop = False
        self.grace_s = grace_s
        self._clock = clock
        self._first: float | None = None
        self._say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._old: dict[int, Any] = {}
        self._exited = False

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        now = self._clock()
        if self._first is None:
            self._first = now
            self.stop = True
            self._say(f"\n[gptforge] got {name}: finishing this step, saving a checkpoint, then exiting "
                      f"(press Ctrl-C again after {self.grace_s:g} s to abort without saving)")
            return
        if now - self._first < self.grace_s:  # a duplicate delivery, not a decision: keep saving
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
            raise KeyboardInterrupt
        self._say(f"[gptforge] got {name} again: still saving the checkpoint (SIGKILL stops at once, unsaved)")

    def __exit__(self, *exc: Any) -> None:
        self._exited = True
        if self._first is None or self._clock() - self._first >= self.grace_s:
            self._restore()

    def _restore(self) -> None:
        for sig, old in self._old.items():
            if old is not None:  # None: a handler installed outside Python, which cannot be put back
                signal.signal(sig, old)
        self._old = {}
