"""ShardLoader shuffling: seeded per-epoch shard and document orders, resumable; off = llm.c order."""

from __future__ import annotations

import numpy as np
import pytest

from gptforge.config import ConfigError, DataConfig
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import ShardError, list_shards, write_shard

EOT = 50256


def shard_set(tmp_path, n_shards: int = 5, size: int = 40):
    for s in range(n_shards):  # shard s holds s*1000 + 0..size-1: the first token names the shard
        write_shard(tmp_path / f"d_train_{s:03d}.bin", np.arange(size) + 1000 * s)
    return list_shards(tmp_path, "train")


def first_tokens(loader: ShardLoader, steps: int) -> list[int]:
    return [int(loader.next_batch()[0][0, 0]) for _ in range(steps)]


def test_shard_order_is_a_seeded_permutation_per_epoch(tmp_path):
    files = shard_set(tmp_path)
    steps_per_shard = 3  # B*T = 10 and 40 tokens: starts 0, 10, 20
    epochs = 4
    seq = first_tokens(ShardLoader(files, B=2, T=5, shuffle="shards", seed=7), 5 * steps_per_shard * epochs)
    orders = []
    for e in range(epochs):
        block = seq[e * 15 : (e + 1) * 15]
        order = [block[i] // 1000 for i in range(0, 15, steps_per_shard)]
        assert sorted(order) == list(range(5))  # every shard once per epoch
        assert block == [1000 * s + k for s in order for k in (0, 10, 20)]  # in order inside a shard
        expected = np.random.default_rng([7, e]).permutation(5).tolist()  # the documented draw
        assert order == expected
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1  # changes per epoch
    again = first_tokens(ShardLoader(files, B=2, T=5, shuffle="shards", seed=7), len(seq))
    other = first_tokens(ShardLoader(files, B=2, T=5, shuffle="shards", seed=8), len(seq))
    assert again == seq and other != seq


def test_off_is_llmc_order(tmp_path):
    files = shard_set(tmp_path, 3)
    seq = first_tokens(ShardLoader(files, B=2, T=5), 18)
    assert seq == [1000 * s + k for _ in range(2) for s in range(3) for k in (0, 10, 20)]


def make_doc_shard(path, n_docs: int, seed: int, lead_fragment: bool) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = [[EOT, *rng.integers(0, 5000, rng.integers(1, 30)).tolist()] for _ in range(n_docs)]
    if lead_fragment:  # a shard that starts inside a document split by prepare
        docs.insert(0, rng.integers(0, 5000, 7).tolist())
    write_shard(path, np.concatenate(docs))
    return docs


def segments(tokens: np.ndarray) -> list[tuple]:
    cuts = [0, *np.flatnonzero(tokens == EOT).tolist(), len(tokens)]
    return [tuple(tokens[a:b].tolist()) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def test_document_shuffle_permutes_whole_documents(tmp_path):
    docs0 = make_doc_shard(tmp_path / "d_train_000.bin", 60, 0, lead_fragment=True)
    docs1 = make_doc_shard(tmp_path / "d_train_001.bin", 50, 1, lead_fragment=False)
    files = list_shards(tmp_path, "train")
    ld = ShardLoader(files, B=1, T=8, shuffle="documents", seed=3)
    seen = {}
    for epoch in range(2):
        for _ in range(2):
            index = ld._order()[ld.shard]
            toks = np.asarray(ld._current())
            original = docs0 if index == 0 else docs1
            # the same documents, each intact, in another order; a split document's tail stays first
            lead = [tuple(original[0])] if original[0][0] != EOT else []
            segs = segments(toks)
            assert segs[: len(lead)] == lead
            assert sorted(segs[len(lead) :]) == sorted(tuple(d) for d in original[len(lead) :])
            assert segs != [tuple(d) for d in original]
            seen[(epoch, index)] = toks.copy()
            ld._advance_shard()
    assert not np.array_equal(seen[(0, 0)], seen[(1, 0)])  # a new document order every epoch


def test_shuffled_state_resumes_exactly_and_rejects_other_settings(tmp_path):
    files = shard_set(tmp_path, 4, size=60)
    for mode in ("shards", "documents"):
        a = ShardLoader(files, B=2, T=5, shuffle=mode, seed=11)
        for _ in range(31):  # into the second epoch
            a.next_batch()
        assert a.epoch == 1
        b = ShardLoader(files, B=2, T=5, shuffle=mode, seed=11)
        b.load_state_dict(a.state_dict())
        for _ in range(40):
            assert (a.next_batch()[0] == b.next_batch()[0]).all()
    state = ShardLoader(files, B=2, T=5, shuffle="shards", seed=11).state_dict()
    with pytest.raises(ShardError, match="data.shuffle=shards data.shuffle_seed=11"):
        ShardLoader(files, B=2, T=5, shuffle="shards", seed=12).load_state_dict(state)
    with pytest.raises(ShardError, match="data.shuffle"):
        ShardLoader(files, B=2, T=5).load_state_dict(state)
    # a state saved before shuffling existed (no keys) loads into an unshuffled loader
    ShardLoader(files, B=2, T=5).load_state_dict({"shard": 1, "pos": 10, "epoch": 0})


def test_shuffle_config_validated():
    with pytest.raises(ConfigError, match="data.shuffle"):
        DataConfig(shuffle="random")
    assert DataConfig().shuffle == "off"


def test_training_uses_shuffle_settings(tmp_path, shard_dir):
    from gptforge.training.loop import train
    from tests.conftest import tiny_config

    cfg = tiny_config(shard_dir, tmp_path / "run", max_steps=3, val_every=0)
    cfg.data.shuffle, cfg.data.shuffle_seed = "shards", 5
    train(cfg)
    import json

    from gptforge.run import checkpoint as ckpt

    meta = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "run"))
    assert meta["loader"]["shuffle"] == "shards" and meta["loader"]["seed"] == 5
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["shuffle"] == "shards"
