"""``gptforge export`` writes a model in its own dtype by default, as transformers' ``save_pretrained`` does
(issue 55: a bfloat16 SmolLM2 came out float32, twice its size), and says which dtype and why. The reference
is safetensors' own reader of the files written and the source's tensors as transformers saved them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from gptforge.cli import main

transformers = pytest.importorskip("transformers")


def _bf16_llama(path, vocab: int = 300):
    """A tiny Llama saved by transformers in bfloat16 (config.json: torch_dtype/dtype bfloat16)."""
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5)).to(torch.bfloat16)
    m.save_pretrained(path)
    return {k: v.clone() for k, v in m.state_dict().items()}


def _written(d) -> dict[str, torch.Tensor]:
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def test_a_bfloat16_model_exports_as_bfloat16_and_says_so(tmp_path, capsys):
    want = _bf16_llama(tmp_path / "src")
    assert main(["export", "hf", "--hf", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--no-tokenizer"]) == 0
    err = capsys.readouterr().err
    assert f"as bfloat16 (the model's own: {tmp_path / 'src' / 'config.json'}'s " in err, err
    got = _written(tmp_path / "out")
    assert {v.dtype for v in got.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    for k, v in got.items():  # bf16 -> float32 -> bf16 is exact: the very values transformers saved
        assert torch.equal(v, want[k]), k
    # --dtype still chooses: float32, twice the bytes, said as chosen
    assert main(["export", "hf", "--hf", str(tmp_path / "src"), "--out", str(tmp_path / "f32"), "--no-tokenizer",
                 "--dtype", "float32"]) == 0
    assert "as float32 (--dtype)" in capsys.readouterr().err
    assert {v.dtype for v in _written(tmp_path / "f32").values()} == {torch.float32}
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["torch_dtype"] == "float32"


def test_an_import_remembers_its_dtype_for_export(tmp_path, capsys):
    want = _bf16_llama(tmp_path / "src", vocab=50257)  # no tokenizer files: GPT-2's is recorded
    assert main(["import", "hf", "--model", str(tmp_path / "src"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", "hf", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out"),
                 "--no-tokenizer"]) == 0
    assert "as bfloat16 (the model's own: imported from " in capsys.readouterr().err
    got = _written(tmp_path / "out")
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, want[k]) for k, v in got.items())


def test_a_trained_gpt2_checkpoint_exports_float32(tmp_path, capsys):
    from tests.conftest import tiny_chat_checkpoint

    where = tiny_chat_checkpoint(tmp_path / "run")
    assert main(["export", "hf", "--ckpt", str(where), "--out", str(tmp_path / "out")]) == 0
    assert "as float32 (the model's own: a gptforge checkpoint's weights are float32" in capsys.readouterr().err
    assert {v.dtype for v in _written(tmp_path / "out").values()} == {torch.float32}
    assert main(["export", "hf", "--ckpt", str(where), "--out", str(tmp_path / "bf"), "--dtype", "bf16"]) == 0
    assert {v.dtype for v in _written(tmp_path / "bf").values()} == {torch.bfloat16}  # GPT-2's exporter too


@pytest.mark.parametrize("qtype,dtype", [("F16", "float16"), ("Q8_0", "float32"), ("F32", "float32")])
def test_a_gguf_exports_in_its_matrices_type(tmp_path, capsys, qtype, dtype):
    pytest.importorskip("gguf")
    from tests.interop.test_gguf_read import tiny_llama, write_gguf

    src = write_gguf(tmp_path / "m.gguf", tiny_llama(), qtype=qtype)
    assert main(["export", "hf", "--gguf", str(src), "--out", str(tmp_path / "out"), "--no-tokenizer"]) == 0
    err = capsys.readouterr().err
    assert f"as {dtype} (the model's own: the GGUF file's matrices are {qtype}" in err, err
    assert {v.dtype for v in _written(tmp_path / "out").values()} == {getattr(torch, dtype)}
