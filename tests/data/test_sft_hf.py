"""SFT from Hugging Face chat datasets, offline: a `save_to_disk` directory, a parquet file and a
local dataset directory read the same conversations as the JSONL file they were made from, `gptforge
sft --data DIR` trains on one, bad data is named by dataset, split and row, and a Hub name goes to
`datasets.load_dataset(name, split=...)` (the online path, with the hub call replaced)."""

from __future__ import annotations

import json

import pytest

from gptforge.cli import main
from gptforge.data.chat import ChatTemplate
from gptforge.data.sft import SFTDataError, read_conversations, render_all
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations

datasets = pytest.importorskip("datasets")

ROWS = [{"messages": p.messages(), "source": "gen"} for p in arithmetic_problems(30, seed=5)]


def _messages(convs):
    return [m for _, m in convs]


@pytest.fixture
def jsonl(tmp_path):
    return write_conversations(arithmetic_problems(30, seed=5), tmp_path / "conv.jsonl")


@pytest.mark.parametrize("kind", ["save_to_disk_dict", "save_to_disk", "parquet", "json_dir"])
def test_offline_hf_datasets_read_like_the_jsonl(tmp_path, jsonl, tokenizer, kind):
    ds = datasets.Dataset.from_list(ROWS)
    where = tmp_path / "ds"
    if kind == "save_to_disk_dict":
        datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(where))
    elif kind == "save_to_disk":
        ds.save_to_disk(str(where))
    elif kind == "parquet":
        where = tmp_path / "chat.parquet"
        ds.to_parquet(str(where))
    else:  # a dataset repository's layout, as downloaded: data files in a folder
        (where / "data").mkdir(parents=True)
        ds.to_json(str(where / "data" / "train.jsonl"))
    got = read_conversations(str(where))
    assert _messages(got) == _messages(read_conversations(str(jsonl)))
    assert got[4][0] == f"{where}[train] row 4"
    t = ChatTemplate.gpt2()
    a, b = render_all(got, t, 65, tokenizer), render_all(read_conversations(str(jsonl)), t, 65, tokenizer)
    assert all((x.ids == y.ids).all() and (x.mask == y.mask).all() for x, y in zip(a, b, strict=True))
    if kind == "save_to_disk_dict":
        assert len(read_conversations(str(where), split="test")) == 3
        with pytest.raises(SFTDataError, match=r"no split 'validation' \(splits: train, test\)"):
            read_conversations(str(where), split="validation")


def test_sft_trains_on_a_saved_hf_dataset(tmp_path, tokenizer):
    import torch

    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run import checkpoint as ckpt

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    base = ckpt.save_checkpoint(tmp_path / "base", 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "ds"))
    run = tmp_path / "run"
    assert main(["sft", "--init-from", str(base), "--data", str(tmp_path / "ds"), "--out", str(run), "--val-count",
                 "8", "--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens", "256",
                 "--train.max_steps", "2", "--train.val_every", "2", "--train.sample_every", "0",
                 "--train.device", "cpu", "--train.dtype", "float32"]) == 0
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["config"]["sft"]["data"] == str(tmp_path / "ds") and meta["recipe"] == "sft" and meta["chat_template"] == ChatTemplate.gpt2().to_dict()
    assert any(json.loads(x)["kind"] == "val" for x in (run / "metrics.jsonl").read_text().splitlines())


def test_bad_hf_rows_are_named_or_skipped(tmp_path, tokenizer, capsys):
    rows = [dict(r) for r in ROWS]
    rows[3] = {"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}], "source": "x"}
    rows[7] = {"messages": [{"role": "user", "content": "hi"}], "source": "x"}
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    convs = read_conversations(str(tmp_path / "ds"))
    with pytest.raises(SFTDataError, match=r"ds\[train\] row 3: message 0: unknown role 'bot'"):
        render_all(convs, ChatTemplate.gpt2(), 65, tokenizer)
    stats: dict[str, int] = {}
    assert len(render_all(convs, ChatTemplate.gpt2(), 65, tokenizer, skip_bad=True, stats=stats)) == 28
    assert stats == {"skipped": 2}
    datasets.Dataset.from_list([{"text": "no chat here"}] * 3).save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(SFTDataError, match=r"plain\[train\]: the dataset has no 'messages' column \(columns: text\)"):
        read_conversations(str(tmp_path / "plain"))
    datasets.Dataset.from_list([{"messages": "hello"}]).save_to_disk(str(tmp_path / "str"))
    with pytest.raises(SFTDataError, match=r"str\[train\] row 0: 'messages' is str, expected a list"):
        read_conversations(str(tmp_path / "str"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "state.json").write_text("{")
    with pytest.raises(SFTDataError, match=r"broken: cannot load it as a Hugging Face dataset \(split 'train'\)"):
        read_conversations(str(tmp_path / "broken"))


def test_a_hub_name_goes_to_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(name, split=None, **kw):
        calls.append((name, split))
        if name != "someone/chat":
            raise FileNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")
        return datasets.Dataset.from_list(ROWS[:5])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    convs = read_conversations("someone/chat", split="train_sft")
    assert calls == [("someone/chat", "train_sft")] and convs[0][0] == "someone/chat[train_sft] row 0"
    assert _messages(convs) == [r["messages"] for r in ROWS[:5]]
    with pytest.raises(SFTDataError, match=r"--data nobody/none: cannot load it .*doesn't exist on the Hub"):
        read_conversations("nobody/none")
