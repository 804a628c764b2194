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

from gptforge.errors import CheckpointError
from gptforge.interop.hf_tokenizer import (  # noqa: F401 (re-exported: the tokenizer files' home is hf_tokenizer)
    gpt2_ranks,
    ranks_to_vocab_merges,
    tokenizer_json_of,
    write_generation_config,
    write_hf_tokenizer,
    write_model_tokenizer,
    write_tokenizer,
)
from gptforge.models.registry import FAMILIES
from gptforge.numbers import MAX_DIM  # past it a config is damaged, not big
from gptforge.reading import read_json
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


# Hugging Face ``config.json`` model_type -> the gptforge model family that implements it, from the
# registry (Family.hf_model_type). Anything else is refused by name instead of loading as a randomly
# initialised GPT-2; a family registered with hf_model_type="llama" plugs in with no change here.
HF_MODEL_TYPES: dict[str, str] = {t: f.name for f in FAMILIES.values() if f.hf_model_type
                                  for t in (f.hf_model_type, *f.hf_also)}


class HFModelError(CheckpointError):
    """A Hugging Face directory/model gptforge cannot load faithfully; the message names what was found."""


def _transformers():
    """transformers, or one line naming the extra (every hub-name load starts here)."""
    from gptforge.extras import require

    return require("transformers", extra="hf", for_what="loading Hugging Face weights from the hub (--hf NAME)")


def peft_adapters(folder: Path) -> str | None:
    """The refusal for a peft adapter folder (``adapter_config.json``, no ``config.json``) given as a model, or
    None: it was "no config.json" (sample, import) or "holds no complete checkpoint" (--init-from), never what
    it is. gptforge puts LoRA adapters on from its own runs only (their base fingerprinted)."""
    cfg = folder / "adapter_config.json"
    if not cfg.is_file() or (folder / "config.json").exists():
        return None
    try:
        base = read_json(cfg, ValueError, "adapter_config.json").get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    on = f" for the base {base!r}" if isinstance(base, str) and base else ""
    return (f"{folder}: a peft LoRA adapter folder (adapter_config.json{on}), not a model; gptforge loads adapters "
            "from its own LoRA runs (--ckpt RUN) only: merge these into their base with peft "
            "(PeftModel.from_pretrained(base, dir).merge_and_unload().save_pretrained(out)) and give that folder")


def hf_model_type(name_or_dir: str) -> str:
    """``model_type`` from a local directory's config.json, or the hub config of a model name. Only a hub name
    needs transformers (a local directory is read with safetensors alone, as the loaders read it)."""
    local = Path(name_or_dir)
    if local.exists() and not local.is_dir():  # transformers would take a file as its config (or weights: a pickle)
        raise HFModelError(f"{local}: a file, not a directory; give the directory save_pretrained() wrote (its "
                           "config.json and model.safetensors), or a hub name")
    if not local.is_dir() and (local.is_symlink() or name_or_dir.startswith(("/", ".", "~")) or
                               name_or_dir.count("/") > 1 or "\\" in name_or_dir):  # a path, never a hub name
        raise FileNotFoundError(f"{name_or_dir}: no such directory (a local path; a hub name is NAME or ORG/NAME)")
    if local.is_dir():
        cfg_path = local / "config.json"
        if not cfg_path.is_file():
            adapters = peft_adapters(local)
            if adapters:
                raise HFModelError(adapters)
            raise FileNotFoundError(f"{local}: no config.json; give a directory written by save_pretrained()")
        cfg = read_hf_json(cfg_path)
        if not isinstance(cfg.get("model_type"), str):
            raise HFModelError(f"{cfg_path}: no 'model_type' string; is this a Hugging Face model directory?")
        return cfg["model_type"]
    tf = _transformers()  # a hub name: before anything is fetched, a missing package is one line naming the extra
    try:
        return tf.AutoConfig.from_pretrained(name_or_dir).model_type
    except (OSError, ValueError) as e:  # one line: transformers' own message runs over several
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise FileNotFoundError(f"could not load Hugging Face model {name_or_dir!r}: {first.strip()}; give a hub "
                                "name (needs network) or a directory written by save_pretrained()") from e


