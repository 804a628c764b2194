"""BOS-aligned batches: every row of a batch starts at a document boundary where one is in reach.

    gptforge train --preset speedrun-d4 --data.align bos --model.attention document

``data.align bos`` (with document-causal attention, :mod:`gptforge.models.masks`) is
modded-nanogpt's batching: a row that starts at a BOS never begins mid-sentence without context.
Rows are cut from a shard in order: a row takes ``T+1`` tokens from its start; the next row starts
at the first BOS at or after that row's end, if that BOS lies within ``T`` tokens; otherwise (a
document longer than that) it continues right at the end, so long documents are not thrown away.
At most ``T-1`` tokens before each document boundary are skipped.

Everything else is :class:`gptforge.data.loader.ShardLoader`'s: the loader's position counts
rows (in units of ``T`` tokens), so ranks, micro-steps, shard changes, shuffling and the resumable
state work as they do there, and a checkpoint records ``align`` so a resume continues the same rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gptforge.data.loader import ShardLoader
from gptforge.data.shards import ShardError


def row_starts(tokens: np.ndarray, T: int, bos: int) -> np.ndarray:
    """Start offsets of the ``T+1``-token rows of one shard (see the module docstring)."""
    bos_at = np.flatnonzero(np.asarray(tokens) == bos)
    n = len(tokens)
    starts = []
    s = int(bos_at[0]) if len(bos_at) and bos_at[0] < T else 0
    while s + T + 1 <= n:
        starts.append(s)
        end = s + T
        i = np.searchsorted(bos_at, end)
        s = int(bos_at[i]) if i < len(bos_at) and bos_at[i] - end < T else end
    return np.asarray(starts, dtype=np.int64)


class AlignedShardLoader(ShardLoader):
    """ShardLoader whose rows start at BOS tokens (``data.align bos``)."""

    def __init__(self, files: list[Path], B: int, T: int, rank: int = 0, world: int = 1, **kw):
        super().__init__(files, B, T, rank, world, **kw)  # shuffle, seed, eot, step_tokens, vocab_size
        self._starts: np.ndarray | None = None

    def reset(self) -> None:
        super().reset()
        self._starts = None

    def _rows(self) -> np.ndarray:
        tokens = self._current()
        if self._starts is None:
            self._starts = row_starts(tokens, self.T, self.eot)
            need = max(self.B * self.world, (self.step_tokens or 0) // self.T)
            if len(self._starts) < need:
                raise ShardError(f"{self.files[self._order()[self.shard]]}: only {len(self._starts)} BOS-aligned rows of "
                                 f"{self.T + 1} tokens, fewer than one step needs ({need}); use --data.align off")
        return self._starts

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        starts = self._rows()
        tokens = self._tokens
        first = self.pos // T + self.rank * B  # pos counts rows * T, as the unaligned loader counts tokens
        rows = np.stack([tokens[s : s + T + 1] for s in starts[first : first + B]]).astype(np.int64)
        buf = torch.from_numpy(rows)
        self.pos += B * T * self.world
        n_rows = len(starts)
        if self.step_tokens:
            if (self.pos - self._origin) % self.step_tokens == 0 and (self.pos + self.step_tokens) // T > n_rows:
                self._advance()
        elif (self.pos + B * T * self.world) // T > n_rows:
            self._advance()
        return buf[:, :-1], buf[:, 1:]

    def _advance(self) -> None:
        self._advance_shard()

    def _advance_shard(self) -> None:
        super()._advance_shard()
        self._starts = None

    def _fits(self, n: int) -> bool:
        return (self.pos + n) // self.T <= len(self._rows())

    def load_state_dict(self, state: dict) -> None:
        if state.get("align", "off") != "bos":
            raise ShardError("checkpoint loader state was saved with data.align=off, but this run has data.align=bos; "
                             "resume with the original setting")
        if "seq_len" in state:  # (checkpoints from before it was saved: no check)
            from gptforge.errors import saved_int

            saved = saved_int(state, "seq_len", 1, 2**31)
            if saved != self.T:
                # the rows are cut for one row length (row_starts depends on T) and the position counts them, so
                # under another length the saved position names other rows: data re-read or skipped in silence
                raise ShardError(f"checkpoint loader state counts BOS-aligned rows of train.seq_len {saved}, but this "
                                 f"run has train.seq_len {self.T}; resume with --train.seq_len {saved} (data.align=bos "
                                 "cuts its rows for one length)")
        self._starts = None
        super().load_state_dict(state)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "align": "bos", "seq_len": self.T}


def make_loader(files: list[Path], B: int, T: int, rank: int, world: int, align: str = "off", **kw) -> ShardLoader:
    """The training loader for ``data.align`` (off: llm.c's contiguous rows; bos: rows start at BOS)."""
    cls = AlignedShardLoader if align == "bos" else ShardLoader
    return cls(files, B, T, rank, world, **kw)
