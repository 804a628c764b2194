"""A model with its own tokenizer, end to end through the CLI (the README's "your own tokenizer"):
tokenizer train -> prepare -> train a small Llama -> sample -> sft -> chat, and the doors that refuse
mixing tokenizers (shards of another tokenizer, --init-from another tokenizer's model)."""

from __future__ import annotations

import json
import random

import pytest

from gptforge.cli import main

WORDS = ("the king queen castle sword river night day love war bread wine horse ship storm crown "
         "speak answer question number seven eleven twenty").split()


def corpus(folder, docs: int = 60, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.mkdir()
    for i in range(docs):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "." for _ in range(30)]
        (folder / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A trained tokenizer, shards made with it, and a 4-step Llama pretrained on them."""
    root = tmp_path_factory.mktemp("own")
    corpus(root / "corpus")
    assert main(["tokenizer", "train", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", "320",
                 "--trainer", "tokenizers", "--no-progress"]) == 0
    assert main(["prepare", "files", str(root / "corpus"), "--out", str(root / "data"), "--tokenizer",
                 str(root / "tok"), "--val-tokens", "2000", "--workers", "1", "--no-progress"]) == 0
    assert main(["train", "--preset", "llama-tiny", "--data.dir", str(root / "data"), "--out", str(root / "run"),
                 "--train.max_steps", "4", "--train.micro_batch", "2", "--train.seq_len", "64",
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


def test_sft_and_chat_use_the_tokenizers_chatml_template(own, tmp_path, capsys, monkeypatch):
    import io

    rows = [{"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w} {w}."}]}
            for w in WORDS * 3]
    (tmp_path / "convs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["sft", "--init-from", str(own / "run"), "--data", str(tmp_path / "convs.jsonl"), "--out",
                 str(tmp_path / "sft"), "--val-count", "8", "--train.max_steps", "3", "--train.micro_batch", "2",
                 "--train.seq_len", "64", "--train.total_batch_tokens", "128", "--train.val_every", "0",
                 "--train.device", "cpu"]) == 0
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    meta = read_meta(latest_checkpoint(tmp_path / "sft"))
    assert meta["chat_template"]["kind"] == "jinja" and "<|im_start|>" in meta["chat_template"]["template"]
    assert meta["config"]["model"]["vocab_size"] == 320  # the ChatML tokens are the tokenizer's own
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("Say crown\n/quit\n"))
    assert main(["chat", "--ckpt", str(tmp_path / "sft"), "--max-new-tokens", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.strip(), out
