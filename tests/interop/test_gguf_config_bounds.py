"""GGUF metadata to a Llama or GPT config, key by key (issue 36, lane ``gguf``): each hyperparameter is
read from its llama.cpp key into its field, each bound is tried on both sides (the largest value allowed
builds a config, one more is refused naming the key, the value and the bound), and every refusal is one
line that names the file. The metadata are plain dicts, as ``read_gguf`` hands them over, so each case
runs in microseconds; test_gguf_read.py and test_llama_variants.py read whole files.

The defaults are llama.cpp's (``llm_load_hparams``): ``head_count_kv`` absent means ``head_count``,
``rope.freq_base`` absent means 10,000; the RMS epsilon has no default there, so none here."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptforge.interop.gguf_config import gpt2_config_from_gguf, llama_config_from_gguf
from gptforge.interop.gguf_tokenizer import GGUFReadError

PATH = Path("/models/m.gguf")
VOCAB = 100
NOT_IMPLEMENTED = "does not implement it and will not load the model wrong"


def llama_kv(arch: str = "llama", **over) -> dict:
    kv = {"general.architecture": arch, f"{arch}.block_count": 3, f"{arch}.embedding_length": 64,
          f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
          f"{arch}.feed_forward_length": 96, f"{arch}.context_length": 48, f"{arch}.rope.freq_base": 500.0,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    kv.update({f"{arch}.{k}" if not k.startswith("general.") else k: v for k, v in over.items()})
    return {k: v for k, v in kv.items() if v is not None}


def gpt2_kv(**over) -> dict:
    kv = {"general.architecture": "gpt2", "gpt2.block_count": 3, "gpt2.embedding_length": 64,
          "gpt2.attention.head_count": 4, "gpt2.feed_forward_length": 256, "gpt2.context_length": 48,
          "gpt2.attention.layer_norm_epsilon": 1e-5}
    kv.update({f"gpt2.{k}": v for k, v in over.items()})
    return {k: v for k, v in kv.items() if v is not None}


def llama(kv: dict, names=frozenset({"output.weight"}), arrays=None, vocab=VOCAB):
    return llama_config_from_gguf(kv, arrays or {}, set(names), PATH, vocab)


def refused(fn, *args) -> str:
    with pytest.raises(GGUFReadError) as e:
        fn(*args)
    msg = str(e.value)
    assert msg.startswith(f"{PATH}: ") and "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------------------------------------ Llama

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_llama_key_lands_in_its_field(arch):
    cfg = llama(llama_kv(arch))
    got = {k: getattr(cfg, k) for k in ("n_layer", "n_embd", "n_head", "n_kv_head", "intermediate_size",
                                        "block_size", "vocab_size", "rope_theta", "norm_eps", "tie_embeddings",
                                        "qkv_bias", "rope_type")}
    assert got == dict(n_layer=3, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=96, block_size=48,
                       vocab_size=VOCAB, rope_theta=500.0, norm_eps=1e-6, tie_embeddings=False,
                       qkv_bias=arch == "qwen2", rope_type="default")
    assert type(cfg.rope_theta) is float and type(cfg.norm_eps) is float
    # no output.weight: the embedding is the head (tied); the names of other tensors do not matter
    assert llama(llama_kv(arch), names={"token_embd.weight", "output_norm.weight"}).tie_embeddings


def test_llama_cpp_defaults_and_an_int_where_a_float_is_stored():
    cfg = llama(llama_kv(**{"attention.head_count_kv": None, "rope.freq_base": None}))
    assert (cfg.n_kv_head, cfg.rope_theta) == (4, 10_000.0)  # head_count_kv = head_count; theta 10,000
    cfg = llama(llama_kv(**{"rope.freq_base": 10_000, "attention.layer_norm_rms_epsilon": 1}))
    assert (cfg.rope_theta, cfg.norm_eps) == (10_000.0, 1.0) and type(cfg.norm_eps) is float
    assert llama(llama_kv(**{"rope.freq_base": 1e-3})).rope_theta == 1e-3


@pytest.mark.parametrize(("key", "hi"), [("block_count", 1024), ("embedding_length", 1 << 16),
                                         ("attention.head_count", 1 << 10), ("attention.head_count_kv", 1 << 10),
                                         ("feed_forward_length", 1 << 18), ("context_length", 1 << 24)])
def test_llama_bounds_on_both_sides(key, hi):
    # the others set so that the largest value makes whole, even heads
    fit = {"attention.head_count": {"embedding_length": 2048, "attention.head_count_kv": 1},
           "attention.head_count_kv": {"embedding_length": 2048, "attention.head_count": 1024}}.get(key, {})
    cfg = llama(llama_kv(**fit, **{key: hi}))
    field = {"block_count": "n_layer", "embedding_length": "n_embd", "attention.head_count": "n_head",
             "attention.head_count_kv": "n_kv_head", "feed_forward_length": "intermediate_size",
             "context_length": "block_size"}[key]
    assert getattr(cfg, field) == hi
    for v in (hi + 1, 0, -1):
        msg = refused(llama, llama_kv(**fit, **{key: v}))
        assert msg == f"{PATH}: metadata key llama.{key}={v} is out of range (1 to {hi})", msg


def test_llama_smallest_model_reads():
    """One layer, one head of two channels, a one-wide MLP, a one-token context: the lower bounds' side."""
    cfg = llama(llama_kv(**{"block_count": 1, "embedding_length": 2, "attention.head_count": 1,
                            "attention.head_count_kv": 1, "feed_forward_length": 1, "context_length": 1}))
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.intermediate_size, cfg.block_size) == (1, 2, 1, 1,
                                                                                                          1, 1)


