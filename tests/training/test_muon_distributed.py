"""Muon under 2-process gloo: DDP, ZeRO-1 and FSDP2 equal one process with twice the accumulation,
and a Muon run stopped at world 2 resumes at world 2 and at world 1 on the same curve."""

from __future__ import annotations

import json

import pytest

from gptforge.config import Config, OptimConfig
from gptforge.training.loop import train
from tests.conftest import make_shards
from tests.training.test_distributed import HERE, STEPS, _cfg, _read, _torchrun

pytestmark = pytest.mark.slow  # one 2-process torchrun launch, ~25 s


def _muon(cfg: Config) -> Config:
    cfg.optim = OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, warmup_steps=2, min_lr_frac=0.1, schedule="wsd",
                            cooldown_frac=0.5)
    return cfg


def _close(a: dict[int, float], b: dict[int, float], steps, rtol: float) -> None:
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=rtol, abs=1e-6), (s, a[s], b[s])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("muon_dist")
    data = make_shards(tmp / "data")

    def job(name: str, resume=None, stop=None, copy_to=(), **dist) -> dict:
        cfg = _muon(_cfg(data, tmp / name.split(":")[0], **dist))
        cfg.train.trust_checkpoint = True  # our own sharded checkpoints (dcp/.metadata is a pickle)
        return {"config": cfg.to_dict(),
                "out": str(tmp / f"{name.split(':')[-1]}.json"), "resume": resume, "stop_at_step": stop,
                "copy_to": [str(tmp / c) for c in copy_to]}

    jobs = [
        job("ddp"), job("zero", shard="zero1"), job("fsdp", shard="fsdp"),
        job("fsdp_part", stop=4, copy_to=["fsdp_w1"], shard="fsdp"),
        job("fsdp_part:fsdp_rest", resume="latest", shard="fsdp"),
        job("zero_part", stop=4, shard="zero1"),
    ]
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    proc = _torchrun([str(HERE / "dist_worker.py"), str(tmp / "jobs.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = {n: _read(tmp / f"{n}.json") for n in ("ddp", "zero", "fsdp", "fsdp_part", "fsdp_rest", "zero_part")}
    for name, cfg_dir, resume, dist in (("one", "one", None, {}), ("fsdp_w1", "fsdp_w1", "latest", {"shard": "fsdp"}),
                                        ("zero_w1", "zero_part", "latest", {"shard": "zero1"})):
        cfg = _muon(_cfg(data, tmp / cfg_dir, **dist))
        cfg.train.trust_checkpoint = True
        res = train(cfg, resume=resume)  # world 1, accumulation 2
        out[name] = {"train": res.train_losses, "val": res.val_losses}
    out["log"] = proc.stdout
    return out


# Muon orthogonalises in bfloat16: a last-bit difference in a summed gradient can round one element
# of the update the other way, so the curves agree to ~1e-5, not to float32's last bit.
RTOL = 5e-5


def test_muon_world_2_matches_world_1_with_accumulation(runs):
    one = runs["one"]
    assert one["train"][STEPS] < one["train"][1] - 0.3  # learning
    for name in ("ddp", "zero", "fsdp"):
        _close(runs[name]["train"], one["train"], range(1, STEPS + 1), RTOL)
        _close(runs[name]["val"], one["val"], [4, 8], RTOL)
    assert "world 2 (zero1)" in runs["log"] and "world 2 (fsdp)" in runs["log"]


def test_muon_resume_at_world_2_and_world_1(runs):
    full = runs["fsdp"]["train"]
    assert set(runs["fsdp_rest"]["train"]) == set(range(5, STEPS + 1))
    for s in range(5, STEPS + 1):  # world 2 -> world 2: the same processes, the same bits
        assert runs["fsdp_rest"]["train"][s] == full[s], s
    _close(runs["fsdp_w1"]["train"], full, range(5, STEPS + 1), RTOL)  # FSDP world 2 -> one process
    _close(runs["zero_w1"]["train"], runs["zero"]["train"], range(5, STEPS + 1), RTOL)  # ZeRO-1 world 2 -> 1
