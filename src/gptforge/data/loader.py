"""Rank-strided, resumable batch loader over llm.c token shards (llm.c's DistributedDataLoader).

Each step every rank takes ``B*T+1`` tokens at ``pos + rank*B*T`` of the current shard (inputs are
the first ``B*T``, targets the last); ``pos`` then advances by ``B*T*world``. When the next step
would run past the shard end, the loader moves to the next shard (wrapping around: an epoch).
``state_dict()`` / ``load_state_dict()`` capture the exact position, so a resumed run sees the
same batches as an uninterrupted one, and what the shards held (each file's token count and a digest of
its first and last 64 KiB), so a resume on shards changed since is refused naming the file.

Shuffling (``shuffle``): ``off`` is llm.c's order exactly. ``shards`` visits the shards in a
permutation drawn from ``(seed, epoch)``, so it changes every epoch. ``documents`` does that and
also permutes the documents inside each shard (a document = an ``eot`` token and what follows it
up to the next one; the tail of a document split across shards stays at the shard's start), drawn
from ``(seed, epoch, shard)``. Every rank draws the same permutations; the mode and seed are part of
the state, so a resumed run continues the same order.

``vocab_size`` (the model's): every shard is checked up front for ids outside the vocabulary (one
vectorised pass per shard, see :func:`gptforge.data.shards.check_token_ids`).

The loader holds its shards' folders for reading while it lives (:func:`gptforge.data.shards.reading`), so a
``prepare`` cannot rewrite them under it.

    >>> loader = ShardLoader(list_shards("data/shakespeare", "train"), B=8, T=128, vocab_size=50257)
    >>> x, y = loader.next_batch()
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gptforge.data.shards import ShardError, check_token_ids, holds_for, read_header, read_shard
from gptforge.tokens import EOT

SHUFFLE_MODES = ("off", "shards", "documents")
_SAMPLE = 1 << 16  # bytes read from each end of a shard for its digest: cheap at any shard size


def sample_digest(path: Path) -> str:
    """sha256 (first 16 hex digits) of a shard's first and last 64 KiB: a shard rewritten with other tokens
    of the same count is told apart without reading it whole (a 100 MB shard: 128 KiB read)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        size = f.seek(0, 2)
        if size > _SAMPLE:
            f.seek(max(_SAMPLE, size - _SAMPLE))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()[:16]


