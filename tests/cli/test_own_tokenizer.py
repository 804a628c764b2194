"""A model with its own tokenizer, end to end through the CLI (the README's "your own tokenizer"):
tokenizer train -> prepare -> train a small Llama -> sample -> sft -> chat, and the doors that refuse
mixing tokenizers (shards of another tokenizer, --init-from another tokenizer's model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptforge.cli import main
from tests.conftest import WORDS, word_corpus


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A trained tokenizer, shards made with it, and a 4-step Llama pretrained on them."""
    root = tmp_path_factory.mktemp("own")
    word_corpus(root / "corpus")
    assert main(["tokenizer", "train", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", "320",
                 "--trainer", "tokenizers", "--no-progress"]) == 0
    assert main(["prepare", "files", str(root / "corpus"), "--out", str(root / "data"), "--tokenizer",
                 str(root / "tok"), "--val-tokens", "2000", "--workers", "1", "--no-progress"]) == 0
    assert main(["train", "--preset", "llama-tiny", "--data.dir", str(root / "data"), "--out", str(root / "run"),
                 "--train.max_steps", "4", "--train.micro_batch", "2", "--train.seq_len", "64", "--model.block_size", "128",
                 "--train.total_batch_tokens", "128", "--train.val_every", "0", "--train.val_tokens", "256",
                 "--train.device", "cpu", "--train.compile", "false", "--eval.every", "0"]) == 0
    return root


def test_the_model_takes_its_shards_tokenizer(own):
    from gptforge.data.tokenizer import load_tokenizer, shard_tokenizer
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    tok = load_tokenizer(own / "tok")
    assert tok.n_vocab == 320 and not tok.is_gpt2
    assert shard_tokenizer(own / "data").fingerprint == tok.fingerprint
    ckpt = latest_checkpoint(own / "run")
    meta = read_meta(ckpt)
    assert meta["config"]["model"]["vocab_size"] == 320  # the preset's GPT-2 size became the tokenizer's
    assert meta["config"]["data"]["eot_token"] == tok.eot_token
    assert meta["tokenizer"]["fingerprint"] == tok.fingerprint
    assert "tokenizer/tokenizer.json" in meta["files"]  # the files travel with the checkpoint, checksummed


def test_sample_decodes_with_the_models_tokenizer(own, capsys):
    assert main(["sample", "--ckpt", str(own / "run"), "--prompt", "The king", "--num-samples", "1",
                 "--max-new-tokens", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("--- sample 0\nThe king")


def test_shards_of_another_tokenizer_are_refused(own, tmp_path, capsys):
    from gptforge.data.prepare.shakespeare import prepare  # noqa: F401 (GPT-2 shards below come from files)

    assert main(["prepare", "files", str(own / "corpus"), "--out", str(tmp_path / "gpt2data"), "--val-tokens", "2000",
                 "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--preset", "llama-tiny", "--data.dir", str(tmp_path / "gpt2data"), "--out",
                 str(tmp_path / "x"), "--init-from", str(own / "run"), "--train.max_steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "speaks the tokenizer 'tok'" in err and "'gpt2'" in err
    # resuming the run on GPT-2's shards: refused, both named
    assert main(["train", "--resume", "--out", str(own / "run"), "--data.dir", str(tmp_path / "gpt2data"),
                 "--train.max_steps", "6"]) == 2
    err = capsys.readouterr().err
    assert "was trained with the tokenizer 'tok'" in err and "'gpt2'" in err


@pytest.fixture(scope="module")
def sft_run(own):
    """The pretrained model fine-tuned for 3 steps on conversations: the tokenizer's ChatML template."""
    rows = [{"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w} {w}."}]}
            for w in WORDS * 3]
    (own / "convs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["sft", "--init-from", str(own / "run"), "--data", str(own / "convs.jsonl"), "--out",
                 str(own / "sft"), "--val-count", "8", "--train.max_steps", "3", "--train.micro_batch", "2",
                 "--train.seq_len", "64", "--train.total_batch_tokens", "128", "--train.val_every", "0",
                 "--train.device", "cpu"]) == 0
    return own / "sft"


def test_sft_and_chat_use_the_tokenizers_chatml_template(own, sft_run, capsys, monkeypatch):
    import io

    from gptforge.data.tokenizer import load_tokenizer
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    meta = read_meta(latest_checkpoint(sft_run))
    assert meta["chat_template"]["kind"] == "jinja" and "<|im_start|>" in meta["chat_template"]["template"]
    assert meta["config"]["model"]["vocab_size"] == 320  # the ChatML tokens are the tokenizer's own
    assert meta["tokenizer"]["fingerprint"] == load_tokenizer(own / "tok").fingerprint
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("Say crown\n/quit\n"))
    assert main(["chat", "--ckpt", str(sft_run), "--max-new-tokens", "6", "--temperature", "0", "--device", "cpu"]) == 0
    reply = capsys.readouterr().out
    # the same greedy reply through the template rendered by hand and the model's own generate
    import torch

    from gptforge.data.chat import template_from_meta
    from gptforge.generation import generate
    from gptforge.load import ModelSource, load_model

    tok = load_tokenizer(own / "tok")
    chat = template_from_meta(meta, tok=tok)
    ids = chat.render_for_generation([{"role": "user", "content": "Say crown"}])
    assert ids[-3:] == tok.encode("<|im_start|>assistant\n", allowed_special="all")[-3:]
    model = load_model(ModelSource(ckpt=str(sft_run)))
    out = generate(model, torch.tensor([ids]), max_new_tokens=6, temperature=0.0)[0, len(ids):].tolist()
    if chat.end in out:
        out = out[: out.index(chat.end)]
    assert tok.decode(out).strip() in reply


