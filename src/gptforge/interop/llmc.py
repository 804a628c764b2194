"""llm.c model and tokenizer files, read and written, so weights move both ways between llm.c and gptforge.

Model file (llm.c ``train_gpt2.py write_model`` / ``gpt2_build_from_checkpoint``): a header of 256
int32 — magic 20240326, version (3 = float32 parameters, 5 = bfloat16), maxT, V, L, NH, C, Vp — then
every parameter, contiguous, in llm.c's fixed order, each stacked over layers and in nn.Linear's
(out, in) layout::

    wte (Vp, C)  wpe (maxT, C)  ln1w (L, C)  ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)
    attprojw (L, C, C)  attprojb (L, C)  ln2w (L, C)  ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
    fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw (C,)  lnfb (C,)

Tokenizer file (``write_tokenizer``): 256 int32 — magic 20240328, version 2, vocab size, eot token
(version 1 has no eot) — then per token a uint8 length and the token's bytes.

    gptforge export llmc --ckpt runs/shakespeare-cpu --out exports/llmc --dtype bfloat16   # model.bin + tokenizer.bin
    gptforge import llmc --model gpt2_124M.bin --out runs/from-llmc
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from gptforge.errors import CheckpointError
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.head import padded_vocab
from gptforge.models.registry import get_family
from gptforge.sizecheck import check_model_size

MODEL_MAGIC = 20240326
TOKENIZER_MAGIC = 20240328
HEADER_INTS = 256
VERSIONS = {3: torch.float32, 5: torch.bfloat16}  # llm.c: 3 = fp32 params, 5 = bf16, both with padded vocab
DTYPE_VERSION = {"float32": 3, "bfloat16": 5}


class LlmcFormatError(CheckpointError):
    """A file that is not a valid llm.c model/tokenizer file; the message names the file."""


def _param_shapes(L: int, C: int, maxT: int, Vp: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,)),
    ]


# llm.c tensor -> gptforge per-layer key ("{}" is the layer index)
LAYER_KEYS = {
    "ln1w": "transformer.h.{}.ln_1.weight", "ln1b": "transformer.h.{}.ln_1.bias",
    "qkvw": "transformer.h.{}.attn.c_attn.weight", "qkvb": "transformer.h.{}.attn.c_attn.bias",
    "attprojw": "transformer.h.{}.attn.c_proj.weight", "attprojb": "transformer.h.{}.attn.c_proj.bias",
    "ln2w": "transformer.h.{}.ln_2.weight", "ln2b": "transformer.h.{}.ln_2.bias",
    "fcw": "transformer.h.{}.mlp.c_fc.weight", "fcb": "transformer.h.{}.mlp.c_fc.bias",
    "fcprojw": "transformer.h.{}.mlp.c_proj.weight", "fcprojb": "transformer.h.{}.mlp.c_proj.bias",
}
GLOBAL_KEYS = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight",
               "lnfw": "transformer.ln_f.weight", "lnfb": "transformer.ln_f.bias"}


def _not_a_file(path: Path) -> str:
    """Why ``path`` cannot be read as a file: it is a directory, a dangling link, or absent."""
    if path.is_dir():
        bins = sorted(p.name for p in path.glob("*.bin"))[:3]
        return "is a directory, not a file" + (f" (it holds {', '.join(bins)})" if bins else "")
    if path.exists():  # /dev/null, a pipe: there, but not a file
        return "is a device or other special file, not a file"
    return "is a symlink to a missing file" if path.is_symlink() else "does not exist"


def read_model_header(path: str | Path) -> dict[str, int]:
    """Validate an llm.c model file's header and length; return its fields."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"llm.c model file {path} " + _not_a_file(path))
    size = path.stat().st_size
    if size < HEADER_INTS * 4:
        raise LlmcFormatError(f"{path}: {size} bytes is shorter than the 1024-byte llm.c header")
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if h[0] != MODEL_MAGIC:
        hint = " (that is a tokenizer file)" if h[0] == TOKENIZER_MAGIC else ""
        raise LlmcFormatError(f"{path}: magic {h[0]} is not llm.c's model magic {MODEL_MAGIC}{hint}")
    if h[1] not in VERSIONS:
        raise LlmcFormatError(f"{path}: version {h[1]} unsupported; gptforge reads 3 (float32) and 5 (bfloat16), "
                              "re-export with llm.c's train_gpt2.py")
    f = dict(version=int(h[1]), maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]), Vp=int(h[7]))
    if min(f["maxT"], f["V"], f["L"], f["NH"], f["C"]) <= 0 or f["Vp"] < f["V"] or f["C"] % f["NH"]:
        raise LlmcFormatError(f"{path}: inconsistent header {f} (need positive sizes, Vp >= V, C divisible by NH)")
    # Python ints: the header's int32 sizes multiply past int64, where numpy would wrap silently and a
    # crafted header could then "match" a small file
    n = sum(math.prod(s) for _, s in _param_shapes(f["L"], f["C"], f["maxT"], f["Vp"]))
    want = HEADER_INTS * 4 + n * VERSIONS[f["version"]].itemsize
    if size != want:
        raise LlmcFormatError(f"{path}: {size} bytes, but the header {f} implies {n:,} parameters = {want} bytes; "
                              "the file is truncated or not an llm.c model")
    f["num_params"] = n
    return f


