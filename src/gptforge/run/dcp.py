"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), for runs whose state is sharded.

    torchrun --nproc_per_node 2 -m gptforge train --preset tiny --dist.shard fsdp  # writes step_*/dcp/
    gptforge train --preset tiny --resume                                          # resumes it on 1 process

With ``--dist.shard fsdp`` every rank writes its own shards of the model and optimizer into
``step_XXXXXX.tmp/dcp/`` (keys are fully-qualified parameter names, from
``get_state_dict``); the full weights are also gathered to rank 0 (on the CPU) and written as
``model.safetensors``, so commands that need only weights (sample, eval, export, serve,
``--init-from``) never read ``dcp/``; rank 0 adds ``rng.pt`` and ``meta.json`` (with every file's
sha256) and renames the directory once every rank has finished, so a rank that dies mid-save leaves
only a ``.tmp`` that resume ignores. DCP reshards on load, so the checkpoint resumes at any world
size, with or without FSDP. Loading it unpickles ``dcp/.metadata``, so it happens only with
``--trust-checkpoint`` (``train.trust_checkpoint``). ZeRO-1 runs consolidate the optimizer on rank 0
and write the ordinary single-file checkpoint instead (see :mod:`gptforge.run.checkpoint`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from gptforge.parallel.tensor import dcp_view
from gptforge.run import checkpoint as ckpt
from gptforge.run.identity import require_trust
from gptforge.storage import ordinary_file_mode
from gptforge.storage.faults import tensor_bytes

DCP_DIR = "dcp"


def is_sharded(ckpt_dir: str | Path) -> bool:
    return (Path(ckpt_dir) / DCP_DIR).is_dir()


def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as sd

    return dcp, sd


def save_sharded(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 meta: dict[str, Any], keep: int, is_main: bool,
                 rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> Path | None:
    """Collective: every rank calls it. Returns the final directory on rank 0, None elsewhere."""
    dcp, sd = _dcp()
    tmp = ckpt.ckpt_root(run_dir) / f"{ckpt.CKPT_PREFIX}{step:06d}.tmp"
    if is_main:
        tmp = ckpt.begin_checkpoint(run_dir, step)
    dist.barrier()  # the empty .tmp exists before anyone writes into it
    split = _split_by_stage(model)
    tied = tied_heads(model)  # asked of the live model: after the gather every tensor is a separate copy
    # pipeline stages hold different parameters, so their param groups differ: keyed per parameter
    # name (torchtitan's flattened form) instead of by group index, which DCP would keep one rank's of
    model_sd, optim_sd = sd.get_state_dict(model, optimizer, options=sd.StateDictOptions(
        flatten_optimizer_state_dict=split))
    # the whole model, gathered to rank 0 on the CPU: weights that load without unpickling anything.
    # Pipeline stages each hold some layers: rank 0 reads the whole model back from the DCP files instead
    full = None if split else sd.get_model_state_dict(model, options=sd.StateDictOptions(full_state_dict=True,
                                                                                          cpu_offload=True))
    needed = 2 * tensor_bytes(model_sd) + tensor_bytes(optim_sd)  # DTensor sizes are global sizes
    nccl = dist.get_backend() == "nccl"
    failed = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
    final = None
    try:
        with ckpt.cleanup_on_failure(tmp, step, needed) if is_main else _nothing():
            # collective; returns on rank 0 once every rank's shards are written
            view, _ = dcp_view({"model": model_sd, "optim": optim_sd})  # strided TP shards as DCP can write them
            dcp.save(view, checkpoint_id=str(tmp / DCP_DIR))
            if is_main:
                if split:
                    full = _read_full_model(tmp / DCP_DIR)
                weights = {k: v.contiguous() for k, v in full.items() if k not in tied}
                save_file(weights, str(tmp / "model.safetensors"), metadata=ckpt.weights_metadata(meta))
                ordinary_file_mode(tmp / "model.safetensors")  # safetensors leaves it 0600
                final = ckpt.finalize_checkpoint(run_dir, tmp, {**meta, "format": "dcp"}, keep, rng)
    except BaseException:
        failed += 1
        raise
    finally:
        dist.all_reduce(failed)  # every rank learns that the save failed, instead of waiting at a barrier
    if failed.item():
        raise ckpt.CheckpointError(f"writing checkpoint step {step} failed on another rank (see its error)")
    return final


def _stored(dcp_dir: Path) -> dict[str, Any]:
    """The key -> tensor metadata table of a DCP checkpoint's ``.metadata``; a damaged or foreign file (which
    unpickles to something else, or not at all) is a CheckpointError naming it, not a traceback."""
    dcp, _ = _dcp()
    where = Path(dcp_dir) / ".metadata"
    try:
        table = dcp.FileSystemReader(str(dcp_dir)).read_metadata().state_dict_metadata
    except Exception as e:  # unpickling runs arbitrary classes: any error means "not a DCP table"
        raise ckpt.CheckpointError(f"{where}: not a readable DCP metadata file ({type(e).__name__}: {str(e)[:120]}); "
                                   "the checkpoint is damaged: resume from an earlier one (--resume CKPT)") from e
    if not isinstance(table, dict):
        raise ckpt.CheckpointError(f"{where}: its table is a {type(table).__name__}, not a DCP metadata table; the "
                                   "checkpoint is damaged: resume from an earlier one (--resume CKPT)")
    return table


def _split_by_stage(model: torch.nn.Module) -> bool:
    """True for a pipeline stage's model (gptforge.parallel.pipeline keeps its layers in a ModuleDict
    under their original indices): no rank holds the whole model."""
    return isinstance(getattr(model, "blocks", None), torch.nn.ModuleDict)


def _read_full_model(dcp_dir: Path) -> dict[str, torch.Tensor]:
    """Every ``model.*`` tensor of a DCP checkpoint, whole, on the CPU (read by one process)."""
    dcp, _ = _dcp()
    meta = _stored(dcp_dir)
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.items()
             if k.startswith("model.") and hasattr(m, "size")}
    with warnings.catch_warnings():  # one process reading on purpose: torch's "is disabled" warning is noise
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, checkpoint_id=str(dcp_dir), no_dist=True)
    return {k[len("model."):]: v for k, v in state.items()}


