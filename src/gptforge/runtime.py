"""Where and how a command computes: the device, the world size torchrun announces, the autocast
dtype and the precision switches, each resolved in this one place.

    >>> device = resolve_device("auto")                  # cuda:LOCAL_RANK, mps or cpu
    >>> autocast = autocast_for(device, "auto")          # bf16 where the GPU supports it
    >>> with autocast(): logits, _ = model(idx)
    >>> set_threads(cfg.train.threads, device)          # CPU threads, before any compute
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from gptforge import environment

DTYPES = ("auto", "float32", "bfloat16")


class DeviceUnavailable(ValueError):
    """A device was asked for that this machine does not have (the CLI exits 2)."""


def resolve_device(name: str, local_rank: int = 0, flag: str = "train.device") -> torch.device:
    """"auto" -> cuda:local_rank, mps or cpu; "cuda" -> cuda:local_rank; anything else as given. ``flag``:
    the setting a refusal names (the config key, or ``--device`` for the commands that take that flag)."""
    use = flag if flag.startswith("--") else f"--{flag}"
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceUnavailable(f"{flag}={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceUnavailable(f"{flag}={name!r} but MPS is not available here; use {use} cpu or auto")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"{flag}={name!r} but CUDA is not available here; use {use} cpu or auto")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def launched_world() -> int:
    """World size torchrun announces (1 when not launched by torchrun); used to validate before compute."""
    return int(environment.number("WORLD_SIZE", 1))


def resolve_dtype(device: torch.device, dtype: str = "auto") -> str:
    """"auto" -> "bfloat16" on a CUDA device that supports it, else "float32"."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype


def autocast_for(device: torch.device, dtype: str = "auto") -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of autocast contexts: bf16 autocast, or a no-op for float32."""
    if resolve_dtype(device, dtype) == "float32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def set_precision(cfg, device: torch.device):
    """Apply a run config's TF32 switch; return (autocast context factory, precision name for MFU,
    compile?)."""
    train_cfg = cfg.train
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = train_cfg.tf32
        torch.backends.cudnn.allow_tf32 = train_cfg.tf32
    precision = resolve_dtype(device, train_cfg.dtype)
    if precision == "float32" and device.type == "cuda" and train_cfg.tf32:
        precision = "tf32"
    compile_model = device.type == "cuda" if train_cfg.compile is None else train_cfg.compile
    dist_cfg = getattr(cfg, "dist", None)
    if train_cfg.compile is None and dist_cfg is not None and dist_cfg.tp > 1 and launched_world() > 1:
        compile_model = False  # auto: off under tensor parallelism (asking for it is refused, parallel/mesh.py)
    return autocast_for(device, train_cfg.dtype), precision, compile_model


def auto_threads(device: torch.device) -> int:
    """``train.threads 0``: OMP_NUM_THREADS when the user (or torchrun) set it; else one thread per
    process on CPU, where torch's default (one per physical core) was 3-7x slower on a loaded 2-core
    machine (docs/benchmarks.md, "CPU threads": a spinning OpenMP team loses to other processes for
    the cores); on a GPU, torch's own choice (the CPU only feeds the device). A machine of one's own
    may do better with more: ``gptforge bench --switch train.threads=N`` measures it."""
    omp = environment.omp_threads()  # "+4" and nested "4,1" as libgomp reads them: 4 ("+4" was 1 here, 4 in torch)
    if omp is not None:
        return omp
    if device.type == "cpu":
        return 1
    return torch.get_num_threads()


def set_threads(threads: int, device: torch.device) -> int:
    """Set torch's intra-op CPU threads (``train.threads``; 0 = :func:`auto_threads`); return the count."""
    n = threads or auto_threads(device)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
