"""GGUF files of Qwen3, Mistral, Phi-3, Gemma 2 and Gemma 3 against transformers.

Each tiny random transformers model (shaped as llama.cpp's fixed choices need: Gemma's query scale
by head_dim, its every-2nd/6th full layer, Gemma 3's local rope base 10,000) is written to GGUF here,
by the test, with the ``gguf`` package as llama.cpp's converter (``convert_hf_to_gguf.py``) lays it
out: its tensor names, Gemma's norms stored as 1 + w, Mistral's q/k rows permuted as Llama's, Phi-3's
fused matrices as they are, the family's metadata keys. ``read_gguf`` of that file must give
transformers' logits (float32, 40 tokens over a window of 8). Then gptforge's own ``export_gguf`` of
the loaded model must write the same tensors and keys the converter layout says, and read back to the
same logits; what llama.cpp's architecture fixes differently is refused at export by the field's name.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gptforge.interop.gguf import export_gguf  # noqa: E402
from gptforge.interop.gguf_config import IGNORES_WINDOW  # noqa: E402
from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from gptforge.interop.hf_llama import load_hf_llama  # noqa: E402
from tests.interop.test_gguf_read import MERGES, TOKENS, TYPES  # noqa: E402
from tests.models.hf_reference import random_hf_model  # noqa: E402

VOCAB = len(TOKENS)  # 268
T, WINDOW = 40, 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
ROPE = {"rope_type": "default", "rope_theta": 500.0}
S, F = "sliding_attention", "full_attention"
FAMILIES = {  # name -> (transformers class prefix, config extras, llama.cpp arch)
    "qwen3": ("Qwen3", dict(head_dim=24, rope_parameters=ROPE), "qwen3"),
    "mistral": ("Mistral", dict(sliding_window=WINDOW, rope_parameters=ROPE), "llama"),
    "phi3": ("Phi3", dict(sliding_window=WINDOW, rope_parameters=ROPE), "phi3"),
    "gemma2": ("Gemma2", dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=WINDOW, layer_types=[S, F, S],
                              attn_logit_softcapping=0.5, final_logit_softcapping=1.0, rope_parameters=ROPE), "gemma2"),
    "gemma3": ("Gemma3Text", dict(num_hidden_layers=6, head_dim=32, query_pre_attn_scalar=32, sliding_window=WINDOW,
                                  layer_types=[S] * 5 + [F],
                                  rope_parameters={S: {"rope_type": "default", "rope_theta": 10_000.0},
                                                   F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
               "gemma3"),
}
IDX = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(7))
# derived as in tests/models/test_llama_families.py: sums of <= 96 float32 terms over <= 6 layers and the
# head, |logits| < 10: 96 * 7 * 1.2e-7 * 10 ~ 8e-4 bounds any reordering; measured: ~1e-6 or exactly 0
ATOL = 96 * 7 * 1.2e-7 * 10


def _hf_model(name: str):
    kind, extra, _ = FAMILIES[name]
    return random_hf_model(kind, **{**COMMON, **extra})


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter's LlamaModel.permute (HF rotate-half rows -> interleaved pairs), written from it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def converter_tensors(hf, arch: str) -> dict[str, np.ndarray]:
    """The HF state dict as llama.cpp's convert_hf_to_gguf.py names and transforms it."""
    c = hf.config
    gemma = arch.startswith("gemma")
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
             "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
    out = {}
    for k, v in hf.state_dict().items():
        v = v.detach().float()
        if k == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif k == "model.norm.weight":
            name = "output_norm.weight"
        elif k == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            name = "output.weight"
        else:
            _, _, i, rest = k.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{i}.{names[module]}.{kind}"
            if arch == "llama" and module == "self_attn.q_proj":
                v = _permute(v, c.num_attention_heads)
            if arch == "llama" and module == "self_attn.k_proj":
                v = _permute(v, c.num_key_value_heads)
        if gemma and name.endswith("norm.weight"):
            v = v + 1  # Gemma2Model.modify_tensors: llama.cpp multiplies by the stored weight
        out[name] = v.numpy()
    return out


