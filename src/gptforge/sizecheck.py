"""Size before work: the one check every reader of a model makes before any per-layer work or allocation.

    >>> claimed = layered_elements(lambda k: shapes_for(n_layer=k), n_layer)   # two tiny tables, any n_layer
    >>> check_model_size("dir/config.json", "config.json", claimed, present, HFModelError, "GPT-2")

A model file is data: a ``config.json``, GGUF header, llm.c header or ``meta.json`` may claim 10^6
layers beside two layers of weights. A reader that first builds a table of expected shapes, or a
model (even on the meta device), for every claimed layer spends minutes and gigabytes before it can
compare anything. So each reader computes the claimed size in closed form (from the tables of a one-
and a two-layer model: the difference is one layer, the rest is everything outside the blocks),
compares it with the elements the weights actually hold (their headers, never their data) and with
the memory this machine has free, and only then walks layers or allocates.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gptforge.errors import CheckpointError

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit



# bytes per element of safetensors' dtypes: an entry's shape must fill its byte range exactly, so a header
# cannot claim 10^12 elements over 8 bytes (a reader sums these shapes to bound what a config claims)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def weights_header(path: str | Path, error: type[Exception] = CheckpointError,
                   damaged: str = "the checkpoint is damaged") -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a safetensors file, from its JSON header alone. The header's length,
    its JSON, every entry's shape, dtype and byte range are checked against the file's size (an entry's
    shape times its dtype's size is its byte range). ``error``/``damaged``: the refusal and its advice."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > min(MAX_HEADER_BYTES, size - 8):
            raise error(f"{path} cannot be read (not safetensors: header length {n} in a {size}-byte file); "
                        f"{damaged}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} cannot be read (its safetensors header is not JSON: {e}); {damaged}") from e
    if not isinstance(header, dict):
        raise error(f"{path} cannot be read (its safetensors header is not a JSON object); {damaged}")
    data = size - 8 - n
    out: dict[str, tuple[int, ...]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and 0 <= o <= data for o in offsets) or offsets[0] > offsets[1]
                or entry.get("dtype") not in DTYPE_BYTES
                or math.prod(shape) * DTYPE_BYTES[entry["dtype"]] != offsets[1] - offsets[0]):
            raise error(f"{path} cannot be read (header entry {name!r} has no valid dtype, shape and byte range "
                        f"within its {data} data bytes); {damaged}")
        out[name] = tuple(shape)
    return out



def header_metadata(path: str | Path) -> dict[str, str]:
    """The ``__metadata__`` (str -> str) of a safetensors file whose header :func:`weights_header` has read
    and checked; {} when it has none or it is not that shape."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        try:
            meta = json.loads(f.read(n)).get("__metadata__")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return {}
    return {k: v for k, v in meta.items() if isinstance(v, str)} if isinstance(meta, dict) else {}


def layered_elements(shapes_of: Callable[[int], Mapping[str, tuple[int, ...]]], n_layer: int) -> int:
    """Total elements of a model of ``n_layer`` blocks whose tensor shapes for ``k`` blocks are
    ``shapes_of(k)``, from ``shapes_of(1)`` and ``shapes_of(2)`` only: the work is the same for 2 and for 10^6
    claimed layers. Python integers, so a claimed size never wraps."""
    one = sum(math.prod(s) for s in shapes_of(1).values())
    two = sum(math.prod(s) for s in shapes_of(2).values())
    per_layer = two - one
    return one - per_layer + n_layer * per_layer


def elements(shapes: Iterable[tuple[int, ...]]) -> int:
    """Elements of tensors of these shapes (a header's, before any tensor is read)."""
    return sum(math.prod(s) for s in shapes)


def check_model_size(where: str, what: str, claimed: int, present: int | None, error: type[Exception],
                     family: str = "the model", bytes_per_element: int = 4, memory: bool = True,
                     layers: tuple[int, int] | None = None) -> None:
    """Refuse, before any per-layer work or allocation, a model whose ``what`` (the config, header or
    meta.json at ``where``) claims more elements than the weights hold (``present``, from their headers;
    None where nothing is present yet, a hub model), raising ``error``; then a model whose float32
    parameters (``bytes_per_element`` each) exceed the memory available now, as a ResourceError (unless
    not ``memory``: a reader that builds no model, only reads a file's tokenizer).

    ``layers``: (claimed, present) block counts, where the reader knows them from the tensor names. A
    claim within the layers present leaves a width that differs to the reader's own tensor-by-tensor
    comparison, whose work the file bounds and whose refusal names the tensor."""
    from gptforge import resources
    from gptforge.errors import ResourceError

    if present is not None and claimed > present:
        if layers is not None and layers[0] <= layers[1]:
            return  # the reader names the tensor that differs; nothing of the claimed size is built before it
        in_layers = (f" in {layers[0]:,} layers", f" in {layers[1]:,}") if layers is not None else ("", "")
        raise error(f"{where}: the weights do not fit {family} as {what} sizes it: it implies {claimed:,} parameters"
                    f"{in_layers[0]}, the weights hold {present:,}{in_layers[1]}; refusing before building anything "
                    f"(is {what} from another model?)")
    need = claimed * bytes_per_element
    free = resources.free_memory() if memory else None
    if free is not None and need > free.bytes:
        raise ResourceError(f"{where}: {family} as {what} sizes it has {claimed:,} parameters, {need / 2**30:,.1f} GiB "
                            f"in float32 before any activation, and {free}; "
                            "use a smaller model or a machine with more memory")


_BLOCK = re.compile(r"\.(\d+)\.")  # a block's index in a tensor name: h.3. / layers.3. / blk.3.


def count_layers(names: Iterable[str]) -> int:
    """Blocks the tensor ``names`` hold: distinct indices (the first number between dots in each name)."""
    return len({m.group(1) for n in names if (m := _BLOCK.search(n))})


def safetensors_shapes(files: Iterable, error: type[Exception]) -> dict[str, tuple[int, ...]]:
    """{name: shape} over the safetensors ``files``, from their headers alone (each entry's shape checked
    against its byte range and the file's size, so a header cannot claim more than its bytes); ``error``."""
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        out.update(weights_header(f, error, "not a safetensors file gptforge can read"))
    return out
