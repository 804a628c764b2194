"""The model-family seam: configs pick their family by ``model.arch``, commands build models through
the registry, and the one ``load_model`` serves every model-taking command."""

from __future__ import annotations

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.load import ModelSource, load_model
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.registry import FAMILIES, build_model, get_family, model_config, size_config, switch_family
from gptforge.presets import get_preset


def test_model_config_dispatches_on_arch_and_defaults_to_gpt2():
    cfg = model_config({"n_layer": 2, "n_head": 2, "n_embd": 64})  # an old checkpoint: no "arch" key
    assert isinstance(cfg, GPTConfig) and cfg.arch == "gpt2" and cfg.n_layer == 2
    assert isinstance(build_model(cfg), GPT)
    with pytest.raises(ValueError, match="model.arch='nope' is not a known model family"):
        model_config({"arch": "nope"})
    with pytest.raises(ValueError, match=r"unknown key\(s\).*'n_kv_head'"):
        model_config({"arch": "gpt2", "n_kv_head": 2})


def test_config_round_trips_through_dict_with_its_family():
    cfg = get_preset("tiny")
    back = Config.from_dict(cfg.to_dict())
    assert back == cfg and back.model.arch == "gpt2"
    d = cfg.to_dict()
    d["model"].pop("arch")  # checkpoints written before the registry
    assert Config.from_dict(d) == cfg
    d["model"]["arch"] = "nope"
    with pytest.raises(ConfigError, match="model.arch"):
        Config.from_dict(d)


def test_arch_override_is_checked_and_carries_the_shape():
    cfg = get_preset("tiny")
    with pytest.raises(ConfigError, match="--model.arch 'nope'"):
        apply_overrides(cfg, ["--model.arch", "nope"])
    same = switch_family(cfg.model, "gpt2")
    assert same is cfg.model
    apply_overrides(cfg, ["--model.arch", "gpt2", "--model.n_layer", "3"])
    assert cfg.model.n_layer == 3 and cfg.model.n_embd == 64


def test_every_family_builds_its_sizes_and_has_blocks():
    for fam in FAMILIES.values():
        assert get_family(fam.name) is fam
        for size in fam.size_names()[:1]:
            with torch.device("meta"):
                model = build_model(size_config(size))
            assert len(model.blocks) == model.config.n_layer
    with pytest.raises(ValueError, match="unknown model size 'nope'"):
        size_config("nope")


def test_load_model_takes_exactly_one_source():
    model = load_model(ModelSource(random="d2"))
    assert model.config.n_layer == 2 and not model.training
    with pytest.raises(ValueError, match="exactly one"):
        load_model(ModelSource(random="d2", hf="gpt2"))
    assert ModelSource.from_path(__file__).llmc == __file__
    assert ModelSource.from_path("runs/x").ckpt == "runs/x"


def test_random_source_works_in_sample_and_bad_size_exits_2(capsys):
    assert main(["sample", "--random", "d2", "--num-samples", "1", "--max-new-tokens", "3", "--device", "cpu"]) == 0
    assert main(["sample", "--random", "nope", "--device", "cpu"]) == 2
    assert "unknown model size 'nope'" in capsys.readouterr().err


def test_help_config_shows_the_preset_values_with_overrides(capsys):
    assert main(["train", "--preset", "tiny", "--train.max_steps", "7", "--help-config"]) == 0
    out = capsys.readouterr().out
    line = lambda key: next(ln for ln in out.splitlines() if ln.strip().startswith(key))  # noqa: E731
    assert line("--train.micro_batch").rstrip().endswith("4")  # tiny's, not the general default 64
    assert line("--train.seq_len").rstrip().endswith("32")
    assert line("--train.max_steps").rstrip().endswith("7")