@pytest.mark.parametrize(("embd", "heads", "kv"), [(64, 5, 5), (64, 4, 3), (12, 4, 2), (64, 64, 64)])
def test_llama_heads_must_be_whole_even_and_shared_evenly(embd, heads, kv):
    msg = refused(llama, llama_kv(**{"embedding_length": embd, "attention.head_count": heads,
                                     "attention.head_count_kv": kv}))
    assert msg == (f"{PATH}: llama.embedding_length={embd}, llama.attention.head_count={heads} and "
                   f"llama.attention.head_count_kv={kv} "
                   "do not make whole, even heads shared evenly"), msg


@pytest.mark.parametrize("theta", [0.0, -500.0, float("nan"), float("inf"), 0])
def test_llama_rope_base_must_be_a_positive_number(theta):
    msg = refused(llama, llama_kv(**{"rope.freq_base": theta}))
    assert msg == f"{PATH}: metadata key llama.rope.freq_base={theta} must be a positive number", msg


def test_llama_epsilon_is_required_and_a_config_refusal_names_the_file():
    msg = refused(llama, llama_kv(**{"attention.layer_norm_rms_epsilon": None}))
    assert msg == (f"{PATH}: metadata key llama.attention.layer_norm_rms_epsilon is missing; gptforge needs it to "
                   "build the Llama"), msg
    msg = refused(llama, llama_kv(**{"attention.layer_norm_rms_epsilon": 0.0}))  # the file's key, not model.norm_eps
    assert msg == f"{PATH}: metadata key llama.attention.layer_norm_rms_epsilon=0.0 must be a positive number", msg


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                                 "context_length"])
def test_llama_required_keys(key):
    msg = refused(llama, llama_kv(**{key: None}))
    assert msg == f"{PATH}: metadata key llama.{key} is missing; gptforge needs it to build the Llama", msg
    msg = refused(llama, llama_kv(**{key: 4.0}))
    assert msg == f"{PATH}: metadata key llama.{key}=4.0 has the wrong type", msg


def test_llama_optional_keys_of_the_wrong_type_and_rope_refusals_name_the_file():
    msg = refused(llama, llama_kv(**{"attention.head_count_kv": 2.0}))
    assert msg == f"{PATH}: metadata key llama.attention.head_count_kv=2.0 has the wrong type", msg
    msg = refused(llama, llama_kv(**{"rope.freq_base": "500"}))
    assert msg == f"{PATH}: metadata key llama.rope.freq_base='500' has the wrong type", msg
    msg = refused(llama, llama_kv(**{"rope.scaling.factor": -2.0}))
    assert msg == (f"{PATH}: llama.rope.scaling.factor=-2.0: a rope scaling factor must be positive; gptforge's Llama "
                   f"{NOT_IMPLEMENTED}"), msg


