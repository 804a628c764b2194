"""Issue 21 class 2 (chat-template part): the ids of a checkpoint's chat template are checked by the one
reader (ChatTemplate.from_dict) against the checkpoint's vocabulary, so chat, sample, eval and export
refuse a damaged template in one line naming meta.json and the field (exit 2) instead of an
IndexError at first use; `export hf` never silently writes no tokenizer."""

from __future__ import annotations

import io
import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatFormatError, ChatTemplate
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt

T = ChatTemplate.gpt2()


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=T.vocab_size)
    root = tmp_path_factory.mktemp("chat")
    return ckpt.save_checkpoint(root / "sft", 1, GPT(cfg), None,
                                {"config": Config(model=cfg).to_dict(), "chat_template": T.to_dict()})


def _damage(path, tmp_path, field: str, value):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(path, d)
    meta = json.loads((d / "meta.json").read_text())
    if field.startswith("roles."):
        meta["chat_template"]["roles"][field.split(".")[1]] = value
    else:
        meta["chat_template"][field] = value
    (d / "meta.json").write_text(json.dumps(meta))
    return d


CASES = [("roles.assistant", T.vocab_size + 5), ("end", 10**12), ("bos", -1), ("roles.user", "50258"),
         ("end", 50260.0), ("roles.system", True), ("bos", None), ("end", T.roles["user"])]  # last: not distinct
COMMANDS = {
    "chat": lambda d: ["chat", "--ckpt", str(d), "--max-new-tokens", "2", "--device", "cpu"],
    "sample": lambda d: ["sample", "--ckpt", str(d), "--max-new-tokens", "2", "--device", "cpu"],
    "eval": lambda d: ["eval", "--ckpt", str(d), "--tasks", "arithmetic", "--limit", "2", "--device", "cpu"],
    "export": lambda d: ["export", "hf", "--ckpt", str(d), "--out", str(d.parent / "hf")],
}


@pytest.mark.parametrize("field,value", CASES)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_damaged_template_id_is_one_line_naming_meta_json_and_the_field(chat_ckpt, tmp_path, capsys, monkeypatch,
                                                                          field, value, command):
    d = _damage(chat_ckpt, tmp_path, field, value)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n/quit\n"))
    assert main(COMMANDS[command](d)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(d / "meta.json") in err and "chat_template." in err, err
    assert not (d.parent / "hf").exists()  # export refused before writing anything


def test_the_reader_bounds_ids_by_the_vocabulary_it_is_given():
    d = T.to_dict()
    assert ChatTemplate.from_dict(d, vocab_size=T.vocab_size) == T
    with pytest.raises(ChatFormatError, match=r"x.json: chat_template.end=50260: .*below model.vocab_size=50260"):
        ChatTemplate.from_dict(d, where="x.json", vocab_size=T.vocab_size - 1)
    with pytest.raises(ChatFormatError, match="expected an object"):
        ChatTemplate.from_dict([1, 2])


def test_export_hf_refuses_instead_of_silently_skipping_the_tokenizer(tmp_path, capsys):
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=512)
    path = ckpt.save_checkpoint(tmp_path / "run", 1, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})
    assert main(["export", "hf", "--ckpt", str(path), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "model.vocab_size=512" in err and "--no-tokenizer" in err
    assert main(["export", "hf", "--ckpt", str(path), "--out", str(tmp_path / "hf"), "--no-tokenizer"]) == 0
    assert not (tmp_path / "hf" / "vocab.json").exists()  # asked for: weights alone
