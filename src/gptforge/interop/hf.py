"""Hugging Face GPT-2 <-> gptforge weights: an explicit key map plus the Conv1D transposes, and an
exporter that writes a directory ``transformers.GPT2LMHeadModel.from_pretrained`` loads.

    >>> from gptforge.interop.hf import load_hf
    >>> model = load_hf("gpt2")            # online, hub name
    >>> model = load_hf("./my-gpt2-dir")   # offline, a save_pretrained directory

    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/shakespeare-hf

The export needs no ``transformers``: weights go to ``model.safetensors`` (padded vocabulary sliced
back to 50,257 rows, tied ``lm_head`` stored once), ``config.json`` is written by hand, and the
tokenizer files (``vocab.json`` + ``merges.txt``) are derived offline from the tiktoken ranks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from gptforge.interop.hf_folder import (
    HFModelError,
    check_out_dir,
    hf_family,
    pad_rows,
    read_hf_json,
    read_safetensors,
    require_transformers,
    safetensors_files,
)
from gptforge.interop.hf_tokenizer import write_tokenizer
from gptforge.numbers import MAX_DIM  # past it a config is damaged, not big
from gptforge.sizecheck import (
    check_model_size,
    count_layers,
    elements,
    layered_elements,
    safetensors_shapes,
)
from gptforge.tokens import EOT

# HF GPT-2 uses Conv1D (weight shape (in, out)); we use nn.Linear (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers HF keeps in some versions that are not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


# transformers' activation names that compute GPT-2's tanh GELU (nn.GELU(approximate="tanh")) exactly
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate", "gelu_python_tanh")
GPT2_REQUIRED = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
# what transformers' GPT2Config makes of a size config.json leaves out (the weights' shapes are then checked against
# it, so a file of other sizes is refused naming them, never loaded partly random as transformers would)
GPT2_DEFAULTS = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)


# every key of a GPT-2 config.json, accounted for (as interop/hf_keys.py does for the Llama families): read by
# gpt2_config_from_hf, inert (its INERT, and GPT-2's own below), or refused by name (check_gpt2_keys)
GPT2_READ = GPT2_REQUIRED + ("model_type", "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
                             "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention", "n_inner",
                             "reorder_and_upcast_attn")
GPT2_ALIASES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
                "num_hidden_layers": "n_layer"}  # GPT2Config's attribute_map: another name for the same size
GPT2_INERT = ("n_ctx",  # the old configs' copy of n_positions, read by no transformers model
              "attn_pdrop", "embd_pdrop", "resid_pdrop",  # dropout
              "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
              "summary_first_dropout",  # GPT2DoubleHeadsModel's classifier head, no part of the LM
              "n_special", "predict_special_tokens", "_num_labels", "output_past", "gradient_checkpointing")


def check_gpt2_keys(c: dict, where: str) -> dict:
    """``c`` with GPT2Config's aliases under their own names, after refusing by name a key neither read nor inert
    (a field gptforge has not accounted for may change the function), or an alias that disagrees with its name."""
    from gptforge.interop.hf_keys import INERT, INERT_AT

    known = set(GPT2_READ) | set(GPT2_INERT) | set(INERT)
    for key, value in c.items():
        if key in GPT2_ALIASES:
            own = GPT2_ALIASES[key]
            if own in c and c[own] != value:
                raise HFModelError(f"{where}: Hugging Face config {key}={value!r} and {own}={c[own]!r}: two values "
                                   "for one size")
        elif not (key in known or key in INERT_AT and value == INERT_AT[key]):
            raise HFModelError(f"{where}: Hugging Face config {key}={value!r}: a key gptforge does not read for "
                               "model_type gpt2 and does not know to leave the model unchanged; it may change what "
                               "the model computes, so gptforge will not load it (if it is only a note, remove it "
                               "from config.json)")
    return {**{own: c[alias] for alias, own in GPT2_ALIASES.items() if alias in c}, **c}


def _refuse(where: str, key: str, value, why: str) -> HFModelError:
    return HFModelError(f"{where}: Hugging Face config {key}={value!r}: {why}; gptforge's GPT-2 does not "
                        "implement it and will not load the model wrong")


def gpt2_config_from_hf(c: dict, where: str = "config.json") -> dict:
    """The sizes of a HF ``GPT2Config`` dict (n_layer, n_head, n_embd, n_positions, vocab_size, untied),
    refusing by name every field that changes the function in a way gptforge's GPT-2 does not compute."""
    if c.get("model_type") != "gpt2":
        raise HFModelError(f"{where}: model_type={c.get('model_type')!r}; the GPT-2 loader reads 'gpt2' only")
    c = {**GPT2_DEFAULTS, **check_gpt2_keys(c, where)}  # a size left out is GPT2Config's; a null one is refused below, as transformers does
    bad = [k for k in GPT2_REQUIRED
           if isinstance(c.get(k), bool) or not isinstance(c.get(k), int) or not 0 < c[k] <= MAX_DIM]
    if bad:
        raise HFModelError(f"{where}: {', '.join(f'{k}={c.get(k)!r}' for k in bad)}: expected a positive integer "
                           f"up to {MAX_DIM}; is this a GPT2LMHeadModel config?")
    if c["n_embd"] % c["n_head"]:
        raise _refuse(where, "n_head", c["n_head"], f"heads must split n_embd={c['n_embd']} evenly")
    act = c.get("activation_function", "gelu_new")
    if act not in TANH_GELU:
        raise _refuse(where, "activation_function", act, "the MLP uses the tanh GELU (gelu_new)")
    eps = c.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not abs(eps - 1e-5) <= 1e-12:  # NaN too
        raise _refuse(where, "layer_norm_epsilon", eps, "LayerNorm uses eps 1e-5")
    if not isinstance(c.get("tie_word_embeddings", True), bool):  # "no" would load tied, as transformers reads it
        raise HFModelError(f"{where}: Hugging Face config tie_word_embeddings={c['tie_word_embeddings']!r}: expected "
                           "true or false")
    if c.get("scale_attn_weights", True) is not True:
        raise _refuse(where, "scale_attn_weights", c["scale_attn_weights"], "attention scores are scaled by 1/sqrt(head size)")
    if c.get("scale_attn_by_inverse_layer_idx", False):
        raise _refuse(where, "scale_attn_by_inverse_layer_idx", True, "attention scores are not scaled by layer")
    if c.get("add_cross_attention", False):
        raise _refuse(where, "add_cross_attention", True, "there is no cross-attention")
    if c.get("n_inner") not in (None, 4 * c["n_embd"]):
        raise _refuse(where, "n_inner", c["n_inner"], f"the MLP is 4 * n_embd = {4 * c['n_embd']} wide")
    # reorder_and_upcast_attn computes the same function in float32 (gptforge loads float32): accepted
    return {k: c[k] for k in GPT2_REQUIRED} | {"untied": c.get("tie_word_embeddings", True) is False}


