"""What ``gptforge serve`` is serving, for ``GET /api/info`` and the page's header.

    >>> describe_served(model, ckpt="runs/shakespeare-cpu")["step"]
    200

Where the weights came from (a checkpoint, a Hugging Face name or directory, an llm.c file), the
checkpoint path and step, the model family (the config's ``model.arch`` where a checkpoint records
one, else ``gpt2``), its size and how many tokens it was trained on (step x the run's
``train.total_batch_tokens`` for a pretraining run; unknown for imported or external weights and for
post-training runs, whose steps are not token batches: those name what they were tuned from).

The model's config (:func:`model_fields`) is what the served model does, not what its config leaves to be decided:
a field set to auto (``fused_ce``: None) or to 0 = derived (a Llama's ``n_kv_head``, ``head_size``,
``intermediate_size``; ``layer_types`` and ``family`` empty) is shown as the value the model was built with, and
``auto`` lists those fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def describe_served(model, ckpt: str | None = None, hf: str | None = None, llmc: str | None = None,
                    random: str | None = None, gguf: str | None = None) -> dict[str, Any]:
    """A JSON-ready description of the served model and where it came from."""
    cfg = model.config
    out: dict[str, Any] = {
        "source": ("ckpt" if ckpt else "hf" if hf else "llmc" if llmc else "gguf" if gguf else "random" if random
                   else "memory"),
        "path": None, "run_dir": None, "step": None, "tokens_trained": None,
        "family": getattr(cfg, "arch", "gpt2"),
        "parameters": sum(p.numel() for p in model.parameters()), "layers": cfg.n_layer, "heads": cfg.n_head, "width": cfg.n_embd,
        "context": cfg.block_size, "vocab_size": cfg.vocab_size,
    }
    if random is not None:
        out["path"] = f"random {random} (untrained)"
        out["tokens_trained"] = 0
    elif hf is not None:
        out["path"] = str(Path(hf).resolve()) if Path(hf).exists() else hf
    elif llmc is not None:
        out["path"] = str(Path(llmc).resolve())
    elif gguf is not None:
        out["path"] = str(Path(gguf).resolve())
    elif ckpt is not None:
        from gptforge.run import checkpoint as ck
        from gptforge.run.identity import resolve_checkpoint

        where = resolve_checkpoint(ckpt)
        meta = ck.read_meta(where)
        step = int(meta.get("step", 0))
        config = meta.get("config", {})
        out.update(path=str(where.resolve()), step=step,
                   run_dir=str(where.parent.parent.resolve()) if where.parent.name == "checkpoints" else None)
        out["family"] = config.get("model", {}).get("arch", out["family"])
        batch = config.get("train", {}).get("total_batch_tokens")
        recipe, tuned = _post_training(config)
        if recipe is not None:  # SFT/RL/DPO/RM steps are not train.total_batch_tokens each: unknown, not step x batch
            out.update(recipe=recipe, fine_tuned_from=tuned)
        elif "source" not in meta and batch:  # an imported checkpoint ("source": the llm.c file) has no history
            out["tokens_trained"] = step * int(batch)
    return out


def readable(value: Any) -> Any:
    """``value`` (a str, or dicts and lists of them) with every lone surrogate made U+FFFD: a path whose name is not
    UTF-8 (Python decodes its bytes as surrogates, ``runs/caf\\udce9``) answered every /v1 request, /v1/models and
    /api/info with a 500 (JSON's UTF-8 cannot hold a surrogate), and streamed it as a ``\\udce9`` escape that strict
    clients refuse. Each byte that was not UTF-8 becomes one U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else "\ufffd" for c in value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable(v) for v in value]
    return value


def model_fields(cfg: Any) -> dict[str, Any]:
    """The served model's config for /api/info, each auto or derived field as the model resolved it (the
    module's docstring). ``bos_token`` (where a document starts, for document-masked attention) only where
    attention is ``document``: elsewhere it is an unused default, GPT-2's 50256, which read as the bos of a
    SmolLM2 whose vocabulary stops at 49,152."""
    d = cfg.to_dict()
    if d.get("attention") != "document":
        d.pop("bos_token", None)
    resolved: dict[str, Any] = {}
    if "fused_ce" in d and d["fused_ce"] is None:
        # auto decides the training loss only (models/head.py): a served forward computes plain logits
        resolved["fused_ce"] = False
    for key, derived in (("n_kv_head", "kv_heads"), ("head_size", "head_dim"), ("intermediate_size", "hidden_dim"),
                         ("layer_types", "sliding_pattern")):
        if key in d and not d[key] and hasattr(cfg, derived):
            resolved[key] = getattr(cfg, derived)
    if d.get("family") == "":  # how export writes it: Qwen2 where the q, k and v projections have biases
        resolved["family"] = "qwen2" if d.get("qkv_bias") else "llama"
    d.update(resolved)
    d["auto"] = sorted(resolved)
    return d


def _post_training(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(recipe, starting model) of a post-training run (sft, rl, dpo, rm) from its config, the starting
    model where the config records one; (None, None) for pretraining."""
    for section, key in (("rl", "init_from"), ("dpo", "init_from"), ("sft", "data"), ("rm", "data")):
        part = config.get(section) or {}
        if part.get(key):
            return section, (str(part["init_from"]) if part.get("init_from") else None)
    return None, None
