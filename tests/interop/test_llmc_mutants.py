"""gptforge.interop.llmc where the `interop` mutation lane found its tests blind (issue 36). llm.c reads a
model file's header as 256 int32 (train_gpt2.cu ``gpt2_build_from_checkpoint``: ``freadCheck(model_header,
sizeof(int), 256, model_file)``) and only then the parameters; checking a file's header must likewise
read the header, not the whole model (GPT-2 XL's file is 6 GB). Checked with a sparse file of 64 MiB
whose header is valid for its size: the memory numpy allocates while the header is checked (tracemalloc
sees numpy's buffers) must stay near the header's 1 KiB."""

from __future__ import annotations

import tracemalloc

import numpy as np

from gptforge.interop import llmc


def test_checking_a_big_model_files_header_reads_the_header_only(tmp_path):
    L, NH, C, T, Vp = 1, 1, 8, 8, 1 << 21  # wte: 2M x 8 float32 = 64 MiB
    n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # llm.c's fill_in_parameter_sizes, summed
    h = np.zeros(256, dtype="<i4")
    h[:8] = [20240326, 3, T, Vp, L, NH, C, Vp]
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.truncate(1024 + 4 * n)  # sparse: no disk used
    tracemalloc.start()
    try:
        info = llmc.read_model_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info["num_params"] == n and info["Vp"] == Vp
    assert peak < 1 << 20, f"{peak:,} bytes allocated to check a header"
