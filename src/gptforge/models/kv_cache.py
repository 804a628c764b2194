"""The key/value cache both model families decode with: per-layer keys and values preallocated to
``max_len``, filled one forward at a time (``generation.py`` makes one with ``model.new_kv_cache``).

    >>> cache = model.new_kv_cache(batch=1)  # a KVCache sized for the model's heads and block_size
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer key/value tensors for incremental decoding, preallocated to ``max_len``."""

    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_size: int, device, dtype):
        shape = (n_layer, batch, n_head, max_len, head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # tokens already cached (same for every layer once a forward finishes)
        self._pending = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = k.size(2)
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked for {end}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        self._pending = T
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self) -> None:
        self.length += self._pending
        self._pending = 0

    def take_rows(self, rows: torch.Tensor) -> None:
        """Make row i a copy of row ``rows[i]`` (the batch becomes ``len(rows)`` rows): a prompt that
        several rows repeat is prefilled once, then each of its rows gets its own copy to extend."""
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
