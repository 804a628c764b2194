"""A config float keeps the decimal its writer meant (issue 55): GGUF stores ``rms_norm_eps`` as float32, and
reading it as a Python float gave 9.999999747378752e-06 for 1e-05, which then travelled into every config.json
an export wrote. The reference is the decimal the test's writer typed, and for any float32 the shortest
decimal found by counting digits (``%.{p}g`` for p = 1, 2, ...), a different algorithm from numpy's."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.interop.gguf_read import read_gguf, shortest_float32  # noqa: E402
from tests.interop.test_gguf_read import tiny_llama, write_gguf  # noqa: E402


def _digits_shortest(v32: float) -> float:
    for p in range(1, 10):  # float32 needs at most 9 significant digits
        d = float(f"{v32:.{p}g}")
        if np.float32(d) == np.float32(v32):
            return d
    raise AssertionError(v32)


def test_shortest_float32_is_the_shortest_decimal_of_the_same_float32():
    rng = random.Random(0)
    bits = [rng.getrandbits(32) for _ in range(3000)] + [0x3727C5AC, 0x358637BD, 0x47C35000]  # 1e-5, 1e-6, 1e5
    for b in bits:
        v = struct.unpack("<f", struct.pack("<I", b))[0]
        if not np.isfinite(v):
            continue
        got = shortest_float32(v)
        assert np.float32(got) == np.float32(v) and got == _digits_shortest(v), (hex(b), v, got)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 3e-7])
def test_a_gguf_epsilon_reads_and_exports_as_written(tmp_path, eps):
    src = write_gguf(tmp_path / "m.gguf", tiny_llama(norm_eps=eps))
    assert read_gguf(src).model.config.norm_eps == eps  # exactly: 1e-05, not 9.999999747378752e-06
    assert main(["export", "hf", "--gguf", str(src), "--out", str(tmp_path / "hf"), "--no-tokenizer"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rms_norm_eps"] == eps
