"""Issue 11 (hardening), data / config / operator mistakes: bad input is refused before any compute
with one line that names the file, key or flag; diverged numbers are written as standard JSON."""

from __future__ import annotations

import json
import math

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
