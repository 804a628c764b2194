"""Model families: one readable file each (``gpt2.py``, ...), found here by name.

    >>> from gptforge.models.registry import build_model, model_config
    >>> model = build_model(model_config({"arch": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64}))

A family is a config dataclass (whose first field is ``arch``, the family's name; with a
``from_size(name, **overrides)`` classmethod over the module's ``SIZES`` table, and ``__post_init__``
raising ValueError naming a bad ``model.*`` key) and an ``nn.Module`` built from it. Commands never import a family's module: they go through this registry,
so adding ``models/llama.py`` means adding one :class:`Family` entry and touches no command code.

A family module also counts its model from the config alone (no tensors; ``models/counting.py``):
``counts(cfg, seq_len) -> Counts`` (parameters, FLOPs per token) and ``layer_act_bytes(cfg, dtype,
recompute)`` (what autograd keeps per token per block). MFU, ``gptforge plan`` and the benchmarks use
them through :func:`counts`, :func:`flops_per_token` and :func:`layer_act_bytes` here.

What every family's model provides (the code outside ``models/`` relies on exactly this):

* ``model.config``: the config, with ``n_layer``, ``n_head``, ``n_embd``, ``block_size``,
  ``vocab_size``, ``padded_vocab_size``, ``recompute`` and ``dropout``;
* ``forward(idx, targets=None, kv_cache=None, pos=None, attn_mask=None) -> (logits, loss)``: logits
  over the real vocabulary, mean cross-entropy with targets of -1 ignored; ``pos`` (B, T) and
  ``attn_mask`` (B, 1, T, Tk) bool for left-padded batches (see :mod:`gptforge.generation`);
* ``hidden_states(idx, kv_cache=None, pos=None, attn_mask=None) -> (B, T, n_embd)``: the final
  hidden states, after the last norm and before the LM head (reward models and value heads read them);
* ``new_kv_cache(batch, max_len=None, dtype=None)``, an object with ``length``;
* ``num_parameters(exclude_embeddings=False)``;
* ``blocks``: the ``nn.ModuleList`` of transformer blocks (FSDP shards and recomputes per block).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

import torch.nn as nn


@dataclass(frozen=True)
class Family:
    name: str  # the config's ``arch`` value
    module: str  # where the family lives
    config_class: str  # dataclass in ``module``
    model_class: str  # nn.Module in ``module``
    hf_model_type: str | None  # Hugging Face config.json ``model_type`` it maps to (None: no HF interop)
    llmc: bool  # llm.c model files can hold it
    sizes: str = "SIZES"  # name -> shape table in ``module`` (for ``--random SIZE`` and presets)
    hf_also: tuple[str, ...] = ()  # other model_types the family loads (a variant its config expresses)

    def _get(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.module), attr)

    @property
    def config_cls(self) -> type:
        return self._get(self.config_class)

    @property
    def model_cls(self) -> type[nn.Module]:
        return self._get(self.model_class)

    def size_names(self) -> list[str]:
        return list(self._get(self.sizes))

    def count(self, what: str) -> Any:
        """The family's counting function ``what``: ``counts`` or ``layer_act_bytes``."""
        return self._get(what)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


register(Family("gpt2", "gptforge.models.gpt2", "GPTConfig", "GPT", hf_model_type="gpt2", llmc=True))
register(Family("llama", "gptforge.models.llama", "LlamaConfig", "Llama", hf_model_type="llama", llmc=False,
                hf_also=("qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "granite",
                                                                                 "olmo2")))
# Qwen2: a Llama with q/k/v biases (model.qkv_bias); the others are Llama with the fields interop/hf_families.py sets


def get_family(arch: str) -> Family:
    if not isinstance(arch, str) or arch not in FAMILIES:  # a saved config's JSON may hold a list here
        raise ValueError(f"model.arch={arch!r} is not a known model family; known: {', '.join(FAMILIES)}")
    return FAMILIES[arch]


def family_of(model_cfg: Any) -> Family:
    return get_family(model_cfg.arch)


def model_config(values: dict[str, Any] | None = None) -> Any:
    """A family's config from a dict (a checkpoint's ``config["model"]``); ``arch`` picks the family
    (default gpt2, which older checkpoints without the key are)."""
    values = dict(values or {})
    fam = get_family(values.pop("arch", "gpt2"))
    known = {f.name for f in dataclasses.fields(fam.config_cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown key(s) in section 'model' for model.arch={fam.name}: {sorted(unknown)}")
    from gptforge.errors import saved_field_types

    saved_field_types("model", fam.config_cls, values)  # a saved config's JSON types, before its checks run
    return fam.config_cls(**values)


def switch_family(model_cfg: Any, arch: str) -> Any:
    """``model_cfg`` as family ``arch``'s config, carrying over the fields both families have
    (so ``--model.arch llama`` on a d4 preset gives a d4-shaped Llama)."""
    fam = get_family(arch)
    if model_cfg.arch == arch:
        return model_cfg
    target = {f.name for f in dataclasses.fields(fam.config_cls)} - {"arch"}
    carried = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg) if f.name in target}
    return fam.config_cls(**carried)


