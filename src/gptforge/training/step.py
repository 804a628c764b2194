"""One optimizer step, the validation loss, and a phase timer: the pieces the loop, ``bench`` and
``plan --measure`` share (so none of them imports the loop).

    loss, norm = train_step(wrapped, model, optimizer, loader, grad_accum, autocast, info, grad_clip=1.0)
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gptforge.parallel.distributed import DistInfo, all_reduce_mean, grad_sync, local_tensor
from gptforge.parallel.grads import grad_norm_and_clip, loss_context


class PhaseTimer:
    """Accumulates wall time per phase (data, forward, backward, optimizer) for the bench command.
    On CUDA it records events (no host sync inside the step); ``totals()`` synchronizes once."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []

    def mark(self, phase: str) -> None:
        """Everything since the previous mark belongs to ``phase``."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((phase, ev))
        else:
            self.marks.append((phase, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        """Seconds per phase since the first mark; resets."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:], strict=False):
            dt = a.elapsed_time(b) / 1000 if self.cuda else b - a
            out[phase] = out.get(phase, 0.0) + dt
        self.marks = []
        return out


def train_step(
    wrapped: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader,
    grad_accum: int,
    autocast,
    info: DistInfo,
    grad_clip: float,
    timer: PhaseTimer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``grad_accum`` micro-batches. The loss is scaled by 1/grad_accum so
    the gradient does not depend on how the total batch is split; DDP syncs gradients only on the
    last micro-step. Returns (mean loss over ranks, pre-clip grad norm)."""
    if getattr(wrapped, "pipeline", False):  # pipeline stages: the schedule runs the micro-batches
        from gptforge.parallel.pipeline import pipeline_step

        return pipeline_step(wrapped, model, optimizer, loader, grad_accum, autocast, info, grad_clip, timer)
    device = info.device
    loss_accum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        x, y = loader.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if timer:
            timer.mark("data")
        with grad_sync(wrapped, info, sync=micro == grad_accum - 1), loss_context(info):
            with autocast():
                _, loss = wrapped(x, y)
            loss = loss / grad_accum
            loss_accum += local_tensor(loss.detach())  # tensor parallel: a replicated DTensor
            if timer:
                timer.mark("forward")
            loss.backward()
            if timer:
                timer.mark("backward")
    all_reduce_mean(loss_accum, info)
    if info.mesh is not None:  # DTensors on a mesh: norm reduced by DTensor (and over stages)
        norm = grad_norm_and_clip(list(model.parameters()), grad_clip, info)
    elif grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    norm = local_tensor(norm)  # FSDP: the norm is a DTensor over the shards
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if timer:
        timer.mark("optimizer")
    return loss_accum, norm


def evaluate_loss(model: torch.nn.Module, loader, steps: int, autocast, info: DistInfo) -> float:
    """Mean loss over ``steps`` batches from the start of the val split, averaged over ranks."""
    was_training = model.training
    model.eval()
    loader.reset()
    total = torch.zeros((), device=info.device)
    with torch.no_grad():
        for _ in range(steps):
            x, y = loader.next_batch()
            x, y = x.to(info.device), y.to(info.device)
            with autocast(), loss_context(info):
                _, loss = model(x, y)
            total += local_tensor(loss.detach()).float()
    total /= steps
    all_reduce_mean(total, info)
    model.train(was_training)
    return total.item()
