"""``read_gguf`` against independent references, for the bugs a person makes in a GGUF reader (issues 32
and 36's hand-planted audit): the model through transformers' own GGUF loader (q/k row order, tied
head, rope theta, rms epsilon, qwen2's unpermuted rows, a custom alignment), every supported tensor
type through the ``gguf`` package's ``dequantize`` of the same bytes (the K-quants included), and the
header's bounds. Files are written small with ``gguf.GGUFWriter``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from tests.interop.test_gguf_read import tiny_llama, write_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType


def _without_key(src: Path, dst: Path, key: str) -> Path:
    """``src`` rewritten by the gguf package's reader and writer with metadata ``key`` left out."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8"))
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", key):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), vt)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_llama_without_its_rms_epsilon_is_refused(tmp_path, capsys):
    """llama.cpp requires ``llama.attention.layer_norm_rms_epsilon`` (``get_key`` with required true in
    its llama hparams) and transformers' loader, finding none, keeps LlamaConfig's 1e-6; a reader that
    guesses (1e-5 here before) loads a model neither of them would. So a file without it is refused in
    one line naming the file and the key, by the reader and by ``gptforge import gguf`` (exit 2)."""
    from gptforge.cli import main

    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    assert read_gguf(good, weights=False).model is None
    key = "llama.attention.layer_norm_rms_epsilon"
    bad = _without_key(good, tmp_path / "noeps.gguf", key)
    with pytest.raises(GGUFReadError, match=rf"{key} is missing") as e:
        read_gguf(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    assert main(["import", "gguf", "--model", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err and key in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()
