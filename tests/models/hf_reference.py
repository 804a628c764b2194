"""What the transformers-reference tests of the Llama-family readers share: a random HF model saved with
save_pretrained and loaded back through gptforge's one reader, and a logits comparison that records the
largest difference seen (each test module keeps its own table and tolerance)."""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.interop.hf_llama import load_hf_llama


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
