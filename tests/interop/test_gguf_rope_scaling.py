"""A GGUF's rope scaling read as llama.cpp's loader reads it (issue 36, lane ``gguf``: mutmut found
``gguf_config._rope_scaling`` pinned only by two refusals). The reference is llama.cpp's own rules,
written out here rather than taken from gptforge:

- ``llm_load_hparams``: ``{arch}.rope.scaling.type`` defaults to "linear"; the factor is
  ``{arch}.rope.scaling.factor``, and 0 means none (``rope_freq_scale_train = factor == 0 ? 1 : 1/factor``),
  so every frequency is divided by the factor whatever the type says ("none" included);
- ``convert_hf_to_gguf.py``'s ``LlamaModel.generate_extra_tensors``: Llama 3.1/3.2's scaling travels as
  per-frequency divisors in tensor ``rope_freqs.weight``, computed from Meta's formula (in float64 below).

What gptforge cannot represent (another type, a factor that is not a positive number, divisors beside a
factor or under another architecture, divisors no scaling reproduces) is refused in one line naming the
file, the key and its value."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gptforge.interop.gguf_config import _rope_scaling
from gptforge.interop.gguf_tokenizer import GGUFReadError

PATH = Path("/models/m.gguf")
HEAD_DIM, THETA = 16, 500.0
NONE = {"rope_type": "default"}  # what a Llama config holds unscaled (LlamaConfig's defaults)


def converter_rope_freqs(factor: float, low: float, high: float, orig: int, head_dim: int = HEAD_DIM,
                         theta: float = THETA) -> torch.Tensor:
    """llama.cpp's converter, written out: 1 for short wavelengths, ``factor`` for long ones, and the
    smooth blend ``1 / ((1 - s) / factor + s)`` between, s = (orig / wavelen - low) / (high - low)."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            s = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return torch.tensor(out, dtype=torch.float64).float()


def fields(scalars: dict, arch: str = "llama", rope_freqs: torch.Tensor | None = None) -> dict:
    out = _rope_scaling(scalars, PATH, arch, HEAD_DIM, THETA, rope_freqs)
    return {"rope_type": "default", **out}