def gpt2_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every weight of a HF GPT2LMHeadModel of ``cfg``'s sizes, as HF stores it (Conv1D is (in, out))."""
    C, V = cfg["n_embd"], cfg["vocab_size"]
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (cfg["n_positions"], C),
              "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        shapes |= {h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                   h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                   h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                   h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                   h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)}
    return shapes


def gpt2_elements(cfg: dict) -> int:
    """Elements of a HF GPT2LMHeadModel of ``cfg``'s sizes (tied head once), in closed form: any n_layer
    costs the same."""
    return layered_elements(lambda k: gpt2_shapes(cfg | {"n_layer": k}), cfg["n_layer"])


def _gpt2_name(k: str) -> str:
    return k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k  # base GPT2Model files


def _hub_state_dict(name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) of a hub model: transformers downloads, safetensors only."""
    tf = require_transformers()
    try:
        c = tf.AutoConfig.from_pretrained(name).to_dict()
        cfg = gpt2_config_from_hf(c, where=name)  # refuse before downloading the weights
        check_model_size(name, "its config", gpt2_elements(cfg), None, HFModelError, "GPT-2")
        with _quiet_transformers():
            hf = tf.GPT2LMHeadModel.from_pretrained(name, use_safetensors=True)
    except OSError as e:
        raise FileNotFoundError(
            f"could not load Hugging Face model {name!r}: {e}\n"
            "Give a hub name (needs network) or a directory written by save_pretrained()."
        ) from e
    sd = hf.state_dict()
    if c.get("tie_word_embeddings", True) is not False:
        sd.pop("lm_head.weight", None)
    return c, sd


def load_hf_state_dict(name_or_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Return (sizes, state dict) of a HF GPT-2 model from a hub name or local directory.
    The config is read and judged before any weight (unimplemented fields refused by name), the
    weights' shapes are checked against it from the safetensors header before anything is read,
    and an untied ``lm_head`` is accepted only when it equals the embedding."""
    family = hf_family(name_or_dir)
    if family != "gpt2":
        raise HFModelError(f"{name_or_dir}: a {family} model; the GPT-2 loader cannot read it")
    d = Path(name_or_dir)
    if d.is_dir():
        where = str(d / "config.json")
        cfg = gpt2_config_from_hf(read_hf_json(d / "config.json"), where)
        files = safetensors_files(d)
        found = safetensors_shapes(files, HFModelError)  # before the table below, which has a row per claimed layer
        check_model_size(where, "config.json", gpt2_elements(cfg), elements(found.values()), HFModelError, "GPT-2",
                         layers=(cfg["n_layer"], count_layers(found)))
        head = {"lm_head.weight": (cfg["vocab_size"], cfg["n_embd"])}  # tied: a file may store it anyway
        sd = read_safetensors(files, gpt2_shapes(cfg) | head, optional=() if cfg["untied"] else ("lm_head.weight",),
                              ignored=IGNORED_SUFFIXES, rename=_gpt2_name, family="GPT-2")
    else:
        c, sd = _hub_state_dict(name_or_dir)
        where, cfg = name_or_dir, gpt2_config_from_hf(c, name_or_dir)
    head = sd.pop("lm_head.weight", None)
    if head is not None and cfg["untied"] and not torch.equal(head, sd["transformer.wte.weight"]):
        raise _refuse(where, "tie_word_embeddings", False, "lm_head is its own matrix, not the token embedding")
    return cfg, sd


