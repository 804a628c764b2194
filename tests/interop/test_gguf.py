"""``gptforge export gguf`` read back with the ``gguf`` package (llama.cpp's own reader): tensor names
from llama.cpp's per-architecture lists, shapes, dtypes, the metadata keys llama.cpp's loader reads,
the tokenizer and chat template; values round-trip, and a small NumPy forward pass written from
llama.cpp's definitions of the ``gpt2`` and ``llama`` graphs (interleaved rotary pairs, tanh GELU)
reproduces gptforge's logits from the file alone, for both families."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.config import Config  # noqa: E402
from gptforge.data.chat import ChatTemplate  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
from gptforge.run.checkpoint import save_checkpoint  # noqa: E402

T = ChatTemplate.gpt2()
IDS = [15496, 11, 314, 1101, 257, 3303, 2746, 11, 50256, 464]


def _perturbed(m: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():  # non-trivial norms and biases, so a mix-up shows in the logits
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def gpt2_model(**kw) -> GPT:
    torch.manual_seed(0)
    return _perturbed(GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, block_size=32), **kw})))


def llama_model(**kw) -> Llama:
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=T.vocab_size, rope_theta=500.0)
    return _perturbed(Llama(LlamaConfig(**{**cfg, **kw})))


def _export(tmp_path, model, *flags, chat: bool = False) -> tuple[int, object]:
    meta = {"config": Config(model=model.config).to_dict()}
    if chat:
        meta["chat_template"] = T.to_dict()
    ck = save_checkpoint(tmp_path / "myrun", 1, model, None, meta)
    return main(["export", "gguf", "--ckpt", str(ck), "--out", str(tmp_path / "out"), *flags]), tmp_path / "out"


def _read(path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    tensors = {t.name: t for t in r.tensors}
    return fields, tensors


def _array(t) -> np.ndarray:
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
        tuple(int(x) for x in reversed(t.shape)))


def _expected_names(arch, n_layer: int, names: set[str]) -> None:
    """Every tensor is one llama.cpp knows for the architecture (gguf's MODEL_TENSORS tables)."""
    allowed = {gguf.TENSOR_NAMES[t].format(bid=b) for t in gguf.MODEL_TENSORS[arch] for b in range(n_layer)}
    assert {n.rsplit(".", 1)[0] for n in names} <= allowed


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _attend(q, k, v):  # (H, T, hd) each, causal
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def gpt2_forward(W: dict, f: dict, ids: list[int]) -> np.ndarray:
    """llama.cpp's gpt2 graph, from the file's tensors and keys only."""
    H, T_ = f["gpt2.attention.head_count"], len(ids)
    eps = f["gpt2.attention.layer_norm_epsilon"]
    x = W["token_embd.weight"][ids] + W["position_embd.weight"][:T_]
    for i in range(f["gpt2.block_count"]):
        g = lambda n, i=i: W[f"blk.{i}.{n}"]  # noqa: E731
        h = _layer_norm(x, g("attn_norm.weight"), g("attn_norm.bias"), eps)
        q, k, v = np.split(h @ g("attn_qkv.weight").T + g("attn_qkv.bias"), 3, axis=-1)
        heads = [a.reshape(T_, H, -1).transpose(1, 0, 2) for a in (q, k, v)]
        a = _attend(*heads).transpose(1, 0, 2).reshape(T_, -1)
        x = x + a @ g("attn_output.weight").T + g("attn_output.bias")
        h = _layer_norm(x, g("ffn_norm.weight"), g("ffn_norm.bias"), eps)
        u = h @ g("ffn_up.weight").T + g("ffn_up.bias")
        u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))  # ggml_gelu
        x = x + u @ g("ffn_down.weight").T + g("ffn_down.bias")
    x = _layer_norm(x, W["output_norm.weight"], W["output_norm.bias"], eps)
    return x @ W["output.weight"].T


