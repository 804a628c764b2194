"""gptforge.parallel.grads where the `parallel` mutation lane found its tests blind (issue 36): a rank whose
parameters have no gradients (a pipeline stage with only a tied embedding counted elsewhere, or a rank
that got no gradient this step) still holds a norm for the collective, and that zero must live on the
rank's own device (``info.device``): a CUDA rank's NCCL all-reduce over the ``pp`` group refuses a CPU
tensor. Checked on the meta device, the one device besides the CPU a CPU-only machine has."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from gptforge.parallel import grads
from tests.training.test_grad_norm_unit import _Dim  # the stand-in mesh dimension (its group is "pp-group")


def test_the_zero_norm_of_a_rank_without_gradients_is_on_the_ranks_device(monkeypatch):
    meta = torch.device("meta")
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    total = grads.grad_norm_and_clip(params, 1.0, SimpleNamespace(mesh=None, device=meta))
    assert total.shape == () and total.device == meta
    # under a pipeline: the zero that goes into the pp all-reduce is on the rank's device
    seen = []
    monkeypatch.setattr(grads.dist, "all_reduce", lambda t, group=None: seen.append((t.device, group)))
    info = SimpleNamespace(mesh={"pp": _Dim(2), "tp": _Dim(1)}, device=meta)
    params[0].grad = torch.ones(2)  # counted on the other stage (a tied embedding): skipped here
    total = grads.grad_norm_and_clip(params, 0.0, info, skip={id(params[0])})
    assert seen == [(meta, "pp-group")] and total.device == meta
