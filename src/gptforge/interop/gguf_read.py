"""Read a GGUF file (llama.cpp, Ollama, LM Studio) into gptforge: a Llama or a GPT-2, its tokenizer, its chat template.

    >>> from gptforge.interop.gguf_read import read_gguf
    >>> g = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # gptforge.interop.smollm2.fetch_smollm2()
    >>> g.model, g.tokenizer, g.chat_template, g.metadata["general.name"]

The reverse of ``gguf.py``'s exporter, through the ``gguf`` package's dequantizers (llama.cpp's own,
in numpy): tensors are dequantized to float32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
the K-quants Q2_K..Q6_K); llama.cpp's tensor names map back to Hugging Face's, and the query/key rows
are put back from llama.cpp's interleaved rotary pairs into rotate-half order (exactly undoing
``rotate_half_to_interleaved``, which is llama.cpp's converter's permutation). The config comes from
the ``llama.*`` keys. Architecture ``qwen2`` (its ``qwen2.*`` keys) is a Llama with q/k/v biases
(``attn_q.bias`` ...) and rotate-half rotary, so its rows are not reordered. Rope scaling: ``linear``
(``rope.scaling.type``/``factor``), and Llama 3.1/3.2's, which llama.cpp stores as per-frequency
divisors (tensor ``rope_freqs.weight``) that ``models.rope.scaling_from_factors`` turns back into
llama3 parameters. Architecture ``gpt2`` (its ``gpt2.*`` keys; what ``gguf.py`` writes and llama.cpp's
converter makes of Hugging Face's GPT-2) is gptforge's GPT: its matrices are (out, in) in the file as in
``nn.Linear``, ``attn_qkv`` is ``c_attn``'s q, k, v rows in order, the head is tied to ``token_embd`` (an
``output.weight`` that differs is refused), and its LayerNorm epsilon must be ``nn.LayerNorm``'s 1e-5, its
MLP 4 x wide. Architectures ``qwen3``, ``gemma2``, ``gemma3`` and ``phi3``, and ``llama`` with a sliding
window (Mistral), are the Llama with the fields ``gguf_families.py`` reads (Gemma's norms stored as
1 + w, Phi-3's fused matrices split, their rotary NEOX). What gptforge's Llama cannot represent (another
architecture or rope scaling, partial rotary, experts, other biases, per-layer widths) is refused by name.

The tokenizer is rebuilt as a ``tokenizer.json`` text from ``tokenizer.ggml.*`` (``gguf_tokenizer.py``:
the byte-level BPE, with the pre-tokenizer llama.cpp runs for ``tokenizer.ggml.pre``; a SentencePiece
vocabulary as transformers' GGUF loader builds it).

A GGUF file is untrusted: its header is walked once with bounds (counts, string and array lengths,
tensor ranks, shapes, types, offsets against the file size), and that walk is the only parse of it
(the ``gguf`` package's reader took 2.4 s of CPU per parse of SmolLM2's vocabulary); tensor shapes
are checked against the config before anything is dequantized. Every refusal is a one-line
:class:`GGUFReadError` (a ``ValueError``) naming the file and the key or tensor.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptforge.interop import gguf_families
from gptforge.interop.gguf_config import (  # noqa: F401 - the limits are read from here too
    ARCHITECTURES,
    BLOCK_NAMES,
    GPT2_NORM_EPS,
    MAX_CONTEXT,
    MAX_LAYERS,
    ROPE_FREQS,
    gpt2_config_from_gguf,
    llama_config_from_gguf,
)
from gptforge.interop.gguf_tokenizer import (  # GGUFReadError re-exported: the reader's error
    GGUF_STRING,
    GGUFReadError,
    tokenizer_from_gguf,
)
from gptforge.models.registry import at_layers
from gptforge.sizecheck import check_model_size, count_layers, elements, layered_elements

MAX_TENSORS = 1 << 16  # Llama 3 405B has ~1,100 tensors
MAX_KV = 1 << 14
MAX_KEY = 1 << 16
MAX_STRING = 1 << 20  # a scalar string (chat templates are a few KB)
MAX_ARRAY = 1 << 22  # tokens and merges (Gemma 3's 262,144 tokens fit)
MAX_ITEM_STRING = 1 << 16  # one token or merge
MAX_DIMS = 4
MAX_ELEMENTS = 1 << 36
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types -> (struct format, size); 8 = string, 9 = array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_ARRAY = 9  # GGUF_STRING (8) comes with the tokenizer's reader, which reads strings too
_FLOAT32 = 6


def shortest_float32(x: float) -> float:
    """The shortest decimal that is the same float32 as ``x``, as a Python float: a float32 metadata value
    (an epsilon, a rope base) keeps the value its writer typed through a config and an export, as
    transformers' config.json keeps 1e-05. Read back as float32 it is bit for bit the value stored."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-")) if math.isfinite(x) else x

