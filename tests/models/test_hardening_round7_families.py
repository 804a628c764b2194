"""Hardening round seven, the model families: configs a family's config.json can carry that are unusual
but loadable, read as transformers reads them, or refused by the key's name.

Each family (Llama and Qwen2 as controls, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3) is a tiny random
transformers model saved once per module (3 layers, a window of 8 over 40 tokens; Gemma 3's six layers).
A case edits its config.json; then transformers 5 (``AutoModelForCausalLM.from_pretrained``, float32) and
gptforge (``load_hf_llama``, what every command's HF door calls) both read the folder, and they must agree:
both load, with the same logits and the same meaning of every field that decides them (norm eps, soft-caps,
window and which layers slide, rope bases, tied head), and gptforge's ``export hf`` of it reloads in
transformers to the same logits; or both refuse, gptforge in one line naming the key. The cases:

* a key left out: it means what transformers' class for that model_type says, and the classes disagree
  (Phi-3's rms_norm_eps 1e-5, Gemma 2's soft-caps 50 and 30, Gemma 3's full-layer rope base 1e6, the
  default windows, kv heads and head sizes);
* ``rope_scaling`` beside ``rope_parameters`` (the former replaces the latter whole, its base included),
  Gemma 3's legacy rope keys and its rope_scaling merged into the full layers' parameters;
* ``tie_word_embeddings`` true over a file that holds a head of its own (transformers keeps it, untied);
* ``layer_types`` on a family whose model reads none (Phi-3 slides every layer), of the wrong length or kind;
* ``partial_rotary_factor`` null (transformers' default: all of each head rotates).

A window of 0 on a layer that slides, which no model has and transformers fails on, is refused by name.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.interop import hf_families  # noqa: E402
from gptforge.interop.hf import HFModelError  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, load_hf_llama  # noqa: E402
from tests.models.test_llama_families import ATOL, COMMON, FAMILIES, IDX  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 500.0}
BUILD = {name: (kind, extra) for name, (kind, extra, _) in FAMILIES.items()}
BUILD.update(llama=("Llama", dict(rope_parameters=ROPE)), qwen2=("Qwen2", dict(rope_parameters=ROPE)))
MODEL_TYPE = {"gemma3": "gemma3_text"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> the folder of its transformers model, saved on first use."""
    dirs: dict = {}

    def get(name: str):
        if name not in dirs:
            kind, extra = BUILD[name]
            torch.manual_seed(0)
            cfg = getattr(transformers, f"{kind}Config")(**COMMON, **extra)
            hf = getattr(transformers, f"{'Gemma3' if kind == 'Gemma3Text' else kind}ForCausalLM")(cfg).eval()
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():  # non-trivial norms, and a head apart from the embedding
                for p in hf.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() == 1 else 0.05))
            dirs[name] = tmp_path_factory.mktemp(name) / "hf"
            hf.save_pretrained(dirs[name])
        return dirs[name]

    return get


def _edited(src, dst, edit):
    shutil.copytree(src, dst)
    c = json.loads((dst / "config.json").read_text())
    edit(c)
    (dst / "config.json").write_text(json.dumps(c))
    return dst


def _meaning_hf(hf) -> dict:
    """What decides the logits, as transformers' loaded model holds it (config and weights)."""
    c = hf.config
    rope = c.rope_parameters
    full = rope.get("full_attention", rope)
    reads = (*hf_families.READS_LAYER_TYPES, "ministral")  # a mistral config with layer_types loads as Ministral
    kinds = getattr(c, "layer_types", None) if c.model_type in reads else None
    window = getattr(c, "sliding_window", None) if c.model_type != "llama" else None  # Qwen's: None unless used
    slides = [k == "sliding_attention" for k in kinds] if kinds else [window is not None] * c.num_hidden_layers
    head, embed = hf.get_output_embeddings().weight, hf.get_input_embeddings().weight
    return dict(eps=c.rms_norm_eps, attn_cap=getattr(c, "attn_logit_softcapping", None) or 0.0,
                logit_cap=getattr(c, "final_logit_softcapping", None) or 0.0,
                slides=[bool(s and window) for s in slides], window=window if window and any(slides) else 0,
                theta=full["rope_theta"], scaling=full.get("factor") if full["rope_type"] != "default" else None,
                local_theta=rope["sliding_attention"]["rope_theta"] if "sliding_attention" in rope else None,
                tied=head.data_ptr() == embed.data_ptr())


