"""Hardening round 6, the RL recipe's counts: rl.updates_per_batch had no upper bound, and every update of a
sampled batch runs inside one step, so `gptforge rl --updates-per-batch 1e15` sampled, evaluated and then never
ended its first step; a SIGTERM (which waits for the step to finish before saving) could not stop it either.
It is now refused in one line naming the key, by the config check every door (flag, --rl.key, a resumed run's
config) goes through, before the model loads."""

from __future__ import annotations

import pytest

from gptforge.cli import main
from gptforge.config import Config, ConfigError
from gptforge.config_recipes import MAX_UPDATES_PER_BATCH


@pytest.mark.parametrize("value", [MAX_UPDATES_PER_BATCH + 1, 10**15, 0, -1])
def test_updates_per_batch_out_of_range_is_refused_by_the_config(value):
    with pytest.raises((ConfigError, ValueError), match=r"rl\.updates_per_batch"):
        Config.from_dict({"rl": {"updates_per_batch": value}})


def test_updates_per_batch_in_range_is_taken():
    assert Config.from_dict({"rl": {"updates_per_batch": MAX_UPDATES_PER_BATCH}}).rl.updates_per_batch == 1000


@pytest.mark.parametrize("argv", [["--updates-per-batch", "1e15"], ["--rl.updates_per_batch", "1001"]])
def test_rl_refuses_a_huge_updates_per_batch_in_one_line(tmp_path, capsys, argv):
    from tests.conftest import tiny_chat_checkpoint

    sft = tiny_chat_checkpoint(tmp_path / "sft")
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "rl"), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rl.updates_per_batch" in err[0] and "[1, 1,000]" in err[0], err
    assert not (tmp_path / "rl" / "checkpoints").exists()