# tensor types read (their names in gguf.GGMLQuantizationType); anything else is refused by name
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                   "Q6_K")

TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
# llama.cpp's gpt2 tensors (per block, weight and bias each) -> gptforge's GPT (Hugging Face's GPT-2 names)
GPT2_BLOCK_NAMES = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
                    "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
GPT2_TOP_NAMES = {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
                  "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias"}




@dataclass
class GGUFModel:
    """What a GGUF file holds, as gptforge objects."""

    model: Any  # gptforge.models.llama.Llama or gptforge.models.gpt2.GPT, eval mode, float32
    tokenizer: Any  # gptforge.data.tokenizer.HFTokenizer
    chat_template: str | None
    metadata: dict[str, Any] = field(default_factory=dict)  # the scalar keys (provenance)
    path: Path | None = None
    matrix_types: tuple[str, ...] = ()  # the GGML types of its 2-D tensors, sorted (F16, Q4_1, ...)


@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (rows first): GGUF's dims reversed
    type_name: str
    offset: int  # from the start of the data section
    n_bytes: int


def _gguf():
    from gptforge.extras import require

    return require("gguf", extra="gguf", for_what="reading a GGUF file")


# ----------------------------------------------------------------------------- header walk (bounded)


class _Cursor:
    def __init__(self, buf: Any, path: Path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what: str) -> GGUFReadError:
        return GGUFReadError(f"{self.path}: {what}; not a GGUF file gptforge can read")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated at byte {self.pos} reading {what} ({n} bytes, file has {self.size})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        return struct.unpack(fmt, self.take(size, what))[0]

    def string(self, limit: int, what: str) -> str:
        n = self.scalar("<Q", 8, f"{what} length")
        if n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit})")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


@dataclass
class _Header:
    scalars: dict[str, Any]
    arrays: dict[str, tuple[int, int]]  # key -> (item type, count)
    items: dict[str, list]  # key -> the array's items: numbers, or bytes for strings (decoded by their reader)
    infos: list[_TensorInfo]
    data_start: int  # where the tensor data begins (tensor offsets count from here)


