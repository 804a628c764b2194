"""A checkpoint's saved config is read through one door, ``run.resume.saved_config``, by every command
that loads a checkpoint: a damaged section inside meta.json's ``config`` (a section that is not an
object, a value of the wrong type, an unknown family) is one line naming the meta.json and the field,
exit 2, never a TypeError traceback. Before, sample/chat/serve/eval (load.py), ``export hf
--adapters-only`` and the reward-model loader called ``Config.from_dict`` on it directly."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gptforge.config import Config, ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "gptforge"

DAMAGES = {  # what is written into meta.json's config -> what the one line must name
    "model_not_object": (lambda c: c.__setitem__("model", 5), "model"),
    "optim_a_list": (lambda c: c.__setitem__("optim", [1, 2]), "optim"),
    "train_a_string": (lambda c: c.__setitem__("train", "abc"), "train"),
    "n_layer_a_string": (lambda c: c["model"].__setitem__("n_layer", "4"), "n_layer"),
    "unknown_family": (lambda c: c["model"].__setitem__("arch", "nope"), "nope"),
    "lr_a_string": (lambda c: c["optim"].__setitem__("lr", "fast"), "optim.lr"),
}


def _checkpoint(tmp_path: Path, damage, **extra) -> Path:
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run.checkpoint import read_meta, save_checkpoint

    cfg = Config(model=GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=50304))
    ck = save_checkpoint(tmp_path / "run", 1, GPT(cfg.model), None, {"config": cfg.to_dict(), **extra})
    meta = read_meta(ck)
    damage(meta["config"])
    (ck / "meta.json").write_text(json.dumps(meta))
    return ck


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_every_loading_command_refuses_a_damaged_section_in_one_line(tmp_path, capsys, name):
    from gptforge.cli import main

    damage, field = DAMAGES[name]
    ck = _checkpoint(tmp_path, damage)
    for argv in (["sample", "--ckpt", str(ck), "--max-new-tokens", "2", "--num-samples", "1"],
                 ["export", "hf", "--ckpt", str(ck), "--out", str(tmp_path / "hf")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{ck / 'meta.json'}" in err and field in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["model_not_object", "optim_a_list", "n_layer_a_string"])
def test_adapter_export_and_reward_model_loader_read_the_config_through_the_one_door(tmp_path, capsys, name):
    from gptforge.cli import main
    from gptforge.training.rm import _load_one_reward_model

    damage, field = DAMAGES[name]
    ck = _checkpoint(tmp_path, damage, lora={"rank": 2}, recipe="rm")
    assert main(["export", "hf", "--ckpt", str(ck), "--out", str(tmp_path / "ad"), "--adapters-only"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{ck / 'meta.json'}" in err and field in err, err
    with pytest.raises(ConfigError, match=rf"{ck / 'meta.json'}.*{field}"):
        _load_one_reward_model(str(ck))


def test_config_from_dict_names_a_section_that_is_not_an_object():
    good = Config().to_dict()
    for section, bad in (("model", 5), ("optim", [1, 2]), ("train", "abc"), ("data", None)):
        broken = dict(good, **{section: bad})
        with pytest.raises(ConfigError, match=rf"section '{section}' = .*expected an object"):
            Config.from_dict(broken)
    with pytest.raises(ConfigError, match="expected an object"):
        Config.from_dict([1, 2])


def test_only_the_one_door_calls_config_from_dict():
    """By construction: a new command that reads a checkpoint's config cannot skip saved_config's guards
    (the file's name in the message, legacy sections, damaged sections)."""
    callers = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_dict"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "Config"):
                callers.append(str(path.relative_to(SRC)))
    assert callers == ["run/resume.py"], callers
