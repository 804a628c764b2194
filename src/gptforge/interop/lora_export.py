"""A LoRA run's adapters alone, as ``peft`` writes them: ``adapter_config.json`` + ``adapter_model.safetensors``.

    gptforge export hf --ckpt runs/base --out exports/base                      # the base, once
    gptforge export hf --ckpt runs/lora --adapters-only --out exports/lora      # adapters only (a few MB)
    >>> PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("exports/base"), "exports/lora")

gptforge's module names are Hugging Face's (GPT-2's ``transformer.h.0.attn.c_attn``, Llama's
``model.layers.0.self_attn.q_proj``), so a key is peft's ``base_model.model.<module>.lora_A.weight``;
lora_A (r, in) and lora_B (out, r) have peft's shapes for both families (GPT-2's Conv1D layers only
transpose the base weight, hence ``fan_in_fan_out``). ``export hf`` without ``--adapters-only`` writes
the merged model (W + alpha/r B A).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from gptforge.models.lora import lora_layers, resolve_targets

PEFT_PREFIX = "base_model.model."


# what transformers fuses that gptforge keeps apart, per family: Phi-3's q, k, v rows stacked in one
# self_attn.qkv_proj, its gate then up rows in one mlp.gate_up_proj (hf_families.py splits them on import)
FUSED = {"phi3": {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                  "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}}


def _fused_of(family: str, name: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(the fused module's full name, this part's name, the fused module's parts) for a layer of a family
    whose transformers model fuses it; None otherwise."""
    for fused, parts in FUSED.get(family, {}).items():
        for part in parts:
            if name.endswith("." + part):
                return name[: -len(part)] + fused, part, parts
    return None


def peft_adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of a model carrying them (``models.lora.add_lora``), under peft's key names. A fused
    module (Phi-3's qkv_proj, gate_up_proj) gets one adapter that is exactly its parts' adapters: A the
    parts' A stacked (rank r per targeted part), B block-diagonal over the parts' rows (zero rows for a part
    not targeted); its scale, alpha/r, is kept by ``peft_adapter_config``'s rank and alpha patterns."""
    out: dict[str, torch.Tensor] = {}
    family = getattr(model.config, "family", "")
    groups: dict[str, dict[str, torch.nn.Module]] = {}
    for name, m in lora_layers(model):
        fused = _fused_of(family, name)
        if fused is None:
            out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A.weight.detach().cpu().contiguous()
            out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B.weight.detach().cpu().contiguous()
        else:
            groups.setdefault(fused[0], {})[fused[1]] = m
    for fused_name, got in groups.items():
        parts = next(p for f, p in FUSED[family].items() if fused_name.endswith("." + f))
        prefix = fused_name[: fused_name.rindex(".", 0, fused_name.rindex(".")) + 1]  # model.layers.i.
        rows = [model.get_submodule(prefix + p).weight.shape[0] for p in parts]
        r = next(iter(got.values())).lora_A.weight.shape[0]
        A = torch.cat([got[p].lora_A.weight.detach().cpu() for p in parts if p in got])  # (n r, in)
        B = torch.zeros(sum(rows), A.shape[0], dtype=A.dtype)  # (out, n r)
        row, col = 0, 0
        for p, n_rows in zip(parts, rows, strict=True):
            if p in got:
                B[row : row + n_rows, col : col + r] = got[p].lora_B.weight.detach().cpu()
                col += r
            row += n_rows
        out[f"{PEFT_PREFIX}{fused_name}.lora_A.weight"] = A.contiguous()
        out[f"{PEFT_PREFIX}{fused_name}.lora_B.weight"] = B.contiguous()
    return out


def peft_adapter_config(cfg, base: str) -> dict:
    """peft's ``LoraConfig`` for a run's ``lora`` section (task CAUSAL_LM, no bias, no rsLoRA/DoRA). A fused
    module (``FUSED``) whose adapter stacks n parts has rank n r and alpha n alpha: the same alpha/r scale."""
    lc, arch = cfg.lora, cfg.model.arch
    targets = list(resolve_targets(arch, lc.target_names()))
    ranks, alphas = {}, {}
    for fused, parts in FUSED.get(getattr(cfg.model, "family", ""), {}).items():
        n = sum(any(t == p or p.endswith("." + t) for t in targets) for p in parts)
        if n:
            targets = [t for t in targets if not any(p == t or p.endswith("." + t) for p in parts)] + [
                fused.split(".")[-1]]
            ranks[fused.split(".")[-1]], alphas[fused.split(".")[-1]] = n * lc.rank, n * lc.alpha
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": lc.rank, "lora_alpha": lc.alpha, "lora_dropout": lc.dropout,
        "target_modules": targets, "rank_pattern": ranks, "alpha_pattern": alphas,
        "fan_in_fan_out": arch == "gpt2",  # transformers' GPT-2 stores its layers as Conv1D (in, out)
        "bias": "none", "modules_to_save": None, "init_lora_weights": True, "inference_mode": True,
        "use_rslora": False, "use_dora": False,
    }


def write_peft_adapters(model, cfg, out_dir: str | Path) -> list[Path]:
    """Write the adapters of ``model`` (a LoRA model on its base, unmerged: ``load.lora_merged(...,
    merge=False)``, which checked the base's fingerprint and the shapes) into ``out_dir`` (which exists)
    in peft's format, with ``cfg`` (the run's Config) for the adapter config."""
    out = Path(out_dir)
    weights, config = out / "adapter_model.safetensors", out / "adapter_config.json"
    save_file(peft_adapter_state(model), str(weights), metadata={"format": "pt"})
    config.write_text(json.dumps(peft_adapter_config(cfg, cfg.lora.base), indent=2) + "\n")
    return [weights, config]
