"""Issue 11 (hardening), data / config / operator mistakes: bad input is refused before any compute
with one line that names the file, key or flag; diverged numbers are written as standard JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gptforge.cli import main
from gptforge.config import Config, ConfigError, OptimConfig, apply_overrides
from gptforge.presets import get_preset
from gptforge.training.observe import MetricsLog, read_metrics


def _strict_json(line: str) -> dict:
    """Python's json accepts NaN/Infinity; standard JSON (jq, browsers) does not."""
    def refuse(token: str):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(line, parse_constant=refuse)


# --- item 6: non-finite config floats, standard JSON in metrics.jsonl --------------------------------

@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "1e999"])
@pytest.mark.parametrize("key", ["optim.lr", "optim.grad_clip", "dist.timeout", "train.peak_flops",
                                 "model.dropout"])
def test_non_finite_float_override_is_refused_naming_the_key(key, raw):
    with pytest.raises(ConfigError, match=f"--{key} .*finite"):
        apply_overrides(get_preset("tiny"), [f"--{key}", raw])


def test_non_finite_float_in_a_saved_config_is_refused():
    d = Config().to_dict()
    d["optim"]["eps"] = math.nan  # e.g. a hand-edited meta.json / config.json
    with pytest.raises(ConfigError, match="optim.eps=nan"):
        Config.from_dict(d)
    cfg = Config()
    cfg.optim = OptimConfig()
    cfg.optim.weight_decay = math.inf  # set after construction, as a preset function could
    with pytest.raises(ConfigError, match="optim.weight_decay=inf"):
        cfg.validate()


def test_cli_lr_inf_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "tiny", "--optim.lr", "inf"]) == 2
    assert "--optim.lr 'inf'" in capsys.readouterr().err


def test_metrics_log_writes_standard_json_for_non_finite_values(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write("train", 3, loss=math.nan, lr=1e-3, grad_norm=math.inf, mfu=None,
              tasks={"hellaswag": -math.inf}, hist=[1.0, math.nan])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rec = _strict_json(lines[0])
    assert rec["loss"] is None and rec["loss_str"] == "nan"
    assert rec["grad_norm"] is None and rec["grad_norm_str"] == "inf"
    assert rec["tasks"] == {"hellaswag": None, "hellaswag_str": "-inf"}
    assert rec["hist"] == [1.0, None] and rec["lr"] == 1e-3 and rec["mfu"] is None
    assert read_metrics(tmp_path)[0]["loss_str"] == "nan"  # the reader everything else uses


# --- item 2: token ids against the model's vocabulary, checked when the shards are opened ------------

def _bad_val(shard_dir, bad_id: int, at: int = 1234):
    from gptforge.data.shards import read_shard, write_shard

    path = shard_dir / "toy_val_000000.bin"
    toks = np.array(read_shard(path, mmap=False), dtype=np.int64)
    toks[at] = bad_id
    write_shard(path, toks)
    return path


def test_out_of_vocab_id_in_the_val_shard_is_refused_before_any_step(shard_dir, tmp_path):
    from gptforge.data.shards import TokenRangeError
    from gptforge.training.loop import train

    from .conftest import tiny_config

    path = _bad_val(shard_dir, 600)  # the model has 512 ids
    cfg = tiny_config(shard_dir, tmp_path / "run")
    with pytest.raises(TokenRangeError) as e:
        train(cfg)
    msg = str(e.value)
    assert str(path) in msg and "token id 600 at token offset 1234" in msg and "model.vocab_size=512" in msg
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before the first step


def test_ids_in_the_padded_vocabulary_range_are_refused(tmp_path):
    from gptforge.data.loader import ShardLoader
    from gptforge.data.shards import TokenRangeError, write_shard
    from gptforge.models.gpt2 import GPTConfig

    cfg = GPTConfig(vocab_size=50257, pad_vocab=True)
    assert cfg.padded_vocab_size == 50304  # the model has rows for 50300, but they are padding
    toks = np.full(1000, 50256, dtype=np.int64)
    toks[777] = 50300
    path = write_shard(tmp_path / "x_train_000000.bin", toks)
    with pytest.raises(TokenRangeError, match="token id 50300 at token offset 777"):
        ShardLoader([path], B=2, T=8, vocab_size=cfg.vocab_size)
    ShardLoader([path], B=2, T=8, vocab_size=50301)  # in range: accepted


def test_cli_vocab_smaller_than_the_data_exits_2_naming_both(shard_dir, tmp_path, capsys, monkeypatch):
    """Item 8: --model.vocab_size below the data's largest id (here 511) names both numbers."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--model.vocab_size", "300",
            "--train.device", "cpu", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "model.vocab_size=300" in err and "largest id in this shard is 511" in err
    assert len(err.strip().splitlines()) == 1
