"""The batch-size schedule (train.batch_warmup_steps): the batch grows in whole micro-batches."""

from __future__ import annotations

import json

import pytest

from gptforge.config import ConfigError
from gptforge.training.loop import train
from tests.conftest import make_shards, tiny_config


def test_the_ramp_grows_in_whole_micro_batches_and_counts_tokens(tmp_path):
    cfg = tiny_config(tmp_path, tmp_path / "r", micro_batch=4, seq_len=16, total_batch_tokens=512,
                      batch_warmup_steps=4, batch_warmup_start=0.25)  # 8 micro-batches of 64 tokens
    # fractions .25, .4375, .625, .8125 of 8 micro-batches, half rounding up; then the full 8
    assert [cfg.train.accum_at(s) for s in range(6)] == [2, 4, 5, 7, 8, 8]
    assert cfg.train.tokens_before(6) == 64 * (2 + 4 + 5 + 7 + 8 + 8)
    assert cfg.train.accum_at(0, world=2) == 1  # 4 micro-batches per step on two ranks


def test_a_small_first_batch_trains_exactly_like_a_constant_small_batch(tmp_path):
    """While the schedule is at one micro-batch, the run sees the same data and takes the same steps
    as a run whose whole batch is one micro-batch (same lr schedule): losses equal bit for bit; later
    the scheduled run takes bigger steps, and metrics.jsonl counts their tokens."""
    data = make_shards(tmp_path / "data", n_train=1_000)  # 500-token shards: steps cross shard ends
    sched = train(tiny_config(data, tmp_path / "s", total_batch_tokens=256, max_steps=10, batch_warmup_steps=24))
    const = train(tiny_config(data, tmp_path / "c", total_batch_tokens=64, max_steps=10))
    ones = [s for s in range(24) if tiny_config(data, tmp_path, total_batch_tokens=256,
                                                 batch_warmup_steps=24).train.accum_at(s) == 1]
    assert ones == list(range(4))  # .25 + .75 s/24 of 4 rounds to 1 for s < 4
    for step in range(1, 5):
        assert sched.train_losses[step] == const.train_losses[step], step
    assert sched.train_losses[6] != const.train_losses[6]
    records = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    tokens = [r["tokens"] for r in records if r["kind"] == "train"]
    accum = [tiny_config(data, tmp_path, total_batch_tokens=256, batch_warmup_steps=24).train.accum_at(s)
             for s in range(10)]
    assert tokens == [64 * sum(accum[: s + 1]) for s in range(10)]
    assert tokens[-1] < 10 * 256


def test_resume_inside_the_ramp_is_bit_exact(shard_dir, tmp_path):
    kw = dict(total_batch_tokens=256, max_steps=12, batch_warmup_steps=8)
    full = train(tiny_config(shard_dir, tmp_path / "full", **kw))
    train(tiny_config(shard_dir, tmp_path / "part", **kw), stop_at_step=4)
    rest = train(tiny_config(shard_dir, tmp_path / "part", **kw), resume="latest")
    for s in range(5, 13):
        assert rest.train_losses[s] == full.train_losses[s], s
    tokens = [json.loads(line)["tokens"] for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "train" and not json.loads(line).get("replayed")]
    full_tokens = [json.loads(line)["tokens"] for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["kind"] == "train"]
    assert tokens[-1] == full_tokens[-1]


def test_a_schedule_needs_more_than_one_micro_batch(shard_dir, tmp_path):
    cfg = tiny_config(shard_dir, tmp_path / "r", total_batch_tokens=64, batch_warmup_steps=10)
    with pytest.raises(ConfigError, match="train.batch_warmup_steps=10.*lower train.micro_batch"):
        cfg.validate()
    with pytest.raises(ValueError, match="train.batch_warmup_start"):
        tiny_config(shard_dir, tmp_path / "r", batch_warmup_start=0.0)
