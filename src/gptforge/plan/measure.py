"""Measured peak memory of a few real training steps: what ``gptforge plan --measure`` compares with the estimate.

    gptforge plan --preset tiny --measure

On CUDA the allocator's peak; on CPU the peak of live tensor storage (a dispatch-mode tracker counting
every tensor the steps allocate).
"""

from __future__ import annotations

import copy
import weakref

import torch

from gptforge.config import Config
from gptforge.models.registry import build_model


class LiveTensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Tracks bytes of live CPU tensor storage and its peak: every op's outputs are seen once, and a
    weakref finalizer subtracts a storage when autograd or Python frees it."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.weak import WeakIdKeyDictionary

        self.live = 0
        self.peak = 0
        self._seen = WeakIdKeyDictionary()

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                if st not in self._seen:
                    n = st.nbytes()
                    self._seen[st] = n
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, n)
        return out


def measure_peak(cfg: Config, steps: int = 2) -> tuple[float, str]:
    """Run ``steps`` training steps of ``cfg`` on one process (model and optimizer built inside the
    measurement) on random tokens; return (peak bytes, what was measured)."""
    from gptforge.optim import build_optimizer
    from gptforge.parallel.distributed import DistInfo
    from gptforge.runtime import resolve_device, set_precision
    from gptforge.training.step import train_step

    device = resolve_device(cfg.train.device)
    cfg = copy.deepcopy(cfg)
    cfg.train.compile = False
    accum = cfg.validate()
    autocast, _, _ = set_precision(cfg, device)
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    gen = torch.Generator().manual_seed(0)

    class _Random:
        def next_batch(self):
            buf = torch.randint(0, cfg.model.vocab_size, (B, T + 1), generator=gen)
            return buf[:, :-1], buf[:, 1:]

    def run() -> None:
        from gptforge.training.switches import resolve_model_switches

        model = build_model(resolve_model_switches(cfg, device)).to(device)  # model.fused_ce=auto as training decides
        opt = build_optimizer(model, cfg.optim, device.type)
        model.train()
        for _ in range(steps):
            train_step(model, model, opt, _Random(), accum, autocast, DistInfo(device=device), cfg.optim.grad_clip)

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        return torch.cuda.max_memory_allocated(device) - base, "cuda_max_memory_allocated"
    tracker = LiveTensorBytes()
    with tracker:
        run()
    return tracker.peak, "cpu_live_tensor_peak"


