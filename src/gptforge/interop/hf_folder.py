"""The Hugging Face folder, whichever family is in it: what every family's importer and exporter shares.
Reading: which family a folder (or hub name) holds (``config.json``'s ``model_type``), its JSON files
bounded, its safetensors weights (never a pickle) checked against the shapes a config promises before any
is read. Writing: the output folder refused when it holds files, the padded vocabulary's rows. The families
themselves are ``hf.py`` (GPT-2) and ``hf_llama.py`` (the Llama family); their tokenizer files are
``hf_tokenizer.py``'s.

    gptforge import hf --model ./my-llama-dir --out runs/imported
"""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.errors import CheckpointError
from gptforge.models.registry import FAMILIES
from gptforge.reading import read_json

# Hugging Face ``config.json`` model_type -> the gptforge model family that implements it, from the
# registry (Family.hf_model_type). Anything else is refused by name instead of loading as a randomly
# initialised GPT-2; a family registered with hf_model_type="llama" plugs in with no change here.
HF_MODEL_TYPES: dict[str, str] = {t: f.name for f in FAMILIES.values() if f.hf_model_type
                                  for t in (f.hf_model_type, *f.hf_also)}


class HFModelError(CheckpointError):
    """A Hugging Face directory/model gptforge cannot load faithfully; the message names what was found."""


def require_transformers():
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
    tf = require_transformers()  # a hub name: before anything is fetched, a missing package is one line naming the extra
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


def read_safetensors(files: list[Path], expected: dict[str, tuple[int, ...]], optional: tuple[str, ...] = (), *,
                     ignored: tuple[str, ...], rename, family: str) -> dict[str, torch.Tensor]:
    """Check every tensor's shape against ``expected`` (names after ``rename``; ``optional`` ones may
    be absent) from the files' headers, before any tensor is read, then read them. Anything missing,
    unexpected or mis-shaped is one HFModelError naming it: a config whose sizes disagree with its
    weights never builds a model, however large it claims to be."""
    from safetensors import SafetensorError

    from gptforge.storage.tensors import open_safetensors

    handles, shapes, dtypes = {}, {}, {}
    try:
        for f in files:
            h = open_safetensors(f)  # any path: safe_open takes UTF-8 text only
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


def pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w`` with zero rows added up to ``rows`` (the padded vocabulary): every importer's embedding and head."""
    if w.size(0) >= rows:
        return w
    pad = torch.zeros(rows - w.size(0), w.size(1), dtype=w.dtype)
    return torch.cat([w, pad], dim=0)



def check_out_dir(out: str | Path, force: bool) -> Path:
    """Refuse to write into a non-empty directory unless ``force`` (exports overwrite file names)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--out {out} is not empty; choose an empty directory or pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    return out