@pytest.mark.parametrize("key", ["rope.dimension_count", "attention.key_length", "attention.value_length"])
def test_llama_head_widths_other_than_embedding_over_heads_are_refused(key):
    assert llama(llama_kv(**{key: 16})).head_dim == 16  # what converters write: the same width
    if key == "attention.key_length":  # a head size apart (Mistral Nemo, Qwen3, Gemma): model.head_size
        assert (llama(llama_kv(**{key: 8})).head_dim, llama(llama_kv(**{key: 8})).head_size) == (8, 8)
        return
    msg = refused(llama, llama_kv(**{key: 8}))
    assert msg == (f"{PATH}: llama.{key}=8: heads of 16 channels (attention.key_length, or embedding_length/"
                   f"head_count), all of them rotated; gptforge's Llama {NOT_IMPLEMENTED}"), msg


@pytest.mark.parametrize("key", ["feed_forward_length", "attention.head_count", "attention.head_count_kv"])
def test_per_layer_widths_are_refused(key):
    for arch, kv, what in (("llama", llama_kv(), "Llama"), ("qwen2", llama_kv("qwen2"), "Llama"),
                           ("gpt2", gpt2_kv(), "GPT")):
        arrays = {f"{arch}.{key}": [96, 96, 96]}
        if arch == "gpt2":
            msg = refused(gpt2_config_from_gguf, kv, arrays, PATH, VOCAB)
        else:
            msg = refused(llama_config_from_gguf, kv, arrays, set(), PATH, VOCAB)
        assert msg == f"{PATH}: {arch}.{key}='an array': per-layer widths; gptforge's {what} {NOT_IMPLEMENTED}", msg


@pytest.mark.parametrize("arch", [None, "mistral", "gemma", "LLAMA", 7])
def test_other_architectures_are_refused(arch):
    kv = llama_kv()
    kv["general.architecture"] = arch
    msg = refused(llama, {k: v for k, v in kv.items() if v is not None})
    assert msg == (f"{PATH}: general.architecture={arch!r}; gptforge reads GGUF architectures llama, qwen2, gpt2, "
                   "qwen3, gemma2, gemma3, phi3"), msg


def test_llama_vocabulary_and_extras_are_checked_with_the_llama_name():
    msg = refused(llama, llama_kv(**{"vocab_size": VOCAB + 1}))
    assert msg == f"{PATH}: llama.vocab_size={VOCAB + 1} but tokenizer.ggml.tokens holds {VOCAB}", msg
    msg = refused(llama, llama_kv("qwen2", **{"expert_count": 4}))
    assert msg == (f"{PATH}: qwen2.expert_count=4: experts and sliding windows; gptforge's Llama "
                   f"{NOT_IMPLEMENTED}"), msg
    assert llama(llama_kv(), vocab=7).vocab_size == 7


def test_llama_rope_scaling_reaches_the_config_with_the_head_width_and_base():
    """``_rope_scaling`` (test_gguf_rope_scaling.py) gets this file's head width and base: Llama 3 divisors
    for 16-channel heads and base 500 read only with those."""
    from tests.interop.test_gguf_rope_scaling import converter_rope_freqs

    freqs = converter_rope_freqs(8.0, 1.0, 4.0, 32, head_dim=16, theta=500.0)
    kv = llama_kv(**{"rope.scaling.original_context_length": 32})
    cfg = llama_config_from_gguf(kv, {}, set(), PATH, VOCAB, freqs)
    assert (cfg.rope_type, cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
            cfg.rope_original_context) == ("llama3", 8.0, 1.0, 4.0, 32)
    cfg = llama(llama_kv(**{"rope.scaling.factor": 4.0}))
    assert (cfg.rope_type, cfg.rope_factor) == ("linear", 4.0)


# ------------------------------------------------------------------------------------------------ GPT-2

def gpt2(kv: dict, arrays=None, vocab=VOCAB):
    return gpt2_config_from_gguf(kv, arrays or {}, PATH, vocab)


def test_each_gpt2_key_lands_in_its_field():
    cfg = gpt2(gpt2_kv())
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size) == (3, 64, 4, 48, VOCAB)
    cfg = gpt2(gpt2_kv(**{"attention.head_count_kv": 4}), vocab=9)  # grouped heads key equal to heads: fine
    assert (cfg.n_head, cfg.vocab_size) == (4, 9)


@pytest.mark.parametrize(("key", "hi"), [("block_count", 1024), ("embedding_length", 1 << 16),
                                         ("attention.head_count", 1 << 10), ("feed_forward_length", 1 << 18),
                                         ("context_length", 1 << 24)])
