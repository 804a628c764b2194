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
The other doors: a Gemma 2 GGUF without its optional keys reads as llama.cpp runs it (window 4096, caps 50
and 30), so a Gemma 2 with a cap off is refused at GGUF export; a Gemma GGUF's sliding-window period or local
rope base apart from the fixed choice is refused; the hub reader returns every family's tensors as stored;
``export llmc`` refuses every Llama family in one line naming it, before anything is said or written.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.interop import hf_families  # noqa: E402
from gptforge.interop.hf_folder import HFModelError  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, load_hf_llama  # noqa: E402
from tests.models.test_llama_families import ATOL, COMMON, FAMILIES, IDX  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 500.0}
BUILD = {name: (kind, extra) for name, (kind, extra, _) in FAMILIES.items()}
BUILD.update(llama=("Llama", dict(rope_parameters=ROPE)), qwen2=("Qwen2", dict(rope_parameters=ROPE)))
MODEL_TYPE = {"gemma3": "gemma3_text"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saver(tmp_path_factory)


def saver(tmp_path_factory):
    """family -> the folder of its transformers model, saved on first use (the ``saved`` fixture)."""
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


def _agree(folder, tmp_path, export: bool = True):
    """transformers and gptforge read ``folder`` alike: both load (same logits, same meaning; with ``export``,
    export hf reloads in transformers to the same logits) or both refuse (gptforge in one line). Returns
    gptforge's model, or its error message."""
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
    if not export:
        return model
    export_hf_llama(model, tmp_path / "export", tokenizer=False)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (back(IDX).logits - ref).abs().max().item() <= ATOL
    return model


# ----------------------------------------------------------------------------- a key left out


def test_the_defaults_are_transformers_class_defaults():
    """HF_DEFAULTS against each transformers config class built with no arguments."""
    classes = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi3",
               "gemma2": "Gemma2", "gemma3_text": "Gemma3Text", "granite": "Granite", "olmo2": "Olmo2"}
    assert set(classes) == set(hf_families.HF_DEFAULTS)
    for model_type, kind in classes.items():
        c = getattr(transformers, f"{kind}Config")()
        rope = c.rope_parameters
        got = {"rope_theta": rope.get("full_attention", rope)["rope_theta"],
               "rope_local_base_freq": rope.get("sliding_attention", {}).get("rope_theta")}
        for key, value in hf_families.HF_DEFAULTS[model_type].items():
            theirs = got[key] if key in got else getattr(c, key)
            assert theirs == value, (model_type, key, theirs)


# the keys left out whose defaults an export must then write out (the rest: the CASES below export)
EXPORTED = ("rms_norm_eps", "attn_logit_softcapping", "final_logit_softcapping", "rope_parameters", "sliding_window")
DROPPED = [(name, key) for name in BUILD for key in
           sorted({*hf_families.HF_DEFAULTS[MODEL_TYPE.get(name, name)], "rope_parameters", "max_position_embeddings"})]


@pytest.mark.parametrize("name, key", DROPPED, ids=[f"{n}-{k}" for n, k in DROPPED])
def test_a_key_left_out_means_what_transformers_says(saved, name, key, tmp_path):
    def edit(c):
        c.pop(key, None)
        if key == "use_sliding_window":  # Qwen's layer_types, as saved, say which layers slide: let them be derived
            c.pop("layer_types")
        c["max_position_embeddings"] = 8192  # past the default windows (4096), so a dropped window still counts

    _agree(_edited(saved(name), tmp_path / "hf", edit), tmp_path, export=key in EXPORTED)


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


# ----------------------------------------------------------------------------- the GGUF door: llama.cpp's defaults


GEMMA2_KEYS = ("gemma2.attention.sliding_window", "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping")


@pytest.mark.parametrize("left_out", [GEMMA2_KEYS[1:], GEMMA2_KEYS])
def test_a_gemma2_gguf_without_its_optional_keys_reads_as_llamacpp_runs_it(left_out, tmp_path):
    """llama.cpp's gemma2 loader takes a window of 4096 and soft-caps of 50 and 30 for the keys a file leaves
    out (the Gemma 2 paper's values, and transformers' Gemma2Config defaults): a converter-layout file without
    them gives the logits of transformers' Gemma 2 with those values; it was read uncapped (or refused)."""
    pytest.importorskip("gguf")
    from gptforge.interop.gguf_read import read_gguf
    from tests.interop.test_gguf_families import FAMILIES as GGUF_FAMILIES
    from tests.interop.test_gguf_families import IDX as GGUF_IDX
    from tests.interop.test_gguf_families import _hf_model, write_converter_gguf
    from tests.interop.test_gguf_read import rewrite_gguf

    kind, extra, arch = GGUF_FAMILIES["gemma2"]
    GGUF_FAMILIES["gemma2"] = (kind, {**extra, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                      "sliding_window": 4096 if "gemma2.attention.sliding_window" in left_out else 8},
                               arch)
    try:
        hf = _hf_model("gemma2")
    finally:
        GGUF_FAMILIES["gemma2"] = (kind, extra, arch)
    path = write_converter_gguf(tmp_path / "full.gguf", hf, arch)
    for i, key in enumerate(left_out):
        path = rewrite_gguf(path, tmp_path / f"{i}.gguf", key)
    model = read_gguf(path).model
    assert (model.config.attn_softcap, model.config.logit_softcap) == (50.0, 30.0)
    with torch.no_grad():
        assert (model(GGUF_IDX)[0] - hf(GGUF_IDX).logits).abs().max().item() <= ATOL


