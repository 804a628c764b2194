"""GPT-2 GGUF files read back (issue 32: a GGUF file is a model source everywhere a checkpoint is).

``read_gguf`` maps llama.cpp's ``gpt2`` architecture (what ``export gguf`` writes for a GPT-2 and what
llama.cpp's converter makes of Hugging Face's) onto gptforge's GPT. The reference is the original
checkpoint as gptforge loads it: its logits (bit for bit from an f32 export; within float16 rounding
from an f16 one), its tokenizer's ids and its chat template's rendering. A file that gptforge's GPT
cannot represent (an ``attn_qkv`` laid out for other heads, another LayerNorm epsilon, an untied head)
is refused in one line naming the tensor or key.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.interop import gguf as gguf_export  # noqa: E402
from gptforge.interop.gguf_read import GGUFReadError, read_gguf  # noqa: E402
from gptforge.load import ModelSource, load_chat_template_of, load_model, load_tokenizer_of  # noqa: E402

IDS = torch.tensor([[15496, 11, 314, 1101, 50256, 257, 50257, 3303, 50260, 2746, 11, 464]])
TEXTS = ["Hello, world!", "  two  spaces\tand a tab\n", "it's 1234 o'clock: x=y+2", "naïve café 東京 🙂",
         "<|endoftext|> is text here", ""]
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": "5"}]


def _checkpoint(out: Path) -> Path:
    """tests/conftest.py's tiny chat checkpoint, with non-trivial biases and norms (GPT-2's init makes
    them 0 and 1, which would hide a bias or norm read into the wrong place)."""
    from gptforge.config import Config
    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run import checkpoint as ckpt

    torch.manual_seed(0)
    t = ChatTemplate.gpt2()
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return ckpt.save_checkpoint(out, 1, model, None, {"config": Config(model=cfg).to_dict(),
                                                      "chat_template": t.to_dict()})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint, f32 file, f16 file), written by the CLI as a user would."""
    tmp = tmp_path_factory.mktemp("gpt2gguf")
    ck = _checkpoint(tmp / "ck")
    files = {}
    for dtype in ("f32", "f16"):
        out = tmp / dtype
        assert main(["export", "gguf", "--ckpt", str(ck), "--out", str(out), "--dtype", dtype]) == 0
        files[dtype] = out / f"model-{dtype}.gguf"
    return ck, files["f32"], files["f16"]


def _logits(model, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0][..., : model.config.vocab_size]


