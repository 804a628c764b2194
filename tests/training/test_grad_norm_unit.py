"""The mesh step's gradient norm and clipping (gptforge.parallel.grads) in one process (issue 36: the
`parallel` mutation lane's fast tests; the multi-rank runs of test_model_parallel.py compare a mesh
with one rank, in subprocesses mutmut cannot follow). The norm is checked against a float64 hand
computation, the clipping against its definition (each gradient times max_norm / norm when the norm
is larger), the pipeline's sum of squared norms over stages with a stand-in all-reduce that adds a
known other stage, and a sequence-parallel Partial gradient reduced to its parameter's placement on a
one-rank DTensor mesh (gloo)."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from gptforge.parallel import grads


class _Dim:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n

    def get_group(self):
        return "pp-group"


def _info(pp=None, tp=None):
    mesh = None if pp is None and tp is None else {"pp": _Dim(pp or 1), "tp": _Dim(tp or 1)}
    return SimpleNamespace(mesh=mesh, device=torch.device("cpu"))


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(3, 4, generator=g)) for _ in range(3)]
    for p in ps[:2]:
        p.grad = torch.randn(p.shape, generator=g)
    return ps  # the third has no gradient


def _norm64(ts):
    return math.sqrt(sum((t.double() ** 2).sum().item() for t in ts))


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_norm_is_the_global_l2_and_clipping_scales_to_max_norm(max_norm):
    ps = _params()
    before = [p.grad.clone() for p in ps[:2]]
    want = _norm64(before)
    total = grads.grad_norm_and_clip(ps, max_norm, _info())
    assert total.item() == pytest.approx(want, rel=1e-6)
    scale = max_norm / want if 0 < max_norm < want else 1.0
    for p, g in zip(ps[:2], before, strict=True):
        torch.testing.assert_close(p.grad, g * scale, rtol=1e-5, atol=1e-7)
    assert ps[2].grad is None


def test_skipped_parameters_are_not_counted_but_still_clipped():
    ps = _params(1)
    before = [p.grad.clone() for p in ps[:2]]
    want = _norm64(before[1:])  # the first is counted on another stage (a tied embedding)
    total = grads.grad_norm_and_clip(ps, 0.1, _info(), skip={id(ps[0])})
    assert total.item() == pytest.approx(want, rel=1e-6)
    for p, g in zip(ps[:2], before, strict=True):
        torch.testing.assert_close(p.grad, g * (0.1 / want), rtol=1e-5, atol=1e-7)


def test_no_gradients_give_a_zero_norm():
    ps = [torch.nn.Parameter(torch.ones(2))]
    total = grads.grad_norm_and_clip(ps, 1.0, _info())
    assert total.shape == () and total.item() == 0.0 and total.device.type == "cpu"
    assert grads.grad_norm_and_clip(_params()[:2], 0.0, _info(), skip={id(p) for p in _params()}).item() > 0


@pytest.mark.parametrize("pp", [1, 2])
def test_pipeline_stages_sum_their_squared_norms(monkeypatch, pp):
    other = 2.5  # the other stage's norm
    calls = []

    def all_reduce(t, group=None):
        calls.append((t.dtype, group))
        t.add_(other ** 2)

    monkeypatch.setattr(grads.dist, "all_reduce", all_reduce)
    ps = _params(2)
    before = [p.grad.clone() for p in ps[:2]]
    mine = _norm64(before)
    total = grads.grad_norm_and_clip(ps, 1.0, _info(pp=pp))
    want = math.sqrt(mine ** 2 + other ** 2) if pp > 1 else mine
    assert total.item() == pytest.approx(want, rel=1e-6)
    assert calls == ([(torch.float32, "pp-group")] if pp > 1 else [])
    for p, g in zip(ps[:2], before, strict=True):  # clipped by the global norm, not this stage's
        torch.testing.assert_close(p.grad, g * (1.0 / want), rtol=1e-5, atol=1e-7)


def test_loss_context_is_loss_parallel_only_under_tensor_parallelism():
    assert isinstance(grads.loss_context(_info()), contextlib.nullcontext)
    assert isinstance(grads.loss_context(_info(pp=2, tp=1)), contextlib.nullcontext)
    ctx = grads.loss_context(_info(tp=2))
    assert getattr(ctx, "func", None).__name__ == "loss_parallel"


@pytest.fixture
def one_rank_mesh(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group is already up")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("pp", "tp"))
    finally:
        dist.destroy_process_group()


def test_a_partial_gradient_is_reduced_to_its_parameters_placement(one_rank_mesh):
    from torch.distributed.tensor import DTensor, Partial, Replicate

    mesh = one_rank_mesh["tp"]
    g = torch.randn(4, generator=torch.Generator().manual_seed(3))
    p = torch.nn.Parameter(DTensor.from_local(torch.ones(4), mesh, [Replicate()]))
    p.grad = DTensor.from_local(g.clone(), mesh, [Partial()])
    plain = torch.nn.Parameter(DTensor.from_local(torch.ones(3), mesh, [Replicate()]))
    plain.grad = DTensor.from_local(torch.tensor([3.0, 0.0, 4.0]), mesh, [Replicate()])
    info = SimpleNamespace(mesh=one_rank_mesh, device=torch.device("cpu"))
    total = grads.grad_norm_and_clip([p, plain], 0.0, info)
    assert tuple(p.grad.placements) == (Replicate(),)
    assert not isinstance(total, DTensor) and total.item() == pytest.approx(math.sqrt(_norm64([g]) ** 2 + 25), rel=1e-6)
