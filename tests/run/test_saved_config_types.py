"""Every key of every config section read back from a checkpoint's meta.json is type-checked as the
command line's parser would, for every recipe's config (issue 33: `dpo.beta: "abc"` was a TypeError
traceback on --resume)."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from gptforge.config import Config, ConfigError
from gptforge.presets import PRESETS, get_preset


def _wrong(value, tp):
    """A JSON value of the wrong type for a field of type ``tp`` (None when every JSON value fits)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _wrong(value, inner[0]) if len(inner) == 1 and inner[0] in (bool, int, float, str) else None
    if tp is bool:
        return "false"
    if tp in (int, float):
        return "abc"
    if tp is str or origin is typing.Literal:
        return 7
    return None


def _configs():
    from gptforge.training.grpo import rl_config
    from gptforge.training.pairs import pair_config
    from gptforge.training.sft import sft_config

    out = {name: get_preset(name) for name in sorted(PRESETS)}
    base = get_preset("tiny").model
    out.update(sft=sft_config(base, "o"), rl=rl_config(base, "o", "i"), pairs=pair_config(base, "o"))
    return out


def test_every_key_of_every_section_refuses_a_wrong_json_type():
    checked = 0
    for _name, cfg in _configs().items():
        d = cfg.to_dict()
        Config.from_dict(json.loads(json.dumps(d)))  # the saved form reads back as it was written
        for section, values in d.items():
            sec_obj = getattr(cfg, section)
            hints = typing.get_type_hints(type(sec_obj))
            for f in dataclasses.fields(sec_obj):
                bad = _wrong(values.get(f.name), hints[f.name])
                if bad is None or f.name == "arch":
                    continue
                broken = json.loads(json.dumps(d))
                broken[section][f.name] = bad
                with pytest.raises(ConfigError, match=rf"{section}\.{f.name} = "):
                    Config.from_dict(broken)
                checked += 1
    assert checked > 300  # every typed key of every section of every preset and recipe config


def test_a_damaged_dpo_config_is_one_line_on_resume(tmp_path, capsys):
    from gptforge.cli import main
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run.checkpoint import read_meta, save_checkpoint

    cfg = Config(model=GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=64))
    ck = save_checkpoint(tmp_path / "dpo", 1, GPT(cfg.model), None, {"config": cfg.to_dict(), "recipe": "dpo"})
    meta = read_meta(ck)
    meta["config"]["dpo"]["beta"] = "abc"
    (ck / "meta.json").write_text(json.dumps(meta))
    assert main(["dpo", "--resume", "--out", str(tmp_path / "dpo")]) == 2
    err = capsys.readouterr().err
    assert "dpo.beta = 'abc': expected a number" in err and "Traceback" not in err
