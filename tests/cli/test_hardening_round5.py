"""Issue 56 class 6 (and class 7's token-id boundary, at the end): messages tell the truth. A device, a pipe
or a folder given where a file is read is called what it is, never "no such file"; `import`'s full-disk
advice is built from import's own options (it has no --resume); text that is not valid Unicode is named
as the input's fault, not the tokenizer's.
Plants tried: not_a_file's device branch dropped (the walk fails on /dev/null and the pipe), import's
`then=` dropped (the --resume advice comes back), and library_failure's Unicode check dropped (the
tokenizer is blamed again)."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch

from gptforge.cli import main


@pytest.fixture(scope="module")
def specials(tmp_path_factory):
    """A device (/dev/null), a named pipe and a folder: each is there, none is a regular file."""
    d = tmp_path_factory.mktemp("special")
    fifo = d / "pipe.txt"
    os.mkfifo(fifo)
    (d / "folder.bin").mkdir()
    return {"device": "/dev/null", "pipe": str(fifo)}


# every door that reads one named file the user gives: (argv before the path, argv after it)
DOORS = {
    "prepare files": (["prepare", "files"], ["--out", "{tmp}/o", "--no-progress"]),
    "tokenizer train": (["tokenizer", "train"], ["--out", "{tmp}/t", "--no-progress"]),
    "sample --llmc": (["sample", "--llmc"], ["--max-new-tokens", "1"]),
    "sample --gguf": (["sample", "--gguf"], ["--max-new-tokens", "1"]),
    "import llmc": (["import", "llmc", "--model"], ["--out", "{tmp}/i"]),
    "import gguf": (["import", "gguf", "--model"], ["--out", "{tmp}/i"]),
    # a checkpoint is a folder: one given as a device or pipe was "holds no complete checkpoint"
    "sample --ckpt": (["sample", "--ckpt"], ["--max-new-tokens", "1"]),
    "eval --ckpt": (["eval", "--tasks", "compare", "--ckpt"], []),
    "export hf --ckpt": (["export", "hf", "--ckpt"], ["--out", "{tmp}/e"]),
}


@pytest.mark.parametrize("kind", ["device", "pipe"])
@pytest.mark.parametrize("door", list(DOORS))
def test_a_device_or_pipe_is_never_called_missing(door, kind, specials, tmp_path, capsys):
    before, after = DOORS[door]
    path = specials[kind]
    rc = main([*before, path, *[a.format(tmp=tmp_path) for a in after]])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert path in err, err
    low = err.lower()
    assert "no such" not in low and "does not exist" not in low and "missing" not in low, err
    assert any(w in low for w in ("device", "special", "not a file", "not a regular file")), err


def test_a_checkpoint_given_as_a_file_is_called_a_file(tmp_path, capsys):
    """--ckpt takes a folder; a model file there is named as a file (the flags that read model files differ per
    command: --gguf of sample, --init-from of sft, so the line names none)."""
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF")
    assert main(["sample", "--ckpt", str(f), "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{f} is a file, not a folder" in err, err


def test_not_a_file_names_each_kind(specials, tmp_path):
    from gptforge.reading import not_a_file

    (tmp_path / "link").symlink_to(tmp_path / "gone")
    assert not_a_file(tmp_path) == "a folder, not a file"
    assert not_a_file("/dev/null").startswith("a device")
    assert not_a_file(specials["pipe"]).startswith("a device or other special file")
    assert not_a_file(tmp_path / "link") == "a symlink to a missing file"
    assert not_a_file(tmp_path / "nothing") == "no such file or folder"


def test_imports_full_disk_advice_is_imports_own(tmp_path, capsys, monkeypatch):
    """`import` writes a checkpoint through the run stack, whose advice was training's `--resume`."""
    import gptforge.run.checkpoint as ck
    from gptforge.interop.llmc import write_llmc_model
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    model = write_llmc_model(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)),
                             tmp_path / "m.bin")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", full)
    out = tmp_path / "run"
    assert main(["import", "llmc", "--model", str(model), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no space left on device" in err, err
    assert "--resume" not in err, err  # import has no such flag
    assert f"gptforge import llmc --model {model} --out {out}" in err, err
    import argparse

    from gptforge.cli import build_parser

    sub = next(a for a in build_parser(["import"])._actions if isinstance(a, argparse._SubParsersAction))
    assert "--resume" not in {o for a in sub.choices["import"]._actions for o in a.option_strings}


def _library_tokenizer(tmp_path):
    """A byte-level BPE the tokenizers library runs itself (no tiktoken twin, which replaces surrogates)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from gptforge.data.tokenizer import load_tokenizer

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+|\S+"), "isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["the quick brown fox"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path / "tok"
    d.mkdir()
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return load_tokenizer(d)


def test_text_that_is_not_unicode_is_the_inputs_fault(tmp_path):
    from gptforge.data.tokenizer import TokenizerError

    tok = _library_tokenizer(tmp_path)
    assert tok.encode_ordinary("the fox") and getattr(tok, "_fast", None) is None
    bad = b"the \xff fox".decode("utf-8", "surrogateescape")  # how a non-UTF-8 file reads with surrogateescape
    for call in (lambda: tok.encode_ordinary(bad), lambda: tok.encode_batch_numpy(["ok", bad])):
        with pytest.raises(TokenizerError) as e:
            call()
        msg = str(e.value)
        assert "not valid Unicode" in msg and "lone surrogate '\\udcff'" in msg and "character 4" in msg, msg
        assert "split pattern" not in msg and "normalizer" not in msg, msg


# --- issue 56 class 7: a token id equal to the vocabulary size, at each door that bounds ids ------------------
# The middle (an id far outside) was tested; the boundary was not: `<` against `<=` survived. Plants tried:
# `0 <= t < vocab` -> `0 <= t <= vocab` in generation.fit_new_tokens and `hi >= vocab_size` -> `hi > vocab_size`
# in shards.check_token_ids: each fails here.

VOCAB = 300


def test_a_prompt_id_equal_to_the_vocabulary_is_refused_and_the_last_id_is_not():
    from types import SimpleNamespace

    from gptforge.generation import PromptError, fit_new_tokens

    cfg = SimpleNamespace(vocab_size=VOCAB, block_size=16)
    assert fit_new_tokens([[0, VOCAB - 1]], cfg, 4, 4) == 4  # ids 0..V-1 are the model's
    for bad in (VOCAB, -1):
        with pytest.raises(PromptError, match=f"token id {bad} is outside this model's vocabulary of {VOCAB} ids"):
            fit_new_tokens([[1, bad]], cfg, 4, 4)


def test_a_shard_id_equal_to_the_vocabulary_is_refused_and_the_last_id_is_not(tmp_path):
    import numpy as np

    from gptforge.data.shards import TokenRangeError, check_token_ids, write_shard

    ok = write_shard(tmp_path / "ok_000000.bin", np.array([0, 5, VOCAB - 1]))
    assert check_token_ids(ok, VOCAB) == VOCAB - 1
    bad = write_shard(tmp_path / "bad_000000.bin", np.array([0, VOCAB, 5]))
    with pytest.raises(TokenRangeError, match=f"token id {VOCAB} at token offset 1 is outside model.vocab_size="
                                              f"{VOCAB}"):
        check_token_ids(bad, VOCAB)
