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
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptforge.data.chat import ChatFormatError, ChatTemplate


class SFTDataError(ValueError):
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
    or a dataset name on the Hub (``datasets.load_dataset``, online)."""
    path = Path(source)
    if path.is_file() and path.suffix != ".parquet":
        return _read_jsonl(path, skip_bad, stats)
    if not path.exists() and path.suffix in (".jsonl", ".json", ".parquet"):
        raise SFTDataError(f"--data {source}: no such file (give a .jsonl of {{\"messages\": [...]}} or a HF dataset)")
    ds = _load_hf(source, split)
    name = f"{source}[{split}]"
    if "messages" not in ds.column_names:
        raise SFTDataError(f"--data {name}: the dataset has no 'messages' column (columns: {', '.join(ds.column_names)})")
    out: list[tuple[str, Any]] = []
    for i, messages in enumerate(ds["messages"]):
        where = f"{name} row {i}"
        if not isinstance(messages, list):
            _bad(where, f"'messages' is {type(messages).__name__}, expected a list of {{role, content}}", skip_bad, stats)
            continue
        out.append((where, messages))
    return out


def _read_jsonl(path: Path, skip_bad: bool, stats: dict[str, int] | None) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                _bad(where, f"not UTF-8 text ({e.reason} at byte {e.start})", skip_bad, stats)
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                _bad(where, f"not valid JSON ({e.msg})", skip_bad, stats)
                continue
            except RecursionError:  # [[[[... thousands deep: the parser's stack, not a crash of the run
                _bad(where, "JSON nested too deeply to be a conversation", skip_bad, stats)
                continue
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                _bad(where, 'expected an object with a "messages" list', skip_bad, stats)
                continue
            out.append((where, row["messages"]))
    return out


def _load_hf(source: str, split: str) -> Any:
    """A ``datasets.Dataset``: ``load_from_disk`` for a ``save_to_disk`` directory, else ``load_dataset``
    (a parquet file, a local dataset directory, or a Hub name); failures name the dataset and split."""
    try:
        import datasets
    except ImportError as e:
        raise SFTDataError(f"--data {source}: not a JSONL file, and reading a Hugging Face dataset needs `datasets` "
                           "(pip install 'gptforge[hf]')") from e
    path = Path(source)
    try:
        if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(str(path))
        elif path.is_file():
            ds = datasets.load_dataset("parquet", data_files={split: str(path)})
        else:
            ds = datasets.load_dataset(source, split=split)
    except Exception as e:  # hub/network/format errors come in many types; keep the cause
        raise SFTDataError(f"--data {source}: cannot load it as a Hugging Face dataset (split {split!r}): "
                           f"{type(e).__name__}: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise SFTDataError(f"--data {source}: no split {split!r} (splits: {', '.join(ds)}); pass --split")
        ds = ds[split]
    return ds


def _bad(where: str, why: str, skip_bad: bool, stats: dict[str, int] | None) -> None:
    if not skip_bad:
        raise SFTDataError(f"{where}: {why} (fix the row, or pass --skip-bad to count and skip such rows)")
    if stats is not None:
        stats["skipped"] = stats.get("skipped", 0) + 1


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


class ConversationLoader:
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

    def reset(self) -> None:
        self.epoch, self.cursor = 0, 0
        self._perm = self._order(0)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.convs))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.convs))

    def _take(self) -> Rendered:
        c = self.convs[self._perm[self.cursor]]
        self.cursor += 1
        if self.cursor == len(self.convs):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._perm = self._order(self.epoch)
        return c

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
        if state["fingerprint"] != self.fingerprint:
            raise SFTDataError(
                f"checkpoint was trained on other conversations (fingerprint {state['fingerprint']}, now "
                f"{self.fingerprint}); resume with the original --data, --val-count and --seed"
            )
        self.seed, self.shuffle = int(state["seed"]), bool(state["shuffle"])
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._perm = self._order(self.epoch)