def test_f32_export_reads_back_bit_identical(exported):
    ck, f32, _ = exported
    want = load_model(ModelSource(ckpt=str(ck)))
    g = read_gguf(f32)
    for key in ("arch", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab_size", "bias"):
        assert getattr(g.model.config, key) == getattr(want.config, key), key
    assert torch.equal(_logits(g.model), _logits(want))
    assert g.model.lm_head.weight is g.model.transformer.wte.weight  # tied, as GPT.__init__ ties it
    assert g.model.transformer.wte.weight[want.config.vocab_size:].abs().sum() == 0  # padding rows


def test_f32_export_tokenizer_and_chat_template(exported):
    ck, f32, _ = exported
    src, ref = ModelSource(gguf=str(f32)), ModelSource(ckpt=str(ck))
    tok, ref_tok = load_tokenizer_of(src), load_tokenizer_of(ref)
    for s in TEXTS:
        assert tok.encode_ordinary(s) == ref_tok.encode_ordinary(s), s
    chat, ref_chat = load_chat_template_of(src, tok), load_chat_template_of(ref, ref_tok)
    assert chat is not None and ref_chat is not None
    assert chat.render(CONVERSATION) == ref_chat.render(CONVERSATION)  # ids and the trained-on mask
    assert chat.render_for_generation(CONVERSATION[:2]) == ref_chat.render_for_generation(CONVERSATION[:2])


def test_f16_export_within_rounding(exported):
    """The f16 file holds the matrices rounded to float16 (norms and biases float32): the original with
    its matrices so rounded is the reference, to float32 summation order."""
    ck, _, f16 = exported
    want = load_model(ModelSource(ckpt=str(ck)))
    got = _logits(read_gguf(f16).model)
    exact = _logits(want)
    with torch.no_grad():
        for p in want.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    torch.testing.assert_close(got, _logits(want), atol=1e-5, rtol=0)
    assert not torch.equal(got, exact)  # the rounding is there: the file is really f16


def test_sft_init_from_gpt2_gguf(exported, tmp_path):
    from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations

    _, f32, _ = exported
    conv = write_conversations(arithmetic_problems(20, seed=2), tmp_path / "conv.jsonl")
    rc = main(["sft", "--init-from", str(f32), "--data", str(conv), "--val-count", "4", "--train.seq_len", "64",
               "--train.micro_batch", "2", "--train.total_batch_tokens", "128", "--steps", "1",
               "--train.ckpt_every", "0", "--train.device", "cpu", "--out", str(tmp_path / "run")])
    assert rc == 0
    tuned = load_model(ModelSource(ckpt=str(tmp_path / "run")))
    assert tuned.config.arch == "gpt2" and tuned.config.n_layer == 2


def _export_with(model_ck: Path, out: Path, monkeypatch, change) -> Path:
    """export gguf with ``change`` applied to the gpt2 tensors it writes."""
    orig = gguf_export.gpt2_tensors
    monkeypatch.setattr(gguf_export, "gpt2_tensors", lambda m: change(dict(orig(m))))
    assert main(["export", "gguf", "--ckpt", str(model_ck), "--out", str(out)]) == 0
    monkeypatch.setattr(gguf_export, "gpt2_tensors", orig)
    return out / "model-f32.gguf"


def _refused(path: Path, match: str) -> None:
    with pytest.raises(GGUFReadError, match=match) as e:
        read_gguf(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_refuses_what_gpt_cannot_represent(exported, tmp_path, monkeypatch):
    ck = exported[0]
    C = 32

    def grouped_qkv(t):  # q for 2 heads, k and v for one (grouped-query layout): rows disagree with head_count
        t["blk.1.attn_qkv.weight"] = t["blk.1.attn_qkv.weight"][: C + 2 * (C // 2)]
        t["blk.1.attn_qkv.bias"] = t["blk.1.attn_qkv.bias"][: C + 2 * (C // 2)]
        return t

    _refused(_export_with(ck, tmp_path / "qkv", monkeypatch, grouped_qkv),
             r"tensor blk\.1\.attn_qkv\.(weight|bias) has shape \[64(, 32)?\], the metadata implies \[96")

    def untied(t):
        t["output.weight"] = t["output.weight"] + 1e-3
        return t

    _refused(_export_with(ck, tmp_path / "untied", monkeypatch, untied), r"tensor output\.weight differs")

    def extra(t):
        t["blk.0.attn_q.weight"] = t["blk.0.attn_output.weight"]
        return t

    _refused(_export_with(ck, tmp_path / "extra", monkeypatch, extra), r"tensor blk\.0\.attn_q\.weight has no place in gptforge's GPT \(1 such tensors; ")

    orig_eps = gguf.GGUFWriter.add_layer_norm_eps
    monkeypatch.setattr(gguf.GGUFWriter, "add_layer_norm_eps", lambda w, v: orig_eps(w, 1e-6))
    assert main(["export", "gguf", "--ckpt", str(ck), "--out", str(tmp_path / "eps")]) == 0
    # the value as its writer gave it (1e-06), not its float32 expansion (9.99...e-07): gguf_read.shortest_float32
    _refused(tmp_path / "eps" / "model-f32.gguf", r"gpt2\.attention\.layer_norm_epsilon=1e-06: ")
    monkeypatch.setattr(gguf.GGUFWriter, "add_layer_norm_eps", orig_eps)

    orig_heads = gguf.GGUFWriter.add_head_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_head_count", lambda w, v: orig_heads(w, 3))
    assert main(["export", "gguf", "--ckpt", str(ck), "--out", str(tmp_path / "heads")]) == 0
    _refused(tmp_path / "heads" / "model-f32.gguf", r"gpt2\.attention\.head_count=3")


def test_the_converters_tensor_order_no_head_copy_and_a_bad_tensor(exported, tmp_path, monkeypatch):
    """What llama.cpp's converter writes and gptforge's export does not: output.weight right after
    token_embd.weight (convert_hf_to_gguf's GPT2Model yields the head copy with the embeddings), or no head
    copy at all (llama.cpp ties it): both read to the checkpoint's logits bit for bit. A tensor holding NaN
    and an untied head are refused in one line naming the file and the tensor, word for word."""
    ck = exported[0]
    want = _logits(load_model(ModelSource(ckpt=str(ck))))

    def converter_order(t):
        head = t.pop("output.weight")
        return {"token_embd.weight": t.pop("token_embd.weight"), "output.weight": head, **t}

    def no_head_copy(t):
        t.pop("output.weight")
        return t

    for name, change in (("order", converter_order), ("nohead", no_head_copy)):
        g = read_gguf(_export_with(ck, tmp_path / name, monkeypatch, change))
        assert torch.equal(_logits(g.model), want), name
        assert g.model.lm_head.weight is g.model.transformer.wte.weight

    def nan(t):
        t["blk.0.ffn_up.weight"] = t["blk.0.ffn_up.weight"].clone()
        t["blk.0.ffn_up.weight"][3, 5] = float("nan")
        return t

    bad = _export_with(ck, tmp_path / "nan", monkeypatch, nan)
    with pytest.raises(GGUFReadError) as e:
        read_gguf(bad)
    assert str(e.value) == f"{bad}: tensor blk.0.ffn_up.weight: holds NaN or infinite values"

    def untied(t):
        t["output.weight"] = t["output.weight"] + 1e-3
        return t

    bad = _export_with(ck, tmp_path / "untied2", monkeypatch, untied)
    with pytest.raises(GGUFReadError) as e:
        read_gguf(bad)
    assert str(e.value) == (f"{bad}: tensor output.weight differs from token_embd.weight; gptforge's GPT ties its "
                            "head to the token embeddings and will not load the model wrong")