def _meaning_gf(model) -> dict:
    c = model.config
    window_kept = c.sliding_window or None
    return dict(eps=c.norm_eps, attn_cap=c.attn_softcap, logit_cap=c.logit_softcap,
                slides=[k == "s" for k in c.sliding_pattern], window=c.sliding_window,
                theta=c.rope_theta, scaling=c.rope_factor if c.rope_type != "default" else None,
                local_theta=(c.rope_local_theta or c.rope_theta) if c.family == "gemma3" else None,
                tied=c.tie_embeddings, _window=window_kept)


def _agree(folder, tmp_path):
    """transformers and gptforge read ``folder`` alike: both load (same logits, same meaning; export hf
    reloads in transformers to the same logits) or both refuse (gptforge in one line). Returns gptforge's
    model, or its error message."""
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(IDX).logits
    except Exception:  # noqa: BLE001 - any refusal of transformers': gptforge must refuse too
        hf = None
    if hf is None:
        with pytest.raises((HFConfigError, HFModelError)) as e:  # a config's key, or weights it does not fit
            load_hf_llama(str(folder))
        assert "\n" not in str(e.value)
        return str(e.value)
    model = load_hf_llama(str(folder))
    with torch.no_grad():
        got = model(IDX)[0]
    want, have = _meaning_hf(hf), _meaning_gf(model)
    if not any(want["slides"]):  # no layer slides: the window and the sliding layers' base mean nothing
        want["window"] = have["window"] = 0
        want["local_theta"] = have["local_theta"]
    elif want["window"] >= model.config.block_size and all(want["slides"]):  # as long as the context: the
        want["window"], want["slides"] = have["window"], have["slides"]  # reader drops it, plain causal attention
    have.pop("_window")
    assert have == want
    assert (got - ref).abs().max().item() <= ATOL
    export_hf_llama(model, tmp_path / "export", tokenizer=False)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (back(IDX).logits - ref).abs().max().item() <= ATOL
    return model


# ----------------------------------------------------------------------------- a key left out


def test_the_defaults_are_transformers_class_defaults():
    """HF_DEFAULTS against each transformers config class built with no arguments."""
    classes = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi3",
               "gemma2": "Gemma2", "gemma3_text": "Gemma3Text"}
    assert set(classes) == set(hf_families.HF_DEFAULTS)
    for model_type, kind in classes.items():
        c = getattr(transformers, f"{kind}Config")()
        rope = c.rope_parameters
        got = {"rope_theta": rope.get("full_attention", rope)["rope_theta"],
               "rope_local_base_freq": rope.get("sliding_attention", {}).get("rope_theta")}
        for key, value in hf_families.HF_DEFAULTS[model_type].items():
            theirs = got[key] if key in got else getattr(c, key)
            assert theirs == value, (model_type, key, theirs)


DROPPED = [(name, key) for name in BUILD for key in
           sorted({*hf_families.HF_DEFAULTS[MODEL_TYPE.get(name, name)], "rope_parameters", "max_position_embeddings"})]


@pytest.mark.parametrize("name, key", DROPPED, ids=[f"{n}-{k}" for n, k in DROPPED])
def test_a_key_left_out_means_what_transformers_says(saved, name, key, tmp_path):
    def edit(c):
        c.pop(key, None)
        if key == "use_sliding_window":  # Qwen's layer_types, as saved, say which layers slide: let them be derived
            c.pop("layer_types")
        c["max_position_embeddings"] = 8192  # past the default windows (4096), so a dropped window still counts

    _agree(_edited(saved(name), tmp_path / "hf", edit), tmp_path)


# ----------------------------------------------------------------------------- keys transformers reads its way


