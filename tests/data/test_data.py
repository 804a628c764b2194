"""Shards against the llm.c format (bytes built independently here), the loader, the tokenizer."""

import struct

import numpy as np
import pytest

from gptforge.data.loader import ShardLoader
from gptforge.data.shards import ShardError, list_shards, read_header, read_shard, write_shard


def llmc_bytes(tokens, magic=20240520, version=1, fmt="H"):
    """The llm.c layout written by hand: 256 int32 header, then tokens."""
    header = struct.pack("<256i", magic, version, len(tokens), *([0] * 253))
    return header + struct.pack(f"<{len(tokens)}{fmt}", *tokens)


def test_shard_bytes_match_llmc_format(tmp_path):
    toks = [50256, 15496, 11, 314, 0, 65535]
    p = write_shard(tmp_path / "a_val.bin", toks)
    assert p.read_bytes() == llmc_bytes(toks)
    assert read_shard(p).tolist() == toks


def test_wide_vocab_uses_uint32_v7(tmp_path):
    toks = [1, 70_000, 2]
    p = write_shard(tmp_path / "w.bin", toks)
    assert p.read_bytes() == llmc_bytes(toks, 20240801, 7, "I")
    assert read_header(p)[:3] == (20240801, 7, 3)
    assert read_shard(p).tolist() == toks


def test_reader_accepts_llmc_written_file(tmp_path):
    p = tmp_path / "x_train.bin"
    p.write_bytes(llmc_bytes(list(range(100))))
    assert read_shard(p, mmap=False).tolist() == list(range(100))


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda b: struct.pack("<i", 123) + b[4:], "bad magic"),
        (lambda b: b[:4] + struct.pack("<i", 2) + b[8:], "version"),
        (lambda b: b[:-2], "truncated"),
        (lambda b: b[:100], "shorter than"),
        (lambda b: b[:8] + struct.pack("<i", 99) + b[12:], "header says 99 tokens"),
    ],
)
def test_bad_headers_are_rejected_naming_the_file(tmp_path, mutate, words):
    p = tmp_path / "bad_train.bin"
    p.write_bytes(mutate(llmc_bytes(list(range(10)))))
    with pytest.raises(ShardError) as e:
        read_shard(p)
    assert str(p) in str(e.value) and words in str(e.value)


def test_missing_shards_named(tmp_path):
    with pytest.raises(ShardError, match="does not exist"):
        list_shards(tmp_path / "nope", "train")
    with pytest.raises(ShardError, match="no 'train' shards"):
        list_shards(tmp_path, "train")


def test_no_partial_shard_left_on_failure(tmp_path):
    with pytest.raises(ValueError):
        write_shard(tmp_path / "neg.bin", [1, -5])
    assert list(tmp_path.iterdir()) == []


def test_loader_walks_shards_like_llmc(tmp_path):
    write_shard(tmp_path / "d_train_0.bin", np.arange(0, 50))
    write_shard(tmp_path / "d_train_1.bin", np.arange(100, 150))
    files = list_shards(tmp_path, "train")
    ld = ShardLoader(files, B=2, T=5)
    seen = []
    for _ in range(8):
        x, y = ld.next_batch()
        assert (y[:, :-1] == x[:, 1:]).all()
        seen.append(int(x[0, 0]))
    # 50 tokens: steps at 0, 10, 20, 30 (40+10+1 > 50 -> next shard), then shard 2, then wrap
    assert seen == [0, 10, 20, 30, 100, 110, 120, 130]
    assert ld.epoch == 1


def test_loader_ranks_partition_the_batch(tmp_path):
    write_shard(tmp_path / "d_train_0.bin", np.arange(1000))
    f = list_shards(tmp_path, "train")
    single = ShardLoader(f, B=4, T=8)
    r0, r1 = ShardLoader(f, B=2, T=8, rank=0, world=2), ShardLoader(f, B=2, T=8, rank=1, world=2)
    for _ in range(5):
        x, _ = single.next_batch()
        a, _ = r0.next_batch()
        b, _ = r1.next_batch()
        assert (x == np.concatenate([a, b])).all()


def test_loader_state_roundtrip(tmp_path):
    write_shard(tmp_path / "d_train_0.bin", np.arange(300))
    write_shard(tmp_path / "d_train_1.bin", np.arange(300, 600))
    f = list_shards(tmp_path, "train")
    a = ShardLoader(f, B=2, T=10)
    for _ in range(17):
        a.next_batch()
    b = ShardLoader(f, B=2, T=10)
    b.load_state_dict(a.state_dict())
    for _ in range(20):
        assert (a.next_batch()[0] == b.next_batch()[0]).all()


def test_loader_rejects_too_small_shard(tmp_path):
    write_shard(tmp_path / "d_train_0.bin", np.arange(10))
    with pytest.raises(ShardError, match="fewer than one step"):
        ShardLoader(list_shards(tmp_path, "train"), B=2, T=8)


def test_tokenizer_offline_matches_gpt2(tokenizer):
    assert tokenizer.encode_ordinary("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    assert tokenizer.eot_token == 50256 and tokenizer.n_vocab == 50257


def test_tokenizer_missing_gives_instructions(tmp_path, monkeypatch):
    import tiktoken

    from gptforge.data import tokenizer as tok

    monkeypatch.setenv("GPTFORGE_GPT2_RANKS", str(tmp_path / "missing.tiktoken"))
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(ConnectionError("offline")))
    tok.gpt2_tokenizer.cache_clear()
    try:
        with pytest.raises(tok.TokenizerUnavailable, match="gptforge assets tokenizer"):
            tok.gpt2_tokenizer()
    finally:
        tok.gpt2_tokenizer.cache_clear()


def test_prepare_shakespeare_offline(tmp_path, tokenizer, monkeypatch):
    from gptforge.data.prepare import shakespeare

    monkeypatch.setattr(shakespeare, "download_tiny", lambda timeout=10: (_ for _ in ()).throw(OSError("offline")))
    s = shakespeare.prepare(tmp_path / "sh", source="auto")
    assert s["source"] == "plays" and s["documents"] == 42
    val = read_shard(tmp_path / "sh" / "shakespeare_val.bin")
    train = read_shard(tmp_path / "sh" / "shakespeare_train.bin")
    assert val[0] == 50256 and train[0] == 50256  # each document starts with <|endoftext|>
    assert val.size >= 32_768 and train.size > 1_000_000
    text = tokenizer.decode(val[1:200].tolist())
    assert "by William Shakespeare" in text