def tied_heads(model: torch.nn.Module) -> set[str]:
    """The output heads (``lm_head.weight`` at any depth: ``body.`` in a reward model, ``policy.`` /
    ``value.body.`` in PPO's) that are their embedding, stored once as in single-file checkpoints: asked of
    the live model before the gather, whose full copies share no storage. A head is tied when it is the same
    parameter as another one (FSDP2 and tensor parallelism keep a tied pair one parameter), never because
    its values are equal: an untied head that still equals its embedding (a copy not trained apart yet) is
    saved. A pipeline stage holds no whole model (rank 0's first stage has no head): there the model
    config's tie flag answers (a Llama's ``tie_embeddings``; GPT-2's head is always its wte)."""
    if _split_by_stage(model):
        return {ckpt.TIED} if getattr(model.config, "tie_embeddings", True) else set()
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {n for same in names.values() if len(same) > 1 for n in same if ckpt.is_head_key(n)}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


def _check_shapes(model: torch.nn.Module, ckpt_dir: Path) -> None:
    stored = _stored(ckpt_dir / DCP_DIR)
    wrong = []
    for name, p in model.state_dict().items():
        meta = stored.get(f"model.{name}")
        size = getattr(meta, "size", None)
        if size is not None and tuple(size) != tuple(p.shape):  # DTensor .shape is the global shape
            wrong.append(f"{name}: checkpoint {tuple(size)} vs model {tuple(p.shape)}")
    if wrong:
        raise ckpt.CheckpointError(
            f"{ckpt_dir} does not fit the model (shapes differ): {'; '.join(wrong[:3])}. Resume with the "
            "checkpoint's own model config (drop --model.* overrides) or start a new run"
        )


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, ckpt_dir: str | Path,
                 *, trusted: bool = False) -> None:
    """Load a DCP checkpoint into ``model`` (FSDP-wrapped or a plain module) and a matching plain
    optimizer (AdamW over ``model``'s parameters), resharding to the current world.
    DCP unpickles ``dcp/.metadata``: refused unless ``trusted`` (``--trust-checkpoint``); the files
    are checked against meta.json's checksums first."""
    ckpt_dir = Path(ckpt_dir)
    require_trust(ckpt_dir, trusted)
    ckpt.verify_checkpoint(ckpt_dir)
    _check_shapes(model, ckpt_dir)
    no_dist = not dist.is_initialized()
    with warnings.catch_warnings():
        if no_dist:  # loading on one process is intended here: DCP reshards to a single copy
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        _load(model, optimizer, ckpt_dir, no_dist)


def _load(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, ckpt_dir: Path, no_dist: bool) -> None:
    dcp, sd = _dcp()
    if optimizer is None:
        model_sd = sd.get_model_state_dict(model)
        state = {"model": model_sd}
        view, copy_back = dcp_view(state)
        dcp.load(view, checkpoint_id=str(ckpt_dir / DCP_DIR), no_dist=no_dist)
        copy_back()
        sd.set_model_state_dict(model, state["model"])
        return
    options = sd.StateDictOptions(flatten_optimizer_state_dict=_flat_optimizer(ckpt_dir))
    model_sd, optim_sd = sd.get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    view, copy_back = dcp_view(state)  # DCP reads strided TP shards replicated; copied back into them
    dcp.load(view, checkpoint_id=str(ckpt_dir / DCP_DIR), no_dist=no_dist)
    copy_back()
    sd.set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                      options=options)


def _flat_optimizer(ckpt_dir: Path) -> bool:
    """True when the checkpoint keys optimizer param groups by parameter name (written by pipeline
    stages), False for the by-index form of every other sharded run."""
    keys = _stored(ckpt_dir / DCP_DIR)
    return any(k.startswith("optim.param_groups.") and not k.split(".")[2].isdigit() for k in keys)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter name, unsharded (to carry it into an FSDP optimizer)."""
    _, sd = _dcp()
    return sd.get_optimizer_state_dict(model, optimizer, options=sd.StateDictOptions(full_state_dict=True))


def set_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Shard a :func:`full_optimizer_state` dict into the optimizer of an FSDP-wrapped ``model``."""
    _, sd = _dcp()
    sd.set_optimizer_state_dict(model, optimizer, state, options=sd.StateDictOptions(full_state_dict=True))
