"""Conversations for supervised fine-tuning: read, render with the chat template, batch with masks.

:class:`ConversationLoader` has the interface of :class:`gptforge.data.loader.ShardLoader`
(``next_batch() -> (x, y)``, ``state_dict`` / ``load_state_dict``, ``reset``), so the pretraining
loop trains on it unchanged. Targets are -1 wherever the loss mask is off (system and user turns,
role tokens, padding), and the model's cross-entropy ignores them.

Batching packs whole conversations into rows of ``T + 1`` tokens, in a seeded order that changes
every epoch, and pads the rest of a row; a conversation is never split across rows, so every
assistant token sees its prompt. All ranks build the same global batch of ``B * world`` rows and
each takes its own ``B``; the state is (epoch, cursor), so a resumed run sees the same batches.

    >>> convs = read_conversations("conv.jsonl")
    >>> train, val = split_conversations(render_all(convs, ChatTemplate.gpt2(), T + 1), val_count=200)
    >>> loader = ConversationLoader(train, B=8, T=128); x, y = loader.next_batch()
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gptforge.data.chat import ChatFormatError, ChatTemplate
from gptforge.data.order import EpochOrder
from gptforge.data.rows import DataError, bad_row, read_rows


class SFTDataError(DataError):
    """Bad SFT data; the message names the file and row."""


@dataclass
class Rendered:
    ids: np.ndarray  # int64 (L,)
    mask: np.ndarray  # bool (L,): train on this token


def read_conversations(source: str, split: str = "train", skip_bad: bool = False,
                       stats: dict[str, int] | None = None) -> list[tuple[str, Any]]:
    """(where, messages) per conversation. ``source`` is a JSONL file of ``{"messages": [...]}``, or a
    Hugging Face dataset with a ``messages`` column: a ``.parquet`` file, a directory written by
    ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a local dataset directory of data files,
    or a dataset name on the Hub (``datasets.load_dataset``, online). See :mod:`gptforge.data.rows`."""
    rows = read_rows(source, split, ("messages",), _check_messages, skip_bad, stats, SFTDataError,
                     jsonl_shape='an object with a "messages" list',
                     what='a .jsonl of {"messages": [...]}')
    return [(where, row["messages"]) for where, row in rows]


def _check_messages(row: dict[str, Any]) -> str | None:
    m = row["messages"]
    return None if isinstance(m, list) else f"'messages' is {type(m).__name__}, expected a list of {{role, content}}"


def _bad(where: str, why: str, skip_bad: bool, stats: dict[str, int] | None) -> None:
    bad_row(where, why, skip_bad, stats, SFTDataError)


def render_all(convs: Iterable[tuple[str, Any]], template: ChatTemplate, max_tokens: int, enc: Any = None,
               skip_bad: bool = False, stats: dict[str, int] | None = None) -> list[Rendered]:
    """Render every conversation; refuse (or skip) unknown roles, no assistant turn, and
    conversations longer than ``max_tokens`` (the context plus one)."""
    out = []
    for where, messages in convs:
        try:
            ids, mask = template.render(messages, enc)
        except ChatFormatError as e:
            _bad(where, str(e), skip_bad, stats)
            continue
        except RecursionError:  # a message nested just under the parser's limit, met while describing it
            _bad(where, "a message is nested too deeply; expected {role, content} objects", skip_bad, stats)
            continue
        if len(ids) > max_tokens:
            _bad(where, f"{len(ids)} tokens is longer than the context ({max_tokens - 1} + 1); shorten it or raise "
                        "train.seq_len", skip_bad, stats)
            continue
        out.append(Rendered(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)))
    if not out:
        raise SFTDataError("no usable conversations")
    return out


def split_conversations(rendered: list[Rendered], val_count: int, seed: int = 0) -> tuple[list[Rendered], list[Rendered]]:
    """A seeded held-out set of ``val_count`` conversations (at least one left for training)."""
    if not 0 < val_count < len(rendered):
        raise SFTDataError(f"--val-count {val_count}: need 0 < val-count < {len(rendered)} conversations")
    perm = np.random.default_rng(seed).permutation(len(rendered))
    val = set(perm[:val_count].tolist())
    return ([r for i, r in enumerate(rendered) if i not in val], [r for i, r in enumerate(rendered) if i in val])


def fingerprint(rendered: Sequence[Rendered]) -> str:
    h = hashlib.sha256()
    for r in rendered:
        h.update(r.ids.tobytes())
        h.update(r.mask.tobytes())
    return h.hexdigest()[:16]


class ConversationLoader(EpochOrder):
    """Packed, padded, masked batches of whole conversations (see the module docstring)."""

    def __init__(self, convs: list[Rendered], B: int, T: int, rank: int = 0, world: int = 1, shuffle: bool = True,
                 seed: int = 0, pad: int = 50256):
        if not convs:
            raise SFTDataError("no conversations")
        longest = max(len(c.ids) for c in convs)
        if longest > T + 1:
            raise SFTDataError(f"a conversation has {longest} tokens, more than a row holds (seq_len + 1 = {T + 1})")
        self.convs, self.B, self.T, self.rank, self.world = convs, B, T, rank, world
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.fingerprint = fingerprint(convs)
        self.reset()

    def _count(self) -> int:
        return len(self.convs)

    def _take(self) -> Rendered:
        return self.convs[self._advance()]

    def _peek(self) -> Rendered:
        return self.convs[self._perm[self.cursor]]

    def _row(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full(self.T + 1, self.pad, dtype=np.int64)
        mask = np.zeros(self.T + 1, dtype=bool)
        n = 0
        while n == 0 or n + len(self._peek().ids) <= self.T + 1:
            c = self._take()
            ids[n : n + len(c.ids)], mask[n : n + len(c.ids)] = c.ids, c.mask
            n += len(c.ids)
        return ids, mask

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._row() for _ in range(self.B * self.world)][self.rank * self.B : (self.rank + 1) * self.B]
        ids = torch.from_numpy(np.stack([r[0] for r in rows]))
        mask = torch.from_numpy(np.stack([r[1] for r in rows]))
        x = ids[:, :-1]
        y = ids[:, 1:].masked_fill(~mask[:, 1:], -1)
        return x.contiguous(), y.contiguous()

    def num_batches(self) -> int:
        """Batches in one pass over the conversations (the val loss uses at most this many)."""
        saved = self.state_dict()
        self.reset()
        n = 0
        while self.epoch == 0:
            self.next_batch()
            n += 1
        self.load_state_dict(saved)
        return n

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "shuffle": self.shuffle,
                "fingerprint": self.fingerprint, "kind": "conversations"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "conversations":
            raise SFTDataError("checkpoint loader state is not from an SFT run (no conversation position)")
        if state.get("fingerprint") != self.fingerprint:
            raise SFTDataError(
                f"checkpoint was trained on other conversations (fingerprint {state.get('fingerprint')}, now "
                f"{self.fingerprint}); resume with the original --data, --val-count and --seed"
            )
        self._load_position(state)
