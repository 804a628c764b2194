"""The visiting order the conversation and preference loaders share: a seeded permutation of the
items, a new one each epoch, and (epoch, cursor) as the whole resumable position.

    class MyLoader(EpochOrder):
        def __init__(self, items, shuffle, seed):
            self.items, self.shuffle, self.seed = items, shuffle, seed
            self.reset()
        def next_item(self):
            return self.items[self._advance()]
"""

from __future__ import annotations

import numpy as np


class EpochOrder:
    """Mix-in. The host sets ``shuffle``, ``seed`` and ``_count()`` (how many items); every rank that
    uses the same seed walks the same order, so a loader can deal each rank its share of a step."""

    shuffle: bool
    seed: int

    def _count(self) -> int:
        raise NotImplementedError

    def reset(self) -> None:
        self._seek(0, 0)

    def _seek(self, epoch: int, cursor: int) -> None:
        self.epoch, self.cursor = epoch, cursor
        self._perm = self._order(epoch)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self._count())
        return np.random.default_rng([self.seed, epoch]).permutation(self._count())

    def _load_position(self, state: dict) -> None:
        """Seed, shuffle and (epoch, cursor) from a checkpoint's loader state, each checked (a cursor
        past the items, or a shuffle of "false", is a damaged checkpoint, not a position)."""
        from gptforge.errors import saved_bool, saved_int

        self.seed, self.shuffle = saved_int(state, "seed", 0, 2**32), saved_bool(state, "shuffle")
        self._seek(saved_int(state, "epoch", 0), saved_int(state, "cursor", 0, self._count()))

    def _advance(self) -> int:
        """The next item's index; the epoch turns (and the order with it) after the last one."""
        i = int(self._perm[self.cursor])
        self.cursor += 1
        if self.cursor == self._count():
            self._seek(self.epoch + 1, 0)
        return i