def size_config(size: str, **overrides: Any) -> Any:
    """The config of a named size (``d2``, ``gpt2``, ``llama-tiny``, ...) from whichever family has it."""
    for fam in FAMILIES.values():
        if size in fam.size_names():
            return fam.config_cls.from_size(size, **overrides)
    raise ValueError(f"unknown model size {size!r}; known: {', '.join(all_sizes())}")


def all_sizes() -> list[str]:
    return [s for fam in FAMILIES.values() for s in fam.size_names()]


def at_layers(cfg, k: int):
    """``cfg`` with ``k`` blocks, for the shape checks that build a model of 1 or 2 blocks (the closed-form
    size check, :func:`gptforge.sizecheck.layered_elements`; a checkpoint's tensors against its config,
    ``run/weights.py``): a per-layer table (``layer_types``) is cut to ``k`` letters, all
    ``s``, or the config would refuse itself for its length. Sound for mixed layers: a sliding and a full
    layer hold the same tensors (the window is a mask, the local rope base a buffer-free angle), so the
    elements per layer, and the total, do not depend on the letters; ``s`` keeps a sliding layer, which
    ``rope_local_theta`` needs. A config with no such field (GPT-2's) only gets ``n_layer``."""
    if getattr(cfg, "layer_types", ""):
        return dataclasses.replace(cfg, n_layer=k, layer_types="s" * k)
    return dataclasses.replace(cfg, n_layer=k)


def build_model(model_cfg: Any) -> nn.Module:
    """A freshly initialised model of the family ``model_cfg.arch`` names, after its float32 parameters
    are checked against the memory this machine has free: a size nobody bounded (``--random gpt3-175b``,
    a typo'd ``--model.n_layer``) is one line, not the kernel's OOM killer an hour into an allocation.
    Every command builds its models here, so each inherits the check."""
    import torch

    if torch.get_default_device().type == "meta":  # shapes only (`with torch.device("meta")`): nothing allocated
        with _skip_init_on_meta():
            return family_of(model_cfg).model_cls(model_cfg)
    check_memory(model_cfg)
    return family_of(model_cfg).model_cls(model_cfg)


_INIT_OPS = frozenset({"normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_", "trunc_normal_",
                       "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_"})


def _skip_init_on_meta():
    """A torch function mode under which initialising a meta tensor does nothing, as it would anyway (a
    meta tensor holds no values). The point is time: torch runs meta ``normal_`` through a Python
    decomposition whose first use imports ``torch._dynamo``, 1.4 s of CPU in every command that loads
    a model (they build it on meta first)."""
    import torch

    class SkipInitOnMeta(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") in _INIT_OPS:
                t = args[0] if args else kwargs.get("tensor")
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    return t
            return func(*args, **kwargs)

    return SkipInitOnMeta()


def check_memory(model_cfg: Any, bytes_per_param: int = 4) -> None:
    """ResourceError when the parameters alone (float32, the dtype models are built in) exceed the
    memory free now (:func:`gptforge.resources.free_memory`: MemAvailable under any cgroup limit; elsewhere no
    check)."""
    from gptforge import resources
    from gptforge.errors import ResourceError

    need = counts(model_cfg).params * bytes_per_param
    free = resources.free_memory()
    if free is not None and need > free.bytes:
        raise ResourceError(f"model.{model_cfg.arch} with n_layer={model_cfg.n_layer}, n_embd={model_cfg.n_embd} has "
                            f"{counts(model_cfg).params / 1e9:,.1f}B parameters: {need / 2**30:,.1f} GiB in float32 "
                            f"before any activation, and {free}. Use a smaller model, or `gptforge plan` to size it "
                            "for many GPUs")


def counts(model_cfg: Any, seq_len: int | None = None) -> Any:
    """The :class:`~gptforge.models.counting.Counts` of ``model_cfg`` at ``seq_len`` (default: its block size)."""
    return family_of(model_cfg).count("counts")(model_cfg, seq_len or model_cfg.block_size)


def flops_per_token(model_cfg: Any, seq_len: int, formula: str = "llmc", n_params: int | None = None) -> float:
    """Training FLOPs per token by ``formula`` (``llmc`` or ``palm``; see ``models/counting.py``)."""
    from gptforge.models.counting import flops_per_token as count

    return count(counts(model_cfg, seq_len), formula, n_params)


def layer_act_bytes(model_cfg: Any, dtype: str, recompute: str) -> float:
    """Bytes autograd keeps per token per block for ``dtype`` (float32 or bfloat16) and ``recompute``."""
    return family_of(model_cfg).count("layer_act_bytes")(model_cfg, dtype, recompute)
