"""A checkpoint whose meta.json ``config`` is not a JSON object (a list, a string, null) is damaged:
``--resume`` refuses it at exit 2 in one line naming the meta.json (``checkpoint.read_meta``'s guard),
for ``train`` and ``sft`` alike, and never gets as far as a traceback. Resuming the run directory
(``--resume`` with ``--out``, "latest") skips the damaged checkpoint, says which and why, and then finds
nothing to resume. (Damaged sections *inside* the config object are tests/run/test_saved_config_types.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.config import Config
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run.checkpoint import read_meta, save_checkpoint


def _damaged(tmp_path: Path, recipe: str, config) -> tuple[Path, Path]:
    """(run dir, checkpoint dir) of a one-step checkpoint of ``recipe`` whose meta.json config is ``config``."""
    cfg = Config(model=GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=64))
    run = tmp_path / recipe
    ck = save_checkpoint(run, 1, GPT(cfg.model), None, {"config": cfg.to_dict(), "recipe": recipe})
    meta = read_meta(ck)
    meta["config"] = config
    (ck / "meta.json").write_text(json.dumps(meta))
    return run, ck


@pytest.mark.parametrize("config", [[1, 2], "tiny", None], ids=["list", "string", "null"])
@pytest.mark.parametrize("command,recipe", [("train", "pretrain"), ("sft", "sft")])
def test_resume_refuses_a_config_that_is_not_an_object_in_one_line(tmp_path, capsys, command, recipe, config):
    run, ck = _damaged(tmp_path, recipe, config)
    assert main([command, "--resume", str(ck), "--out", str(run)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"gptforge {command}: error: {ck / 'meta.json'}: 'config' is not an object; "
                            f"the checkpoint is damaged\n")
    assert "Traceback" not in captured.out


@pytest.mark.parametrize("command,recipe", [("train", "pretrain"), ("sft", "sft")])
def test_resume_latest_skips_it_naming_the_file_then_finds_nothing(tmp_path, capsys, command, recipe):
    run, ck = _damaged(tmp_path, recipe, [1, 2])
    assert main([command, "--resume", "--out", str(run)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"skipping damaged checkpoint {ck.name}: {ck / 'meta.json'}: 'config' is not an object; the checkpoint is damaged",
        f"gptforge {command}: error: --resume: no complete checkpoint in {run / 'checkpoints'} that verifies "
        "(1 damaged, named above); start without --resume, or point --out at the run to continue"]
