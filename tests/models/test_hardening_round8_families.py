"""Hardening round eight, the model families: what a careless or hostile config.json or GGUF file says, read
as transformers or llama.cpp reads it, or refused by the field's name in one line.

The families are round seven's tiny random transformers models (``saved``, its fixture, and ``_agree``: both
transformers 5 and gptforge's ``load_hf_llama`` load the edited folder to the same logits and meaning, or both
refuse, gptforge in one line naming the key). The cases:

* the context a config leaves out (``max_position_embeddings``) is the family's transformers default (Llama
  2048, Qwen 32768, Mistral and Gemma 3 131072, Phi-3 4096, Gemma 2 8192), not 2048 for all, and so are Qwen's
  kv heads (32, not num_attention_heads) and the others the reader reads; a key set to null where transformers'
  class refuses null is refused, not read as its default;
* a rope type transformers' class refuses for the family (Phi3Config accepts longrope only) is refused, the
  others load alike, for every family;
* Gemma 3's ``sliding_window_pattern`` of 0, a list or a string (transformers fails on each) is refused by name;
* the GGUF door: a Mistral or Phi-3 whose window is shorter than its context is refused at export (llama.cpp's
  ``llama`` ignores ``llama.attention.sliding_window`` and its ``phi3`` turns it off), a window as long as the
  context exports and reads back; a per-layer ``sliding_window_pattern`` array loads where it says what
  llama.cpp runs and is refused by name otherwise.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.interop import hf_families  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, load_hf_llama  # noqa: E402
from tests.models.test_hardening_round7_families import BUILD, MODEL_TYPE, _agree, _edited, saver  # noqa: E402
from tests.models.test_llama_families import ATOL  # noqa: E402

CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi3",
           "gemma2": "Gemma2", "gemma3": "Gemma3Text"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> the folder of its tiny transformers model (round seven's), saved on first use."""
    return saver(tmp_path_factory)


def _drop(*keys):
    def edit(c):
        for k in keys:
            c.pop(k, None)
    return edit


def _set(**kw):
    return lambda c: c.update(kw)


# ----------------------------------------------------------------------------- keys left out or null


LEFT_OUT = [(name, key) for name in BUILD for key in ("max_position_embeddings", "num_key_value_heads", "head_dim")]


