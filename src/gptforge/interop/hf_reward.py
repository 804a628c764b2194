"""Reward models as transformers' sequence classifiers: ``GPT2ForSequenceClassification`` /
``LlamaForSequenceClassification`` with one label, the same weights and the same scores.

A gptforge reward model (``training.rm.RewardModel``: a family model's ``body`` plus a linear
``score`` head, read at a sequence's last token) maps onto them key for key: the base model's
weights under HF's names and ``score.weight``. transformers reads a classifier at the last token that
is not ``pad_token_id``; give a pad id that never ends a scored sequence (the chat template's
``<|endoftext|>`` only starts one) and right-pad.

    >>> hf = reward_model_to_transformers(rm, pad=50256)
    >>> hf(input_ids).logits[:, 0]   # == rm(input_ids, last token positions)
"""

from __future__ import annotations

from typing import Any

import torch


def reward_model_hf_config(rm: Any, pad: int) -> dict:
    """config.json for the family's ``*ForSequenceClassification`` with one label."""
    cfg = rm.body.config
    if cfg.arch == "gpt2":
        from gptforge.interop.hf import hf_config

        c, arch = hf_config(cfg), "GPT2ForSequenceClassification"
    elif cfg.arch == "llama":
        from gptforge.interop.hf_llama import hf_llama_config

        c = hf_llama_config(cfg)  # LlamaForCausalLM's, or Qwen2ForCausalLM's for a model with q/k/v biases
        arch = c["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
        if c["model_type"] == "granite":
            raise ValueError("model.family=granite: transformers has no GraniteForSequenceClassification, so a Granite "
                             "reward model has no Hugging Face form (its weights export as any run's do)")
        if c["model_type"] == "gemma3_text":  # Gemma3ForSequenceClassification is the image-text model's
            arch = "Gemma3TextForSequenceClassification"
    else:
        raise ValueError(f"model.arch={cfg.arch!r}: no Hugging Face sequence classifier for this family")
    return {**c, "architectures": [arch], "num_labels": 1, "pad_token_id": pad, "tie_word_embeddings": False}


def reward_model_state_dict_for_hf(rm: Any) -> dict[str, torch.Tensor]:
    """The base model's weights under HF's names (no LM head) plus ``score.weight`` (1, n_embd)."""
    cfg = rm.body.config
    if cfg.arch == "gpt2":
        from gptforge.interop.hf import gptforge_to_hf

        sd = gptforge_to_hf({k: v.detach().float().cpu() for k, v in rm.body.state_dict().items()}, cfg)
        base = "transformer."
    else:
        from gptforge.interop.hf_llama import llama_state_dict_for_hf

        sd, base = llama_state_dict_for_hf(rm.body), "model."
    out = {k: v for k, v in sd.items() if k.startswith(base)}
    out["score.weight"] = rm.score.weight.detach().float().cpu().contiguous()
    return out


def reward_model_to_transformers(rm: Any, pad: int) -> Any:
    """A transformers sequence classifier holding ``rm``'s weights, in memory (tests; ``export hf``)."""
    import transformers

    c = reward_model_hf_config(rm, pad)
    arch = c["architectures"][0]
    config_class = getattr(transformers, arch.replace("ForSequenceClassification", "Config"))  # Gemma3TextConfig
    config = config_class(**{k: v for k, v in c.items() if k not in ("architectures", "model_type", "torch_dtype")})
    hf = getattr(transformers, arch)(config)
    missing, unexpected = hf.load_state_dict(reward_model_state_dict_for_hf(rm), strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit transformers' {arch}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return hf.eval()


def export_reward_hf(rm: Any, out_dir: str, pad: int, force: bool = False, tokenizer: bool = True,
                     chat_template: dict | None = None) -> list:
    """Write ``rm`` as a Hugging Face ``*ForSequenceClassification`` directory (``gptforge export hf``
    on a reward-model checkpoint): model.safetensors, config.json and the tokenizer (with the chat
    template). ``AutoModelForSequenceClassification.from_pretrained(dir)`` then gives rm's scores."""
    import json

    from safetensors.torch import save_file

    from gptforge.interop.hf_chat import check_tokenizer_vocab
    from gptforge.interop.hf_folder import check_out_dir
    from gptforge.interop.hf_tokenizer import write_tokenizer
    from gptforge.storage import ordinary_file_mode

    cfg = rm.body.config
    if cfg.arch == "gpt2" and not cfg.bias:
        raise ValueError("Hugging Face GPT-2 has biases in every Linear and LayerNorm; a model.bias=false reward "
                         "model cannot be exported to GPT2ForSequenceClassification")
    config = reward_model_hf_config(rm, pad)  # refuses a family without a classifier, before writing
    chat = check_tokenizer_vocab(cfg.vocab_size, chat_template) if tokenizer else None
    out = check_out_dir(out_dir, force)
    files = [out / "model.safetensors", out / "config.json"]
    save_file(reward_model_state_dict_for_hf(rm), str(files[0]), metadata={"format": "pt"})
    ordinary_file_mode(files[0])  # safetensors writes 0600; the other files get the umask's mode
    files[1].write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer:
        files += write_tokenizer(out, chat, model_max_length=cfg.block_size)
    return files
