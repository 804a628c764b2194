"""Muon for the hidden matrices, AdamW for everything else: one optimizer object, two kinds of group.

    gptforge train --preset tiny --optim.name muon --optim.muon_lr 0.02

Muon (Keller Jordan, modded-nanogpt) keeps SGD momentum per matrix, then replaces the update by an
approximately orthogonal matrix with the same row/column spaces: five steps of a quintic
Newton-Schulz iteration with coefficients (3.4445, -4.7750, 2.0315) in bfloat16. It suits the 2-D
weights inside the transformer blocks; embeddings, the output head, norms, biases and scalars keep
AdamW. :class:`MuonAdamW` holds both as param groups tagged ``kind`` ("muon" or "adamw"), each with
its own ``base_lr`` (the schedule scales every group by the same factor), so the train loop,
checkpoints, ZeroRedundancyOptimizer and FSDP2/DCP see one ordinary ``torch.optim.Optimizer``.

The orthogonalisation is ``torch.optim.Muon``'s own Newton-Schulz kernel where the installed torch
has it (2.9+), else :func:`newton_schulz`, the same algorithm written here; tests check both
against an independent reference and the whole Muon step against ``torch.optim.Muon``.

Sharded matrices. Newton-Schulz needs the whole matrix:
- DDP: every rank holds whole, already-averaged gradients; every rank computes the same update.
- ZeRO-1 (ZeroRedundancyOptimizer): whole parameters are assigned to ranks; each rank runs this
  optimizer on its own whole matrices and broadcasts the result. Nothing special is needed.
- FSDP2: parameters, gradients and momentum are DTensor row shards. Each rank all-gathers the
  momentum-corrected update (``full_tensor()``), orthogonalises the whole matrix, and keeps its
  own rows (``distribute_tensor(..., src_data_rank=None)``, no communication). Every rank does every
  matrix's Newton-Schulz (redundant compute, one all-gather per matrix); the result equals the
  unsharded step.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # modded-nanogpt's quintic: maximal slope at zero
NS_EPS = 1e-7


class MuonParamError(ValueError):
    """Muon was asked for a parameter it cannot take (not a 2-D matrix), or for none at all."""


def newton_schulz(G: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  eps: float = NS_EPS) -> torch.Tensor:
    """Approximately orthogonalise a 2-D matrix: X <- aX + b(XX^T)X + c(XX^T)^2 X, ``steps`` times,
    in bfloat16, after scaling X to spectral norm <= 1 (Frobenius norm). Works on the wide
    orientation (rows <= cols) so the Gram matrix is the small one."""
    if G.ndim != 2:
        raise ValueError(f"newton_schulz takes a 2-D matrix, got shape {tuple(G.shape)}")
    a, b, c = coeffs
    X = G.bfloat16()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.T  # (rows, rows)
        B = torch.addmm(A, A, A, beta=b, alpha=c)  # b*A + c*A@A
        X = torch.addmm(X, B, X, beta=a)  # a*X + B@X
    return X.T if tall else X


def _torch_newton_schulz() -> Callable | None:
    """torch.optim.Muon's kernel (same signature order as ours), when this torch has it."""
    if not hasattr(torch.optim, "Muon"):
        return None
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz
    except ImportError:  # the class exists but its module moved: use ours
        return None
    return lambda G, steps, coeffs, eps: _zeropower_via_newtonschulz(G, coeffs, steps, eps)


