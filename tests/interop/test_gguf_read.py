"""``read_gguf``: GGUF files back into gptforge (a Llama, its tokenizer, its chat template).

Fast tests write small files (gptforge's own ``export_gguf``, or ``gguf.GGUFWriter`` for the
quantised types and the tokenizer variants) and read them back: same logits, the exact dequantized
weights, llama.cpp's split for each pre-tokenizer, and one-line refusals for bad files. The real
SmolLM2-135M-Instruct file's tests are in test_gguf_smollm.py.
"""

from __future__ import annotations

import random
import struct
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf import export_gguf, llama_tensors  # noqa: E402
from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402

Q = gguf.GGMLQuantizationType


def _alphabet() -> list[str]:
    from gptforge.data.tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER = ["<think>"]
MERGED = ["12", "34", "1234", "Ġt", "he", "Ġthe", "ab", "abc"]  # "abc" has no merge leading to it
MERGES = ["1 2", "3 4", "12 34", "Ġ t", "h e", "Ġt he", "a b"]
TOKENS = SPECIALS + USER + _alphabet() + MERGED
TYPES = [3] * len(SPECIALS) + [4] * len(USER) + [1] * (256 + len(MERGED))


def tiny_llama(vocab: int = len(TOKENS), **kw) -> Llama:
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=64, vocab_size=vocab, rope_theta=500.0)
    m = Llama(LlamaConfig(**{**cfg, **kw}))
    with torch.no_grad():  # non-trivial norms, so a mix-up shows in the logits
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def add_llama_hparams(w, cfg) -> None:
    """The llama hyperparameters of a GGUF, as llama.cpp's converter writes them (shared by the GGUF tests)."""
    w.add_context_length(cfg.block_size)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)


def write_f32_tensors(w, model: Llama) -> None:
    """``model``'s tensors in llama.cpp's layout as float32, then the file closed (shared by the GGUF tests)."""
    import numpy as np

    from gptforge.interop.gguf import llama_tensors

    for name, t in llama_tensors(model).items():
        w.add_tensor(name, np.ascontiguousarray(t.detach().float().numpy(), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path: Path, model: Llama, qtype: str = "F32", pre: str | None = "smollm", arch: str = "llama",
               tok_model: str = "gpt2", kv: dict | None = None, tensors: dict | None = None) -> Path:
    """A llama GGUF as llama.cpp's converter lays it out (``llama_tensors``: names, q/k permutation),
    matrices in ``qtype``, norms F32, with the small byte-level tokenizer above."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    add_llama_hparams(w, cfg)
    for k, v in (kv or {}).items():
        (w.add_string if isinstance(v, str) else w.add_uint32 if isinstance(v, int) else w.add_float32)(k, v)
    w.add_tokenizer_model(tok_model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    for name, t in (tensors if tensors is not None else llama_tensors(model)).items():
        data = t.detach().float().numpy()
        if data.ndim == 1 or qtype == "F32":
            w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        elif qtype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, Q[qtype]), raw_dtype=Q[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rewrite_gguf(src: Path, dst: Path, key: str, value=None, vtype=None) -> Path:
    """``src`` rewritten by the gguf package's reader and writer with metadata ``key`` set to ``value`` of
    GGUF type ``vtype``, or left out when ``vtype`` is None; every other key and tensor as it was."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8"))
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", key):
            continue
        vt = f.types[0]
        (w.add_array(k, f.contents()) if vt == gguf.GGUFValueType.ARRAY else w.add_key_value(k, f.contents(), vt))
    if vtype is not None:
        w.add_key_value(key, value, vtype)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


IDS = torch.tensor([[5, 77, 100, 3, 200, 9, 42, 260, 7, 1]])


def _logits(model: Llama, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]


# ----------------------------------------------------------------------------- weights and logits


@pytest.mark.parametrize("tied", [False, True])
def test_writer_f32_logits_equal(tmp_path, tied):
    model = tiny_llama(tie_embeddings=tied)
    g = read_gguf(write_gguf(tmp_path / "m.gguf", model))
    assert g.model.config.tie_embeddings is tied and not g.model.training
    assert g.model.config.n_kv_head == 2 and g.model.config.hidden_dim == model.config.hidden_dim
    torch.testing.assert_close(_logits(g.model), _logits(model), atol=1e-5, rtol=0)
    if tied:
        assert g.model.lm_head.weight is g.model.model.embed_tokens.weight


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_types_dequantize_exactly(tmp_path, qtype):
    """Each weight read back is exactly the ``gguf`` package's quantize -> dequantize of the original
    (the q/k permutation only moves rows, and blocks run along a row), so the logits are the
    reference model's."""
    model = tiny_llama()
    g = read_gguf(write_gguf(tmp_path / "m.gguf", model, qtype))
    V = model.config.vocab_size
    ref = tiny_llama()
    with torch.no_grad():
        for k, p in ref.named_parameters():
            if p.dim() == 2:
                rows = p[:V] if "embed" in k or "lm_head" in k else p
                x = rows.numpy()
                if qtype == "F16":
                    y = x.astype(np.float16).astype(np.float32)
                else:
                    y = gguf.quants.dequantize(gguf.quants.quantize(x, Q[qtype]), Q[qtype])
                rows.copy_(torch.from_numpy(np.asarray(y, dtype=np.float32)))
    got = g.model.state_dict()
    for k, v in ref.state_dict().items():
        rows = v[:V] if "embed" in k or "lm_head" in k else v
        assert torch.equal(got[k][: rows.shape[0]], rows), k
    torch.testing.assert_close(_logits(g.model), _logits(ref), atol=1e-5, rtol=0)


