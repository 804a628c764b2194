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


def peft_adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of a model carrying them (``models.lora.add_lora``), under peft's key names."""
    out = {}
    for name, m in lora_layers(model):
        out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A.weight.detach().cpu().contiguous()
        out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B.weight.detach().cpu().contiguous()
    return out


def peft_adapter_config(cfg, base: str) -> dict:
    """peft's ``LoraConfig`` for a run's ``lora`` section (task CAUSAL_LM, no bias, no rsLoRA/DoRA)."""
    lc, arch = cfg.lora, cfg.model.arch
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": lc.rank, "lora_alpha": lc.alpha, "lora_dropout": lc.dropout,
        "target_modules": list(resolve_targets(arch, lc.target_names())),
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
