"""Stop signals: SIGINT/SIGTERM finish the current step, save a checkpoint and exit.

    with StopFlag() as stop:
        for step in ...:
            ...
            if stop.stop: save(); break
"""

from __future__ import annotations

import signal
import sys
from typing import Any


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.stop:  # second signal: give up immediately
            raise KeyboardInterrupt
        self.stop = True
        print(f"\n[gptforge] got signal {signum}: finishing this step, saving a checkpoint, then exiting "
              "(send again to abort without saving)", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
