"""``rope_freqs.weight`` read from a whole GGUF file (issue 36, lane ``gguf-read``): llama.cpp's Llama 3.1/3.2
files carry their rope scaling as this tensor of per-frequency divisors. ``read_gguf`` reads it before the
config (its values are the scaling), checks its shape (one row of at most 4,096 divisors), and leaves it out of
the weights. The divisors are the converter's, computed in float64 by test_gguf_rope_scaling.py; the logits
are checked against the same weights in a model built with Meta's parameters given directly."""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf import llama_tensors  # noqa: E402
from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
from tests.interop.test_gguf_read import tiny_llama, write_gguf  # noqa: E402
from tests.interop.test_gguf_rope_scaling import converter_rope_freqs  # noqa: E402

LLAMA3 = dict(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_context=32)


def _file(tmp_path, freqs, block_size=64):
    model = tiny_llama(block_size=block_size)  # 4 heads of 16 channels, theta 500
    tensors = {"rope_freqs.weight": freqs, **llama_tensors(model)}  # first, where llama.cpp's converter writes it
    kv = {"llama.rope.scaling.original_context_length": 32}
    return model, write_gguf(tmp_path / "m.gguf", model, kv=kv, tensors=tensors)


def test_llama3_divisors_become_the_configs_scaling_and_no_weight(tmp_path):
    model, path = _file(tmp_path, converter_rope_freqs(8.0, 1.0, 4.0, 32, head_dim=16, theta=500.0), block_size=96)
    g = read_gguf(path)
    got = {k: getattr(g.model.config, k) for k in LLAMA3}
    assert got == LLAMA3
    assert not any("rope_freqs" in k for k in g.model.state_dict())
    # what read_gguf hands back besides the model: the file, its metadata, the document separator
    assert g.path == path and g.metadata["llama.rope.scaling.original_context_length"] == 32
    assert g.metadata["general.architecture"] == "llama" and g.model.config.bos_token == g.tokenizer.eot_token
    # the same weights under Meta's parameters given directly: the same logits, and not the unscaled ones
    ref = Llama(LlamaConfig(**{**model.config.to_dict(), **LLAMA3}))
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.config.vocab_size, (1, 90), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs, plain = g.model(ids)[0], ref.eval()(ids)[0], model(ids[:, :64])[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[:, :64], plain, atol=1e-3)


@pytest.mark.parametrize(("freqs", "shape"), [(torch.ones(2, 8), [2, 8]), (torch.ones(4097), [4097])])
def test_a_divisor_tensor_of_another_shape_is_refused_before_it_is_read(tmp_path, freqs, shape):
    _, path = _file(tmp_path, freqs)
    with pytest.raises(GGUFReadError) as e:
        read_gguf(path, weights=False)
    assert str(e.value) == f"{path}: tensor rope_freqs.weight has shape {shape}, not (head_dim/2,)"


def test_the_largest_divisor_tensor_reaches_the_config_check(tmp_path):
    """4,096 divisors (head_dim 8,192) pass the shape bound; this model's heads of 16 then refuse them."""
    _, path = _file(tmp_path, torch.ones(4096))
    with pytest.raises(GGUFReadError) as e:
        read_gguf(path, weights=False)
    assert "tensor rope_freqs.weight" in str(e.value) and "not (head_dim/2,)" not in str(e.value)