def _rms(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def _rope_interleaved(x, base):  # (H, T, hd): llama.cpp's LLAMA_ROPE_TYPE_NORM rotates pairs (2i, 2i+1)
    hd = x.shape[-1]
    ang = np.arange(x.shape[1])[:, None] * base ** (-np.arange(0, hd, 2) / hd)[None, :]
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def llama_forward(W: dict, f: dict, ids: list[int]) -> np.ndarray:
    """llama.cpp's llama graph (GQA, interleaved rotary, SwiGLU), from the file's tensors and keys only."""
    H, KV, T_ = f["llama.attention.head_count"], f["llama.attention.head_count_kv"], len(ids)
    eps, base = f["llama.attention.layer_norm_rms_epsilon"], f["llama.rope.freq_base"]
    x = W["token_embd.weight"][ids]
    for i in range(f["llama.block_count"]):
        g = lambda n, i=i: W[f"blk.{i}.{n}"]  # noqa: E731
        h = _rms(x, g("attn_norm.weight"), eps)
        q = (h @ g("attn_q.weight").T).reshape(T_, H, -1).transpose(1, 0, 2)
        k = (h @ g("attn_k.weight").T).reshape(T_, KV, -1).transpose(1, 0, 2)
        v = (h @ g("attn_v.weight").T).reshape(T_, KV, -1).transpose(1, 0, 2)
        q, k = _rope_interleaved(q, base), _rope_interleaved(k, base)
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)
        x = x + _attend(q, k, v).transpose(1, 0, 2).reshape(T_, -1) @ g("attn_output.weight").T
        h = _rms(x, g("ffn_norm.weight"), eps)
        gate = h @ g("ffn_gate.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ g("ffn_up.weight").T)) @ g("ffn_down.weight").T
    x = _rms(x, W["output_norm.weight"], eps)
    return x @ W.get("output.weight", W["token_embd.weight"]).T


def _logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0, :, : model.config.vocab_size].double().numpy()


@pytest.fixture(scope="module")
def gpt2_file(tmp_path_factory):
    """A GPT-2 base model exported as f16 without the tokenizer (the reader takes seconds over 50k
    tokens; the Llama file below carries and checks it)."""
    from gptforge.interop.gguf import export_gguf

    model = gpt2_model()
    return model, *_read(export_gguf(model, tmp_path_factory.mktemp("g"), dtype="f16", name="myrun", tokenizer=False))


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    """A Llama chat model (GQA, own head) exported as f32, read back once."""
    model = llama_model()
    code, out = _export(tmp_path_factory.mktemp("l"), model, chat=True)
    assert code == 0
    return model, *_read(out / "model-f32.gguf")