def orthogonalize(G: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  eps: float = NS_EPS, use_torch: bool = True) -> torch.Tensor:
    fn = _torch_newton_schulz() if use_torch else None
    return fn(G, steps, coeffs, eps) if fn is not None else newton_schulz(G, steps, coeffs, eps)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "full_tensor") and hasattr(t, "placements")


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer with Muon groups (``kind="muon"``) and AdamW groups (``kind="adamw"``).

    Muon group keys: lr, weight_decay, momentum, nesterov, ns_steps. AdamW group keys: lr,
    weight_decay, betas, eps. Missing keys come from the constructor's defaults. State names match
    torch's (``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``).
    """

    def __init__(self, params: Iterable[dict], lr: float = 1e-3, weight_decay: float = 0.0,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, use_torch_ns: bool = True):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                        betas=betas, eps=eps, kind="adamw")
        super().__init__(params, defaults)
        self.use_torch_ns = use_torch_ns
        for group in self.param_groups:
            if group["kind"] not in ("muon", "adamw"):
                raise ValueError(f"param group kind {group['kind']!r}: expected muon or adamw")
            if group["kind"] == "muon":
                bad = [tuple(p.shape) for p in group["params"] if p.ndim != 2]
                if bad:
                    raise MuonParamError(f"Muon takes 2-D matrices only; got parameters of shape {bad}")

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon_group(group)
            else:
                self._adamw_group(group)
        return loss

    def _muon_group(self, group: dict) -> None:
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(g, 1 - mu)
            update = g.lerp(buf, mu) if group["nesterov"] else buf
            if _is_dtensor(update):  # FSDP2 row shard: orthogonalise the whole matrix, keep our rows
                from torch.distributed.tensor import distribute_tensor

                full = orthogonalize(update.full_tensor(), group["ns_steps"], use_torch=self.use_torch_ns)
                update = distribute_tensor(full.to(update.dtype), update.device_mesh, update.placements,
                                           src_data_rank=None)
            else:
                update = orthogonalize(update, group["ns_steps"], use_torch=self.use_torch_ns)
            rows, cols = p.shape
            scale = math.sqrt(max(1.0, rows / cols))  # equal update RMS for tall matrices (Keller's "original")
            p.mul_(1 - lr * wd)
            p.add_(update.to(p.dtype), alpha=-lr * scale)

    def _adamw_group(self, group: dict) -> None:
        # torch.optim.AdamW's single-tensor update, written out (tests compare against torch's)
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = state["step"].item()
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            p.mul_(1 - lr * wd)
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            step_size = lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


# --- which parameters get Muon --------------------------------------------------------------------

HEAD_NAMES = ("lm_head",)  # output heads by module name (both model families)


def muon_split(model: nn.Module, spec: str = "auto") -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """Split ``model``'s trainable parameters into (Muon, AdamW) lists of (name, parameter).

    ``spec="auto"``: the weights of the ``nn.Linear`` layers except the output head (and any
    Linear whose weight is tied to an embedding), i.e. the attention and MLP matrices inside the
    blocks. Otherwise a comma-separated list of parameter-name globs (``transformer.h.*.attn.*.weight``);
    every match must be 2-D, else :class:`MuonParamError` names it.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # tied weights appear once
    if spec == "auto":
        embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        chosen = set()
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and name.split(".")[-1] not in HEAD_NAMES \
                    and id(mod.weight) not in embedding_ids and mod.weight.requires_grad:
                chosen.add(id(mod.weight))
    else:
        globs = [g.strip() for g in spec.split(",") if g.strip()]
        chosen = {id(p) for n, p in named if any(fnmatch.fnmatchcase(n, g) for g in globs)}
        bad = [f"{n} {tuple(p.shape)}" for n, p in named if id(p) in chosen and p.ndim != 2]
        if bad:
            raise MuonParamError(
                f"optim.muon_params={spec!r} selects {', '.join(bad[:3])}: Muon takes 2-D matrices only; "
                "narrow the globs (or use auto) so norms, biases and scalars stay with AdamW"
            )
    muon = [(n, p) for n, p in named if id(p) in chosen]
    if not muon:
        raise MuonParamError(
            f"optim.muon_params={spec!r} selects no parameter of this model; use auto or globs over names "
            f"such as {named[0][0] if named else '?'}"
        )
    adamw = [(n, p) for n, p in named if id(p) not in chosen]
    return muon, adamw
