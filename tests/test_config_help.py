"""--help-config explains every key: allowed values written as a user types them, and one line of
description from the comment next to the field (so a new field without one fails here)."""

from __future__ import annotations

import pytest

from gptforge.cli import main
from gptforge.config import Config, config_keys
from gptforge.config_help import UNDOCUMENTED, allowed, describe_keys
from gptforge.models.registry import switch_family


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_key_of_every_family_has_a_description(family):
    cfg = Config()
    cfg.model = switch_family(cfg.model, family)
    text = describe_keys(cfg)
    assert UNDOCUMENTED not in text, [ln for ln in text.splitlines() if UNDOCUMENTED in ln]
    keys = [ln.split()[0] for ln in text.splitlines() if ln.startswith("  --")]
    assert keys == [f"--{k}" for k in config_keys(cfg)]


def test_allowed_values_read_as_values_not_as_typing():
    from typing import Literal, Optional

    assert allowed(Literal["off", "shards", "documents"]) == "off | shards | documents"
    assert allowed(Optional[bool]) == "true | false or auto"
    assert allowed(int) == "int"


def test_help_config_lists_choices_and_descriptions(capsys):
    assert main(["train", "--preset", "tiny", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "Literal[" not in out and "typing." not in out and "Optional[" not in out
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith("--data.shuffle "))
    assert "off | shards | documents" in lines[i] and lines[i].split()[-1] == "'off'"
    assert lines[i + 1].strip().startswith("training order")  # the field's comment, under it
    j = next(i for i, ln in enumerate(lines) if ln.strip().startswith("--train.threads "))
    assert "CPU threads" in lines[j + 1]


@pytest.mark.parametrize("command, key, value", [("rl", "--optim.lr", "1e-05"), ("sft", "--optim.lr", "0.0001"),
                                                  ("dpo", "--dpo.beta", "0.1"), ("rm", "--optim.lr", "1e-05")])
def test_recipe_help_config_needs_no_out_or_init_from(capsys, command, key, value):
    """Issue 34: `rl --help-config` failed without --out and --init-from; every recipe lists its keys
    with its own defaults (RL's learning rate, not pretraining's) and exits 0, as --help does."""
    with pytest.raises(SystemExit) as e:
        main([command, "--help-config"])
    assert e.value.code == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith(key + " "))
    assert line.split()[-1] == value


def test_sft_takes_steps_like_rl_and_dpo(tmp_path, capsys):
    from tests.conftest import tiny_chat_checkpoint

    base = tiny_chat_checkpoint(tmp_path / "base")
    assert main(["sft", "--init-from", str(base), "--data", "x.jsonl", "--out", str(tmp_path / "r"), "--steps", "7",
                 "--dry-run"]) == 0
    assert '"max_steps": 7' in capsys.readouterr().out