@pytest.mark.parametrize("field", ["attn_softcap", "logit_softcap"])
def test_a_gemma2_without_a_softcap_is_refused_at_gguf_export_by_name(field, tmp_path):
    """llama.cpp's gemma2 always soft-caps: a Gemma 2 with a cap off (transformers' null) has no GGUF form; the
    exporter wrote no key, and llama.cpp then capped at 50 or 30."""
    pytest.importorskip("gguf")
    from gptforge.interop.gguf import export_gguf
    from gptforge.models.llama import Llama, LlamaConfig

    caps = {"attn_softcap": 50.0, "logit_softcap": 30.0, field: 0.0}
    model = Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96, vocab_size=268,
                              family="gemma2", sliding_window=8, layer_types="sf", mlp="geglu", norm_plus_one=True,
                              post_norms=True, embed_scale=8.0, qk_norm=False, tie_embeddings=True, **caps))
    with pytest.raises(ValueError, match=f"model.{field}=0.0") as e:
        export_gguf(model, tmp_path / "out", tokenizer=False)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- what a format cannot hold, by name


@pytest.mark.parametrize("name", list(BUILD))
def test_export_llmc_refuses_every_llama_family_by_name_in_one_line(saved, name, tmp_path, capsys):
    """llm.c files hold GPT-2 only: ``export llmc`` of each family's HF folder exits 2 with one line naming
    model.arch and the family, said before any 'writing ...' line and before --out exists."""
    from gptforge.cli import main

    folder = saved(name)
    capsys.readouterr()
    assert main(["export", "llmc", "--hf", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.arch='llama'" in err[0] and "llm.c model files hold GPT-2 only" in err[0], err
    if name not in ("llama", "qwen2"):  # the one Llama with a family's fields: named as that family
        assert f"model.family='{name}'" in err[0], err
    assert not (tmp_path / "out").exists()


SWA_KEYS = [("gemma2", "attention.sliding_window_pattern", 2, 3), ("gemma3", "attention.sliding_window_pattern", 6, 3),
            ("gemma2", "rope.freq_base_swa", 500.0, 50.0), ("gemma3", "rope.freq_base_swa", 10_000.0, 50.0)]


@pytest.mark.parametrize("arch, key, fixed, other", SWA_KEYS)
def test_a_gemma_gguf_sliding_key_apart_from_the_fixed_choice_is_refused_by_name(arch, key, fixed, other, tmp_path):
    """Newer llama.cpp reads a Gemma file's sliding-window period and sliding layers' rope base where present;
    gptforge keeps the family's fixed choice (every 2nd / 6th layer full; Gemma 2's bases equal, Gemma 3's local
    10,000): the key at that value loads to transformers' logits, another value is refused by its name (it was
    ignored: another model)."""
    gguf = pytest.importorskip("gguf")
    from gptforge.interop.gguf_read import read_gguf
    from gptforge.interop.gguf_tokenizer import GGUFReadError
    from tests.interop.test_gguf_families import FAMILIES as GGUF_FAMILIES
    from tests.interop.test_gguf_families import IDX as GGUF_IDX
    from tests.interop.test_gguf_families import _hf_model, write_converter_gguf
    from tests.interop.test_gguf_read import rewrite_gguf

    hf = _hf_model(arch)
    path = write_converter_gguf(tmp_path / "full.gguf", hf, GGUF_FAMILIES[arch][2])
    vtype = gguf.GGUFValueType.UINT32 if isinstance(fixed, int) else gguf.GGUFValueType.FLOAT32
    same = read_gguf(rewrite_gguf(path, tmp_path / "same.gguf", f"{arch}.{key}", fixed, vtype)).model
    with torch.no_grad():
        assert (same(GGUF_IDX)[0] - hf(GGUF_IDX).logits).abs().max().item() <= ATOL
    with pytest.raises(GGUFReadError, match=f"{arch}.{key}={other!r}") as e:
        read_gguf(rewrite_gguf(path, tmp_path / "other.gguf", f"{arch}.{key}", other, vtype))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the hub door


@pytest.mark.parametrize("name", list(BUILD))
def test_the_hub_reader_gives_every_familys_tensors_as_stored(saved, name):
    """``load_hf_llama`` of a hub name reads the weights through transformers (``_read_weights``; offline here,
    so called on the folder). It used LlamaForCausalLM for every family: Qwen3's q/k norms and Gemma's extra
    norms were dropped (the load then refused a valid model), and Phi-3's fused q/k/v and gate/up came back
    as new random matrices under Llama's names, which loaded without a word. Now every stored tensor comes
    back unchanged, in float32, and the model built from them gives transformers' logits."""
    from safetensors.torch import load_file

    from gptforge.interop.hf_llama import _read_config, _read_weights, llama_config_from_hf, load_hf_llama_state_dict
    from gptforge.models.llama import Llama

    folder = saved(name)
    stored, got = load_file(str(folder / "model.safetensors")), _read_weights(str(folder))
    assert all(k in got and torch.equal(got[k], v) for k, v in stored.items())
    model = Llama(llama_config_from_hf(_read_config(str(folder))))
    load_hf_llama_state_dict(model, got)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (model.eval()(IDX)[0] - hf(IDX).logits).abs().max().item() <= ATOL
