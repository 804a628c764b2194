"""Hugging Face GPT-2 <-> gptforge weights: an explicit key map plus the Conv1D transposes.

    >>> from gptforge.models.gpt2 import GPT
    >>> model = GPT.from_pretrained("gpt2")            # online, hub name
    >>> model = GPT.from_pretrained("./my-gpt2-dir")   # offline, a save_pretrained directory
"""

from __future__ import annotations

import torch

# HF GPT-2 uses Conv1D (weight shape (in, out)); we use nn.Linear (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers HF keeps in some versions that are not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def load_hf_state_dict(name_or_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Return (config dict, state dict) of a HF GPT-2 model from a hub name or local directory."""
    try:
        from transformers import GPT2LMHeadModel
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "loading Hugging Face weights needs `transformers`: pip install 'gptforge[hf]'"
        ) from e
    try:
        hf = GPT2LMHeadModel.from_pretrained(name_or_dir)
    except OSError as e:
        raise FileNotFoundError(
            f"could not load Hugging Face model {name_or_dir!r}: {e}\n"
            "Give a hub name (needs network) or a directory written by save_pretrained()."
        ) from e
    c = hf.config
    cfg = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, n_positions=c.n_positions, vocab_size=c.vocab_size)
    return cfg, hf.state_dict()


def hf_to_gptforge(sd_hf: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Map a HF GPT-2 state dict onto gptforge names, transposing Conv1D and padding the vocab."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd_hf.items():
        if k.endswith(IGNORED_SUFFIXES):
            continue
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = _pad_rows(v, cfg.padded_vocab_size)
        out[k] = v.contiguous()
    return out


def gptforge_to_hf(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Inverse of :func:`hf_to_gptforge`: slice the padded vocab back, transpose to Conv1D."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.endswith(".attn.mask"):
            continue
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = v[: cfg.vocab_size]
        out[k] = v.contiguous()
    return out


def _pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    if w.size(0) >= rows:
        return w
    pad = torch.zeros(rows - w.size(0), w.size(1), dtype=w.dtype)
    return torch.cat([w, pad], dim=0)