def refused(scalars: dict, arch: str = "llama", rope_freqs: torch.Tensor | None = None) -> str:
    with pytest.raises(GGUFReadError) as e:
        _rope_scaling(scalars, PATH, arch, HEAD_DIM, THETA, rope_freqs)
    msg = str(e.value)
    assert msg.startswith(f"{PATH}: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_factor_divides_every_frequency_whatever_the_type_says(arch):
    """llama.cpp reads the factor whatever ``rope.scaling.type`` holds ("linear", "none", empty, or no type
    key: linear is its default), so each of these is linear scaling by that factor; an int factor is a factor."""
    for kind in (None, "linear", "none", ""):
        for factor in (4.0, 0.5, 3, 1e-3, 1e6):
            scalars = {f"{arch}.rope.scaling.factor": factor}
            if kind is not None:
                scalars[f"{arch}.rope.scaling.type"] = kind
            got = fields(scalars, arch)
            assert got == {"rope_type": "linear", "rope_factor": float(factor)}, (kind, factor, got)
            assert type(got["rope_factor"]) is float


@pytest.mark.parametrize("factor", [None, 0.0, 0, 1.0, 1])
def test_no_factor_a_zero_or_a_one_is_no_scaling(factor):
    """llama.cpp: a missing factor is 0, and 0 means a scale of 1; 1 divides by 1. Either is no scaling,
    not ``linear`` with factor 1 (which gptforge's config refuses as a contradiction)."""
    for kind in (None, "linear", "none"):
        scalars = {} if factor is None else {"llama.rope.scaling.factor": factor}
        if kind is not None:
            scalars["llama.rope.scaling.type"] = kind
        assert fields(scalars) == NONE, (kind, factor)
    # another architecture's keys are not this one's
    assert fields({"qwen2.rope.scaling.factor": 4.0}) == NONE


@pytest.mark.parametrize("kind", ["yarn", "longrope", "dynamic", "LINEAR", "su", "XXlinearXX"])
def test_other_scaling_types_are_refused_naming_key_and_value(kind):
    """Types llama.cpp knows (yarn, longrope) and types nobody writes are refused, each naming the key
    and the value, before the factor is looked at."""
    for arch in ("llama", "qwen2"):
        msg = refused({f"{arch}.rope.scaling.type": kind, f"{arch}.rope.scaling.factor": 4.0}, arch)
        assert msg == (f"{PATH}: {arch}.rope.scaling.type={kind!r}: only linear rope scaling and Llama 3's "
                       "(rope_freqs.weight) are implemented; gptforge's Llama does not implement it and will not "
                       "load the model wrong"), msg


@pytest.mark.parametrize("factor", [-1.0, -4, float("nan"), float("inf"), float("-inf"), -1e-9])
def test_a_factor_that_is_not_a_positive_number_is_refused(factor):
    msg = refused({"llama.rope.scaling.factor": factor})
    assert msg == (f"{PATH}: llama.rope.scaling.factor={factor!r}: a rope scaling factor must be positive; "
                   "gptforge's Llama does not implement it and will not load the model wrong"), msg


@pytest.mark.parametrize("value", ["4", True, [4.0]])
def test_a_factor_of_the_wrong_type_is_refused(value):
    msg = refused({"llama.rope.scaling.factor": value})
    assert msg == f"{PATH}: metadata key llama.rope.scaling.factor={value!r} has the wrong type", msg


def test_llama3_divisors_from_the_converter_become_llama3_scaling():
    """The converter's divisors for Meta's Llama 3.1 parameters (factor 8, low 1, high 4, here an original
    context of 32 tokens so the blend falls inside a 16-channel head) read back as those parameters, with
    the original context from ``rope.scaling.original_context_length`` or, when absent (or not a positive
    int), fitted from the divisors."""
    want = {"rope_type": "llama3", "rope_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
            "rope_original_context": 32}
    freqs = converter_rope_freqs(8.0, 1.0, 4.0, 32)
    assert 1.0 < float(freqs[1]) < 8.0 and float(freqs[0]) == 1.0 and float(freqs[-1]) == 8.0  # all three regions
    for orig in (32, None, 0, -5, "32"):
        scalars = {} if orig is None else {"llama.rope.scaling.original_context_length": orig}
        assert fields(scalars, rope_freqs=freqs) == want, orig
    # the original context is read, not only fitted: another one with the same divisors fits other factors
    other = fields({"llama.rope.scaling.original_context_length": 64}, rope_freqs=freqs)
    assert other["rope_original_context"] == 64 and other["rope_low_freq_factor"] == pytest.approx(2.0)
    one = fields({"llama.rope.scaling.original_context_length": 1}, rope_freqs=freqs)  # the smallest read as given
    assert one["rope_original_context"] == 1 and one["rope_low_freq_factor"] == pytest.approx(1 / 32)
    # a type key "linear" or "none" and a factor of 0 or 1 beside the divisors are no factor
    for extra in ({"llama.rope.scaling.type": "linear"}, {"llama.rope.scaling.factor": 1.0},
                  {"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 0.0}):
        assert fields(extra, rope_freqs=freqs) == want, extra


def test_divisors_all_one_or_one_value_are_no_scaling_or_linear():
    assert fields({}, rope_freqs=torch.ones(HEAD_DIM // 2)) == NONE
    assert fields({}, rope_freqs=torch.full((HEAD_DIM // 2,), 4.0)) == {"rope_type": "linear", "rope_factor": 4.0}


def test_divisors_beside_a_factor_or_under_another_architecture_are_refused():
    freqs = converter_rope_freqs(8.0, 1.0, 4.0, 32)
    for factor in (2.0, 0.5):
        msg = refused({"llama.rope.scaling.factor": factor}, rope_freqs=freqs)
        assert msg == (f"{PATH}: tensor rope_freqs.weight='present': per-frequency rope divisors with architecture "
                       f"llama or llama.rope.scaling.factor={factor}; gptforge's Llama does not implement it and will "
                       "not load the model wrong"), msg
    msg = refused({}, arch="qwen2", rope_freqs=freqs)
    assert msg.startswith(f"{PATH}: tensor rope_freqs.weight='present': per-frequency rope divisors with "
                          "architecture qwen2 or qwen2.rope.scaling.factor=0.0;"), msg


@pytest.mark.parametrize("bad", ["reversed", "negative", "short", "nan"])
def test_divisors_no_scaling_reproduces_are_refused_with_their_first_values(bad):
    freqs = converter_rope_freqs(8.0, 1.0, 4.0, 32)
    freqs = {"reversed": freqs.flip(0), "negative": -freqs, "short": freqs[:-1],
             "nan": torch.cat([freqs[:-1], torch.tensor([float("nan")])])}[bad]
    msg = refused({"llama.rope.scaling.original_context_length": 32}, rope_freqs=freqs)
    assert msg == (f"{PATH}: tensor rope_freqs.weight={freqs[:4].tolist()!r}: these per-frequency rope divisors "
                   "follow neither linear nor Llama 3's scaling; gptforge's Llama does not implement it and will "
                   "not load the model wrong"), msg
