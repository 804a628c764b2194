"""One way to get a model for every command that takes one: ``load_model(source)``.

    >>> model = load_model(ModelSource(ckpt="runs/shakespeare-cpu"))   # newest checkpoint of a run
    >>> model = load_model(ModelSource(hf="gpt2"))                     # Hugging Face (hub or directory)
    >>> model = load_model(ModelSource(llmc="gpt2_124M.bin"))          # an llm.c model file
    >>> model = load_model(ModelSource(random="d2"))                   # random weights of a named size

Weights come from safetensors or llm.c files, never from a pickle. The model family is whatever
the source says (a checkpoint's ``model.arch``, a Hugging Face ``model_type``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gptforge.config import Config
from gptforge.models.registry import build_model, size_config
from gptforge.run import checkpoint as ckpt
from gptforge.run.weights import check_weights_fit


@dataclass(frozen=True)
class ModelSource:
    ckpt: str | None = None  # a checkpoint directory, or a run directory (its newest checkpoint)
    hf: str | None = None  # a Hugging Face hub name (online) or save_pretrained directory
    llmc: str | None = None  # an llm.c model file
    random: str | None = None  # a model size name: random weights (benchmarks, smoke tests)

    def given(self) -> list[str]:
        return [k for k in ("ckpt", "hf", "llmc", "random") if getattr(self, k) is not None]

    def describe(self) -> dict[str, str | None]:
        return {k: getattr(self, k) for k in ("ckpt", "hf", "llmc", "random")}

    @classmethod
    def from_path(cls, path: str) -> ModelSource:
        """A file is an llm.c model; a directory with a ``config.json`` (and no gptforge ``meta.json``)
        a Hugging Face ``save_pretrained`` directory; any other directory a gptforge checkpoint or run
        (``--init-from``; a run directory has a config.json too, beside its checkpoints/)."""
        p = Path(path)
        if p.is_file():
            return cls(llmc=path)
        if (p / "config.json").is_file() and not (p / "meta.json").exists() and not ckpt.ckpt_root(p).is_dir():
            return cls(hf=path)
        return cls(ckpt=path)


def load_model(source: ModelSource) -> torch.nn.Module:
    """The model ``source`` names, in eval mode, on the CPU."""
    if len(source.given()) != 1:
        raise ValueError("give exactly one of --ckpt DIR, --hf NAME_OR_DIR, --llmc FILE or --random SIZE")
    if source.hf is not None:
        # the family by config.json's model_type (an unknown one is refused there), then its loader
        from gptforge.interop import hf_module
        from gptforge.interop.hf import hf_family

        return hf_module(hf_family(source.hf)).load_hf(source.hf)
    if source.llmc is not None:
        from gptforge.interop.llmc import read_llmc_model

        return read_llmc_model(source.llmc)
    if source.random is not None:
        torch.manual_seed(0)
        return build_model(size_config(source.random)).eval()
    where = ckpt.resolve_checkpoint(source.ckpt)
    meta = ckpt.read_meta(where)
    cfg = Config.from_dict(meta["config"])
    recipe = meta.get("recipe")
    if recipe == "rm":  # the one place every text command (sample, chat, serve, eval tasks) loads through
        raise ValueError(f"{where} is a reward model (`gptforge rm`): a reward model does not generate text. Score "
                         f"preference pairs with `gptforge eval --ckpt {source.ckpt} --preferences FILE.jsonl`, "
                         f"export it with `gptforge export hf`, or use it in `gptforge rl --reward-model`")
    check_weights_fit(where, cfg.model, prefix="policy." if recipe == "ppo" else "")  # shapes bounded by the file first
    model = build_model(cfg.model)
    # model.safetensors only (FSDP checkpoints hold a consolidated copy): never dcp/, whose metadata is
    # a pickle; verified against meta.json's checksum. A PPO checkpoint holds the policy and the value
    # model: the policy is the model.
    ckpt.load_model_weights(model, where, prefix="policy." if recipe == "ppo" else "")
    return model.eval()