def test_preference_and_rl_recipes_and_eval_run_on_the_models_tokenizer(own, sft_run, tmp_path, capsys):
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    assert main(["prepare", "preferences", "compare", "--n", "40", "--out", str(tmp_path / "prefs.jsonl")]) == 0
    small = ["--train.micro_batch", "2", "--train.seq_len", "128", "--train.total_batch_tokens", "256",
             "--train.val_every", "0", "--train.device", "cpu", "--val-count", "4"]
    fp = read_meta(latest_checkpoint(sft_run))["tokenizer"]["fingerprint"]
    for cmd in ("rm", "dpo"):
        assert main([cmd, "--init-from", str(sft_run), "--data", str(tmp_path / "prefs.jsonl"), "--out",
                     str(tmp_path / cmd), "--steps", "2", *small]) == 0, cmd
        meta = read_meta(latest_checkpoint(tmp_path / cmd))
        assert meta["tokenizer"]["fingerprint"] == fp and meta["chat_template"]["kind"] == "jinja"
    assert main(["rl", "--init-from", str(sft_run), "--task", "compare", "--out", str(tmp_path / "rl"), "--steps", "1",
                 "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--device", "cpu"]) == 0
    assert read_meta(latest_checkpoint(tmp_path / "rl"))["tokenizer"]["fingerprint"] == fp
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(sft_run), "--tasks", "compare", "--limit", "3", "--device", "cpu"]) == 0
    assert "chat template" in capsys.readouterr().out
    assert main(["eval", "--ckpt", str(tmp_path / "rm"), "--preferences", str(tmp_path / "prefs.jsonl"),
                 "--limit", "4", "--device", "cpu"]) == 0
    # the reward model exports with the model's own tokenizer and template
    assert main(["export", "hf", "--ckpt", str(tmp_path / "rm"), "--out", str(tmp_path / "rm_hf")]) == 0
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "rm_hf")
    assert "<|im_start|>" in hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_serve_speaks_the_models_tokenizer_and_template(own, sft_run):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gptforge.cli.common import words
    from gptforge.load import ModelSource, load_model
    from gptforge.serve.app import create_app

    source = ModelSource(ckpt=str(sft_run))
    model = load_model(source)
    tok, chat = words(source, model)
    client = TestClient(create_app(model, tok, chat_template=chat.to_dict()))
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say crown"}],
                                                   "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    r2 = client.post("/v1/completions", json={"prompt": "The king", "max_tokens": 4, "temperature": 0})
    assert r2.status_code == 200, r2.text
    assert isinstance(text, str) and "<|im_start|>" not in text
    # a prompt in token ids beyond the tokenizer's vocabulary is refused, not embedded
    r3 = client.post("/v1/completions", json={"prompt": [[5000]], "max_tokens": 2})
    assert r3.status_code == 400


