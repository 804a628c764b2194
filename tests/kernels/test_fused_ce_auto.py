"""``model.fused_ce`` = auto, the default (issue 58): on with CUDA and triton, off elsewhere; what
cannot run the fused classifier turns auto off with its reason (logged once) and refuses ``true``.

The probe is ``device.type == "cuda"`` plus ``gptforge.kernels.fused_ce.triton_available``: the tests
fake a CUDA device by its type (``torch.device("cuda")`` needs no GPU) and monkeypatch triton's
availability, so both branches run on any CPU machine."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.models.gpt2 import GPTConfig
from gptforge.presets import get_preset
from gptforge.training.loop import train
from gptforge.training.switches import resolve_model_switches, switch_problem
from tests.conftest import tiny_config

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _cfg(*overrides: str) -> Config:
    cfg = get_preset("tiny")
    cfg.train.device = "cpu"
    return apply_overrides(cfg, list(overrides))


def _resolve(cfg: Config, device: torch.device) -> tuple[bool, list[str]]:
    said: list[str] = []
    return resolve_model_switches(cfg, device, said.append).fused_ce, said


def test_auto_is_the_default_and_the_command_line_spells_all_three():
    assert GPTConfig().fused_ce is None and get_preset("tiny").model.fused_ce is None
    assert _cfg("--model.fused_ce", "auto").model.fused_ce is None
    assert _cfg("--model.fused_ce", "true").model.fused_ce is True
    assert _cfg("--model.fused_ce", "false").model.fused_ce is False
    with pytest.raises(ConfigError, match="model.fused_ce"):
        _cfg("--model.fused_ce", "sometimes")


def test_auto_is_off_on_cpu_even_under_the_interpreter(monkeypatch):
    monkeypatch.setattr("gptforge.kernels.fused_ce.triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the tests' interpreter is asked for, never chosen by auto
    assert _resolve(_cfg(), CPU) == (False, [])  # and silently: most CPU runs have no GPU to miss
    assert switch_problem(_cfg(), CPU) is None  # auto never refuses


def test_auto_trains_on_cpu_bit_identically_to_false(shard_dir, tmp_path):
    """Two steps of the tiny model at auto and at false: the same losses, bit for bit (the plain path)."""
    auto = tiny_config(shard_dir, tmp_path / "auto", max_steps=2, val_every=0)
    off = tiny_config(shard_dir, tmp_path / "off", max_steps=2, val_every=0)
    off.model.fused_ce = False
    assert auto.model.fused_ce is None
    a, b = train(auto), train(off)
    assert a.train_losses == b.train_losses and len(a.train_losses) == 2
    saved = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert saved["model"]["fused_ce"] is None  # the run keeps auto: a resume decides again on its own device


def test_auto_resolves_on_with_cuda_and_triton(monkeypatch):
    monkeypatch.setattr("gptforge.kernels.fused_ce.triton_available", lambda: True)
    assert _resolve(_cfg(), CUDA) == (True, [])
    cfg = _cfg()
    assert resolve_model_switches(cfg, CUDA).fused_ce is True and cfg.model.fused_ce is None  # a copy is built from
    monkeypatch.setattr("gptforge.kernels.fused_ce.triton_available", lambda: False)
    on, said = _resolve(_cfg(), CUDA)
    assert not on and len(said) == 1 and "triton" in said[0] and "model.fused_ce=auto" in said[0]


@pytest.mark.parametrize("overrides, dist, reason", [
    (["--model.lm_head_fp8", "true"], {}, "model.lm_head_fp8"),
    ([], {"tp": 2}, "dist.tp=2"),
    ([], {"pp": 2}, "dist.pp=2"),
    (["--model.arch", "llama", "--model.logit_softcap", "30"], {}, "model.logit_softcap=30"),
], ids=["fp8", "tp", "pp", "softcap"])
def test_what_cannot_run_it_turns_auto_off_with_its_reason_and_refuses_true(monkeypatch, overrides, dist, reason):
    monkeypatch.setattr("gptforge.kernels.fused_ce.triton_available", lambda: True)
    cfg = _cfg(*overrides)
    for k, v in dist.items():
        setattr(cfg.dist, k, v)
    on, said = _resolve(cfg, CUDA)
    assert not on and len(said) == 1 and reason in said[0] and said[0].startswith("model.fused_ce=auto: off")
    assert "\n" not in said[0]
    if not dist:  # the model's config refuses the pair itself, as before
        with pytest.raises(ConfigError, match="fused_ce"):
            _cfg(*overrides, "--model.fused_ce", "true")
        return
    cfg.model.fused_ce = True
    why = switch_problem(cfg, CUDA)
    assert why and why.startswith("model.fused_ce=true") and reason in why
    from gptforge.parallel.mesh import check_layout

    with pytest.raises(ConfigError, match="model.fused_ce"):
        check_layout(cfg, 2, 2)


def test_checkpoints_saved_with_true_or_false_still_load(shard_dir, tmp_path):
    """A checkpoint of a run before auto (fused_ce true or false in its meta.json) loads for sampling and
    resumes training on CPU (false); auto and the booleans all read back as written."""
    from gptforge.load import ModelSource, load_model
    from gptforge.run import checkpoint as ckpt

    for value in (True, False, None):
        d = {**Config().to_dict()}
        d["model"] = {**d["model"], "fused_ce": value}
        assert Config.from_dict(json.loads(json.dumps(d))).model.fused_ce is value
    run = tmp_path / "run"
    train(tiny_config(shard_dir, run, max_steps=2, val_every=0, ckpt_every=2))
    where = ckpt.latest_checkpoint(run)
    meta_path = where / "meta.json"
    meta = json.loads(meta_path.read_text())
    idx = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    logits = {}
    for value in (True, False):
        meta["config"]["model"]["fused_ce"] = value
        meta_path.write_text(json.dumps(meta))
        model = load_model(ModelSource(ckpt=str(where)))
        assert model.config.fused_ce is value
        logits[value] = model(idx)[0]  # evaluation takes the plain head either way
    assert torch.equal(logits[True], logits[False])
    # meta.json keeps false (an old run trained without it): resuming on CPU continues that run
    rest = train(tiny_config(shard_dir, run, max_steps=3, val_every=0), resume="latest")
    assert set(rest.train_losses) == {3}