def hf_family(name_or_dir: str) -> str:
    """The gptforge family that loads this Hugging Face model, or HFModelError naming its model_type."""
    model_type = hf_model_type(name_or_dir)
    if model_type not in HF_MODEL_TYPES:
        raise HFModelError(
            f"{name_or_dir}: config.json model_type {model_type!r} is not a model family gptforge implements "
            f"(it loads {', '.join(sorted(HF_MODEL_TYPES))}); refusing rather than sampling from random weights"
        )
    return HF_MODEL_TYPES[model_type]


# transformers' activation names that compute GPT-2's tanh GELU (nn.GELU(approximate="tanh")) exactly
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate", "gelu_python_tanh")
GPT2_REQUIRED = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
# what transformers' GPT2Config makes of a size config.json leaves out (the weights' shapes are then checked against
# it, so a file of other sizes is refused naming them, never loaded partly random as transformers would)
GPT2_DEFAULTS = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)


def _refuse(where: str, key: str, value, why: str) -> HFModelError:
    return HFModelError(f"{where}: Hugging Face config {key}={value!r}: {why}; gptforge's GPT-2 does not "
                        "implement it and will not load the model wrong")


def gpt2_config_from_hf(c: dict, where: str = "config.json") -> dict:
    """The sizes of a HF ``GPT2Config`` dict (n_layer, n_head, n_embd, n_positions, vocab_size, untied),
    refusing by name every field that changes the function in a way gptforge's GPT-2 does not compute."""
    if c.get("model_type") != "gpt2":
        raise HFModelError(f"{where}: model_type={c.get('model_type')!r}; the GPT-2 loader reads 'gpt2' only")
    c = {**GPT2_DEFAULTS, **c}  # a size left out is GPT2Config's; a null one is refused below, as transformers does
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


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the dtypes a weight may be stored in


def read_hf_json(path: Path) -> dict:
    """A Hugging Face directory's config.json or weight index (bounded, one line naming the file)."""
    return read_json(path, HFModelError, f"Hugging Face {path.name}")


def safetensors_files(d: Path) -> list[Path]:
    """The weight files of a save_pretrained directory: safetensors only, never a pickle."""
    if (d / "model.safetensors").is_file():
        return [d / "model.safetensors"]
    for f in (d / "model.safetensors", d / "model.safetensors.index.json"):  # there, but not a file: said so, not "no"
        if f.exists() or f.is_symlink():
            if not f.is_file():
                from gptforge.reading import not_a_file

                raise HFModelError(f"{f} is {not_a_file(f)}; a Hugging Face folder holds its weights there as a file")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        wm = read_hf_json(index).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) and "/" not in v and "\\" not in v
                                               and v not in ("", ".", "..") for v in wm.values()):
            raise HFModelError(f"{index}: expected a 'weight_map' of weight name -> file name in this directory")
        files = [d / f for f in sorted(set(wm.values()))]
        gone = [f.name for f in files if not (f.exists() or f.is_symlink())]
        if gone:  # was "[Errno 2] No such file or directory" from the header reader, the index unnamed
            raise HFModelError(f"{index} names {len(gone)} weight file(s) this directory lacks ({', '.join(gone[:3])}"
                               f"{' ...' if len(gone) > 3 else ''}): an incomplete download or copy; fetch them again")
        return files
    pickles = sorted(p.name for p in d.glob("*.bin")) + sorted(p.name for p in d.glob("*.pt*"))
    raise HFModelError(f"{d}: no model.safetensors (or model.safetensors.index.json)"
                       + (f", only {', '.join(pickles)}" if pickles else "")
                       + "; gptforge reads Hugging Face weights from safetensors only, never a pickle "
                       "(convert with transformers: from_pretrained(...).save_pretrained(dir))")


def _gpt2_name(k: str) -> str:
    return k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k  # base GPT2Model files