def _rope_scaling(scaling, theta=None):
    def edit(c):
        c["rope_scaling"] = scaling
        if theta is not None:
            c["rope_theta"] = theta
    return edit


def _gemma3_legacy(scaling, local):
    def edit(c):
        c.pop("rope_parameters")
        c.update(rope_theta=500.0, rope_scaling=scaling, rope_local_base_freq=local)
    return edit


def _set(**kw):
    return lambda c: c.update(kw)


def _layers(*kinds):
    return lambda c: c.update(layer_types=[kinds[i % len(kinds)] for i in range(c["num_hidden_layers"])])


S, F = "sliding_attention", "full_attention"
CASES = {  # name -> (families, edit)
    # rope_scaling replaces rope_parameters whole: its base is the top-level rope_theta, else 10,000
    "rope_scaling beside rope_parameters": (("llama", "qwen2", "qwen3", "mistral", "gemma2"),
                                            _rope_scaling({"rope_type": "linear", "factor": 1.0})),
    "rope_scaling with a top-level base": (("llama", "mistral", "gemma2"),
                                           _rope_scaling({"rope_type": "linear", "factor": 2.0}, theta=700.0)),
    "rope_scaling llama3 beside rope_parameters": (("llama", "qwen3"), _rope_scaling(
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 16})),
    # Gemma 3: rope_scaling merged into the full layers' parameters; the legacy top-level keys
    "gemma3 rope_scaling over full_attention": (("gemma3",), _rope_scaling({"rope_type": "linear", "factor": 1.0})),
    "gemma3 legacy rope keys": (("gemma3",), _gemma3_legacy({"rope_type": "linear", "factor": 2.0}, 50.0)),
    "gemma3 legacy rope keys unscaled": (("gemma3",), _gemma3_legacy(None, 10_000.0)),
    "gemma3 flat rope_parameters": (("gemma3",), _set(rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 900.0})),
    "gemma3 every layer full": (("gemma3",), _layers(F)),
    # a head of its own in the file under tie_word_embeddings true: transformers keeps it
    "tied, with a head of its own": (("llama", "qwen2", "qwen3", "mistral", "phi3"), _set(tie_word_embeddings=True)),
    # layer_types where the family's model reads none (Phi-3) or reads them (Mistral, as Ministral)
    "layer_types every layer full": (("phi3", "mistral", "gemma2"), _layers(F)),
    "layer_types alternating": (("phi3", "mistral", "qwen3"), _layers(S, F)),
    "layer_types too short": (("llama", "phi3", "mistral", "gemma2"), _set(layer_types=[F])),
    "layer_types of an unknown kind": (("llama", "qwen2", "phi3"), _layers("chunked_attention")),
    "partial_rotary_factor null": (("llama", "phi3", "gemma2"), _set(partial_rotary_factor=None)),
    "a window past the context": (("mistral", "phi3", "gemma2", "gemma3"), _set(sliding_window=1000)),
    "max_window_layers past the layers": (("qwen2", "qwen3"), _set(use_sliding_window=True, max_window_layers=99)),
}
ROWS = [(case, name) for case, (names, _) in CASES.items() for name in names]


@pytest.mark.parametrize("case, name", ROWS, ids=[f"{n}-{c}" for c, n in ROWS])
def test_what_transformers_loads_gptforge_loads_alike(saved, case, name, tmp_path):
    _agree(_edited(saved(name), tmp_path / "hf", CASES[case][1]), tmp_path)


WINDOW_ZERO = {"qwen3": _set(sliding_window=0, use_sliding_window=True), "mistral": _set(sliding_window=0),
               "phi3": _set(sliding_window=0), "gemma2": _set(sliding_window=0), "gemma3": _set(sliding_window=0)}


@pytest.mark.parametrize("name", list(WINDOW_ZERO))
def test_a_window_of_no_tokens_is_refused_by_name(saved, name, tmp_path):
    msg = _agree(_edited(saved(name), tmp_path / "hf", WINDOW_ZERO[name]), tmp_path)  # transformers fails on it
    assert "sliding_window=0" in msg and "null" in msg
