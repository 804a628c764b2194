"""prepare's val split is sized on its own (--val-tokens, capped at 10% of the corpus), a small
corpus always gets a train split, empty documents are counted rather than fatal; checked against a
plain single-process tokenization and across interruptions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gptforge.cli import main
from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import DEFAULT_VAL_TOKENS, PrepareSettings
from gptforge.data.prepare.sources import FilesSource
from gptforge.data.shards import ShardError, list_shards, read_shard, write_shard
from tests.data.test_prepare import Crash, CrashingSource, make_docs, write_jsonl, write_parquet

SHARD = 1000


def stream(enc, docs: list[str]) -> np.ndarray:
    return np.array([t for d in docs if d for t in [enc.eot_token, *enc.encode_ordinary(d)]], dtype=np.int64)


def expected(enc, docs: list[str], val_tokens: int, shard: int = SHARD) -> dict[str, np.ndarray]:
    """The rule written plainly: val = min(val_tokens, 10% of the corpus) tokens, then train shards."""
    s = stream(enc, docs)
    v = min(val_tokens, len(s) // 10)
    out = {"data_val_000000.bin": s[:v]} if v else {}
    for k, i in enumerate(range(v, len(s), shard), start=1):
        out[f"data_train_{k:06d}.bin"] = s[i : i + shard]
    return out


def written(out: Path) -> dict[str, np.ndarray]:
    return {f.name: np.asarray(read_shard(f), dtype=np.int64) for f in sorted(out.glob("*.bin"))}


def assert_shards(out: Path, want: dict[str, np.ndarray]) -> None:
    got = written(out)
    assert list(got) == sorted(want)
    for name, arr in want.items():
        np.testing.assert_array_equal(got[name], arr)


def test_small_corpus_gets_a_train_split_by_default(tmp_path, tokenizer):
    docs = make_docs(60, seed=20)  # ~5k tokens: far below the default val size
    src = FilesSource([write_parquet(tmp_path / "c.parquet", docs)])
    summary = prepare(src, tmp_path / "out", PrepareSettings(shard_tokens=SHARD, workers=1, chunk_docs=5),
                      progress=False)
    want = expected(tokenizer, docs, DEFAULT_VAL_TOKENS)
    assert_shards(tmp_path / "out", want)
    total = len(stream(tokenizer, docs))
    assert summary["val_tokens"] == total // 10 and summary["tokens"] == total
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["state"]["val_tokens"] == total // 10 and m["settings"]["val_tokens"] == DEFAULT_VAL_TOKENS
    assert list_shards(tmp_path / "out", "train") and not list((tmp_path / "out").glob("*.tmp"))


@pytest.mark.parametrize("val_tokens", [0, 150, 10**9])
def test_val_tokens_exact_capped_or_none(tmp_path, tokenizer, val_tokens):
    docs = make_docs(40, seed=21)
    src = FilesSource([write_parquet(tmp_path / "c.parquet", docs)])
    prepare(src, tmp_path / "out", PrepareSettings(shard_tokens=SHARD, val_tokens=val_tokens, workers=1,
                                                   chunk_docs=3), progress=False)
    assert_shards(tmp_path / "out", expected(tokenizer, docs, val_tokens))


def test_interrupted_anywhere_and_any_workers_same_bytes(tmp_path, tokenizer):
    """Crashes before the val size is decided (chunks held in the spill file), right after it, and
    later; 1 and 2 workers: every run ends byte-identical to the uninterrupted reference."""
    docs = make_docs(120, seed=22)
    path = write_parquet(tmp_path / "c.parquet", docs)
    st = {"shard_tokens": SHARD, "val_tokens": 300, "chunk_docs": 4}  # decided after 3000 tokens, ~25 docs
    want = expected(tokenizer, docs, 300)
    assert len(stream(tokenizer, docs)) > 3000
    out = tmp_path / "resumed"
    crashes, shards_seen = 0, []
    for after in (10, 35, 20, 20, 20):  # items after each run's own resume point
        try:
            prepare(CrashingSource([path], after), out, PrepareSettings(workers=1, **st), progress=False)
        except Crash:
            crashes += 1
        assert not list(out.glob("*.tmp"))  # the spill file is gone with the crash
        shards_seen.append(len(list(out.glob("*.bin"))))
    assert crashes >= 4 and shards_seen[0] == 0 and 0 < shards_seen[1] < shards_seen[-1]
    prepare(FilesSource([path]), out, PrepareSettings(workers=1, **st), progress=False)
    assert_shards(out, want)
    prepare(FilesSource([path]), tmp_path / "w2", PrepareSettings(workers=2, **st), progress=False)
    assert_shards(tmp_path / "w2", want)


def test_empty_documents_are_counted_not_fatal(tmp_path, tokenizer):
    docs = make_docs(30, seed=23)
    rows = [{"text": t} for t in docs[:10]] + [{"text": ""}] + [{"text": t} for t in docs[10:]] + [{"text": ""}]
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows)
    (folder / "b.txt").write_text("")  # a zero-byte text file is an empty document too
    write_parquet(folder / "c.parquet", ["", docs[0], ""])
    summary = prepare(FilesSource([folder]), tmp_path / "out", PrepareSettings(shard_tokens=SHARD, workers=1),
                      progress=False)  # no skip_bad: empty documents must not stop the run
    kept = docs + [docs[0]]
    assert summary["empty_documents"] == 5 and summary["skipped"] == 0 and summary["documents"] == len(kept)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["state"]["empty_documents"] == 5 and m["state"]["skipped_examples"] == []
    assert_shards(tmp_path / "out", expected(tokenizer, kept, DEFAULT_VAL_TOKENS))
    # a really malformed row still stops the run, naming it
    write_jsonl(folder / "d.jsonl", [{"body": "x"}])
    assert main(["prepare", "files", str(folder), "--out", str(tmp_path / "o2"), "--no-progress",
                 "--workers", "1"]) == 2


def test_train_error_names_the_flags_when_only_val_exists(tmp_path):
    write_shard(tmp_path / "data_val_000000.bin", np.arange(100, dtype=np.uint16))
    with pytest.raises(ShardError, match=r"no 'train' shards.*data_val_000000.bin.*--shard-tokens.*--val-tokens"):
        list_shards(tmp_path, "train")
    with pytest.raises(ShardError, match="run `gptforge prepare"):
        list_shards(tmp_path / "missing", "train")


def test_cli_val_tokens(tmp_path, tokenizer, capsys):
    docs = make_docs(40, seed=24)
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in docs])
    assert main(["prepare", "files", str(p), "--out", str(tmp_path / "o"), "--val-tokens", "1e2",
                 "--shard-tokens", "1000", "--workers", "1", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["val_tokens"] == 100
    assert main(["prepare", "files", str(p), "--out", str(tmp_path / "o3"), "--val-tokens", "-5"]) == 2
    assert "--val-tokens -5" in capsys.readouterr().err