def write_converter_gguf(path, hf, arch: str):
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters.get(F, c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in converter_tensors(hf, arch).items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    hf = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    with torch.no_grad():
        ref = hf(IDX).logits
    return request.param, hf, d, ref


def _close(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (got - ref).abs().max().item()
    print(f"{name}: max |gptforge - transformers| = {diff:.2e}")
    assert got.shape == ref.shape and diff <= ATOL, diff


def test_a_converter_layout_gguf_reads_back_to_transformers_logits(family):
    name, hf, d, ref = family
    arch = FAMILIES[name][2]
    g = read_gguf(write_converter_gguf(d / "conv.gguf", hf, arch))
    if arch in IGNORES_WINDOW:  # llama.cpp (and transformers' GGUF loader) run the file's window of 8 over 128 as
        ref = _unwindowed_logits(hf)  # whole-context attention: tests/interop/test_gguf_round13.py
    assert g.model.config.family == ("" if arch == "llama" else name)
    with torch.no_grad():
        _close(f"{name} converter gguf", g.model(IDX)[0], ref)


def _unwindowed_logits(hf) -> torch.Tensor:
    hf = copy.deepcopy(hf)  # the module's model stays as it is
    hf.config.sliding_window = None
    with torch.no_grad():
        return hf(IDX).logits


def test_export_gguf_writes_the_converter_layout(family, tmp_path):
    """export_gguf of the HF-loaded model: the converter's tensors (names, values) and keys, and its
    read-back gives transformers' logits."""
    name, hf, d, ref = family
    arch = FAMILIES[name][2]
    hf.save_pretrained(tmp_path / "hf")
    if arch in IGNORES_WINDOW:  # llama.cpp's llama and phi3 attend over the whole context: the window of 8 over
        with pytest.raises(ValueError, match="shorter than model.block_size"):  # 128 has no GGUF form there
            export_gguf(load_hf_llama(str(tmp_path / "hf")), tmp_path / "out", tokenizer=False)
        hf = copy.deepcopy(hf)  # the same weights without it (the module's model stays as it is): the layout
        hf.config.sliding_window = None  # is what is checked here
        with torch.no_grad():
            ref = hf(IDX).logits
        hf.save_pretrained(tmp_path / "hf")
    path = export_gguf(load_hf_llama(str(tmp_path / "hf")), tmp_path / "out", tokenizer=False)
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.architecture"].contents() == arch
    got = {t.name: np.array(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    want = converter_tensors(hf, arch)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    keys = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.")}
    conv = gguf.GGUFReader(str(write_converter_gguf(tmp_path / "conv.gguf", hf, arch)))
    want_keys = {k: f.contents() for k, f in conv.fields.items() if k.startswith(f"{arch}.")}
    assert {k: keys.get(k) for k in want_keys} == want_keys
    from tests.interop.test_gguf_read import write_gguf

    # the exported tensors and keys with the small tokenizer (export_gguf's own is GPT-2's, 50k tokens)
    written = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base")  # by write_gguf
    kv = {k: v for k, v in keys.items() if k.split(".", 1)[1] not in written}
    model = load_hf_llama(str(tmp_path / "hf"))
    back = read_gguf(write_gguf(tmp_path / "m.gguf", model, arch=arch, kv=kv,
                                tensors={k: torch.from_numpy(v) for k, v in got.items()}))
    assert back.model.config.family == ("" if name == "mistral" else name)  # windowless: llama.cpp's plain llama
    with torch.no_grad():
        _close(f"{name} export gguf", back.model(IDX)[0], ref)


def test_what_llamacpp_fixes_differently_is_refused_at_export(tmp_path):
    """Gemma 2 with a query scale other than llama.cpp's (head_dim for all but the 27B), and Qwen3 with a
    sliding window (llama.cpp's qwen3 has none): refused by the field's name, nothing written."""
    from gptforge.models.llama import Llama, LlamaConfig

    hf = _hf_model("gemma2")
    hf.config.query_pre_attn_scalar = 24
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf_llama(str(tmp_path / "hf"))
    with pytest.raises(ValueError, match=r"model\.query_pre_attn_scalar=24\.0") as e:
        export_gguf(model, tmp_path / "out", tokenizer=False)
    assert "\n" not in str(e.value)
    qwen = Llama(LlamaConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, family="qwen3", qk_norm=True,
                             sliding_window=8))
    with pytest.raises(ValueError, match="qwen3.attention.sliding_window") as e:
        export_gguf(qwen, tmp_path / "out2", tokenizer=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_llamacpp_query_scale_and_layer_kinds_for_the_27b_models():
    """What llama.cpp fixes rather than stores, from its llama-model.cpp: queries scaled by n_embd/n_head
    for Gemma 2 27B (46 layers, 4608 wide, 32 heads of 128: 144) and Gemma 3 27B (62 layers, 5376 wide,
    32 heads of 128: 168), by head_dim otherwise; every 2nd (Gemma 2) or 6th (Gemma 3) layer full."""
    from pathlib import Path

    from gptforge.interop.gguf_families import config_fields

    def fields(arch, n_layer, n_embd, head_dim):
        kv = {f"{arch}.attention.sliding_window": 4096}
        return config_fields(arch, kv, Path("x.gguf"), n_layer, n_embd, 32, head_dim)

    assert fields("gemma2", 46, 4608, 128)["query_pre_attn_scalar"] == 144.0
    assert fields("gemma3", 62, 5376, 128)["query_pre_attn_scalar"] == 168.0
    assert fields("gemma2", 42, 3584, 256)["query_pre_attn_scalar"] == 256.0  # Gemma 2 9B: head_dim
    assert fields("gemma2", 4, 64, 16)["layer_types"] == "sfsf"
    assert fields("gemma3", 7, 64, 16)["layer_types"] == "sssssfs"
