"""The Llama variants common small models need, against transformers as the independent reference:
rope scaling ``llama3`` (Llama 3.1/3.2) and ``linear``, and Qwen2's q/k/v biases.

Tiny random models are built in transformers with a fixed seed and saved with ``save_pretrained``;
gptforge loads them (the HF load path every command uses), and the logits are compared in float32 at
a sequence longer than ``original_max_position_embeddings``, so the scaling changes every answer.
Then back out: ``export hf`` reloaded in transformers, ``export gguf``'s keys and tensors read back by
gptforge's reader (and by transformers' GGUF loader, which knows Qwen2's biases but no rope scaling,
on GPT-2's vocabulary: slow), generation with
a KV cache past the original context, and the refusals of what is still not implemented.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.generation import SamplingParams, generate, stream_tokens  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, load_hf_llama  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
from tests.models.hf_reference import assert_close, logits, random_hf_model, saved_and_loaded  # noqa: E402

VOCAB = 268  # the small byte-level tokenizer of test_gguf_read (no multiple of 128: padded rows)
T = 96  # > original_max_position_embeddings (32): the scaled frequencies decide the logits
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=500.0)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
VARIANTS = {  # name -> (transformers class prefix, config extras, the gptforge fields it must become)
    "llama3": ("Llama", dict(rope_scaling=LLAMA3), dict(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
                                                        rope_high_freq_factor=4.0, rope_original_context=32)),
    "linear": ("Llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
               dict(rope_type="linear", rope_factor=4.0)),
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True), dict(qkv_bias=True, tie_embeddings=True, rope_type="default")),
    "qwen2-linear": ("Qwen2", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
                     dict(qkv_bias=True, rope_type="linear", rope_factor=2.0)),
}
IDX = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(7))
ATOL = 1e-5
MAX_DIFF: dict[str, float] = {}  # for the report: printed with -s


def _hf_model(name: str):
    kind, extra, _ = VARIANTS[name]
    return random_hf_model(kind, **{**COMMON, **extra})


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    """(name, transformers model, its save_pretrained directory, gptforge's load of it, reference logits)."""
    return saved_and_loaded(request.param, _hf_model(request.param), tmp_path_factory, IDX)


def _logits(model: torch.nn.Module, idx: torch.Tensor = IDX) -> torch.Tensor:
    return logits(model, idx)


def _assert_close(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert_close(name, got, ref, ATOL, MAX_DIFF)


def test_hf_load_equals_transformers_past_the_original_context(variant):
    name, hf, d, model, ref = variant
    for key, want in VARIANTS[name][2].items():
        assert getattr(model.config, key) == want, key
    _assert_close(f"{name} hf load", _logits(model), ref)
    # the variant is what makes the logits agree: without it they are far off
    sd, c = model.state_dict(), model.config.to_dict()
    if model.config.rope_type != "default":
        unscaled = Llama(LlamaConfig(**{**c, "rope_type": "default", "rope_factor": 1.0})).eval()
        unscaled.load_state_dict(sd)
        assert (_logits(unscaled) - ref).abs().max() > 1e-2
    if model.config.qkv_bias:
        unbiased = Llama(LlamaConfig(**{**c, "qkv_bias": False})).eval()
        unbiased.load_state_dict({k: v for k, v in sd.items() if not k.endswith(".bias")})
        assert (_logits(unbiased) - ref).abs().max() > 1e-2


def test_export_hf_reloads_in_transformers(variant, tmp_path):
    name, hf, d, model, ref = variant
    export_hf_llama(model, tmp_path / "out", tokenizer=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == ("qwen2" if model.config.qkv_bias else "llama")
    assert config["rope_parameters"]["rope_type"] == model.config.rope_type
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == type(hf).__name__
    _assert_close(f"{name} hf export", _logits_hf(back), ref)
    assert load_hf_llama(str(tmp_path / "out")).config == model.config  # and the config round-trips


def _logits_hf(hf) -> torch.Tensor:
    with torch.no_grad():
        return hf(IDX).logits


def test_export_gguf_reads_back(variant, tmp_path):
    """export gguf's metadata and tensors, given test_gguf_read's small tokenizer (GPT-2's 50k tokens
    take the gguf reader seconds), read back by read_gguf: the config and the logits."""
    gguf = pytest.importorskip("gguf")
    from gptforge.interop.gguf import export_gguf
    from gptforge.interop.gguf_read import read_gguf
    from tests.interop.test_gguf_read import write_gguf

    name, hf, d, model, ref = variant
    r = gguf.GGUFReader(str(export_gguf(model, tmp_path / "out", tokenizer=False)))
    arch = r.fields["general.architecture"].contents()
    kv = {k: f.contents() for k, f in r.fields.items() if ".rope.scaling." in k}
    tensors = {t.name: torch.from_numpy(np.array(t.data)) for t in r.tensors}
    if model.config.rope_type == "llama3":  # Llama 3's scaling travels as llama.cpp's per-frequency divisors
        assert "rope_freqs.weight" in tensors and kv == {f"{arch}.rope.scaling.original_context_length": 32}
    g = read_gguf(write_gguf(tmp_path / "m.gguf", model, arch=arch, kv=kv, tensors=tensors))
    assert g.metadata["general.architecture"] == ("qwen2" if model.config.qkv_bias else "llama")
    fields = [f for f in model.config.to_dict() if f.startswith("rope_") or f in ("qkv_bias", "tie_embeddings")]
    assert {f: getattr(g.model.config, f) for f in fields} == {f: getattr(model.config, f) for f in fields}
    _assert_close(f"{name} gguf", _logits(g.model), ref)


@pytest.mark.slow
def test_transformers_gguf_load_of_a_qwen2_export(tmp_path):
    """transformers' own GGUF loader (no rope scaling for llama/qwen2, so the unscaled Qwen2 only):
    the biases, their names and the unpermuted q/k rows as llama.cpp's qwen2 wants them."""
    from gptforge.interop.gguf import export_gguf

    pytest.importorskip("gguf")
    hf = _hf_model("qwen2")
    hf.resize_token_embeddings(50257)  # export gguf carries GPT-2's tokenizer, which transformers' loader reads
    hf.save_pretrained(tmp_path / "hf")
    path = export_gguf(load_hf_llama(str(tmp_path / "hf")), tmp_path / "gguf")
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    assert type(back).__name__ == "Qwen2ForCausalLM"
    _assert_close("qwen2 transformers gguf load", _logits_hf(back), _logits_hf(hf))


def test_generation_with_cache_equals_without_and_transformers(variant):
    name, hf, d, model, ref = variant
    prompts = [IDX[0, :16].tolist(), IDX[1, :5].tolist()]  # a left-padded batch run past position 32
    p = SamplingParams(max_new_tokens=24, temperature=0.0)
    cached = torch.stack(list(stream_tokens(model, prompts, p, use_cache=True)), 1)
    full = torch.stack(list(stream_tokens(model, prompts, p, use_cache=False)), 1)
    assert torch.equal(cached, full)
    prompt = IDX[:1, :16]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                           pad_token_id=0)
    assert torch.equal(generate(model, prompt, 24, temperature=0.0), want)


# ----------------------------------------------------------------------------- still refused, by name


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                                     {"type": "dynamic", "factor": 2.0}, {"rope_type": "longrope", "factor": 2.0}])
def test_other_rope_types_refused_by_name(tmp_path, scaling):
    kind = scaling.get("rope_type", scaling.get("type"))
    config = {"model_type": "llama", **{k: v for k, v in COMMON.items()}, "rope_scaling": scaling}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConfigError, match=rf"rope_scaling\.rope_type='{kind}'") as e:
        load_hf_llama(str(tmp_path))  # refused from config.json, before any weight is looked for
    _one_line(e)
    config = {**config, "rope_scaling": None, "rope_parameters": {**scaling, "rope_theta": 500.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConfigError, match=rf"rope_parameters\.rope_type='{kind}'") as e:
        load_hf_llama(str(tmp_path))
    _one_line(e)
    with pytest.raises(ValueError, match=rf"model\.rope_type='{kind}'"):
        LlamaConfig(rope_type=kind)


def test_refusals_of_what_llama_configs_ask_beyond_the_variants_and_qwen2_windows(tmp_path):
    base = {"model_type": "qwen2", **COMMON, "use_sliding_window": True, "sliding_window": 16,
            "max_window_layers": 0}
    cases = [({**COMMON, "model_type": "llama", "attention_bias": True}, "attention_bias"),  # o_proj too
             ({**COMMON, "model_type": "llama", "sliding_window": 16}, "sliding_window"),  # a window is Mistral's
             ({**COMMON, "model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 0.0,
                                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
              "rope_factor")]
    for config, key in cases:
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(HFConfigError, match=key) as e:
            load_hf_llama(str(tmp_path))
        _one_line(e)
    from gptforge.interop.hf_llama import llama_config_from_hf

    # every layer slides over 16 of 128 positions (tests/models/test_llama_families.py checks the window's math);
    # a window that covers the context, or layers below max_window_layers, do not slide
    assert (llama_config_from_hf(base).sliding_window, llama_config_from_hf(base).sliding_pattern) == (16, "ss")
    assert llama_config_from_hf({**base, "sliding_window": 128}).sliding_window == 0
    assert llama_config_from_hf({**base, "max_window_layers": 2}).sliding_window == 0
    assert llama_config_from_hf({**base, "max_window_layers": 1}).sliding_pattern == "fs"


@pytest.mark.parametrize("kw, key", [
    (dict(rope_factor=2.0), "rope_factor"),  # scales nothing with rope_type default
    (dict(rope_type="linear", rope_factor=0.0), "rope_factor"),
    (dict(rope_type="llama3", rope_factor=8.0), "rope_original_context"),
    (dict(rope_type="llama3", rope_factor=8.0, rope_original_context=32, rope_low_freq_factor=4.0), "rope_low_freq"),
])
def test_config_validation_names_the_rope_field(kw, key):
    with pytest.raises(ValueError, match=key):
        LlamaConfig(n_layer=2, n_head=4, n_embd=64, **kw)


def test_gguf_export_of_llama3_rope_with_biases_is_refused(tmp_path):
    from gptforge.interop.gguf import export_gguf

    pytest.importorskip("gguf")
    model = Llama(LlamaConfig(n_layer=1, n_head=4, n_embd=64, vocab_size=VOCAB, qkv_bias=True, rope_type="llama3",
                              rope_factor=8.0, rope_original_context=32))
    with pytest.raises(ValueError, match="rope_type='llama3'") as e:
        export_gguf(model, tmp_path / "g")
    _one_line(e)
    assert not (tmp_path / "g").exists()


# ----------------------------------------------------------------------------- llama.cpp's rope divisors


@pytest.mark.parametrize("hd, theta, scaling", [
    (64, 500_000.0, dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_context=8192)),  # Llama 3.2 1B/3B
    (128, 500_000.0, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_context=8192)),  # Llama 3.1 8B
    (32, 500.0, dict(rope_type="llama3", factor=8.0, low_freq_factor=2.0, high_freq_factor=5.0, original_context=40)),
    (16, 500.0, dict(rope_type="linear", factor=4.0)), (16, 500.0, dict(rope_type="default")),
])
def test_rope_divisors_turn_back_into_the_parameters(hd, theta, scaling):
    from gptforge.models import rope

    divisors = rope.rope_factors(hd, theta, **scaling)
    orig = scaling.get("original_context")
    assert rope.scaling_from_factors(hd, theta, divisors, orig) == scaling
    if scaling["rope_type"] == "llama3":  # without the context, Meta's low_freq_factor 1 picks one equal scaling
        again = rope.scaling_from_factors(hd, theta, divisors)
        assert again["low_freq_factor"] == 1.0
        torch.testing.assert_close(rope.inv_freq(hd, theta, **again), rope.inv_freq(hd, theta, **scaling), rtol=1e-6,
                                   atol=0)
    bent = divisors.clone()
    bent[len(bent) // 2] *= 1.01  # divisors no scaling gives: refused, not guessed
    assert rope.scaling_from_factors(hd, theta, bent, orig) is None


def test_gguf_rope_divisors_refused_where_they_cannot_be_read(tmp_path):
    pytest.importorskip("gguf")
    from gptforge.interop.gguf import llama_tensors
    from gptforge.interop.gguf_read import GGUFReadError, read_gguf
    from tests.interop.test_gguf_read import write_gguf

    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=1, n_head=4, n_embd=64, block_size=64, vocab_size=VOCAB, rope_theta=500.0,
                              rope_type="llama3", rope_factor=8.0, rope_original_context=32)).eval()
    tensors = llama_tensors(model)
    bent = dict(tensors, **{"rope_freqs.weight": tensors["rope_freqs.weight"] * torch.linspace(1, 2, 8)})
    cases = [(dict(tensors=bent), "rope_freqs.weight"),  # no scaling gives these divisors
             (dict(tensors=tensors, kv={"llama.rope.scaling.factor": 2.0}), "llama.rope.scaling.factor=2.0"),
             (dict(tensors=tensors, kv={"llama.rope.scaling.type": "yarn"}), "llama.rope.scaling.type='yarn'")]
    for i, (kw, match) in enumerate(cases):
        with pytest.raises(GGUFReadError, match=match) as e:
            read_gguf(write_gguf(tmp_path / f"{i}.gguf", model, **kw))
        _one_line(e)
    g = read_gguf(write_gguf(tmp_path / "ok.gguf", model, tensors=tensors))  # no original_context_length key
    assert (g.model.config.rope_type, g.model.config.rope_original_context) == ("llama3", 32)


def test_a_qwen2_reward_model_scores_the_same_in_transformers():
    """A reward model on a biased Llama exports as Qwen2ForSequenceClassification, the same scores."""
    from gptforge.interop.hf_reward import reward_model_to_transformers
    from gptforge.models.registry import counts
    from gptforge.training.rm import RewardModel

    torch.manual_seed(0)
    body = Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=64, vocab_size=101,
                             qkv_bias=True, rope_type="linear", rope_factor=2.0))
    assert counts(body.config).params == body.num_parameters()  # the planner counts the biases
    rm = RewardModel(body).eval()
    with torch.no_grad():
        for p in rm.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    hf = reward_model_to_transformers(rm, pad=100)
    assert type(hf).__name__ == "Qwen2ForSequenceClassification"
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits[:, 0], rm(ids, torch.tensor([39, 39])), atol=2e-5, rtol=0)