def load_hf(name_or_dir: str, **overrides):
    """A gptforge GPT with Hugging Face GPT-2 weights (a hub name online, or a local
    ``save_pretrained`` directory offline), in eval mode. ``overrides``: other GPTConfig fields
    (``flash``, ``pad_vocab``, ...). A local directory needs only ``safetensors``."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    hf_cfg, sd_hf = load_hf_state_dict(name_or_dir)
    cfg = GPTConfig(n_layer=hf_cfg["n_layer"], n_head=hf_cfg["n_head"], n_embd=hf_cfg["n_embd"],
                    block_size=hf_cfg["n_positions"], vocab_size=hf_cfg["vocab_size"], **overrides)
    model = GPT(cfg)
    missing, unexpected = model.load_state_dict(hf_to_gptforge(sd_hf, cfg), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to wte
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    return model.eval()


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def hf_to_gptforge(sd_hf: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Map a HF GPT-2 state dict onto gptforge names, transposing Conv1D and padding the vocab."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd_hf.items():
        if k.endswith(IGNORED_SUFFIXES):
            continue
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = pad_rows(v, cfg.padded_vocab_size)
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


# ----------------------------------------------------------------------------- export


def hf_config(cfg) -> dict:
    """config.json for transformers' GPT2LMHeadModel describing a gptforge GPTConfig."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,  # 4 * n_embd
        "activation_function": "gelu_new",  # tanh GELU, as in models/gpt2.py
        "layer_norm_epsilon": 1e-5,  # nn.LayerNorm's default
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "torch_dtype": "float32",
    }


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as config.json's ``torch_dtype`` spells it."""
    return str(dtype).removeprefix("torch.")


def to_transformers(model: torch.nn.Module):
    """A transformers ``GPT2LMHeadModel`` holding ``model``'s (a gptforge GPT's) weights, in memory
    (benchmarks, tests); ``interop.hf_llama.to_transformers`` is the Llama family's."""
    GPT2Config, GPT2LMHeadModel = require_transformers().GPT2Config, require_transformers().GPT2LMHeadModel

    cfg = model.config
    config = {k: v for k, v in hf_config(cfg).items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf = GPT2LMHeadModel(GPT2Config(**config))
    missing, unexpected = hf.load_state_dict(gptforge_to_hf(model.state_dict(), cfg), strict=False)
    if unexpected or not all(k.endswith((".attn.bias", ".attn.masked_bias")) for k in missing):
        raise ValueError(f"weights do not fit transformers' GPT-2: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return hf.eval()


def export_hf(model: torch.nn.Module, out_dir: str | Path, force: bool = False, tokenizer: bool = True,
              chat_template: dict | None = None, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write ``model`` (a gptforge GPT) as a Hugging Face GPT-2 directory. Returns the files written.
    ``chat_template``: a checkpoint's meta.json template; the tokenizer gets its tokens and Jinja.
    ``dtype``: of the weights written (config.json's ``torch_dtype`` says it)."""
    from safetensors.torch import save_file

    from gptforge.interop.hf_chat import check_tokenizer_vocab
    from gptforge.storage import ordinary_file_mode

    cfg = model.config
    if not cfg.bias:
        raise ValueError("Hugging Face GPT-2 has biases in every Linear and LayerNorm; a model.bias=false model "
                         "cannot be exported to GPT2LMHeadModel")
    chat = check_tokenizer_vocab(cfg.vocab_size, chat_template) if tokenizer else None  # before writing
    out = check_out_dir(out_dir, force)
    sd = gptforge_to_hf({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, cfg)
    sd = {k: v.to(dtype).contiguous() for k, v in sd.items()}
    sd.pop("lm_head.weight", None)  # tied to transformer.wte.weight (tie_word_embeddings)
    files = [out / "model.safetensors", out / "config.json"]
    save_file(sd, str(files[0]), metadata={"format": "pt"})
    ordinary_file_mode(files[0])  # safetensors writes 0600; the other files get the umask's mode
    files[1].write_text(json.dumps({**hf_config(cfg), "torch_dtype": dtype_name(dtype)}, indent=2) + "\n")
    if tokenizer:
        files += write_tokenizer(out, chat, model_max_length=cfg.block_size)
    return files