@pytest.mark.parametrize("name, key", LEFT_OUT, ids=[f"{n}-{k}" for n, k in LEFT_OUT])
def test_a_size_left_out_is_the_familys_transformers_default(saved, name, key, tmp_path):
    """The context, kv heads and head size a config leaves out are what transformers' class for the model_type
    makes of it (a derived one included): the context was 2048 for every family, Qwen's kv heads were
    num_attention_heads where transformers' are 32 (a file then fits neither, refused)."""
    folder = _edited(saved(name), tmp_path / "hf", _drop(key))
    got = _agree(folder, tmp_path, export=False)
    if isinstance(got, str):  # both refused: a model the weights do not fit, named
        assert key in got or "weights" in got, got
        return
    theirs = transformers.AutoConfig.from_pretrained(folder)
    assert got.config.block_size == theirs.max_position_embeddings
    assert got.config.kv_heads == theirs.num_key_value_heads
    hidden, heads = theirs.hidden_size, theirs.num_attention_heads
    assert got.config.head_dim == (getattr(theirs, "head_dim", None) or hidden // heads)


def test_every_size_default_is_the_classes_fixed_or_derived():
    """Each class built with 16 heads over 128 wide: where its context, kv heads or head size do not follow from
    those (a fixed default: Qwen's 32 kv heads, Mistral's 8, Gemma's 4 and 256, every family's context),
    HF_DEFAULTS holds that value; where they do (Llama's and Phi-3's kv heads, Mistral's head size) it holds
    none, so the reader derives them as the class does."""
    for name, kind in CLASSES.items():
        c = getattr(transformers, f"{kind}Config")(num_attention_heads=16, hidden_size=128)
        defaults = hf_families.HF_DEFAULTS[MODEL_TYPE.get(name, name)]
        derived = {"max_position_embeddings": None, "num_key_value_heads": 16, "head_dim": 8}
        for key, follows in derived.items():
            theirs = getattr(c, key, None)
            if theirs is None or theirs == follows:
                assert key not in defaults, (name, key)
            else:
                assert defaults.get(key) == theirs, (name, key, theirs)


NULLS = [(name, key) for name in BUILD for key in ("max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                                   "num_key_value_heads", "head_dim")]


@pytest.mark.parametrize("name, key", NULLS, ids=[f"{n}-{k}" for n, k in NULLS])
def test_a_null_size_or_norm_is_read_as_transformers_reads_it(saved, name, key, tmp_path):
    """null where transformers' typed class refuses it (a context, an epsilon, a tie flag, Mistral's and
    Gemma's kv heads, Qwen 3's and Gemma's head size) is refused by name; where it means the derived value
    (Llama's kv heads, Mistral's head size) both load alike. It was read as the default, or as 2048."""
    msg = _agree(_edited(saved(name), tmp_path / "hf", _set(**{key: None})), tmp_path, export=False)
    if isinstance(msg, str):  # the null named; or, where it means the derived size, weights that do not fit it
        assert f"{key}=None" in msg or "weights do not fit" in msg and key in ("num_key_value_heads", "head_dim"), msg


# ----------------------------------------------------------------------------- rope types per family


ROPES = {"linear": {"rope_type": "linear", "factor": 2.0},
         "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16},
         "dynamic": {"rope_type": "dynamic", "factor": 2.0}}
ROPE_ROWS = [(name, kind, where) for name in BUILD for kind in ROPES for where in ("rope_scaling",)] + \
    [("phi3", kind, "rope_parameters") for kind in ("linear", "llama3")]


@pytest.mark.parametrize("name, kind, where", ROPE_ROWS, ids=[f"{n}-{k}-{w}" for n, k, w in ROPE_ROWS])
def test_a_rope_type_is_loaded_or_refused_as_the_familys_transformers_class_does(saved, name, kind, where, tmp_path):
    """transformers' Phi3Config refuses every rope type but longrope; the other classes take linear and llama3
    (gptforge loads them to the same logits) and dynamic (gptforge refuses it: not implemented). A Phi-3 with
    linear or llama3 loaded in gptforge: a model no transformers would build."""
    def edit(c):
        if where == "rope_scaling":
            c["rope_scaling"] = dict(ROPES[kind])
        else:
            c["rope_parameters"] = {**ROPES[kind], "rope_theta": 500.0}
    folder = _edited(saved(name), tmp_path / "hf", edit)
    if kind == "dynamic" and name != "phi3":  # transformers builds it; gptforge does not implement it: named
        said = "rope_parameters" if name == "gemma3" else where  # Gemma 3 merges it into rope_parameters, as
        with pytest.raises(HFConfigError, match=f"{said}.rope_type='dynamic'") as e:  # transformers does
            load_hf_llama(str(folder))
        assert "\n" not in str(e.value)
        return
    msg = _agree(folder, tmp_path, export=False)
    if name == "phi3":
        assert isinstance(msg, str) and f"{where}.rope_type={kind!r}" in msg and "config.json" in msg, msg


# ----------------------------------------------------------------------------- Gemma 3's pattern


PATTERNS = {"zero": 0, "a list": [1, 1, 0], "a string": "LLLG", "every 2nd": 2}


@pytest.mark.parametrize("case", list(PATTERNS))
def test_gemma3_sliding_window_pattern_is_read_or_refused_as_transformers_does(saved, case, tmp_path):
    """Without layer_types, Gemma3TextConfig derives them from sliding_window_pattern's period; 0 (it divides
    by it), a list and a string fail there, and are refused by name (0 was read as 6); a period loads alike."""
    def edit(c):
        c.pop("layer_types")
        c["sliding_window_pattern"] = PATTERNS[case]
    got = _agree(_edited(saved("gemma3"), tmp_path / "hf", edit), tmp_path, export=False)
    if case == "every 2nd":
        assert got.config.sliding_pattern == "sfs"
    else:
        assert isinstance(got, str) and "sliding_window_pattern=" in got, got


# ----------------------------------------------------------------------------- the GGUF door


FAMILY_FIELDS = {"mistral": {}, "phi3": {}, "qwen3": dict(qk_norm=True),
                 "gemma2": dict(mlp="geglu", norm_plus_one=True, post_norms=True, embed_scale=8.0, tie_embeddings=True,
                                layer_types="sf", attn_softcap=50.0, logit_softcap=30.0)}


def _windowed(family: str, window: int, block: int):
    from gptforge.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96, vocab_size=268,
                              block_size=block, family=family, sliding_window=window, **FAMILY_FIELDS[family]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms away from their identity (Gemma's start at 0)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


@pytest.mark.parametrize("door", ["hf", "gguf"])
@pytest.mark.parametrize("family", list(FAMILY_FIELDS))
def test_a_window_as_long_as_the_context_exports_through_every_door(family, door, tmp_path):
    """A window of 64 over a context of 40 is plain causal attention. export hf of a Mistral, Phi-3 or Qwen3 with
    one was refused ("MistralForCausalLM cannot express model.sliding_window=64"), because the import drops such a
    window and the read-back compared 0 with 64; export gguf of a Qwen3 wrote a window llama.cpp's qwen3 refuses.
    Now both doors write it (HF: the window as set; GGUF: no key where it spans the context, Gemma's kept) and
    the file reloads to the same logits (transformers for hf, gptforge's reader for gguf)."""
    model = _windowed(family, 64, 40)
    idx = torch.randint(3, 268, (2, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(idx)[0]
    if door == "hf":
        from gptforge.interop.hf_llama import export_hf_llama

        export_hf_llama(model, tmp_path / "hf", tokenizer=False)
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        with torch.no_grad():
            assert (back(idx).logits - want).abs().max().item() <= ATOL
        return
    gguf = pytest.importorskip("gguf")
    from gptforge.interop.gguf import export_gguf
    from gptforge.interop.gguf_families import FAMILY_ARCH
    from gptforge.interop.gguf_read import read_gguf
    from tests.interop.test_gguf_read import write_gguf

    arch = FAMILY_ARCH[family]
    r = gguf.GGUFReader(str(export_gguf(model, tmp_path / "out", tokenizer=False)))
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.") and k.split(".", 1)[1] in
          ("attention.sliding_window", "attention.key_length", "attention.value_length", "rope.dimension_count",
           "attn_logit_softcapping", "final_logit_softcapping")}
    tensors = {t.name: torch.from_numpy(t.data.copy()).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    back = read_gguf(write_gguf(tmp_path / "m.gguf", model, arch=arch, kv=kv, tensors=tensors)).model
    with torch.no_grad():
        assert (back(idx)[0] - want).abs().max().item() <= ATOL


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_a_window_shorter_than_the_context_is_refused_at_gguf_export_by_name(family, tmp_path):
    """llama.cpp's llama never reads attention.sliding_window and its phi3 turns it off: either attends over
    the whole context, so a file of a model with a window of 8 over 40 tokens gave other logits past 8 tokens.
    Refused in one line naming both fields, nothing written; a window as long as the context is plain causal
    attention and exports, reading back to the same logits."""
    pytest.importorskip("gguf")
    from gptforge.interop.gguf import export_gguf
    from gptforge.interop.gguf_read import read_gguf
    from tests.interop.test_gguf_read import write_gguf

    with pytest.raises(ValueError, match=f"model.family={family} with model.sliding_window=8 shorter than "
                                         "model.block_size=40") as e:
        export_gguf(_windowed(family, 8, 40), tmp_path / "out", tokenizer=False)
    assert "\n" not in str(e.value) and "export hf" in str(e.value) and not (tmp_path / "out").exists()
    model = _windowed(family, 40, 40)
    path = export_gguf(model, tmp_path / "ok", tokenizer=False)
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = {"mistral": "llama"}.get(family, family)
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.") and k.split(".", 1)[1] in
          ("attention.sliding_window", "attention.key_length", "attention.value_length", "rope.dimension_count")}
    tensors = {t.name: torch.from_numpy(t.data.copy()).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    back = read_gguf(write_gguf(tmp_path / "m.gguf", model, arch=arch, kv=kv, tensors=tensors)).model
    idx = torch.randint(3, 268, (2, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert (back(idx)[0] - model(idx)[0]).abs().max().item() <= ATOL


ARRAYS = [("gemma2", [1, 0, 1], True), ("gemma2", [1, 1, 1], False), ("gemma3", [1] * 5 + [0], True),
          ("gemma3", [1, 0] * 3, False), ("gemma3", [1] * 5, False), ("mistral", [1, 1, 1], True),
          ("mistral", [1, 0, 1], False), ("phi3", [0, 1, 1], False)]


@pytest.mark.parametrize("arch, pattern, loads", ARRAYS, ids=[f"{a}-{''.join(map(str, p))}" for a, p, _ in ARRAYS])
def test_a_per_layer_sliding_pattern_array_in_a_gguf_is_read_or_refused_by_name(arch, pattern, loads, tmp_path):
    """Converters write attention.sliding_window_pattern as one bool per layer for some architectures; llama.cpp's
    gemma2/gemma3 read only a period there (an array leaves their fixed one) and its llama/phi3 read none. The
    array was not looked at: a file saying other layers slide loaded as the fixed pattern. Now one that says
    what llama.cpp runs loads to transformers' logits, another is refused naming the key."""
    gguf = pytest.importorskip("gguf")
    from gptforge.interop.gguf_config import IGNORES_WINDOW
    from gptforge.interop.gguf_read import read_gguf
    from gptforge.interop.gguf_tokenizer import GGUFReadError
    from tests.interop.test_gguf_families import FAMILIES as GGUF_FAMILIES
    from tests.interop.test_gguf_families import IDX as GGUF_IDX
    from tests.interop.test_gguf_families import _hf_model, write_converter_gguf

    hf = _hf_model(arch)
    file_arch = GGUF_FAMILIES[arch][2]
    path = write_converter_gguf(tmp_path / "full.gguf", hf, file_arch)
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "arr.gguf"), file_arch)
    for k, f in r.fields.items():
        if not k.startswith("GGUF.") and k != "general.architecture":
            vt = f.types[0]
            (w.add_array(k, f.contents()) if vt == gguf.GGUFValueType.ARRAY else w.add_key_value(k, f.contents(), vt))
    w.add_sliding_window_pattern([bool(v) for v in pattern])
    for t in r.tensors:
        w.add_tensor(t.name, t.data.copy().reshape(tuple(int(x) for x in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if loads:
        model = read_gguf(tmp_path / "arr.gguf").model
        if file_arch in IGNORES_WINDOW:  # llama.cpp's llama runs the window (and the array) as whole-context attention
            hf.config.sliding_window = None
        with torch.no_grad():
            assert (model(GGUF_IDX)[0] - hf(GGUF_IDX).logits).abs().max().item() <= ATOL
    else:
        with pytest.raises(GGUFReadError, match=f"{file_arch}.attention.sliding_window_pattern") as e:
            read_gguf(tmp_path / "arr.gguf")
        assert "\n" not in str(e.value) and "per-layer" in str(e.value)


# ----------------------------------------------------------------------------- GPT-2's sizes left out


GPT2_TINY = dict(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=300)


def test_the_gpt2_size_defaults_are_gpt2configs():
    from gptforge.interop.hf import GPT2_DEFAULTS, GPT2_REQUIRED

    c = transformers.GPT2Config()
    assert set(GPT2_DEFAULTS) == set(GPT2_REQUIRED)
    assert GPT2_DEFAULTS == {k: getattr(c, k) for k in GPT2_DEFAULTS}


@pytest.mark.parametrize("key", list(GPT2_TINY))
@pytest.mark.parametrize("at_default", [True, False], ids=["weights-of-the-default", "weights-of-another-size"])
def test_a_gpt2_size_left_out_is_gpt2configs(key, at_default, tmp_path):
    """A GPT-2 config.json without one of its sizes: transformers takes GPT2Config's (1024 positions, 12 layers
    of 12 heads, 768 wide, 50257 tokens). gptforge refused every such file; now it takes the same default, so a
    file whose weights have it loads to transformers' logits, and one whose weights do not is refused naming the
    tensors (transformers refuses it too, or fills missing layers at random)."""
    import json

    from gptforge.interop.hf import GPT2_DEFAULTS, load_hf
    from gptforge.interop.hf_folder import HFModelError

    sizes = {**GPT2_TINY, key: GPT2_DEFAULTS[key]} if at_default else dict(GPT2_TINY)
    if key == "n_head" and at_default:
        sizes["n_embd"] = 24  # 12 heads of 2
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**sizes, resid_pdrop=0.0, embd_pdrop=0.0,
                                                              attn_pdrop=0.0)).eval()
    hf.save_pretrained(tmp_path / "hf")
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    c.pop(key)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(c))
    if not at_default:
        with pytest.raises(HFModelError) as e:
            load_hf(str(tmp_path / "hf"))
        assert "\n" not in str(e.value) and "config.json" in str(e.value)
        return
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ours = load_hf(str(tmp_path / "hf"))
    idx = torch.randint(0, sizes["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    # float32 sums of at most 4 x n_embd terms per product, over the layers and the head, |logits| < 10
    atol = 4 * sizes["n_embd"] * (sizes["n_layer"] + 1) * 1.2e-7 * 10
    with torch.no_grad():
        assert (ours(idx)[0] - theirs(idx).logits).abs().max().item() <= atol


# ----------------------------------------------------------------------------- hostile GGUF keys, by name

GGUF_ARCH = {"qwen3": "qwen3", "mistral": "llama", "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3"}
HOSTILE = [  # (key under the architecture, value, GGUF type name, what the refusal must name)
    ("attention.layer_norm_rms_epsilon", -1e-6, "FLOAT32", "attention.layer_norm_rms_epsilon=-1e-06"),
    ("attention.layer_norm_rms_epsilon", 0.0, "FLOAT32", "attention.layer_norm_rms_epsilon=0.0"),
    ("attention.key_length", 15, "UINT32", "attention.key_length=15"),
    ("attention.head_count_kv", 3, "UINT32", "attention.head_count_kv=3"),
    ("attention.sliding_window", -8, "INT32", "attention.sliding_window=-8"),
    ("attention.head_count", "4", "STRING", "attention.head_count='4'"),
    ("rope.freq_base", float("nan"), "FLOAT32", "rope.freq_base=nan"),
    ("vocab_size", 999, "UINT32", "vocab_size=999"),
]
GEMMA_ONLY = [("attention.sliding_window", 0, "UINT32", "attention.sliding_window=0")]
HOSTILE_ROWS = [(name, *h) for name in GGUF_ARCH for h in HOSTILE] + \
    [(name, *h) for name in ("gemma2", "gemma3") for h in GEMMA_ONLY]


@pytest.fixture(scope="module")
def converter_files(tmp_path_factory):
    files: dict = {}

    def get(name):
        if name not in files:
            from tests.interop.test_gguf_families import _hf_model, write_converter_gguf

            files[name] = write_converter_gguf(tmp_path_factory.mktemp(name) / "conv.gguf", _hf_model(name),
                                               GGUF_ARCH[name])
        return files[name]

    return get


@pytest.mark.parametrize("name, key, value, vtype, named", HOSTILE_ROWS,
                         ids=[f"{r[0]}-{r[1]}={r[2]!r}" for r in HOSTILE_ROWS])
def test_a_hostile_gguf_key_is_refused_naming_it(converter_files, name, key, value, vtype, named, tmp_path):
    """Each family's converter-layout file with one key made hostile: refused in one line naming the key as
    the file spells it. A zero or negative epsilon was named as model.norm_eps (gptforge's field, not the
    file's), an odd key_length as embedding_length, and Gemma's window of 0 as a missing key."""
    gguf = pytest.importorskip("gguf")
    from gptforge.interop.gguf_read import read_gguf
    from gptforge.interop.gguf_tokenizer import GGUFReadError
    from tests.interop.test_gguf_read import rewrite_gguf

    arch = GGUF_ARCH[name]
    path = rewrite_gguf(converter_files(name), tmp_path / "bad.gguf", f"{arch}.{key}", value,
                        getattr(gguf.GGUFValueType, vtype))
    with pytest.raises(GGUFReadError) as e:
        read_gguf(path)
    assert "\n" not in str(e.value) and f"{arch}.{named}" in str(e.value) and str(path) in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- bias switches a family does not read


BIASES = [(name, key) for name in BUILD for key in ("attention_bias", "mlp_bias")]


@pytest.mark.parametrize("name, key", BIASES, ids=[f"{n}-{k}" for n, k in BIASES])
def test_a_bias_switch_is_read_only_where_the_familys_model_reads_it(saved, name, key, tmp_path):
    """attention_bias: true over weights without biases. Where transformers' model reads the switch (Llama both,
    Qwen3 and Gemma attention_bias) it builds biases the file lacks and fills them at random: gptforge refuses by
    the key's name. Where it does not (Mistral, Phi-3, Qwen2; mlp_bias outside Llama) the switch changes nothing
    and both load alike; gptforge refused those configs."""
    folder = _edited(saved(name), tmp_path / "hf", _set(**{key: True}))
    reads = hf_families.READS_BIAS[key]
    module = {"qwen2": "qwen2", "gemma3": "gemma3"}.get(name, name)
    theirs = getattr(transformers.models, module)
    source = open(getattr(theirs, f"modeling_{module}").__file__).read()
    assert (f"config.{key}" in source) == (MODEL_TYPE.get(name, name) in reads), name  # the table is transformers'
    if MODEL_TYPE.get(name, name) in reads:
        with pytest.raises(HFConfigError, match=f"{key}=True") as e:
            load_hf_llama(str(folder))
        assert "\n" not in str(e.value)
    else:
        _agree(folder, tmp_path, export=False)


@pytest.mark.parametrize("rope", [dict(rope_type="linear", rope_factor=2.0),
                                  dict(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
                                       rope_high_freq_factor=4.0, rope_original_context=16)], ids=["linear", "llama3"])
def test_export_hf_of_a_phi3_with_a_rope_phi3config_refuses_is_refused(rope, tmp_path):
    """A Phi-3 with linear or llama3 rope (trained so, or read from a GGUF, where llama.cpp scales any
    architecture) was written as a Phi3ForCausalLM config.json that transformers refuses to load. The export reads
    its config back through the import, which now refuses that rope for phi3: one line naming model.family and the
    field, nothing written."""
    from gptforge.interop.hf_llama import export_hf_llama
    from gptforge.models.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96, vocab_size=268,
                              block_size=32, family="phi3", **rope))
    with pytest.raises(ValueError, match=f"model.family=phi3.*rope_type='{rope['rope_type']}'") as e:
        export_hf_llama(model, tmp_path / "out", tokenizer=False)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    with pytest.raises(Exception, match="longrope"):  # what the file would have been: Phi3Config refuses it
        transformers.Phi3Config(rope_parameters={"rope_type": rope["rope_type"], "factor": rope["rope_factor"],
                                                 "rope_theta": 10_000.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16})


# ----------------------------------------------------------------------------- the hub door's config dict


@pytest.mark.parametrize("name", list(BUILD))
def test_the_hub_doors_config_dict_reads_as_the_folders(name, tmp_path):
    """A hub name's config comes through AutoConfig(...).to_dict(), which spells out every default, some as null
    (Qwen's sliding_window, Gemma 3's soft-caps): it reads to the same LlamaConfig as the folder's config.json,
    and a class's all-default dict is read, not refused as a null where a value belongs."""
    import json

    from gptforge.interop.hf_llama import llama_config_from_hf
    from tests.models.test_llama_families import COMMON

    kind, extra = BUILD[name]
    getattr(transformers, f"{kind}Config")(**COMMON, **extra).save_pretrained(tmp_path)
    folder = llama_config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert llama_config_from_hf(transformers.AutoConfig.from_pretrained(tmp_path).to_dict()) == folder
    defaults = getattr(transformers, f"{kind}Config")().to_dict()
    assert llama_config_from_hf(defaults).block_size == defaults["max_position_embeddings"]


NULL_MEANS_NONE = [("mistral", "sliding_window"), ("phi3", "sliding_window"), ("qwen3", "sliding_window"),
                   ("gemma2", "sliding_window"), ("gemma3", "sliding_window"), ("gemma2", "attn_logit_softcapping"),
                   ("gemma2", "final_logit_softcapping"), ("gemma3", "final_logit_softcapping")]


@pytest.mark.parametrize("name, key", NULL_MEANS_NONE, ids=[f"{n}-{k}" for n, k in NULL_MEANS_NONE])
def test_a_null_window_or_cap_is_read_as_transformers_reads_it(saved, name, key, tmp_path):
    """null for a window or a soft-cap: none, where transformers' model takes it so (Mistral's and Phi-3's window,
    Gemma 2's caps), and refused by name where transformers fails on it (Gemma's window: its sliding layers'
    mask needs one)."""
    msg = _agree(_edited(saved(name), tmp_path / "hf", _set(**{key: None})), tmp_path, export=False)
    if isinstance(msg, str):
        assert f"{key}=None" in msg, msg


@pytest.mark.parametrize("name", ["gemma2", "qwen3"])
def test_a_null_window_where_no_layer_slides_is_read_as_transformers_reads_it(saved, name, tmp_path):
    """Every layer full and the window null: transformers' Gemma still builds its sliding mask and fails (refused
    by name), its Qwen3 never uses the window (both load alike)."""
    def edit(c):
        c.update(sliding_window=None, layer_types=["full_attention"] * c["num_hidden_layers"])
        if name == "qwen3":
            c["max_window_layers"] = c["num_hidden_layers"]
    msg = _agree(_edited(saved(name), tmp_path / "hf", edit), tmp_path, export=False)
    assert isinstance(msg, str) == (name == "gemma2")
