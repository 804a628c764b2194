"""Hugging Face export and llm.c files, checked against transformers (logits, tokenizer) and against
llm.c's documented layout (a file written here by an independent writer that follows train_gpt2.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.interop import llmc
from gptforge.interop.hf import load_hf
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run.checkpoint import save_checkpoint

transformers = pytest.importorskip("transformers")


def _model(pad_vocab: bool = True, vocab: int = 50257, block: int = 32) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block, vocab_size=vocab, pad_vocab=pad_vocab))
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so a mix-up shows in the logits
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def _ckpt(tmp_path, model: GPT):
    return save_checkpoint(tmp_path / "run", 5, model, None, {"config": Config(model=model.config).to_dict()})


IDX = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("pad_vocab", [True, False])
def test_export_hf_logits_match_transformers(tmp_path, pad_vocab):
    from transformers import GPT2LMHeadModel

    model = _model(pad_vocab)
    assert main(["export", "hf", "--ckpt", str(_ckpt(tmp_path, model)), "--out", str(tmp_path / "hf"),
                 "--no-tokenizer"]) == 0
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.vocab_size == 50257 and hf.transformer.wte.weight.shape == (50257, 32)  # padding sliced off
    # the weights are as readable as config.json (safetensors alone would leave them 0600)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "hf").iterdir()}
    assert len(set(modes.values())) == 1, modes
    with torch.no_grad():
        ref = hf(IDX).logits
        got, _ = model(IDX)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
    # and back: gptforge reads the exported directory to the same logits
    back = load_hf(str(tmp_path / "hf"))
    with torch.no_grad():
        assert torch.allclose(back(IDX)[0], got, atol=1e-6)


def test_export_hf_refuses_non_empty_dir(tmp_path, capsys):
    ck = str(_ckpt(tmp_path, _model()))
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export", "hf", "--ckpt", ck, "--out", str(out), "--no-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err and str(out) in err
    assert not (out / "model.safetensors").exists()
    assert main(["export", "hf", "--ckpt", ck, "--out", str(out), "--no-tokenizer", "--force"]) == 0
    assert (out / "model.safetensors").exists() and (out / "notes.txt").exists()


def test_export_hf_tokenizer_encodes_like_tiktoken(tmp_path, tokenizer):
    from transformers import AutoTokenizer

    model = _model()
    assert main(["export", "hf", "--ckpt", str(_ckpt(tmp_path, model)), "--out", str(tmp_path / "hf")]) == 0
    merges = (tmp_path / "hf" / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[1:4] == ["Ġ t", "Ġ a", "h e"] and len(merges) == 1 + 50000  # GPT-2's first merges, all 50,000
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = ["Hello, I'm a language model,", "  leading spaces\n\nand newlines\t tabs", "naïve café — 東京 🤖 x²",
             "don't won't it's we'll they've I'd", "1234567 3.14159 $1,000,000", "ROMEO:\nBut soft! what light"]
    for t in texts:
        assert hf_tok.encode(t) == tokenizer.encode_ordinary(t), t
        assert hf_tok.decode(hf_tok.encode(t)) == t
    assert hf_tok.eos_token_id == 50256


# --- llm.c ------------------------------------------------------------------------------------------


def _reference_llmc_file(path, hf_model, dtype=np.float32, version=3):
    """An llm.c model file written straight from a transformers model, following llm.c's
    train_gpt2.py write_model/write_tensors (not gptforge's writer): Conv1D weights transposed to
    (out, in), vocabulary zero-padded to a multiple of 128."""
    sd = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    c = hf_model.config
    L, C, V = c.n_layer, c.n_embd, c.vocab_size
    Vp = (V + 127) // 128 * 128
    wte = torch.zeros(Vp, C)
    wte[:V] = sd["transformer.wte.weight"]
    parts = [wte, sd["transformer.wpe.weight"]]
    order = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True), ("attn.c_attn.bias", False),
             ("attn.c_proj.weight", True), ("attn.c_proj.bias", False), ("ln_2.weight", False), ("ln_2.bias", False),
             ("mlp.c_fc.weight", True), ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    for name, conv in order:
        for i in range(L):
            t = sd[f"transformer.h.{i}.{name}"]
            parts.append(t.t() if conv else t)
    parts += [sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, version, c.n_positions, V, L, c.n_head, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in parts:
            if dtype == np.float32:
                f.write(t.contiguous().numpy().astype(np.float32).tobytes())
            else:
                f.write(t.contiguous().to(torch.bfloat16).view(torch.int16).numpy().tobytes())


def _hf_tiny():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=50257,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    with torch.no_grad():
        for _, p in hf.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def test_read_llmc_reference_file_matches_transformers(tmp_path):
    hf = _hf_tiny()
    _reference_llmc_file(tmp_path / "ref.bin", hf)
    h = llmc.read_model_header(tmp_path / "ref.bin")
    assert (h["version"], h["maxT"], h["V"], h["L"], h["NH"], h["C"], h["Vp"]) == (3, 32, 50257, 2, 2, 32, 50304)
    ours = llmc.read_llmc_model(tmp_path / "ref.bin")
    with torch.no_grad():
        assert torch.allclose(ours(IDX)[0], hf(IDX).logits, atol=1e-5, rtol=0)
    # our writer reproduces the reference file byte for byte (same layout, same zero padding)
    llmc.write_llmc_model(ours, tmp_path / "ours.bin")
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()


def test_read_llmc_bf16_reference(tmp_path):
    hf = _hf_tiny()
    _reference_llmc_file(tmp_path / "ref5.bin", hf, dtype="bf16", version=5)
    ours = llmc.read_llmc_model(tmp_path / "ref5.bin")
    w = hf.transformer.h[1].mlp.c_fc.weight.detach().t().to(torch.bfloat16).float()
    assert torch.equal(ours.transformer.h[1].mlp.c_fc.weight, w)
    with torch.no_grad():
        assert torch.allclose(ours(IDX)[0], hf(IDX).logits, atol=0.05)  # bf16 weights, close not equal


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llmc_round_trip_via_cli(tmp_path, dtype, tokenizer):
    model = _model(pad_vocab=False)  # written padded to 50304, read back as a padded model
    ck = _ckpt(tmp_path, model)
    assert main(["export", "llmc", "--ckpt", str(ck), "--out", str(tmp_path / "llmc"), "--dtype", dtype]) == 0
    out = tmp_path / "llmc" / "model.bin"
    h = llmc.read_model_header(out)
    assert h["version"] == {"float32": 3, "bfloat16": 5}[dtype] and h["Vp"] == 50304
    assert out.stat().st_size == 1024 + h["num_params"] * (4 if dtype == "float32" else 2)
    assert main(["import", "llmc", "--model", str(out), "--out", str(tmp_path / "run2")]) == 0
    back = GPT(Config.from_dict(json.loads(next((tmp_path / "run2").rglob("meta.json")).read_text())["config"]).model)
    from gptforge.run.identity import resolve_checkpoint
    from gptforge.run.restore import load_model_weights

    load_model_weights(back, resolve_checkpoint(tmp_path / "run2"))
    sd, sd2 = model.state_dict(), back.state_dict()
    for k, v in sd.items():
        w = sd2[k][: v.size(0)] if k in ("transformer.wte.weight", "lm_head.weight") else sd2[k]
        ref = v if dtype == "float32" else v.to(torch.bfloat16).float()
        assert torch.equal(w, ref), k
    assert main(["export", "llmc", "--ckpt", str(ck), "--out", str(tmp_path / "llmc")]) == 2  # exists, no --force
    toks, eot = llmc.read_llmc_tokenizer(tmp_path / "llmc" / "tokenizer.bin")
    assert eot == 50256 and len(toks) == 50257
    assert all(toks[i] == tokenizer.decode_single_token_bytes(i) for i in range(0, 50257, 97))
    assert toks[50256] == b"<|endoftext|>" and toks[15496] == b"Hello"


def test_gpt2_124m_parameter_count_matches_llmc():
    # llm.c prints "num_parameters: 124475904" for gpt2_124M.bin (Vp 50304, maxT 1024)
    assert sum(int(np.prod(s)) for _, s in llmc._param_shapes(12, 768, 1024, 50304)) == 124_475_904


def test_llmc_header_errors_name_the_file(tmp_path, capsys):
    good = tmp_path / "good.bin"
    llmc.write_llmc_model(_model(), good)
    data = bytearray(good.read_bytes())

    def variant(name, mutate):
        p = tmp_path / name
        d = bytearray(data)
        mutate(d)
        p.write_bytes(bytes(d))
        return p

    cases = {
        "magic": (variant("magic.bin", lambda d: d.__setitem__(slice(0, 4), np.int32(20240328).tobytes())),
                  "tokenizer file"),
        "version": (variant("version.bin", lambda d: d.__setitem__(slice(4, 8), np.int32(4).tobytes())), "version 4"),
        "short": (variant("short.bin", lambda d: d.__delitem__(slice(len(d) - 10, len(d)))), "truncated"),
        "header": (variant("header.bin", lambda d: d.__setitem__(slice(20, 24), np.int32(3).tobytes())),
                   "inconsistent header"),
    }
    for path, words in cases.values():
        with pytest.raises(llmc.LlmcFormatError, match=words) as ei:
            llmc.read_model_header(path)
        assert str(path) in str(ei.value)
    (tmp_path / "tiny.bin").write_bytes(b"\0" * 10)
    assert main(["sample", "--llmc", str(tmp_path / "tiny.bin")]) == 2
    assert "tiny.bin" in capsys.readouterr().err
    assert main(["sample", "--llmc", str(tmp_path / "missing.bin")]) == 2
    tok = tmp_path / "tok.bin"
    tok.write_bytes(np.array([20240328, 2, 3, 2] + [0] * 252, dtype=np.int32).tobytes() + b"\x01a\x01b")
    with pytest.raises(llmc.LlmcFormatError, match="ends after 2 of 3"):
        llmc.read_llmc_tokenizer(tok)


def test_fine_tune_from_llmc_file(tmp_path, shard_dir):
    """`train --init-from FILE`: the run starts from the llm.c weights (its first loss is theirs) and
    takes the file's model shape over the preset's."""
    from gptforge.data.loader import ShardLoader
    from gptforge.data.shards import list_shards
    from gptforge.run.metrics import read_metrics

    torch.manual_seed(5)
    src = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=48, block_size=64)).eval()  # not the tiny preset's d2
    llmc.write_llmc_model(src, tmp_path / "src.bin")
    out = tmp_path / "ft"
    argv = ["train", "--preset", "tiny", "--init-from", str(tmp_path / "src.bin"), "--out", str(out),
            "--data.dir", str(shard_dir), "--train.max_steps", "2", "--train.val_every", "0", "--train.device", "cpu"]
    assert main(argv) == 0
    first = next(r for r in read_metrics(out) if r["kind"] == "train")
    loader = ShardLoader(list_shards(str(shard_dir), "train"), 4, 32)
    with torch.no_grad():
        want = sum(src(*loader.next_batch())[1].item() for _ in range(2)) / 2  # grad_accum 2 micro-batches
    assert abs(first["loss"] - want) < 1e-4, (first["loss"], want)
    meta = json.loads(next(out.rglob("meta.json")).read_text())
    assert (meta["config"]["model"]["n_layer"], meta["config"]["model"]["n_embd"]) == (3, 48)
    assert main([*argv, "--resume"]) == 2  # --init-from with --resume is refused