def read_llmc_model(path: str | Path, flash: bool = True) -> GPT:
    """An llm.c model file as a gptforge GPT (float32, eval mode)."""
    h = read_model_header(path)  # its sizes match the file's length exactly: claimed = present
    check_model_size(str(path), "its header", h["num_params"], h["num_params"], LlmcFormatError, "GPT-2")
    L, C, maxT, V, Vp = h["L"], h["C"], h["maxT"], h["V"], h["Vp"]
    cfg = GPTConfig(n_layer=L, n_head=h["NH"], n_embd=C, block_size=maxT, vocab_size=V, pad_vocab=Vp != V, flash=flash)
    dtype = VERSIONS[h["version"]]
    raw = np.fromfile(path, dtype="<u2" if dtype == torch.bfloat16 else "<f4", offset=HEADER_INTS * 4)
    flat = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16) if dtype == torch.bfloat16 else torch.from_numpy(raw)
    sd: dict[str, torch.Tensor] = {}
    off = 0
    for name, shape in _param_shapes(L, C, maxT, Vp):
        n = math.prod(shape)
        t = flat[off : off + n].view(shape).float()
        off += n
        if not bool(torch.isfinite(t).all()):  # as every other reader refuses them: NaN sampled garbage without a word
            raise LlmcFormatError(f"{path}: tensor {name} holds NaN or infinite values; refusing a broken model")
        if name in GLOBAL_KEYS:
            sd[GLOBAL_KEYS[name]] = t
        else:
            for i in range(L):
                sd[LAYER_KEYS[name].format(i)] = t[i]
    wte = sd["transformer.wte.weight"]
    if wte.size(0) != cfg.padded_vocab_size:  # llm.c padded to a different multiple: keep the real rows
        padded = torch.zeros(cfg.padded_vocab_size, C)
        padded[:V] = wte[:V]
        sd["transformer.wte.weight"] = padded
    model = GPT(cfg)
    missing, unexpected = model.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:  # pragma: no cover - the map is fixed
        raise LlmcFormatError(f"{path}: key map mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def check_llmc_model(model: torch.nn.Module) -> None:
    """Refuse, naming the key, a model an llm.c file cannot hold (llm.c's format is GPT-2 only)."""
    cfg = model.config
    if not get_family(cfg.arch).llmc:
        family = getattr(cfg, "family", "")  # a Qwen3, Mistral, Phi-3 or Gemma is named as itself
        raise ValueError(f"model.arch={cfg.arch!r}{f' (model.family={family!r})' if family else ''}: llm.c model "
                         "files hold GPT-2 only; export this model with `gptforge export hf` instead")
    if not cfg.bias:
        raise ValueError("llm.c's GPT-2 has biases everywhere; a model.bias=false model cannot be written")


def write_llmc_model(model: GPT, path: str | Path, dtype: str = "float32") -> Path:
    """Write ``model`` as an llm.c model file (version 3 float32 or 5 bfloat16, padded vocabulary)."""
    if dtype not in DTYPE_VERSION:
        raise ValueError(f"dtype={dtype!r}; llm.c files hold float32 or bfloat16")
    check_llmc_model(model)
    cfg = model.config
    L, C, V = cfg.n_layer, cfg.n_embd, cfg.vocab_size
    Vp = padded_vocab(V)  # llm.c pads to a multiple of 128, as gptforge does
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    # rows past V never get probability; llm.c's exporter (train_gpt2.py write_model) fills them with
    # zeros, so this does too, also for a model already padded to Vp (whose padding rows hold its init)
    wte = torch.zeros(Vp, C)
    wte[:V] = sd["transformer.wte.weight"][:V]
    tensors = {"wte": wte, "wpe": sd["transformer.wpe.weight"], "lnfw": sd["transformer.ln_f.weight"],
               "lnfb": sd["transformer.ln_f.bias"]}
    for name, key in LAYER_KEYS.items():
        tensors[name] = torch.stack([sd[key.format(i)] for i in range(L)])
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, DTYPE_VERSION[dtype], cfg.block_size, V, L, cfg.n_head, C, Vp]
    from gptforge.storage import atomic_open

    with atomic_open(path, "wb", what="the llm.c model file") as f:  # never half a model under the final name
        f.write(header.tobytes())
        for name, shape in _param_shapes(L, C, cfg.block_size, Vp):
            t = tensors[name]
            assert tuple(t.shape) == shape, (name, t.shape, shape)
            if dtype == "bfloat16":
                f.write(t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2").tobytes())
            else:
                f.write(t.contiguous().numpy().astype("<f4").tobytes())
    return Path(path)


def write_llmc_tokenizer(enc, path: str | Path) -> Path:
    """llm.c tokenizer file (version 2) from a tiktoken Encoding: every token's bytes, in id order."""
    n = enc.n_vocab
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = [TOKENIZER_MAGIC, 2, n, enc.eot_token]
    from gptforge.storage import atomic_open

    with atomic_open(path, "wb", what="the llm.c tokenizer file") as f:
        f.write(header.tobytes())
        for i in range(n):
            b = enc.decode_single_token_bytes(i)
            if not 0 < len(b) < 256:
                raise ValueError(f"token {i} is {len(b)} bytes; llm.c stores lengths as one byte (1..255)")
            f.write(bytes([len(b)]) + b)
    return Path(path)


def read_llmc_tokenizer(path: str | Path) -> tuple[list[bytes], int | None]:
    """(token bytes by id, eot id or None for version 1) from an llm.c tokenizer file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"llm.c tokenizer file {path} " + _not_a_file(path))
    data = path.read_bytes()
    if len(data) < HEADER_INTS * 4:
        raise LlmcFormatError(f"{path}: {len(data)} bytes is shorter than the 1024-byte llm.c header")
    h = np.frombuffer(data[: HEADER_INTS * 4], dtype="<i4")
    if h[0] != TOKENIZER_MAGIC:
        raise LlmcFormatError(f"{path}: magic {h[0]} is not llm.c's tokenizer magic {TOKENIZER_MAGIC}")
    if h[1] not in (1, 2):
        raise LlmcFormatError(f"{path}: tokenizer version {h[1]} unsupported (1 or 2)")
    n, eot = int(h[2]), (int(h[3]) if h[1] == 2 else None)
    tokens, off = [], HEADER_INTS * 4
    for i in range(n):
        if off >= len(data):
            raise LlmcFormatError(f"{path}: ends after {i} of {n} tokens")
        length = data[off]
        tokens.append(data[off + 1 : off + 1 + length])
        off += 1 + length
        if length == 0 or len(tokens[-1]) != length:
            raise LlmcFormatError(f"{path}: token {i} is truncated or empty")
    if off != len(data):
        raise LlmcFormatError(f"{path}: {len(data) - off} trailing bytes after {n} tokens")
    return tokens, eot
