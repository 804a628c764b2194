"""What the transformers-reference tests of the Llama-family readers share: a random HF model with no identity
weights, saved with save_pretrained and loaded back through gptforge's one reader, and a logits comparison that
records the largest difference seen (each test module keeps its own table and tolerance)."""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.interop.hf_llama import load_hf_llama


def random_hf_model(kind: str, **config):
    """transformers' ``{kind}ForCausalLM`` (``Gemma3Text``: ``Gemma3ForCausalLM``) over ``{kind}Config(**config)``,
    built with seed 0, then every weight perturbed (seed 1; 1-d ones, norms and biases, by N(0, 0.2), the rest
    by N(0, 0.05)) so no norm or bias is trivial (transformers starts norms at 1, Gemma's at 0, biases at 0).
    In eval mode."""
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, f"{kind}Config")(**config)
    hf = getattr(transformers, f"{'Gemma3' if kind == 'Gemma3Text' else kind}ForCausalLM")(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() == 1 else 0.05))
    return hf


def saved_and_loaded(name: str, hf, tmp_path_factory, idx: torch.Tensor) -> tuple:
    """(name, transformers model, its save_pretrained directory, gptforge's load of it, reference logits)."""
    d: Path = tmp_path_factory.mktemp(name) / "hf"
    hf.save_pretrained(d)
    with torch.no_grad():
        ref = hf(idx).logits
    return name, hf, d, load_hf_llama(str(d)), ref


def logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx)[0]


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, atol: float, seen: dict[str, float]) -> None:
    """``got`` equals ``ref`` to ``atol``; the largest difference per ``name`` is kept in ``seen``."""
    diff = (got - ref).abs().max().item()
    seen[name] = max(seen.get(name, 0.0), diff)
    print(f"{name}: max |gptforge - transformers| = {diff:.2e} (|logits| up to {ref.abs().max():.1f})")
    assert got.shape == ref.shape and diff <= atol, diff