def test_gpt2_bounds_on_both_sides(key, hi):
    fit = {"embedding_length": {"feed_forward_length": 4 << 16},
           "attention.head_count": {"embedding_length": 1024, "feed_forward_length": 4096}}.get(key, {})
    if key == "feed_forward_length":  # the MLP must be 4 x embedding_length: its bound refuses first
        fit = {"embedding_length": 1 << 16}
        for v in (hi + 1, 0, -1):
            msg = refused(gpt2, gpt2_kv(**fit, **{key: v}))
            assert msg == f"{PATH}: metadata key gpt2.{key}={v} is out of range (1 to {hi})", msg
        return
    cfg = gpt2(gpt2_kv(**fit, **{key: hi}))
    field = {"block_count": "n_layer", "embedding_length": "n_embd", "attention.head_count": "n_head",
             "context_length": "block_size"}[key]
    assert getattr(cfg, field) == hi
    for v in (hi + 1, 0, -1):
        msg = refused(gpt2, gpt2_kv(**fit, **{key: v}))
        assert msg == f"{PATH}: metadata key gpt2.{key}={v} is out of range (1 to {hi})", msg


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                                 "context_length", "attention.layer_norm_epsilon"])
def test_gpt2_required_keys(key):
    msg = refused(gpt2, gpt2_kv(**{key: None}))
    assert msg == f"{PATH}: metadata key gpt2.{key} is missing; gptforge needs it to build the GPT", msg
    msg = refused(gpt2, gpt2_kv(**{key: "4"}))
    assert msg == f"{PATH}: metadata key gpt2.{key}='4' has the wrong type", msg


def test_gpt2_smallest_model_reads():
    cfg = gpt2(gpt2_kv(**{"block_count": 1, "embedding_length": 1, "attention.head_count": 1,
                          "feed_forward_length": 4, "context_length": 1}), vocab=1)
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size) == (1, 1, 1, 1, 1)


def test_gpt2_refusals_name_key_value_and_what_gpt_would_need():
    msg = refused(gpt2, gpt2_kv(**{"attention.head_count": 5}))
    assert msg == f"{PATH}: gpt2.embedding_length=64 is not whole heads of gpt2.attention.head_count=5", msg
    msg = refused(gpt2, gpt2_kv(**{"attention.head_count_kv": 2}))
    assert msg == (f"{PATH}: gpt2.attention.head_count_kv=2: grouped keys and values (head_count is 4); gptforge's GPT "
                   f"{NOT_IMPLEMENTED}"), msg
    for ffn in (255, 257, 128):
        msg = refused(gpt2, gpt2_kv(**{"feed_forward_length": ffn}))
        assert msg == (f"{PATH}: gpt2.feed_forward_length={ffn}: an MLP other than 4 x embedding_length (256); "
                       f"gptforge's GPT {NOT_IMPLEMENTED}"), msg
    msg = refused(gpt2, gpt2_kv(**{"attention.layer_norm_epsilon": None}))
    assert msg == f"{PATH}: metadata key gpt2.attention.layer_norm_epsilon is missing; gptforge needs it to build the GPT"
    msg = refused(gpt2, gpt2_kv(**{"block_count": "3"}))
    assert msg == f"{PATH}: metadata key gpt2.block_count='3' has the wrong type", msg
    msg = refused(gpt2, gpt2_kv(**{"vocab_size": 5}))
    assert msg == f"{PATH}: gpt2.vocab_size=5 but tokenizer.ggml.tokens holds {VOCAB}", msg
    msg = refused(gpt2, gpt2_kv(**{"attention.sliding_window": 64}))
    assert msg.endswith(f"experts and sliding windows; gptforge's GPT {NOT_IMPLEMENTED}"), msg


def test_gpt2_epsilon_is_layernorms_to_float32_precision():
    """nn.LayerNorm's 1e-5, stored as float32 (9.99999975e-06): accepted to a part in 10^6 either side."""
    import numpy as np

    for eps in (1e-5, float(np.float32(1e-5)), 1e-5 * (1 + 9e-7), 1e-5 * (1 - 9e-7)):
        assert gpt2(gpt2_kv(**{"attention.layer_norm_epsilon": eps}))
    for eps in (1e-5 * (1 + 2e-6), 1e-5 * (1 - 2e-6), 1e-6, 0.0, float("nan"), -1e-5):
        msg = refused(gpt2, gpt2_kv(**{"attention.layer_norm_epsilon": eps}))
        assert msg == (f"{PATH}: gpt2.attention.layer_norm_epsilon={eps!r}: a LayerNorm epsilon other than 1e-05; "
                       f"gptforge's GPT {NOT_IMPLEMENTED}"), msg