class ShardLoader:
    def __init__(self, files: list[Path], B: int, T: int, rank: int = 0, world: int = 1, shuffle: str = "off",
                 seed: int = 0, eot: int = EOT, step_tokens: int | None = None, vocab_size: int | None = None):
        if not files:
            raise ShardError("no shard files given")
        if shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle={shuffle!r}: expected one of {', '.join(SHUFFLE_MODES)}")
        # the shards' folders held for reading as long as the loader lives (data.shards.reading): a prepare
        # --force meanwhile is refused, naming this process, rather than rewrite a shard this loader opens later
        self.holds = holds_for(files)
        self.files = [Path(f) for f in files]
        self.B, self.T, self.rank, self.world = B, T, rank, world
        self.shuffle, self.seed, self.eot = shuffle, seed, eot
        # step_tokens (tokens per optimizer step, all ranks): move to the next shard only between
        # optimizer steps, when a whole step no longer fits. Then the data a step sees does not depend
        # on how it is split over ranks and micro-steps, and a run resumes at another world size at
        # the same position (the state is a global token offset).
        self.step_tokens = step_tokens
        need = max(B * T * world, step_tokens or 0) + 1
        sizes = [read_header(f)[2] for f in self.files]  # validate every header up front: fail before any compute
        # a shard shorter than one step (prepare's last, the remainder of its split) gives no batch: left out, said
        # by the run (`skipped`), while another shard holds a step; refused when none does. step_tokens is the
        # whole step (every rank), so which are left out does not change with the world size (but under a
        # batch-size schedule, whose unit is one micro-batch of every rank)
        self.skipped = [(f, n) for f, n in zip(self.files, sizes, strict=True) if n < need]
        if len(self.skipped) == len(self.files):
            f, n = max(self.skipped, key=lambda s: s[1])
            more = f" (and so is every other of its {len(self.files)} shards)" if len(self.files) > 1 else ""
            raise ShardError(f"{f}: {n} tokens is fewer than one step needs (B*T*world+1 = {need}){more}; "
                             "lower train.micro_batch / train.seq_len or add data")
        self.files = [f for f, n in zip(self.files, sizes, strict=True) if n >= need]
        self.contents: list[list] = []  # [tokens, sample digest] per file: what a saved position points into
        for f in self.files:
            self.contents.append([read_header(f)[2], sample_digest(f)])
            if vocab_size is not None:  # every id must have an embedding row: refuse now, not hours in
                check_token_ids(f, vocab_size)
        self.reset()

    def reset(self) -> None:
        self.shard = 0
        self.pos = 0
        self.epoch = 0
        self._tokens = None
        self._origin = 0  # where in the shard steps start (pos - _origin is a whole number of steps)

    def _fits(self, n: int) -> bool:
        """``n`` more tokens (and the last target) fit in the current shard from ``pos``."""
        return self.pos + n + 1 <= len(self._current())

    def _order(self) -> list[int]:
        """File indices in this epoch's visiting order."""
        if self.shuffle == "off":
            return list(range(len(self.files)))
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.files)).tolist()

    def _current(self) -> np.ndarray:
        if self._tokens is None:
            index = self._order()[self.shard]
            tokens = self._open(index)
            if self.shuffle == "documents":
                tokens = self._shuffle_documents(tokens, index)
            self._tokens = tokens
        return self._tokens

    def _open(self, index: int) -> np.ndarray:
        """Shard ``index``, opened when the run reaches it: it must still hold what it held when the run
        started (its token count and sampled digest), or the run stops naming it; it was checked then, so
        anything else happened to it while the run trained (deleted, moved, rewritten)."""
        f = self.files[index]
        n, digest = self.contents[index]
        try:
            now = (read_header(f)[2], sample_digest(f))
        except (ShardError, OSError) as e:
            now, why = None, str(e).removeprefix(f"{f}: ")
        if now is None or now != (n, digest):
            if now is not None:
                why = (f"holds {now[0]:,} tokens, {n:,} when the run started" if now[0] != n
                       else "holds other tokens than when the run started (same count)")
            how = "deleted or moved" if not f.exists() else "changed"
            raise ShardError(f"{f}: {why}; it was {how} while the run trained. Put the shards back as they were, "
                             "then continue with --resume (from the run's newest checkpoint)")
        return read_shard(f)

    def _shuffle_documents(self, tokens: np.ndarray, index: int) -> np.ndarray:
        """The shard with its documents in a seeded order (one in-memory copy of the shard)."""
        starts = np.flatnonzero(np.asarray(tokens) == self.eot)
        if len(starts) == 0:
            return tokens
        ends = np.append(starts[1:], len(tokens))
        perm = np.random.default_rng([self.seed, self.epoch, index]).permutation(len(starts))
        # the tail of a document split across shards has no eot: it stays first, where it belongs
        return np.concatenate([tokens[: starts[0]], *(tokens[starts[i] : ends[i]] for i in perm)])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        tokens = self._current()
        start = self.pos + self.rank * B * T
        buf = torch.from_numpy(tokens[start : start + B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T)
        y = buf[1:].view(B, T)
        self.pos += B * T * self.world
        if self.step_tokens:
            if (self.pos - self._origin) % self.step_tokens == 0 and not self._fits(self.step_tokens):
                self._advance_shard()
        elif not self._fits(B * T * self.world):  # next step would not fit: next shard
            self._advance_shard()
        return x, y

    def _advance_shard(self) -> None:
        self.shard += 1
        if self.shard == len(self.files):
            self.shard = 0
            self.epoch += 1
        self.pos = 0
        self._tokens = None
        self._origin = 0

    def state_dict(self) -> dict:
        return {"shard": self.shard, "pos": self.pos, "epoch": self.epoch, "files": [f.name for f in self.files],
                "contents": [list(c) for c in self.contents], "shuffle": self.shuffle, "seed": self.seed,
                "eot": self.eot}

    def _check_contents(self, saved: object) -> None:
        """The shards hold what they held when the position was saved: each file's token count and a digest
        of its first and last 64 KiB. A shard truncated, extended or rewritten under the same name between a
        run and its --resume would make the saved position point at other data (or past the shard's end)."""
        from gptforge.errors import LoaderStateError

        ok = (isinstance(saved, list) and len(saved) == len(self.files)
              and all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], int) and not isinstance(c[0], bool)
                      and isinstance(c[1], str) for c in saved))
        if not ok:
            raise LoaderStateError(f"loader.contents = {saved!r:.80}: not a [tokens, digest] pair per shard")
        for f, (n, digest), (now, now_digest) in zip(self.files, saved, self.contents, strict=True):
            if n != now or digest != now_digest:
                what = (f"holds {now:,} tokens, {n:,} when the checkpoint was saved" if n != now else
                        "holds other tokens than when the checkpoint was saved (same count)")
                raise ShardError(f"{f}: {what}, so the saved data position would point at other data; resume on "
                                 "the shards the run was trained on (or start a new run)")

    def load_state_dict(self, state: dict) -> None:
        names = [f.name for f in self.files]
        saved = state.get("files")
        if saved and saved != names:
            from gptforge.errors import LoaderStateError

            if not isinstance(saved, list) or not all(isinstance(n, str) for n in saved):
                raise LoaderStateError(f"loader.files = {saved!r:.80}: not a list of shard file names")

            def few(xs: list[str]) -> str:
                return ", ".join(xs[:3]) + (f" and {len(xs) - 3} more" if len(xs) > 3 else "")

            added, gone = [n for n in names if n not in saved], [n for n in saved if n not in names]
            what = "; ".join([*([f"{few(added)} added"] if added else []), *([f"{few(gone)} missing"] if gone else [])])
            raise ShardError(
                f"{self.files[0].parent}: {what or 'the same shards in another order'} since the checkpoint was saved "
                f"over {len(saved)} shard(s), which its data position counts; point data.dir at the shards the run was "
                "trained on (or start a new run)"
            )
        if state.get("align", "off") != "off" and type(self) is ShardLoader:
            raise ShardError(
                f"checkpoint loader state was saved with data.align={state['align']}, but this run has "
                "data.align=off; its position counts other rows. Resume with --data.align " + str(state["align"])
            )
        from gptforge.errors import saved_int

        if "contents" in state:  # (checkpoints from before it was saved: the file names only)
            self._check_contents(state["contents"])
        mode = state.get("shuffle", "off")
        seed = saved_int(state, "seed", 0, 2**32) if "seed" in state else self.seed
        if mode != self.shuffle or (mode != "off" and seed != self.seed):
            raise ShardError(
                f"checkpoint loader state was saved with data.shuffle={mode} data.shuffle_seed={seed}, "
                f"but this run has data.shuffle={self.shuffle} data.shuffle_seed={self.seed}; its position would "
                "mean other batches. Resume with the original settings"
            )
        eot = saved_int(state, "eot", 0, 2**32) if "eot" in state else self.eot  # (older checkpoints: no check)
        if mode == "documents" or state.get("align", "off") != "off":
            # the documents the position counts (shuffled, or each a row's start) are cut at this token, so under
            # another data.eot_token the saved position names other data: re-read or skipped in silence
            if eot != self.eot:
                raise ShardError(f"checkpoint loader state counts documents cut at data.eot_token {eot}, but this run "
                                 f"has data.eot_token {self.eot}; its position would mean other batches. Resume with "
                                 f"--data.eot_token {eot}")
        self.epoch = saved_int({"epoch": 0, **state}, "epoch", 0)  # (checkpoints before epochs were counted: 0)
        self.shard = saved_int(state, "shard", 0, len(self.files))
        n = read_header(self.files[self._order()[self.shard]])[2]  # the position must be inside that shard
        self.pos = saved_int(state, "pos", 0, n)
        self._tokens = None
        # A resume may change the step (train.total_batch_tokens, micro_batch, seq_len): the saved position is
        # a step boundary but need not be a multiple of the new step, so steps count from it (else the shard
        # was never left and a batch ran past its end), and a larger step that no longer fits starts the next
        # shard now, as the step before would have had it been this size.
        step = self.step_tokens or self.B * self.T * self.world
        self._origin = self.pos % step
        if not self._fits(step):
            self._advance_shard()