def test_k_quant_passes_through_gguf_dequantize(tmp_path):
    """A K-quant (Q6_K; the gguf package reads but does not write them) is dequantized by the gguf
    package as is: valid blocks with random quants and a finite scale."""
    model = tiny_llama(n_embd=256, n_head=4, n_kv_head=2, intermediate_size=256)
    tensors = llama_tensors(model)
    rng = np.random.default_rng(0)
    name = "blk.0.ffn_up.weight"
    rows, cols = tensors[name].shape
    blocks = rows * cols // 256
    raw = rng.integers(0, 256, size=(blocks, 210), dtype=np.uint8)  # Q6_K: ql 128, qh 64, scales 16, d f16
    raw[:, 208:210] = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)
    raw = raw.reshape(rows, cols // 256 * 210)
    want = gguf.quants.dequantize(raw, Q.Q6_K).reshape(rows, cols)
    path = write_gguf(tmp_path / "m.gguf", model, tensors=dict(tensors))
    # rewrite with the Q6_K tensor in place of the F32 one
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    r = gguf.GGUFReader(str(path))
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, vt)
    for t in r.tensors:
        data = np.array(t.data)
        if t.name == name:
            w.add_tensor(name, raw, raw_dtype=Q.Q6_K)
        else:
            w.add_tensor(t.name, data.reshape(tuple(int(x) for x in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = read_gguf(tmp_path / "k.gguf")
    assert torch.equal(g.model.state_dict()["model.layers.0.mlp.up_proj.weight"], torch.from_numpy(want))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gptforge_export_reads_back(tmp_path, dtype):
    """gptforge's own exporter (GPT-2's tokenizer, pre-tokenizer gpt-2) -> read_gguf: the same
    logits, and the same ids as gptforge's GPT-2 tokenizer."""
    from gptforge.data.tokenizer import gpt2_tokenizer

    model = tiny_llama(vocab=50257, n_embd=32, n_head=4, n_kv_head=2)
    path = export_gguf(model, tmp_path / "out", dtype=dtype)
    g = read_gguf(path)
    if dtype == "f16":  # the exporter rounds matrices to float16 and keeps norms float32
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.copy_(p.half().float())
    ids = torch.tensor([[15496, 11, 314, 1101, 257, 3303, 2746, 11, 50256, 464]])
    torch.testing.assert_close(_logits(g.model, ids), _logits(model, ids), atol=1e-5, rtol=0)
    ref = gpt2_tokenizer()
    for s in strings(300, seed=3):
        assert g.tokenizer.encode_ordinary(s) == ref.encode_ordinary(s), s
    assert g.tokenizer.eot_token == 50256


# ----------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize(("pre", "digits"), [
    ("gpt-2", ["1234", "5"]),  # one \p{N}+ piece, merged as far as the merges go
    ("smollm", list("12345")),  # every digit alone (llama.cpp: \p{N} first)
    ("qwen2", list("12345")),
    ("llama-bpe", ["12", "3", "4", "5"]),  # \p{N}{1,3}: "123" | "45"
])
def test_pre_tokenizer_splits_digits_as_llama_cpp(tmp_path, pre, digits):
    g = read_gguf(write_gguf(tmp_path / "m.gguf", tiny_llama(), pre=pre))
    tok = g.tokenizer
    assert [tok.decode([i]) for i in tok.encode_ordinary("12345")] == digits


def test_tokenizer_specials_user_defined_ignore_merges(tmp_path):
    g = read_gguf(write_gguf(tmp_path / "m.gguf", tiny_llama(), pre="smollm"))
    tok = g.tokenizer
    assert g.chat_template.startswith("{% for m in messages %}")
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2 and tok.eot_token == 1
    assert set(tok.special_tokens) == set(SPECIALS)
    assert tok.encode_ordinary(" the") == [TOKENS.index("Ġthe")]
    assert tok.encode_ordinary("abc") == [TOKENS.index("ab"), TOKENS.index("c")]  # no merge makes "abc"
    assert tok.encode_ordinary("<think>") == [3]  # user-defined: always whole
    assert 1 not in tok.encode_ordinary("<|im_start|>")  # control token text typed as text stays text
    assert tok.encode("<|im_start|>", allowed_special="all") == [1]
    llama3 = read_gguf(write_gguf(tmp_path / "l.gguf", tiny_llama(), pre="llama-bpe")).tokenizer
    assert llama3.encode_ordinary("abc") == [TOKENS.index("abc")]  # ignore_merges: a word in the vocab is whole
    for s in strings(200, seed=1):
        assert tok.decode(tok.encode_ordinary(s)) == s


# ----------------------------------------------------------------------------- refusals


def _one_line(e: pytest.ExceptionInfo, path: Path) -> str:
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def _good(tmp_path) -> Path:
    return write_gguf(tmp_path / "good.gguf", tiny_llama())


def test_refuses_truncated_file(tmp_path):
    good = _good(tmp_path).read_bytes()
    for cut in (len(good) - 100, len(good) // 2, 2000, 30, 3):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(good[:cut])
        with pytest.raises(GGUFReadError) as e:
            read_gguf(bad)
        assert any(w in _one_line(e, bad) for w in ("truncated", "outside", "magic"))


def test_refuses_lying_shapes(tmp_path):
    model = tiny_llama()
    path = write_gguf(tmp_path / "m.gguf", model)
    w_bad = tmp_path / "ffn.gguf"
    tensors = llama_tensors(model)
    tensors["blk.1.ffn_up.weight"] = tensors["blk.1.ffn_up.weight"][:128]  # 192 rows claimed by the metadata
    write_gguf(w_bad, model, tensors=tensors)
    with pytest.raises(GGUFReadError, match=r"tensor blk\.1\.ffn_up\.weight has shape \[128, 64\]") as e:
        read_gguf(w_bad)
    _one_line(e, w_bad)
    extra = dict(llama_tensors(model))
    extra["blk.1.attn_q.bias"] = torch.zeros(64)
    extra["blk.0.attn_q.bias"] = torch.zeros(64)
    write_gguf(tmp_path / "bias.gguf", model, tensors=extra)
    with pytest.raises(GGUFReadError) as e:  # the first by name, the count, the family
        read_gguf(tmp_path / "bias.gguf")
    assert str(e.value) == (f"{tmp_path / 'bias.gguf'}: tensor blk.0.attn_q.bias has no place in gptforge's Llama "
                            "(2 such tensors; biases, experts and extra norms are not implemented)")
    missing = dict(llama_tensors(model))
    del missing["blk.1.ffn_down.weight"], missing["blk.0.ffn_up.weight"]
    write_gguf(tmp_path / "missing.gguf", model, tensors=missing)
    with pytest.raises(GGUFReadError) as e:
        read_gguf(tmp_path / "missing.gguf")
    assert str(e.value) == f"{tmp_path / 'missing.gguf'}: tensor blk.0.ffn_up.weight is missing (2 missing)"
    assert read_gguf(path).model.config.n_layer == 2


def _patch_tensor_type(src: Path, dst: Path, name: str, ttype: int) -> None:
    data = bytearray(src.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key, 24) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, ttype)
    dst.write_bytes(bytes(data))


def test_refuses_unknown_or_unsupported_tensor_type(tmp_path):
    good = _good(tmp_path)
    _patch_tensor_type(good, tmp_path / "iq.gguf", "blk.0.ffn_up.weight", int(Q.IQ2_XXS))
    with pytest.raises(GGUFReadError, match=r"tensor blk\.0\.ffn_up\.weight is IQ2_XXS") as e:
        read_gguf(tmp_path / "iq.gguf")
    _one_line(e, tmp_path / "iq.gguf")
    _patch_tensor_type(good, tmp_path / "99.gguf", "blk.0.ffn_up.weight", 99)
    with pytest.raises(GGUFReadError, match=r"blk\.0\.ffn_up\.weight has unknown type 99"):
        read_gguf(tmp_path / "99.gguf")


def _header(n_tensors: int, n_kv: int, body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body + b"\0" * 64


def _kv_string(key: str, n: int) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IQ", 8, n)


@pytest.mark.parametrize(("raw", "match"), [
    (_header(1 << 40, 0), "tensor_count=1099511627776 is absurd"),
    (_header(0, 1 << 50), "kv_count=.* is absurd"),
    (_header(0, 1, _kv_string("general.name", 1 << 30)), "general.name is 1073741824 bytes long"),
    (_header(0, 1, _kv_string("general.name", 1 << 19)), "truncated"),
    (_header(0, 1, struct.pack("<Q", 14) + b"tokenizer.ggml" + struct.pack("<IIQ", 9, 8, 1 << 40)),
     "tokenizer.ggml claims 1099511627776 items"),
    (_header(1, 0, struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9) + struct.pack("<" + "Q" * 9, *[2] * 9)),
     "has 9 dimensions"),
    (b"NOPE" + b"\0" * 100, "no GGUF magic"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF.version=1"),
])
def test_refuses_absurd_headers(tmp_path, raw, match):
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(GGUFReadError, match=match) as e:
        read_gguf(path)
    _one_line(e, path)


def test_refuses_what_llama_cannot_represent(tmp_path):
    model = tiny_llama()
    cases = [
        (dict(kv={"llama.rope.scaling.type": "longrope"}), "llama.rope.scaling.type='longrope'"),
        (dict(kv={"llama.rope.scaling.type": "yarn"}), "rope scaling"),
        (dict(tok_model="llama"), "tokenizer.ggml.model='llama'"),
        (dict(pre="deepseek-llm"), "tokenizer.ggml.pre='deepseek-llm'"),
        (dict(pre=None), "tokenizer.ggml.pre is missing"),
    ]
    for i, (kw, match) in enumerate(cases):
        path = write_gguf(tmp_path / f"c{i}.gguf", model, **kw)
        with pytest.raises(GGUFReadError, match=match) as e:
            read_gguf(path)
        _one_line(e, path)
    gpt2 = tmp_path / "gpt2.gguf"
    write_gguf(gpt2, model, arch="gpt2")  # a Llama's keys and tensors under gpt2: refused by the first that differs
    with pytest.raises(GGUFReadError, match=r"gpt2\.attention\.head_count_kv=2: grouped keys"):
        read_gguf(gpt2)
    write_gguf(tmp_path / "mistral.gguf", model, arch="mistral")
    with pytest.raises(GGUFReadError) as e:  # refused before the tokenizer is read, naming what is read
        read_gguf(tmp_path / "mistral.gguf")
    assert str(e.value) == (f"{tmp_path / 'mistral.gguf'}: general.architecture='mistral'; gptforge reads GGUF "
                            "architectures llama, qwen2, gpt2, qwen3, gemma2, gemma3, phi3")
    tensors = dict(llama_tensors(model))
    tensors["blk.0.ffn_up.weight"] = tensors["blk.0.ffn_up.weight"].clone()
    tensors["blk.0.ffn_up.weight"][3, 5] = float("nan")
    write_gguf(tmp_path / "nan.gguf", model, tensors=tensors)
    with pytest.raises(GGUFReadError, match=r"blk\.0\.ffn_up\.weight: holds NaN") as e:
        read_gguf(tmp_path / "nan.gguf")
    assert str(e.value) == f"{tmp_path / 'nan.gguf'}: tensor blk.0.ffn_up.weight: holds NaN or infinite values"
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFReadError, match="empty"):
        read_gguf(tmp_path / "empty.gguf")


# ----------------------------------------------------------------------------- generated text
# (here and in test_gguf_smollm.py, which checks the real SmolLM2 tokenizer on it)

POOLS = [
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    ["the", "The", " quick", "brown", " fox", "Hello", " world", "don't", "I'LL", "we've", "it's", "l'été"],
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), ["...", "->", "==", "!=", "**", "//", "''", "'s", "'ll", "'S", "'Re"],
    [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\x0b", "\x0c"],
    list("éèàüößçñøåÆŒ") + ["Ж", "Привет", "мир", "Ελλάδα", "עברית", "العربية", "हिन्दी", "中文", "日本語", "한국어", "ไทย"],
    ["😀", "👍🏽", "🇫🇷", "❤️", "e\u0301", "\u200b", "\ufeff", "ﬁ", "Ⓐ"],
    ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<|im_start|>user\n", "<|", "|>"],
]
NUMERIC_POOLS = [
    list("0123456789"), ["12", "345", "2024", "3.14159", "1,000,000", "-42", "0x1F", "1e10", " 7", "  12", "\n\n3"],
    ["²", "³", "½", "¼", "٣", "٤٥", "۱۲", "४", "Ⅻ", "①", "𝟙", "〇", "¹²³", " ²", " ½x", "x²", "१२३"],
]


def strings(n: int, seed: int = 0) -> list[str]:
    """Generated text: every other string has no numeric character (\\p{N}) at all."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pools = POOLS if i % 2 else POOLS + NUMERIC_POOLS * 2
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 24))))
    return out


def _numeric(s: str) -> bool:
    return any(unicodedata.category(c).startswith("N") for c in s)