def test_gpt2_metadata(gpt2_file):
    _, f, _ = gpt2_file
    assert f["general.architecture"] == "gpt2" and f["general.name"] == "myrun" and f["general.file_type"] == 1
    assert (f["gpt2.context_length"], f["gpt2.embedding_length"], f["gpt2.block_count"],
            f["gpt2.attention.head_count"], f["gpt2.feed_forward_length"]) == (32, 32, 2, 2, 128)
    assert f["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)


def test_gpt2_tensors_and_logits(gpt2_file):
    model, f, tensors = gpt2_file
    _expected_names(gguf.MODEL_ARCH.GPT2, 2, set(tensors))
    assert len(tensors) == 4 + 12 * 2 + 1  # embeddings, final norm, 12 per block, the (tied) output
    qkv = tensors["blk.0.attn_qkv.weight"]
    assert list(qkv.shape) == [32, 96] and qkv.tensor_type == gguf.GGMLQuantizationType.F16  # ne: (in, out)
    assert tensors["blk.0.attn_qkv.bias"].tensor_type == gguf.GGMLQuantizationType.F32  # 1-D stays float32
    W = {n: _array(t) for n, t in tensors.items()}
    assert W["token_embd.weight"].shape == (50257, 32)  # vocabulary padding sliced off
    sd = model.state_dict()
    want = sd["transformer.h.1.mlp.c_proj.weight"].half().double().numpy()
    assert np.array_equal(W["blk.1.ffn_down.weight"], want)  # values round-trip (in float16)
    assert np.array_equal(W["output_norm.bias"], sd["transformer.ln_f.bias"].double().numpy())
    assert np.abs(gpt2_forward(W, f, IDS) - _logits(model, IDS)).max() < 2e-3


def test_llama_chat_model(llama_file):
    model, f, tensors = llama_file
    assert f["general.architecture"] == "llama" and f["general.file_type"] == 0
    assert (f["llama.attention.head_count"], f["llama.attention.head_count_kv"], f["llama.rope.dimension_count"],
            f["llama.feed_forward_length"], f["llama.vocab_size"]) == (4, 2, 8, model.config.hidden_dim, T.vocab_size)
    assert f["llama.rope.freq_base"] == 500.0 and f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert f["general.name"] == "myrun"  # the run directory's name (export gguf --ckpt RUN/checkpoints/step_N)
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "gpt-2"
    toks, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    assert len(toks) == len(types) == T.vocab_size and toks[50256] == "<|endoftext|>" and toks[1212] == "This"
    assert toks[11] == "," and toks[220] == "Ġ" and types[0] == gguf.TokenType.NORMAL
    assert len(f["tokenizer.ggml.merges"]) == 50000 and f["tokenizer.ggml.merges"][0] == "Ġ t"
    assert f["tokenizer.ggml.add_bos_token"] is False and f["tokenizer.ggml.eot_token_id"] == T.end
    assert toks[50257:] == ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    assert all(t == gguf.TokenType.CONTROL for t in types[50256:])
    assert f["tokenizer.ggml.eos_token_id"] == T.end and f["tokenizer.ggml.bos_token_id"] == 50256
    assert f["tokenizer.chat_template"] == T.jinja()
    _expected_names(gguf.MODEL_ARCH.LLAMA, 2, set(tensors))
    assert "output.weight" in tensors and list(tensors["blk.0.attn_k.weight"].shape) == [32, 16]
    W = {n: _array(t) for n, t in tensors.items()}
    sd = model.state_dict()
    assert np.array_equal(W["blk.0.attn_v.weight"], sd["model.layers.0.self_attn.v_proj.weight"].double().numpy())
    # q/k rows are re-paired for llama.cpp's rotary: the same rows, in another order within each head
    q = sd["model.layers.0.self_attn.q_proj.weight"].double().numpy()
    assert not np.array_equal(W["blk.0.attn_q.weight"], q)
    assert np.array_equal(np.sort(W["blk.0.attn_q.weight"], axis=0), np.sort(q, axis=0))
    assert np.abs(llama_forward(W, f, IDS) - _logits(model, IDS)).max() < 1e-4


def test_bf16_and_tied_head(tmp_path):
    """bf16 weights (norms stay float32); a tied Llama leaves ``output`` out. No tokenizer: fast to read."""
    from gptforge.interop.gguf import export_gguf

    model = llama_model(tie_embeddings=True, vocab_size=50257)
    f, tensors = _read(export_gguf(model, tmp_path / "o", dtype="bf16", tokenizer=False))
    assert f["general.file_type"] == 32 and "output.weight" not in tensors  # llama.cpp reads token_embd instead
    assert tensors["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert tensors["blk.0.ffn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    W = {n: _array(t) for n, t in tensors.items()}
    want = model.state_dict()["model.layers.1.mlp.up_proj.weight"].bfloat16().double().numpy()
    assert W["blk.1.ffn_up.weight"].shape == want.shape and np.array_equal(W["blk.1.ffn_up.weight"], want)
    assert np.abs(llama_forward(W, f, IDS) - _logits(model, IDS)).max() < 2e-2


@pytest.mark.parametrize("model, words", [
    (lambda: llama_model(qk_norm=True), "model.qk_norm"),
    (lambda: llama_model(mlp="relu2"), "model.mlp"),
    (lambda: llama_model(logit_softcap=15.0), "model.logit_softcap"),
    (lambda: gpt2_model(bias=False), "model.bias=false"),
    (lambda: gpt2_model(vocab_size=512), "model.vocab_size=512"),
])
def test_refuses_what_llama_cpp_cannot_run(tmp_path, capsys, model, words):
    code, out = _export(tmp_path, model())
    assert code == 2 and words in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written


def test_no_tokenizer_is_refused(tmp_path, capsys):
    code, _ = _export(tmp_path, gpt2_model(), "--no-tokenizer")
    assert code == 2 and "must carry its tokenizer" in capsys.readouterr().err
