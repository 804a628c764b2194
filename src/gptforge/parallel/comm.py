"""Tensor-parallel communication: the formula for one micro-batch's traffic, and a counter that
measures it (DTensor's ``CommDebugMode`` with the bytes added).

    counter = CommVolume()
    with counter, loss_parallel():
        model(x, y)[1].backward()
    assert counter.elements == tp_traffic(model.config, B, T, tp)

The unit is one collective's *full tensor*, in elements: an all-gather's output, a reduce-scatter's
input, an all-reduce's input. (On a ring each rank sends (tp-1)/tp of that for an all-gather or a
reduce-scatter and 2(tp-1)/tp for an all-reduce; multiply by the activation dtype's bytes.)

One micro-batch of N = B*T tokens through L blocks of width C, forward and backward, under the
Megatron + sequence-parallel layout of :mod:`gptforge.parallel.tensor`:

- all-gather    (2L + 1) N C forward (each block's attention and MLP inputs, the head's input)
              + (2L + 1) N C backward (the mirror of each reduce-scatter: blocks' outputs, embedding)
- reduce-scatter (2L + 1) N C forward (each block's two outputs, the embedding)
              + (2L + 1) N C backward (the mirror of each all-gather)
- all-reduce    3 N (``loss_parallel``: each row's max, sum of exponentials and target logit)
- GPT-2 adds its position table, T C reduce-scattered forward and all-gathered backward, and the
  fused q/k/v bias, whose gradient (3C per layer) is all-gathered from the ranks' rows.

Not in the formula: parameter-gradient reductions done at the optimizer step (the replicated norm
weights and row-parallel biases, O(L C) elements), and FSDP's or the pipeline's traffic.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


def tp_traffic(model_cfg, batch: int, seq: int, tp: int) -> dict[str, int]:
    """Predicted full-tensor elements per collective kind for one micro-batch's forward + backward."""
    if tp == 1:
        return {op: 0 for op in OPS}
    L, C, N = model_cfg.n_layer, model_cfg.n_embd, batch * seq
    act = 2 * (2 * L + 1) * N * C
    out = {"all_gather_into_tensor": act, "reduce_scatter_tensor": act, "all_reduce": 3 * N}
    if model_cfg.arch == "gpt2":
        out["all_gather_into_tensor"] += seq * C + (L * 3 * C if model_cfg.bias else 0)
        out["reduce_scatter_tensor"] += seq * C
    return out


class CommVolume(CommDebugMode):
    """``CommDebugMode`` that also adds up each collective's full-tensor elements (see the module
    docstring), in ``self.elements``."""

    def __init__(self):
        super().__init__()
        self.elements: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not isinstance(func, torch._ops.HigherOrderOperator) and not any(t == DTensor for t in types):
            name = func._overloadpacket.__name__
            if name in OPS and args and isinstance(args[0], torch.Tensor):
                n = args[0].numel()
                if name == "all_gather_into_tensor":
                    n *= int(args[1])  # group size: the output is every rank's input
                self.elements[name] += n
        return super().__torch_dispatch__(func, types, args, kwargs)


def measure_tp_traffic(model_cfg, batch: int, seq: int, tp_mesh, seed: int = 0) -> dict[str, int]:
    """Build ``model_cfg``'s model, shard it over ``tp_mesh`` and count one random micro-batch's
    forward + backward traffic (every rank of the mesh calls it)."""
    from torch.distributed.tensor.parallel import loss_parallel

    from gptforge.models.registry import build_model
    from gptforge.parallel.tensor import apply_tp

    torch.manual_seed(seed)
    model = build_model(model_cfg)
    apply_tp(model, tp_mesh)
    x = torch.randint(0, model_cfg.vocab_size, (batch, seq))
    counter = CommVolume()
    with counter, loss_parallel():
        model(x, torch.roll(x, -1, dims=1))[1].backward()
    return {op: counter.elements[op] for op in OPS}
