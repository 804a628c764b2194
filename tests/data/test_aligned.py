"""BOS-aligned batches: row cutting on a hand-made shard, every row starting at a document when
documents are short, the same rows at any world size, resume, and training with document attention."""

from __future__ import annotations

import numpy as np
import pytest

from gptforge.data.aligned import AlignedShardLoader, make_loader, row_starts
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import write_shard
from gptforge.training.loop import train
from tests.conftest import tiny_config

EOT = 9


def test_row_starts_by_hand():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21
    toks = [1, 1, EOT, 2, 2, 2, EOT, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, EOT, 4, 4, 4]
    # T=4: row at 2 (first BOS in reach) covers 2..6; next BOS at 6 is in reach -> 6; row 6..10 ends
    # in a long document with the next BOS (18) more than T away -> continue at 10, then 14 (18 is 4
    # away: not < T, continue), then 18 does not fit T+1 tokens before the end (22)
    assert row_starts(np.array(toks), 4, EOT).tolist() == [2, 6, 10, 14]
    assert row_starts(np.array(toks), 8, EOT).tolist() == [2, 10]  # 10: BOS 18 is 8 away from end 10
    assert row_starts(np.array([5] * 30), 4, EOT).tolist() == [0, 4, 8, 12, 16, 20, 24]


def _doc_shards(folder, n_docs=400, seed=0):
    rng = np.random.default_rng(seed)
    docs = [np.concatenate([[EOT], rng.integers(10, 100, rng.integers(3, 15))]) for _ in range(n_docs)]
    folder.mkdir(parents=True, exist_ok=True)
    half = n_docs // 2
    write_shard(folder / "d_train_000000.bin", np.concatenate(docs[:half]))
    write_shard(folder / "d_train_000001.bin", np.concatenate(docs[half:]))
    write_shard(folder / "d_val_000000.bin", np.concatenate(docs[:100]))
    return folder


def test_every_row_starts_at_a_document_and_targets_follow(tmp_path):
    data = _doc_shards(tmp_path / "d")
    files = sorted(data.glob("d_train_*.bin"))
    loader = AlignedShardLoader(files, B=4, T=16, eot=EOT)
    plain = ShardLoader(files, B=4, T=16, eot=EOT)
    for _ in range(80):  # more than an epoch of both shards
        x, y = loader.next_batch()
        assert (x[:, 0] == EOT).all()
        assert (x[:, 1:] == y[:, :-1]).all()
    assert loader.epoch >= 1
    assert not (plain.next_batch()[0][1:, 0] == EOT).all()  # without alignment rows start anywhere


@pytest.mark.parametrize("world", [1, 2])
def test_same_rows_at_any_world_size_and_resume(tmp_path, world):
    data = _doc_shards(tmp_path / "d")
    files = sorted(data.glob("d_train_*.bin"))
    step = 8 * 16  # 8 rows per optimizer step, all ranks
    one = AlignedShardLoader(files, 4, 16, eot=EOT, step_tokens=step)
    ref = [np.concatenate([one.next_batch()[0].numpy() for _ in range(2)]) for _ in range(30)]  # accum 2
    ranks = [AlignedShardLoader(files, 4, 16, r, world, eot=EOT, step_tokens=step) for r in range(world)]
    accum = 2 // world
    saved: list[dict] = []
    for s in range(30):
        if s == 13:  # resume every rank from its saved state
            ranks = [make_loader(files, 4, 16, r, world, align="bos", eot=EOT, step_tokens=step) for r in range(world)]
            for r, ld in enumerate(ranks):
                ld.load_state_dict(saved[r])
        got = [[ranks[r].next_batch()[0].numpy() for _ in range(accum)] for r in range(world)]
        rows = np.concatenate([got[r][m] for m in range(accum) for r in range(world)])
        assert (rows == ref[s]).all(), s
        saved = [ld.state_dict() for ld in ranks]
    with pytest.raises(Exception, match="data.align"):
        AlignedShardLoader(files, 4, 16, eot=EOT).load_state_dict(ShardLoader(files, 4, 16).state_dict())


def test_training_with_aligned_batches_and_document_attention_resumes_bit_exactly(tmp_path):
    data = _doc_shards(tmp_path / "d", n_docs=3000)

    def cfg(out):
        c = tiny_config(data, out, max_steps=8, val_tokens=256)
        c.data.align, c.data.eot_token = "bos", EOT
        c.model.attention, c.model.bos_token = "document", EOT
        return c

    full = train(cfg(tmp_path / "full"))
    part = train(cfg(tmp_path / "part"), stop_at_step=3)
    rest = train(cfg(tmp_path / "part"), resume="latest")
    for s in range(1, 9):
        assert (part.train_losses.get(s) or rest.train_losses[s]) == full.train_losses[s], s
    assert full.train_losses[8] < full.train_losses[1]


def test_aligned_state_is_refused_by_the_plain_loader_and_back(tmp_path):
    from gptforge.data.shards import ShardError

    files = sorted(_doc_shards(tmp_path / "d").glob("d_train_*.bin"))
    aligned, plain = AlignedShardLoader(files, B=4, T=16, eot=EOT), ShardLoader(files, B=4, T=16, eot=EOT)
    aligned.next_batch()
    plain.next_batch()
    with pytest.raises(ShardError, match="data.align=bos"):
        ShardLoader(files, B=4, T=16, eot=EOT).load_state_dict(aligned.state_dict())
    with pytest.raises(ShardError, match="data.align=off"):
        AlignedShardLoader(files, B=4, T=16, eot=EOT).load_state_dict(plain.state_dict())


def test_aligned_resume_with_another_seq_len_is_refused_naming_it(tmp_path):
    """The aligned loader's position counts rows cut for one T (row_starts depends on it): under another
    seq_len the same position names other rows, so a resume would re-read or skip data in silence."""
    from gptforge.data.shards import ShardError

    files = sorted(_doc_shards(tmp_path / "d").glob("d_train_*.bin"))
    saved = AlignedShardLoader(files, B=4, T=16, eot=EOT)
    for _ in range(3):
        saved.next_batch()
    state = saved.state_dict()
    with pytest.raises(ShardError, match=r"train.seq_len 16, but this run has train.seq_len 8; resume with "
                                         r"--train.seq_len 16"):
        AlignedShardLoader(files, B=8, T=8, eot=EOT).load_state_dict(state)
    same = AlignedShardLoader(files, B=4, T=16, eot=EOT)
    same.load_state_dict(state)  # the same length resumes where it stopped
    x_next, _ = saved.next_batch()
    assert same.next_batch()[0].equal(x_next)
    old = {k: v for k, v in state.items() if k != "seq_len"}  # a checkpoint from before the field: as before
    AlignedShardLoader(files, B=4, T=16, eot=EOT).load_state_dict(old)