def read_safetensors(files: list[Path], expected: dict[str, tuple[int, ...]], optional: tuple[str, ...] = (),
                     ignored: tuple[str, ...] = IGNORED_SUFFIXES, rename=_gpt2_name,
                     family: str = "GPT-2") -> dict[str, torch.Tensor]:
    """Check every tensor's shape against ``expected`` (names after ``rename``; ``optional`` ones may
    be absent) from the files' headers, before any tensor is read, then read them. Anything missing,
    unexpected or mis-shaped is one HFModelError naming it: a config whose sizes disagree with its
    weights never builds a model, however large it claims to be."""
    from safetensors import SafetensorError, safe_open

    handles, shapes, dtypes = {}, {}, {}
    try:
        for f in files:
            h = safe_open(str(f), framework="pt")
            for k in h.keys():
                if rename(k) in handles:  # in two shards, or as both h.0.* and transformer.h.0.*: the later won silently
                    g, was = dtypes[rename(k)][0], handles[rename(k)][1]
                    raise HFModelError(f"{f}: tensor {k} is there and {'in ' + str(g) if g != f else 'in the same file'} "
                                       f"(as {was}); refusing to pick one of two copies of a weight")
                handles[rename(k)] = (h, k)
                shapes[rename(k)] = tuple(h.get_slice(k).get_shape())
                dtypes[rename(k)] = (f, h.get_slice(k).get_dtype())
    except (OSError, SafetensorError) as e:
        raise HFModelError(f"{f}: not a readable safetensors file ({e})") from None
    names = [k for k in shapes if not k.endswith(ignored)]
    # a weight is a float: integer or bool tensors were cast into the float model without a word
    not_float = [(k, *dtypes[k]) for k in names if dtypes[k][1] not in FLOAT_DTYPES]
    if not_float:
        k, f, dtype = not_float[0]
        raise HFModelError(f"{f}: tensor {k} is {dtype}; {family} weights are floats ({', '.join(FLOAT_DTYPES)}), "
                           "refusing to cast integers into them")
    missing = [k for k in expected if k not in shapes and k not in optional]
    unexpected = [k for k in names if k not in expected]
    wrong = [f"{k} {shapes[k]} (config says {expected[k]})" for k in names if k in expected and shapes[k] != expected[k]]
    if missing or unexpected or wrong:
        found = "; ".join(f"{what} {v[:3]}{' ...' if len(v) > 3 else ''}" for what, v in
                          (("missing", missing), ("unexpected", unexpected), ("mis-shaped", wrong)) if v)
        raise HFModelError(f"{files[0].parent}: the weights do not fit {family} as config.json sizes it ({found}); "
                           "refusing a partly random model")
    out = {name: h.get_tensor(k) for name, (h, k) in handles.items() if not name.endswith(ignored)}
    for name, t in out.items():  # as the GGUF reader refuses them: a NaN weight samples garbage without a word
        if not torch.isfinite(t).all():
            raise HFModelError(f"{dtypes[name][0]}: tensor {name} holds NaN or infinite values; refusing a broken model")
    return out


def _hub_state_dict(name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) of a hub model: transformers downloads, safetensors only."""
    tf = _transformers()
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
        sd = read_safetensors(files, gpt2_shapes(cfg) | head, optional=() if cfg["untied"] else ("lm_head.weight",))
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


def pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w`` with zero rows added up to ``rows`` (the padded vocabulary): every importer's embedding and head."""
    if w.size(0) >= rows:
        return w
    pad = torch.zeros(rows - w.size(0), w.size(1), dtype=w.dtype)
    return torch.cat([w, pad], dim=0)


# ----------------------------------------------------------------------------- export


def check_out_dir(out: str | Path, force: bool) -> Path:
    """Refuse to write into a non-empty directory unless ``force`` (exports overwrite file names)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--out {out} is not empty; choose an empty directory or pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    return out


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
    GPT2Config, GPT2LMHeadModel = _transformers().GPT2Config, _transformers().GPT2LMHeadModel

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