def _walk_header(path: Path, buf: Any) -> _Header:
    """Scalars by key, arrays as key -> (item type, count) with their items, tensor infos; everything
    bounded by the file size. This walk is the only parse of the metadata: the ``gguf`` package's own
    reader takes seconds over a 49,152-token vocabulary (a numpy view per string), so it is not used."""
    gguf = _gguf()
    c = _Cursor(buf, path)
    if c.take(4, "the magic") != GGUF_MAGIC:
        raise c.fail("no GGUF magic at the start")
    version = c.scalar("<I", 4, "the version")
    if version not in (2, 3):
        raise c.fail(f"GGUF.version={version} (gptforge reads versions 2 and 3)")
    n_tensors = c.scalar("<Q", 8, "the tensor count")
    n_kv = c.scalar("<Q", 8, "the key count")
    if n_tensors > MAX_TENSORS or n_tensors * 24 > c.size:  # each tensor info takes at least 24 bytes
        raise c.fail(f"GGUF.tensor_count={n_tensors} is absurd for a {c.size}-byte file (at most {MAX_TENSORS})")
    if n_kv > MAX_KV or n_kv * 13 > c.size:
        raise c.fail(f"GGUF.kv_count={n_kv} is absurd for a {c.size}-byte file (at most {MAX_KV})")
    scalars: dict[str, Any] = {}
    arrays: dict[str, tuple[int, int]] = {}
    items: dict[str, list] = {}
    for _ in range(n_kv):
        key = c.string(MAX_KEY, "a metadata key")
        vtype = c.scalar("<I", 4, f"{key}'s type")
        if vtype in _SCALARS:
            scalars[key] = c.scalar(*_SCALARS[vtype], key)
            if vtype == _FLOAT32:  # the decimal the writer meant: 1e-05, not 9.999999747378752e-06 (same float32)
                scalars[key] = shortest_float32(scalars[key])
        elif vtype == GGUF_STRING:
            scalars[key] = c.string(MAX_STRING, key)
        elif vtype == _ARRAY:
            itype = c.scalar("<I", 4, f"{key}'s item type")
            count = c.scalar("<Q", 8, f"{key}'s length")
            if itype in _SCALARS:
                size = _SCALARS[itype][1]
            elif itype == GGUF_STRING:
                size = 8
            else:
                raise c.fail(f"{key} is an array of type {itype} (nested arrays are not read)")
            if count > MAX_ARRAY or count * size > c.size - c.pos:
                raise c.fail(f"{key} claims {count} items (at most {MAX_ARRAY}, and they must fit in the file)")
            if itype == GGUF_STRING:
                strings = []
                for _ in range(count):
                    n = c.scalar("<Q", 8, f"an item of {key}")
                    if n > MAX_ITEM_STRING:
                        raise c.fail(f"an item of {key} is {n} bytes long (at most {MAX_ITEM_STRING})")
                    strings.append(c.take(n, f"an item of {key}"))
                items[key] = strings
            else:
                items[key] = list(struct.unpack(f"<{count}{_SCALARS[itype][0][1]}", c.take(count * size, key)))
            arrays[key] = (itype, count)
        else:
            raise c.fail(f"metadata key {key} has unknown type {vtype}")
    alignment = scalars.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 16 or alignment & (alignment - 1):
        raise c.fail(f"general.alignment={alignment!r} must be a power of two up to 65536")
    infos: list[_TensorInfo] = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = c.string(256, "a tensor name")
        n_dims = c.scalar("<I", 4, f"tensor {name}'s rank")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = [c.scalar("<Q", 8, f"tensor {name}'s shape") for _ in range(n_dims)]
        ttype = c.scalar("<I", 4, f"tensor {name}'s type")
        offset = c.scalar("<Q", 8, f"tensor {name}'s offset")
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
        except ValueError:
            raise c.fail(f"tensor {name} has unknown type {ttype}") from None
        if qtype.name not in SUPPORTED_TYPES:
            raise GGUFReadError(f"{path}: tensor {name} is {qtype.name}; gptforge dequantizes "
                                f"{', '.join(SUPPORTED_TYPES)} (requantize with llama-quantize)")
        if any(d < 1 for d in dims) or math.prod(dims) > MAX_ELEMENTS:
            raise c.fail(f"tensor {name} has shape {dims} (each dimension >= 1, at most {MAX_ELEMENTS} elements)")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise c.fail(f"tensor {name}'s rows of {dims[0]} are not whole {qtype.name} blocks of {block}")
        if name in names:
            raise c.fail(f"tensor {name} appears twice")
        names.add(name)
        n_bytes = math.prod(dims) // block * type_size
        infos.append(_TensorInfo(name, tuple(reversed(dims)), qtype.name, offset, n_bytes))
    data_start = -(-c.pos // alignment) * alignment
    for t in infos:
        if t.offset % alignment or data_start + t.offset + t.n_bytes > c.size:
            raise c.fail(f"tensor {t.name}'s data (offset {t.offset}, {t.n_bytes} bytes) lies outside the "
                         f"{c.size}-byte file or off its {alignment}-byte alignment (truncated?)")
    return _Header(scalars, arrays, items, infos, data_start)


# ----------------------------------------------------------------------------- config


def _gpt2_expected_shapes(cfg, names: set[str]) -> dict[str, tuple[int, ...]]:
    """llama.cpp gpt2 tensor name -> shape the config implies (vocabulary rows unpadded); ``output.weight``
    only where the file has one (llama.cpp's converter writes the tied head again)."""
    C, V = cfg.n_embd, cfg.vocab_size
    out = {"token_embd.weight": (V, C), "position_embd.weight": (cfg.block_size, C), "output_norm.weight": (C,),
           "output_norm.bias": (C,)}
    if "output.weight" in names:
        out["output.weight"] = (V, C)
    per = {"attn_norm": ((C,), (C,)), "attn_qkv": ((3 * C, C), (3 * C,)), "attn_output": ((C, C), (C,)),
           "ffn_norm": ((C,), (C,)), "ffn_up": ((4 * C, C), (4 * C,)), "ffn_down": ((C, 4 * C), (C,))}
    for i in range(cfg.n_layer):
        for name, (w, b) in per.items():
            out[f"blk.{i}.{name}.weight"], out[f"blk.{i}.{name}.bias"] = w, b
    return out


def _expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """llama.cpp tensor name -> (rows, cols) the config implies (vocabulary rows unpadded)."""
    C, H, hd, kv = cfg.n_embd, cfg.hidden_dim, cfg.head_dim, cfg.kv_heads
    out = {"token_embd.weight": (cfg.vocab_size, C), "output_norm.weight": (C,)}
    if not cfg.tie_embeddings:
        out["output.weight"] = (cfg.vocab_size, C)
    per = {"attn_norm.weight": (C,), "attn_q.weight": (C, C), "attn_k.weight": (kv * hd, C),
           "attn_v.weight": (kv * hd, C), "attn_output.weight": (C, C), "ffn_norm.weight": (C,),
           "ffn_gate.weight": (H, C), "ffn_up.weight": (H, C), "ffn_down.weight": (C, H)}
    if cfg.qkv_bias:
        per.update({"attn_q.bias": (C,), "attn_k.bias": (kv * hd,), "attn_v.bias": (kv * hd,)})
    for i in range(cfg.n_layer):
        out.update({f"blk.{i}.{k}": v for k, v in per.items()})
    if cfg.family or cfg.head_size:  # Qwen3, Gemma, Phi-3, Mistral: their norms, fused matrices, head sizes
        out = gguf_families.expected_shapes(cfg, out)
    return out


def interleaved_to_rotate_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of ``gguf.rotate_half_to_interleaved`` (llama.cpp converter's q/k permutation):
    within each head, rows (2i, 2i+1) go back to (i, i + head_dim/2)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


# ----------------------------------------------------------------------------- weights


def _dequantize(data: np.ndarray, data_start: int, info: _TensorInfo) -> torch.Tensor:
    """One tensor of the mapped file (``data``: its bytes as uint8) to float32, through the ``gguf``
    package's dequantizers (which take a tensor's bytes row by row, as its own reader hands them over)."""
    gguf = _gguf()
    qtype = gguf.GGMLQuantizationType[info.type_name]
    start = data_start + info.offset
    raw = data[start : start + info.n_bytes].reshape(gguf.quant_shape_to_byte_shape(info.shape, qtype))
    arr = gguf.quants.dequantize(raw, qtype)
    arr = np.asarray(arr, dtype=np.float32).reshape(info.shape)
    if not np.isfinite(arr).all():
        raise GGUFReadError(f"{info.name}: holds NaN or infinite values")
    if not (arr.flags.writeable and arr.flags.c_contiguous):  # F32 comes back as a view of the mapped file
        arr = np.array(arr, dtype=np.float32, order="C")
    return torch.from_numpy(arr)


def read_gguf(path: str | Path, weights: bool = True) -> GGUFModel:
    """A GGUF file -> :class:`GGUFModel` (gptforge Llama in eval mode, float32; its tokenizer and chat
    template; the scalar metadata). Refuses (:class:`GGUFReadError`, naming the file and the key or
    tensor) anything it cannot represent exactly, before allocating the model."""
    path = Path(path)
    if not path.is_file():
        raise GGUFReadError(f"{path}: not a file (a folder or device); give a .gguf file" if path.exists()
                            else f"{path}: no such file")
    with open(path, "rb") as fh:
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFReadError(f"{path}: empty; not a GGUF file gptforge can read") from None
        try:
            header = _walk_header(path, buf)
        finally:
            buf.close()
    scalars, arrays, infos = header.scalars, header.arrays, header.infos
    names = {t.name for t in infos}
    # the file is now known to be well-formed (every tensor's bytes inside it): map it for the weights
    data = np.memmap(path, dtype=np.uint8, mode="r")
    arch = scalars.get("general.architecture")
    if arch not in ARCHITECTURES:  # before the tokenizer: the architecture is the first thing to refuse
        raise GGUFReadError(f"{path}: general.architecture={arch!r}; gptforge reads GGUF architectures "
                            f"{', '.join(ARCHITECTURES)}")
    tok, template, n_tokens = tokenizer_from_gguf(header.items, scalars, arrays, path)
    rope_freqs = None
    info = next((t for t in infos if t.name == ROPE_FREQS), None)
    if info is not None and arch != "gpt2":  # gpt2 has no rotary: refused below as a tensor with no place  # a few floats, read before the config: they are its rope scaling
        if len(info.shape) != 1 or info.shape[0] > 1 << 12:
            raise GGUFReadError(f"{path}: tensor {ROPE_FREQS} has shape {list(info.shape)}, not (head_dim/2,)")
        rope_freqs = _dequantize(data, header.data_start, info)
    if arch == "gpt2":
        cfg = gpt2_config_from_gguf(scalars, arrays, path, n_tokens)
        shapes_of, family = (lambda c: _gpt2_expected_shapes(c, names)), "GPT"
    else:
        cfg = llama_config_from_gguf(scalars, arrays, names, path, n_tokens, rope_freqs, header.items)
        shapes_of, family = _expected_shapes, "Llama"
    # the total the metadata claims against the tensors present and the memory free (dequantized to float32),
    # before a table of every claimed layer is built or anything is dequantized
    claimed = layered_elements(lambda k: shapes_of(at_layers(cfg, k)), cfg.n_layer)  # per-layer table cut too
    check_model_size(str(path), "its metadata", claimed, elements(t.shape for t in infos), GGUFReadError, family,
                     memory=weights, layers=(cfg.n_layer, count_layers(names)))  # weights=False: the words only
    expected = shapes_of(cfg)
    if arch != "gpt2" and ROPE_FREQS in names:  # the rope divisors, already read into the config
        expected[ROPE_FREQS] = (cfg.head_dim // 2,)
    cfg.bos_token = tok.eot_token  # the document separator the tokenizer names
    unknown = sorted(names - set(expected))
    if unknown:
        raise GGUFReadError(f"{path}: tensor {unknown[0]} has no place in gptforge's {family} "
                            f"({len(unknown)} such tensors; biases, experts and extra norms are not implemented)")
    missing = sorted(set(expected) - names)
    if missing:
        raise GGUFReadError(f"{path}: tensor {missing[0]} is missing ({len(missing)} missing)")
    for t in infos:
        if t.shape != expected[t.name]:
            raise GGUFReadError(f"{path}: tensor {t.name} has shape {list(t.shape)}, the metadata implies "
                                f"{list(expected[t.name])}")
    build = _build_gpt2 if arch == "gpt2" else _build
    model = build(data, header.data_start, infos, cfg, path) if weights else None  # weights=False: the words only (fast)
    return GGUFModel(model=model, tokenizer=tok, chat_template=template, metadata=dict(scalars), path=path,
                     matrix_types=tuple(sorted({t.type_name for t in infos if len(t.shape) == 2})))


def _build(data: np.ndarray, data_start: int, infos: list[_TensorInfo], cfg, path: Path):
    from gptforge.interop.hf_folder import pad_rows
    from gptforge.models.registry import build_model

    sd: dict[str, torch.Tensor] = {}
    for info in infos:
        if info.name == ROPE_FREQS:  # read into the config (model.rope_*), not a weight
            continue
        try:
            w = _dequantize(data, data_start, info)
        except GGUFReadError as e:
            raise GGUFReadError(f"{path}: tensor {e}") from None
        if info.name in ("token_embd.weight", "output.weight"):
            w = pad_rows(w, cfg.padded_vocab_size)
        if info.name.startswith("blk."):
            _, i, rest = info.name.split(".", 2)
            family = gguf_families.read_block(rest, w, cfg) if cfg.family else {}
            if family:  # what a family stores under its own names (or as 1 + w, or fused)
                sd.update({f"model.layers.{i}.{k}": v for k, v in family.items()})
                continue
            if cfg.qkv_bias or cfg.family in gguf_families.NEOX:  # llama.cpp's NEOX rotary is rotate-half
                pass
            elif rest == "attn_q.weight":
                w = interleaved_to_rotate_half(w, cfg.n_head)
            elif rest == "attn_k.weight":
                w = interleaved_to_rotate_half(w, cfg.kv_heads)
            key = f"model.layers.{i}.{BLOCK_NAMES[rest]}"
        else:
            key = TOP_NAMES[info.name]
            if cfg.norm_plus_one and info.name == "output_norm.weight":
                w = w - 1.0  # llama.cpp's converter stored Gemma's 1 + w
        sd[key] = w
    with torch.device("meta"):  # no random init: the weights are assigned, not copied
        model = build_model(cfg)
    if cfg.tie_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.float().eval()


def _build_gpt2(data: np.ndarray, data_start: int, infos: list[_TensorInfo], cfg, path: Path):
    """gptforge's GPT from llama.cpp's gpt2 tensors: names mapped, no transposes (the file's matrices are
    ``nn.Linear``'s (out, in) already), the vocabulary rows padded back; the head tied to ``token_embd``."""
    from gptforge.interop.hf_folder import pad_rows
    from gptforge.models.registry import build_model

    sd: dict[str, torch.Tensor] = {}
    output = None
    for info in infos:
        try:
            w = _dequantize(data, data_start, info)
        except GGUFReadError as e:
            raise GGUFReadError(f"{path}: tensor {e}") from None
        if info.name == "output.weight":
            output = w
            continue
        if info.name == "token_embd.weight":
            w = pad_rows(w, cfg.padded_vocab_size)
        if info.name.startswith("blk."):
            _, i, rest = info.name.split(".", 2)
            part, kind = rest.rsplit(".", 1)
            key = f"transformer.h.{i}.{GPT2_BLOCK_NAMES[part]}.{kind}"
        else:
            key = GPT2_TOP_NAMES[info.name]
        sd[key] = w
    wte = sd["transformer.wte.weight"]
    if output is not None and not torch.equal(output, wte[: cfg.vocab_size]):
        raise GGUFReadError(f"{path}: tensor output.weight differs from token_embd.weight; gptforge's GPT ties its "
                            "head to the token embeddings and will not load the model wrong")
    sd["lm_head.weight"] = wte
    with torch.device("meta"):  # no random init: the weights are assigned, not copied
        model = build_model(cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    model.transformer.wte.weight = model.lm_head.weight  # the tie, as GPT.__init__ makes it
    return model.float().eval()
