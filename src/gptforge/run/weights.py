"""meta.json's model shape, bounded by the weights file before anything is built.

    >>> check_weights_fit("runs/exp1/checkpoints/step_000300", cfg.model)   # CheckpointError, or nothing

A checkpoint is data: its ``meta.json`` could say ``n_layer`` 10^6 or ``vocab_size`` 2^40 beside a
13 MB ``model.safetensors``, and building that model would allocate until memory runs out. So every
reader of a checkpoint (:func:`gptforge.load.load_model` for sample, serve, eval, export and
``--init-from``; the :class:`~gptforge.run.checkpointer.Checkpointer` on resume) first reads the
safetensors JSON header (names and shapes; no tensor is loaded, and the header itself is checked
against the file's size), then compares it with the model the config describes: one block of it is
built on PyTorch's ``meta`` device (shapes only, no memory) and repeated ``n_layer`` times, once the
file is known to hold that many layers, so the work is bounded by the file, never by meta.json. A
mismatch is one line naming ``meta.json``, the ``model.*`` field and the tensor.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch

from gptforge.errors import CheckpointError
from gptforge.sizecheck import DTYPE_BYTES, MAX_HEADER_BYTES, weights_header  # noqa: F401 (re-exported)

_LAYER = re.compile(r"\.(\d+)\.")


# where a recipe's checkpoint keeps the language model among its tensors (the rest: a score or value head)
MODEL_PREFIX = {"rm": "body.", "ppo": "policy."}


def check_weights_fit(ckpt_dir: str | Path, model_cfg: Any, prefix: str | None = None) -> None:
    """Raise CheckpointError (naming meta.json, the ``model.*`` field and the tensor) unless the model
    ``model_cfg`` describes has exactly the tensors of ``ckpt_dir/model.safetensors``, by name and
    shape (a tied output head may be absent). Allocates nothing of the model's size. A checkpoint
    without ``model.safetensors`` (old sharded-only ones) is left to its loader, which names it.
    ``prefix``: the model's tensors are those under it (None: by the checkpoint's recipe, MODEL_PREFIX)."""
    from gptforge.models.registry import at_layers, build_model
    from gptforge.run.checkpoint import TIED, verify_checkpoint

    ckpt_dir = Path(ckpt_dir)
    path, meta = ckpt_dir / "model.safetensors", ckpt_dir / "meta.json"
    if not path.is_file():
        return
    verify_checkpoint(ckpt_dir, only=("model.safetensors",))  # a damaged file is named as such first
    found = weights_header(path)
    from gptforge.run.checkpoint import read_meta

    if read_meta(ckpt_dir, ()).get("lora"):  # adapters only (a LoRA run): checked as they load onto the base
        check_model_record(ckpt_dir)
        return
    if prefix is None:
        prefix = MODEL_PREFIX.get(str(read_meta(ckpt_dir).get("recipe")), "")
    if prefix:
        found = {k[len(prefix):]: v for k, v in found.items() if k.startswith(prefix)}
    layers = {int(m.group(1)) for k in found if (m := _LAYER.search(k))}
    hint = ("Resume with the checkpoint's own model config (drop --model.* overrides); if nothing was "
            "overridden, its meta.json is damaged or belongs to other weights")
    n_layer = model_cfg.n_layer
    if not layers or n_layer != max(layers) + 1 or layers != set(range(n_layer)):  # before any module is built
        raise CheckpointError(f"{meta}: model.n_layer={n_layer} does not fit the weights (shapes differ): {path} "
                              f"holds {max(layers) + 1 if layers else 0} layers. {hint}")
    with torch.device("meta"):  # shapes only, no memory; one block, repeated below: cost independent of n_layer
        sd = build_model(at_layers(model_cfg, 1)).state_dict(keep_vars=True)
    tied = TIED in sd and any(k != TIED and v is sd[TIED] for k, v in sd.items())
    if tied and TIED in found:
        raise CheckpointError(f"{meta}: the model it describes ties {TIED} to its input embedding, but {path} holds "
                              f"a separate {TIED} (model.tie_embeddings). {hint}")
    sd = {k: v for k, v in sd.items() if not (tied and k == TIED)}
    per_layer = [k for k in sd if _LAYER.search(k)]
    if len(found) != len(sd) - len(per_layer) + n_layer * len(per_layer):
        raise CheckpointError(f"{meta}: model.n_layer={n_layer} with {len(per_layer)} tensors per layer does not fit "
                              f"the {len(found)} tensors of {path} (shapes differ). {hint}")
    want = {k: tuple(v.shape) for k, v in sd.items() if k not in per_layer}
    for i in range(n_layer):  # as many entries as the file holds (counted above)
        want.update({_LAYER.sub(f".{i}.", k, count=1): tuple(sd[k].shape) for k in per_layer})
    for name, shape in want.items():
        got = found.get(name)
        if got is None:
            if name == TIED:
                continue
            raise CheckpointError(f"{meta}: the model it describes has {name}, which {path} does not hold "
                                  f"(shapes differ). {hint}")
        if got != shape:
            raise CheckpointError(f"{meta}: {_field(model_cfg, shape, got)} does not fit the weights (shapes differ): "
                                  f"{path} holds {name} as {got}, the config needs {shape}. {hint}")
    extra = sorted(set(found) - set(want))
    if extra:
        raise CheckpointError(f"{meta}: {path} holds {extra[0]} (and {len(extra) - 1} more), which the model it "
                              f"describes does not have (shapes differ). {hint}")
    check_model_record(ckpt_dir)  # the shapes fit: what they do not show (heads, rope, norms, template) next


_ABSENT = object()


def check_model_record(ckpt_dir: str | Path) -> None:
    """meta.json's model (config.model less the run knobs, and the chat template) against the copy the save
    wrote into model.safetensors' header (:func:`gptforge.run.checkpoint.model_record`): CheckpointError naming
    meta.json, the first field that differs, both values and what to do. meta.json is the one file of a
    checkpoint its own checksums cannot cover; an edit or a flipped bit there that keeps every shape (n_head,
    rope_theta, norm_eps, a chat template's ids) built another model over the same weights without a word.
    A checkpoint saved before the record was written (no header entry) is not compared."""
    from gptforge.run.checkpoint import MODEL_RECORD, model_record, read_meta_json
    from gptforge.sizecheck import header_metadata

    ckpt_dir = Path(ckpt_dir)
    path, meta_path = ckpt_dir / "model.safetensors", ckpt_dir / "meta.json"
    raw = header_metadata(path).get(MODEL_RECORD)
    if raw is None:
        return
    try:
        saved = json.loads(raw)
    except json.JSONDecodeError:
        saved = None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise CheckpointError(f"{path}: its header's {MODEL_RECORD} record is not the model it was saved as; the "
                              "checkpoint is damaged (resume or load another one)")
    now = model_record(read_meta_json(ckpt_dir)) or {"model": {}, "chat_template": None}
    if "lora" not in saved:  # saved before adapters' settings were recorded: not compared
        now.pop("lora", None)
    field, was, is_ = _first_difference(saved, now)
    if field is None:
        return
    field = f"config.{field}" if field.startswith(("model.", "lora.")) else field
    shown = "missing" if is_ is _ABSENT else f"= {json.dumps(is_)[:60]}"
    saved_as = "nothing" if was is _ABSENT else json.dumps(was)[:60]
    raise CheckpointError(
        f"{meta_path}: {field} {shown}, but {path} was saved with {saved_as} (its header records the model it "
        f"holds); meta.json was edited or is damaged: put back {saved_as}, or use another checkpoint (a setting is "
        "changed on the command line, --model.KEY VALUE, not in meta.json)")


def _first_difference(a: Any, b: Any, at: str = "") -> tuple[str | None, Any, Any]:
    """(dotted path, value in a, value in b) of the first place two JSON values differ, or (None, ...)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            found = _first_difference(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{at}.{k}" if at else k)
            if found[0] is not None:
                return found
        return None, None, None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{at}[{i}]")
            if found[0] is not None:
                return found
        return None, None, None
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    # 1 and 1.0 are one number; true and 1, "1" and 1 are another type, another value
    same = a is b or ((type(a) is type(b) or (number(a) and number(b))) and a == b)
    return (None, None, None) if same else (at, a, b)


def _field(model_cfg: Any, want: tuple[int, ...], got: tuple[int, ...]) -> str:
    """The ``model.*`` setting behind a wrong dimension: the first integer field (or the padded vocabulary)
    whose value is the dimension the config asks for where the weights differ."""
    dims = [w for i, w in enumerate(want) if i >= len(got) or got[i] != w] or list(want)
    values = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)
              if isinstance(getattr(model_cfg, f.name), int) and not isinstance(getattr(model_cfg, f.name), bool)}
    for d in dims:
        for name, v in values.items():
            if v == d:
                return f"model.{name}={v}"
        if getattr(model_cfg, "padded_vocab_size", None) == d:
            return f"model.vocab_size={model_cfg.vocab_size}"
    return "the model shape"
