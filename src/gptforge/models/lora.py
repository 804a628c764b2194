"""LoRA (Hu et al. 2021), computed as ``peft`` computes it, applied to a model from outside.

    >>> adapters = add_lora(model, "llama", rank=8, alpha=16, dropout=0.0, targets=["q_proj", "v_proj"])
    >>> y = model(x)                  # each targeted nn.Linear: W x + b + (alpha / r) B A dropout(x)
    >>> with adapters_off(model): ...  # the base alone (peft's disable_adapter): a reference model for free
    >>> merge_lora(model)             # W <- W + (alpha / r) B A; plain nn.Linear again

Like parallelism and compilation, adapters are put on a built model from outside (the family files
never know about them): each targeted ``nn.Linear`` becomes a :class:`LoRALinear` in place, keeping
its own ``weight``/``bias`` names and gaining ``lora_A.weight`` (r, in) and ``lora_B.weight`` (out, r),
peft's names and shapes. A starts like peft's (Kaiming-uniform, a=sqrt(5)), B at zero, so the model
is unchanged until it trains. Why not peft itself: peft wraps a Hugging Face ``PreTrainedModel`` and
renames the base weights (``base_layer.weight``), which gptforge's checkpoints, key maps, FSDP/TP plans
and exports all read by name; the math is a dozen lines, and tests/training/test_lora_peft.py proves it
equals peft's outputs (and that peft loads the adapters this writes).

The targets of each family are named here, in models/, so no family branch lives outside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# module names a LoRA target may be (a target matches a module whose name is it or ends in "." + it: peft's rule)
TARGETS: dict[str, tuple[str, ...]] = {
    "gpt2": ("c_attn", "c_proj", "c_fc", "attn.c_proj", "mlp.c_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {"gpt2": ("c_attn",), "llama": ("q_proj", "v_proj")}  # peft's defaults


class LoRAError(ValueError):
    """A LoRA setting that does not fit the model (one line, naming the ``lora.*`` field)."""


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` plus a trainable low-rank update; the base weight and bias keep their names."""

    lora_A: nn.Linear
    lora_B: nn.Linear
    lora_dropout: nn.Module
    scaling: float
    adapter_on: bool = True  # False inside :func:`adapters_off`: the layer is its base nn.Linear, bit for bit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.adapter_on:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def delta(self) -> torch.Tensor:
        """The update as a weight: (alpha / r) B A, shaped like ``weight`` (out, in)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling


def resolve_targets(family: str, targets: list[str]) -> tuple[str, ...]:
    """The targets to use (the family's default when none are given); an unknown name is refused, listing
    the valid ones for this family."""
    valid = TARGETS.get(family)
    if valid is None:
        raise LoRAError(f"lora: model.arch={family!r} has no LoRA targets; LoRA supports {', '.join(TARGETS)}")
    chosen = tuple(targets) or DEFAULT_TARGETS[family]
    unknown = [t for t in chosen if t not in valid]
    if unknown:
        raise LoRAError(f"lora.targets={','.join(targets)!r}: {', '.join(unknown)} is not a layer of a {family} model; "
                        f"valid targets: {', '.join(valid)}")
    return chosen


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def target_modules(model: nn.Module, targets: tuple[str, ...]) -> list[tuple[str, nn.Linear]]:
    """(name, module) of every ``nn.Linear`` in ``model`` that a target names, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, targets)]


def add_lora(model: nn.Module, family: str, rank: int, alpha: float, dropout: float, targets: list[str]) -> list[str]:
    """Put adapters on ``model``'s targeted layers, in place; returns the adapted module names. A rank
    above a layer's min(in, out) is refused (the update could not be low-rank), naming ``lora.rank``."""
    chosen = resolve_targets(family, targets)
    found = target_modules(model, chosen)
    if not found:
        raise LoRAError(f"lora.targets={','.join(chosen)!r}: the model has no such layer")
    widest = min(min(m.in_features, m.out_features) for _, m in found)
    if rank > widest:
        name, m = next((n, m) for n, m in found if min(m.in_features, m.out_features) == widest)
        raise LoRAError(f"lora.rank={rank} is larger than layer {name} ({m.in_features} in, {m.out_features} out) "
                        f"allows: at most {widest}")
    for _, m in found:
        w = m.weight
        m.__class__ = LoRALinear  # in place: the base keeps its parameter names (and any FSDP/TP plan sees a Linear)
        m.lora_A = nn.Linear(m.in_features, rank, bias=False, device=w.device, dtype=w.dtype)
        m.lora_B = nn.Linear(rank, m.out_features, bias=False, device=w.device, dtype=w.dtype)
        nn.init.kaiming_uniform_(m.lora_A.weight, a=math.sqrt(5))  # peft's init_lora_weights=True
        nn.init.zeros_(m.lora_B.weight)
        m.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        m.scaling = alpha / rank
    return [n for n, _ in found]


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def is_adapter_key(name: str) -> bool:
    """A state-dict key of an adapter (``...lora_A.weight`` / ``...lora_B.weight``)."""
    return ".lora_A." in name or ".lora_B." in name or name.startswith(("lora_A.", "lora_B."))


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` as its base inside the block (every adapter skipped, peft's ``disable_adapter()``):
    each adapted layer computes exactly its frozen ``nn.Linear``, so the outputs are the base model's
    bit for bit, with no second copy of the weights."""
    saved = [(m, m.adapter_on) for _, m in lora_layers(model)]
    for m, _ in saved:
        m.adapter_on = False
    try:
        yield model
    finally:
        for m, on in saved:
            m.adapter_on = on


class BaseOf:
    """A LoRA model's frozen base, called like a model: ``BaseOf(policy)(ids, ...)`` runs ``policy`` with
    its adapters off, in eval mode (dropout off, as a frozen copy would be) and without autograd. RL and
    DPO use it as the reference model (TRL's choice with peft: ``ref_model=None``), saving the copy of the
    weights a separate reference costs. Not an ``nn.Module`` on purpose: it must not register the
    policy as a submodule (freezing or moving "the reference" would then freeze or move the policy)."""

    def __init__(self, model: nn.Module):
        self.model = model

    @torch.no_grad()
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        was = self.model.training
        self.model.eval()
        try:
            with adapters_off(self.model):
                return self.model(*args, **kwargs)
        finally:
            self.model.train(was)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.model.parameters()


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W + (alpha / r) B A) and make the layer a plain
    ``nn.Linear`` again: the model then has exactly its family's parameters (export, sample, chat)."""
    for _, m in lora_layers(model):
        m.weight += m.delta().to(m.weight.dtype)
        del m.lora_A, m.lora_B, m.lora_dropout, m.scaling
        m.__class__ = nn.Linear
    return model


@torch.no_grad()
def weights_fingerprint(model: nn.Module) -> str:
    """sha256 over a model's base parameters (adapters left out; names, dtypes, shapes, bytes, in name order): the identity of a
    LoRA run's frozen base, recorded in its checkpoints and compared on resume and on load."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if is_adapter_key(name):
            continue
        t = p.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def adapter_params(model_cfg, rank: int, targets: list[str]) -> int:
    """Parameters the adapters of ``rank`` on ``targets`` add to the model ``model_cfg`` describes, counted
    on the meta device (nothing allocated, any size answers at once): ``plan``'s LoRA memory."""
    from gptforge.models.registry import build_model

    with torch.device("meta"):
        model = build_model(model_cfg)
    layers = target_modules(model, resolve_targets(model_cfg.arch, targets))
    return sum(rank * (m.in_features + m.out_features) for _, m in layers)
