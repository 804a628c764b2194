"""Every ``optim.*`` key of the optimizer reaches the step it names (issue 36: a key tested through to its
effect, not only its refusal). The optimizer is built the way a run builds it (``build_optimizer`` from an
``OptimConfig`` with every key off its default), stepped on fixed gradients, and compared with an
independent computation: AdamW written from its formula in float64, and ``torch.optim.Muon`` for the Muon
matrices. A key dropped on its way (betas hard-coded, Muon's momentum or Newton-Schulz steps left at their
defaults, weight decay given to the biases) moves the weights away from the reference.
"""

from __future__ import annotations

import pytest
import torch

from gptforge.config import OptimConfig
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.optim import build_optimizer

# every AdamW key off its default (OptimConfig: lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1)
ADAMW = dict(lr=0.013, beta1=0.8, beta2=0.9, eps=1e-3, weight_decay=0.3, fused=False)
# every Muon key off its default (muon_lr 0.02, momentum 0.95, nesterov on, 5 steps, no weight decay)
MUON = dict(name="muon", muon_lr=0.031, muon_momentum=0.7, muon_nesterov=False, muon_ns_steps=2,
            muon_weight_decay=0.2)
STEPS = 3


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))


def _grads(params: list[torch.nn.Parameter], step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def _adamw_by_hand(p0: torch.Tensor, grads: list[torch.Tensor], lr: float, b1: float, b2: float, eps: float,
                   wd: float) -> torch.Tensor:
    """Loshchilov & Hutter's AdamW in float64: decoupled decay p -= lr wd p, then the bias-corrected step."""
    p, m, v = p0.double(), torch.zeros_like(p0, dtype=torch.float64), torch.zeros_like(p0, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        p = p - lr * wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    return p


def _run(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> list[list[torch.Tensor]]:
    seen = []
    for step in range(STEPS):
        grads = _grads(params, step)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        seen.append(grads)
    return seen


@pytest.mark.parametrize("name, fused", [("adamw", False), ("adamw", True), ("muon", False)])
def test_adamw_keys_reach_the_step(name, fused):
    """lr, beta1, beta2, eps and weight_decay, under plain AdamW (torch's fused kernel or not: optim.fused)
    and as Muon's AdamW part (the embeddings, the head, the norms and the biases): each weight equals AdamW
    by hand; decay only on 2-D weights."""
    model = _model()
    cfg = OptimConfig(**{**ADAMW, "fused": fused}, **(MUON if name == "muon" else {}))
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    opt = build_optimizer(model, cfg, "cpu")
    muon = {id(p) for g in opt.param_groups if g.get("kind") == "muon" for p in g["params"]}
    assert (len(muon) > 0) == (name == "muon")
    if name == "adamw":
        assert opt.defaults["fused"] is fused  # the kernel asked for (same arithmetic, within float32)
    grads = _run(opt, params)
    checked = 0
    for i, (p, p0) in enumerate(zip(params, start, strict=True)):
        if id(p) in muon:
            continue
        wd = cfg.weight_decay if p.dim() >= 2 else 0.0
        want = _adamw_by_hand(p0, [g[i] for g in grads], cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, wd)
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-5, atol=1e-7)
        checked += 1
    assert checked >= 4  # embeddings (tied head), norms, biases


def test_muon_keys_reach_the_step():
    """muon_lr, muon_momentum, muon_nesterov, muon_ns_steps and muon_weight_decay: the block matrices
    equal torch.optim.Muon given the same settings (torch's own implementation, not gptforge's)."""
    model = _model()
    cfg = OptimConfig(**ADAMW, **MUON)
    params = [p for p in model.parameters() if p.requires_grad]
    start = {id(p): p.detach().clone() for p in params}
    opt = build_optimizer(model, cfg, "cpu")
    (group,) = [g for g in opt.param_groups if g.get("kind") == "muon"]
    ref = [torch.nn.Parameter(start[id(p)].clone()) for p in group["params"]]
    ref_opt = torch.optim.Muon(ref, lr=cfg.muon_lr, weight_decay=cfg.muon_weight_decay, momentum=cfg.muon_momentum,
                               nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps)
    index = {id(p): i for i, p in enumerate(params)}
    grads = _run(opt, params)
    for step in range(STEPS):
        for r, p in zip(ref, group["params"], strict=True):
            r.grad = grads[step][index[id(p)]].clone()
        ref_opt.step()
    assert len(ref) >= 4  # c_attn, attn c_proj, c_fc, mlp c_proj
    for r, p in zip(ref, group["params"], strict=True):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=0, atol=2e-6)


def test_muon_params_picks_the_matrices_muon_takes():
    """optim.muon_params: name globs pick Muon's matrices (here the MLP's two), every other parameter goes
    to AdamW; "auto" takes the blocks' four Linear weights (c_attn, attn c_proj, c_fc, mlp c_proj)."""
    def groups(spec: str) -> tuple[list[str], int]:
        model = _model()
        names = {id(p): n for n, p in model.named_parameters()}
        opt = build_optimizer(model, OptimConfig(**{**ADAMW, **MUON, "muon_params": spec}), "cpu")
        muon = sorted(names[id(p)] for g in opt.param_groups if g.get("kind") == "muon" for p in g["params"])
        return muon, sum(len(g["params"]) for g in opt.param_groups)

    mlp, total = groups("*.mlp.c_fc.weight,*.mlp.c_proj.weight")
    assert mlp == ["transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"]
    auto, total_auto = groups("auto")
    assert auto == sorted(f"transformer.h.0.{m}.weight" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert total == total_auto == sum(1 for _ in _model().parameters())  # every parameter in exactly one group