def test_exports_carry_the_models_own_tokenizer(own, tmp_path, capsys):
    """export hf: transformers loads the tokenizer and the Llama from the folder and agrees with gptforge
    (ids and logits); export gguf: the file's token list is the tokenizer's; export llmc: llm.c's token table."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gptforge.data.tokenizer import load_tokenizer
    from gptforge.load import ModelSource, load_model

    tok = load_tokenizer(own / "tok")
    capsys.readouterr()
    assert main(["export", "hf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "hf")]) == 0
    # the JSON line a script reads: the files written (each there) and which tokenizer went with them
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["format"] == "hf" and all(Path(f).is_file() for f in said["files"])
    assert tok.short in said["tokenizer"] and "tokenizer.json" in {Path(f).name for f in said["files"]}
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "The king speaks to the queen: seven swords, 20 ships."
    ids = tok.encode_ordinary(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids
    assert hf_tok.eos_token == "<|endoftext|>"
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours = load_model(ModelSource(ckpt=str(own / "run")))
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x)[0], atol=1e-4, rtol=1e-4)
    pytest.importorskip("gguf")
    from gguf import GGUFReader

    assert main(["export", "gguf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "gguf")]) == 0
    r = GGUFReader(str(next((tmp_path / "gguf").glob("*.gguf"))))
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    assert len(tokens) == 320 and tokens[tok.eot_token] == "<|endoftext|>"
    assert bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode() == "llama-bpe"
    assert main(["export", "llmc", "--ckpt", str(own / "run"), "--out", str(tmp_path / "llmc")]) == 2  # a Llama
    from gptforge.interop.llmc import read_llmc_tokenizer, write_llmc_tokenizer

    write_llmc_tokenizer(tok, tmp_path / "tokenizer.bin")
    table, eot = read_llmc_tokenizer(tmp_path / "tokenizer.bin")
    assert eot == tok.eot_token and b"".join(table[i] for i in ids).decode() == text
    assert np.all([len(t) > 0 for t in table])


def test_a_gguf_file_is_a_model_source_everywhere(own, sft_run, tmp_path, capsys, monkeypatch):
    """export gguf -> sample/chat --gguf and import gguf: the file's own tokenizer (rebuilt from its
    tokenizer.ggml.* keys) and template speak as the checkpoint's did; greedy text is the same."""
    import io

    pytest.importorskip("gguf")
    assert main(["export", "gguf", "--ckpt", str(sft_run), "--out", str(tmp_path / "g")]) == 0
    gguf_file = str(next((tmp_path / "g").glob("*.gguf")))
    greedy = ["--prompt", "The king", "--num-samples", "1", "--max-new-tokens", "8", "--temperature", "0",
              "--device", "cpu"]
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(sft_run), *greedy]) == 0
    want = capsys.readouterr().out
    assert main(["sample", "--gguf", gguf_file, *greedy]) == 0
    assert capsys.readouterr().out == want
    assert main(["import", "gguf", "--model", gguf_file, "--out", str(tmp_path / "imported")]) == 0
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(tmp_path / "imported"), *greedy]) == 0
    assert capsys.readouterr().out == want
    for src in (["--ckpt", str(sft_run)], ["--gguf", gguf_file], ["--ckpt", str(tmp_path / "imported")]):
        monkeypatch.setattr("sys.stdin", io.StringIO("Say crown\n/quit\n"))
        assert main(["chat", *src, "--max-new-tokens", "5", "--temperature", "0", "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        if src[0] == "--ckpt" and src[1] == str(sft_run):
            reply = out
        assert out == reply, src


def test_sft_starts_from_a_gguf_file(own, sft_run, tmp_path):
    """--init-from FILE.gguf: the file's weights, tokenizer and template start the run, which carries them."""
    pytest.importorskip("gguf")
    from gptforge.data.tokenizer import load_tokenizer
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    assert main(["export", "gguf", "--ckpt", str(sft_run), "--out", str(tmp_path / "g")]) == 0
    gguf_file = str(next((tmp_path / "g").glob("*.gguf")))
    assert main(["sft", "--init-from", gguf_file, "--data", str(own / "convs.jsonl"), "--out", str(tmp_path / "s"),
                 "--val-count", "8", "--train.max_steps", "2", "--train.micro_batch", "2", "--train.seq_len", "64",
                 "--train.total_batch_tokens", "128", "--train.val_every", "0", "--train.device", "cpu"]) == 0
    meta = read_meta(latest_checkpoint(tmp_path / "s"))
    assert meta["chat_template"]["kind"] == "jinja" and meta["config"]["model"]["vocab_size"] == 320
    tok = load_tokenizer(own / "tok")
    from gptforge.data.tokenizer import tokenizer_from_meta

    carried = tokenizer_from_meta(meta, latest_checkpoint(tmp_path / "s"))
    text = "The king speaks: 7 swords, 20 ships!"
    assert carried.encode_ordinary(text) == tok.encode_ordinary(text)


def test_sft_starts_from_a_hugging_face_export_of_the_base(own, sft_run, tmp_path):
    """issue 32's first failure: sft --init-from a Hugging Face directory. The base model's export
    carries its tokenizer's own (ChatML) template, which the SFT run takes and keeps."""
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    assert main(["export", "hf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "hf")]) == 0
    cfg = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in cfg["chat_template"]
    from gptforge.data.tokenizer import load_tokenizer

    eot = load_tokenizer(own / "tok").eot_token  # a base model's text ends at its <|endoftext|>
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == eot
    assert main(["sft", "--init-from", str(tmp_path / "hf"), "--data", str(own / "convs.jsonl"), "--out",
                 str(tmp_path / "s"), "--val-count", "8", "--train.max_steps", "2", "--train.micro_batch", "2",
                 "--train.seq_len", "64", "--train.total_batch_tokens", "128", "--train.val_every", "0",
                 "--train.device", "cpu"]) == 0
    meta = read_meta(latest_checkpoint(tmp_path / "s"))
    assert meta["chat_template"]["kind"] == "jinja" and meta["tokenizer"]["kind"] == "hf"
