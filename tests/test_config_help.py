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
