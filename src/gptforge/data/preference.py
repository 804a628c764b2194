"""Preference pairs for reward models and DPO: read, render with the chat template, batch.

A row is a prompt plus a chosen and a rejected reply, in TRL's conversational form::

    {"prompt": [{"role": "user", "content": "What is 2 + 3?"}],
     "chosen": [{"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}],
     "rejected": [{"role": "assistant", "content": "2 + 3 = 6. The answer is 6."}]}

``chosen`` / ``rejected`` are the assistant's continuation of ``prompt``. Also read, as TRL does:
plain strings (a string prompt is one user turn, a string reply one assistant turn), the implicit
prompt (no ``prompt`` key: ``chosen`` and ``rejected`` are whole conversations and the prompt is
their shared first messages), and an optional numeric ``margin`` (the reward model's margin).
Files and datasets are read as ``sft --data`` reads them (:mod:`gptforge.data.rows`).

Each side renders to token ids and a mask over the reply's tokens (the continuation's assistant
text and end markers; never the prompt, even when it holds earlier assistant turns). A pair longer
than the context is refused or skipped as SFT refuses a long conversation. :class:`PairLoader`
yields :class:`PairBatch` es: the chosen rows then the rejected rows (TRL's concatenated layout),
right-padded, seeded per epoch, sharded by rank, and resumable bit-exactly.

    >>> pairs = read_preferences("prefs.jsonl")
    >>> loader = PairLoader(render_pairs(pairs, ChatTemplate.gpt2(), max_tokens=257), B=8)
    >>> batch = loader.next_batch()  # batch.ids (16, L), batch.mask (16, L), batch.index (8,)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gptforge.data.chat import ChatFormatError, ChatTemplate
from gptforge.data.order import EpochOrder
from gptforge.data.rows import DataError, bad_row, read_rows


class PreferenceDataError(DataError):
    """Bad preference data; the message names the file (or dataset, split) and row."""


@dataclass(frozen=True)
class PreferencePair:
    prompt: list[dict[str, Any]]  # the conversation so far
    chosen: list[dict[str, Any]]  # the preferred continuation (assistant turns)
    rejected: list[dict[str, Any]]  # the other one
    margin: float | None = None  # how much better chosen is (the reward model's optional margin)


@dataclass
class RenderedSide:
    ids: np.ndarray  # int64 (L,): prompt then reply
    mask: np.ndarray  # bool (L,): the reply's tokens (what DPO scores; the last one is where a RM reads)


@dataclass
class RenderedPair:
    chosen: RenderedSide
    rejected: RenderedSide
    margin: float | None = None


# --- reading ----------------------------------------------------------------------------------------

def read_preferences(source: str, split: str = "train", skip_bad: bool = False,
                     stats: dict[str, int] | None = None) -> list[tuple[str, PreferencePair]]:
    """(where, pair) per row of a JSONL file or Hugging Face dataset (see the module docstring)."""
    rows = read_rows(source, split, ("chosen", "rejected"), _check, skip_bad, stats, PreferenceDataError,
                     jsonl_shape='an object with "chosen" and "rejected" (and "prompt")',
                     what='a .jsonl of {"prompt", "chosen", "rejected"}', optional=("prompt", "margin"))
    return [(where, _pair(row)) for where, row in rows]


def _as_messages(x: Any, role: str, key: str) -> list[dict[str, Any]]:
    if isinstance(x, str):
        return [{"role": role, "content": x}]
    if isinstance(x, list) and all(isinstance(m, dict) for m in x):
        return [dict(m) for m in x]
    raise ChatFormatError(f"{key!r} is {type(x).__name__}: expected a list of {{role, content}} messages or a string")


def _pair(row: dict[str, Any]) -> PreferencePair:
    """The row as a pair; raises ChatFormatError when it is not one."""
    chosen = _as_messages(row["chosen"], "assistant", "chosen")
    rejected = _as_messages(row["rejected"], "assistant", "rejected")
    if row.get("prompt") is not None:
        prompt = _as_messages(row["prompt"], "user", "prompt")
    else:  # TRL's implicit prompt: the messages chosen and rejected share
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    for key, side in (("chosen", chosen), ("rejected", rejected)):
        if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in side):
            raise ChatFormatError(f"{key!r} has no assistant message (the reply to compare)")
    if chosen == rejected:
        raise ChatFormatError("'chosen' and 'rejected' are the same reply (nothing to prefer)")
    margin = row.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                               or not math.isfinite(margin)):
        raise ChatFormatError(f"'margin' is {margin!r}: expected a finite number")
    return PreferencePair(prompt, chosen, rejected, None if margin is None else float(margin))


def _check(row: dict[str, Any]) -> str | None:
    try:
        _pair(row)
    except ChatFormatError as e:
        return str(e)
    return None


# --- rendering --------------------------------------------------------------------------------------

def render_side(prompt: Sequence[dict[str, Any]], reply: Sequence[dict[str, Any]], template: ChatTemplate,
                enc: Any = None) -> RenderedSide:
    """prompt + reply -> ids and the reply-token mask (the template's training mask, off over the prompt)."""
    ids, mask = template.render([*prompt, *reply], enc)
    n_prompt = len(template.render_for_generation(prompt, enc)) - 1  # the prompt's tokens: less <|assistant|>
    m = np.asarray(mask, dtype=bool)
    m[:n_prompt] = False
    return RenderedSide(np.asarray(ids, dtype=np.int64), m)


def render_pair(pair: PreferencePair, template: ChatTemplate, enc: Any = None) -> RenderedPair:
    return RenderedPair(render_side(pair.prompt, pair.chosen, template, enc),
                        render_side(pair.prompt, pair.rejected, template, enc), pair.margin)


def render_pairs(pairs: Iterable[tuple[str, PreferencePair]], template: ChatTemplate, max_tokens: int,
                 enc: Any = None, skip_bad: bool = False, stats: dict[str, int] | None = None) -> list[RenderedPair]:
    """Render every pair; refuse (or skip) bad messages and a side longer than ``max_tokens`` (the
    context plus one), as :func:`gptforge.data.sft.render_all` does for a conversation."""
    out = []
    for where, pair in pairs:
        try:
            r = render_pair(pair, template, enc)
        except ChatFormatError as e:
            bad_row(where, str(e), skip_bad, stats, PreferenceDataError)
            continue
        n = max(len(r.chosen.ids), len(r.rejected.ids))
        if n > max_tokens:
            bad_row(where, f"{n} tokens is longer than the context ({max_tokens - 1} + 1); shorten it or raise "
                           "train.seq_len", skip_bad, stats, PreferenceDataError)
            continue
        out.append(r)
    if not out:
        raise PreferenceDataError("no usable preference pairs")
    return out


def split_pairs(pairs: list[RenderedPair], val_count: int, seed: int = 0) -> tuple[list[RenderedPair], list[RenderedPair]]:
    """A seeded held-out set of ``val_count`` pairs (at least one left for training)."""
    if not 0 < val_count < len(pairs):
        raise PreferenceDataError(f"--val-count {val_count}: need 0 < val-count < {len(pairs)} pairs")
    perm = np.random.default_rng(seed).permutation(len(pairs))
    val = set(perm[:val_count].tolist())
    return [p for i, p in enumerate(pairs) if i not in val], [p for i, p in enumerate(pairs) if i in val]


def fingerprint(pairs: Sequence[RenderedPair]) -> str:
    h = hashlib.sha256()
    for p in pairs:
        for s in (p.chosen, p.rejected):
            h.update(s.ids.tobytes())
            h.update(s.mask.tobytes())
        h.update(repr(p.margin).encode())
    return h.hexdigest()[:16]


# --- batching ---------------------------------------------------------------------------------------

@dataclass
class PairBatch:
    """``n`` pairs: rows ``0..n-1`` are the chosen sides and ``n..2n-1`` the rejected ones."""

    ids: torch.Tensor  # long (2n, L), right-padded
    mask: torch.Tensor  # bool (2n, L): reply tokens
    index: torch.Tensor  # long (n,): each pair's position in the loader's list (a key for cached reference log-probs)
    margin: torch.Tensor | None  # float (n,), or None when no pair has one

    @property
    def n(self) -> int:
        return self.index.numel()

    def to(self, device: torch.device | str) -> PairBatch:
        return PairBatch(self.ids.to(device), self.mask.to(device), self.index.to(device),
                         None if self.margin is None else self.margin.to(device))


def collate(pairs: Sequence[RenderedPair], index: Sequence[int], pad: int) -> PairBatch:
    """Pairs -> a right-padded :class:`PairBatch` (chosen rows first). A missing margin is 0."""
    sides = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    L = max(len(s.ids) for s in sides)
    ids = np.full((len(sides), L), pad, dtype=np.int64)
    mask = np.zeros((len(sides), L), dtype=bool)
    for k, s in enumerate(sides):
        ids[k, : len(s.ids)], mask[k, : len(s.ids)] = s.ids, s.mask
    margin = None
    if any(p.margin is not None for p in pairs):
        margin = torch.tensor([p.margin or 0.0 for p in pairs], dtype=torch.float32)
    return PairBatch(torch.from_numpy(ids), torch.from_numpy(mask), torch.tensor(list(index), dtype=torch.long), margin)


class PairLoader(EpochOrder):
    """Batches of ``B`` pairs per rank; all ranks walk the same seeded order of ``B * world`` pairs a
    step and each takes its own ``B``. State (epoch, cursor) resumes bit-exactly."""

    def __init__(self, pairs: list[RenderedPair], B: int, rank: int = 0, world: int = 1, shuffle: bool = True,
                 seed: int = 0, pad: int = 50256):
        if not pairs:
            raise PreferenceDataError("no preference pairs")
        if B < 1 or not 0 <= rank < world:
            raise PreferenceDataError(f"PairLoader: need B >= 1 and 0 <= rank < world (B={B}, rank={rank}, world={world})")
        self.pairs, self.B, self.rank, self.world = pairs, B, rank, world
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.fingerprint = fingerprint(pairs)
        self.reset()

    def _count(self) -> int:
        return len(self.pairs)

    def next_batch(self) -> PairBatch:
        picks = [self._advance() for _ in range(self.B * self.world)][self.rank * self.B : (self.rank + 1) * self.B]
        return collate([self.pairs[i] for i in picks], picks, self.pad)

    def num_batches(self) -> int:
        """Batches in one pass over the pairs (the last may wrap into the next epoch)."""
        return math.ceil(len(self.pairs) / (self.B * self.world))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "shuffle": self.shuffle,
                "fingerprint": self.fingerprint, "kind": "preference"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "preference":
            raise PreferenceDataError("checkpoint loader state is not from a preference run (no pair position)")
        if state.get("fingerprint") != self.fingerprint:
            raise PreferenceDataError(
                f"checkpoint was trained on other preference pairs (fingerprint {state.get('fingerprint')}, now "
                f"{self.fingerprint}); resume with the original --data, --val-count and --seed")
        self._load_position(state)


def pair_loaders(section: Any, template: ChatTemplate, B: int, max_tokens: int, command: str):
    """Read, render and split a recipe section's pairs (``cfg.rm`` / ``cfg.dpo``: data, split, val_count,
    seed, skip_bad) once, before any compute, refusing a side longer than ``max_tokens``; returns
    info -> (train loader, val pairs, val batches)."""
    if not section.data:
        raise PreferenceDataError(f"{command}.data is empty: give --data FILE.jsonl (gptforge prepare preferences "
                                  "writes one) or a Hugging Face preference dataset")
    stats: dict[str, int] = {}
    pairs = read_preferences(section.data, section.split, section.skip_bad, stats)
    rendered = render_pairs(pairs, template, max_tokens, skip_bad=section.skip_bad, stats=stats)
    if stats.get("skipped"):
        print(f"[gptforge {command}] skipped {stats['skipped']} bad preference row(s) (--skip-bad)", flush=True)
    train, val = split_pairs(rendered, section.val_count, section.seed)

    def check_step(world: int) -> None:  # a pair twice in one step is a typo (--micro-batch 1e9 would hang)
        n = B * section.grad_accum * world
        if n > len(train):
            raise PreferenceDataError(
                f"--micro-batch {B} x {command}.grad_accum {section.grad_accum}" + (f" x world {world}" if world > 1 else "")
                + f" = {n} pairs a step, more than the {len(train)} training pairs of --data {section.data} (after "
                f"--val-count {section.val_count}); lower --micro-batch or {command}.grad_accum")

    check_step(1)

    def make(info: Any) -> tuple[PairLoader, list[RenderedPair], int]:
        check_step(info.world)
        loader = PairLoader(train, B, info.rank, info.world, shuffle=True, seed=section.seed, pad=template.bos)
        return loader, val, max(1, math.ceil(len(val) / (B * info.world)))

    return make
