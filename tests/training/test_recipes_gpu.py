"""Every training command, and the commands that read their checkpoints, on CUDA (``pytest -m gpu``).

The commands come from the CLI's own table (tests/training/commands.py), so a new recipe is run here
by construction. Each runs with its CUDA defaults (bf16 autocast, torch.compile) and is checked
against the same 3-step run on the CPU in float32: the first step's loss agrees to bf16's precision
and every logged number is finite. Then Ctrl-C on CUDA: exit 130 with a checkpoint, and ``--resume``
finishes. Last, the readers of those checkpoints on CUDA: sample, a generative eval, a reward
model's pair accuracy and win rate, and on-policy preference pairs. Skipped without CUDA.
"""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from tests.training.commands import RUNS, case_id, training_commands

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CASES = training_commands()


def _on(argv: list[str], device: str) -> list[str]:
    out = list(argv)
    for flag in ("--device", "--train.device"):
        if flag in out:
            out[out.index(flag) + 1] = device
    return out


def _steps(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r and r.get("step", 0) >= 1 and r["kind"] not in ("val", "eval")]


@pytest.mark.parametrize("command,algo", CASES, ids=[case_id(c) for c in CASES])
def test_every_training_command_on_cuda_matches_cpu_and_resumes(world, tmp_path, monkeypatch, capsys, command, algo):
    argv = RUNS[command, algo](world)
    assert main([*_on(argv, "cpu"), "--out", str(tmp_path / "ref")]) == 0
    assert main([*_on(argv, "cuda"), "--out", str(tmp_path / "dev")]) == 0
    cpu, gpu = _steps(tmp_path / "ref"), _steps(tmp_path / "dev")
    assert [r["step"] for r in gpu] == [r["step"] for r in cpu] and gpu, (cpu, gpu)
    start = json.loads((tmp_path / "dev" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["device"].startswith("cuda"), start
    for r in gpu:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
    a, b = cpu[0]["loss"], gpu[0]["loss"]  # same weights and batch: bf16 autocast moves it by ~1%
    assert abs(a - b) <= 0.03 * abs(a) + 0.05, (case_id((command, algo)), a, b)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monkeypatch.setenv("GPTFORGE_FAULT_INJECT", "0:2:int")
        assert main([*_on(argv, "cuda"), "--out", str(tmp_path / "part")]) == 130
        saved = ckpt.latest_checkpoint(tmp_path / "part")
        assert saved is not None and ckpt.read_meta(saved)["step"] == 2
        monkeypatch.delenv("GPTFORGE_FAULT_INJECT")
        assert main([command, "--out", str(tmp_path / "part"), "--resume"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    assert ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "part"))["step"] == 3
    capsys.readouterr()


def test_checkpoint_readers_on_cuda(world, tmp_path, capsys):
    chat = world["chat"]
    rm, ppo = tmp_path / "rm", tmp_path / "ppo"
    assert main([*_on(RUNS["rm", None](world), "cuda"), "--out", str(rm)]) == 0
    assert main([*_on(RUNS["rl", "ppo"](world), "cuda"), "--out", str(ppo)]) == 0
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(ppo), "--device", "cuda", "--max-new-tokens", "8", "--num-samples", "1"]) == 0
    assert main(["eval", "--ckpt", str(ppo), "--tasks", "compare", "--limit", "4", "--device", "cuda"]) == 0
    assert main(["eval", "--ckpt", str(rm), "--preferences", world["prefs"], "--device", "cuda"]) == 0
    assert main(["eval", "--ckpt", str(ppo), "--against", chat, "--reward-model", str(rm), "--tasks", "compare",
                 "--limit", "4", "--device", "cuda"]) == 0
    out = tmp_path / "pairs.jsonl"
    assert main(["prepare", "preferences", "compare", "--policy", chat, "--judge", str(rm), "--n", "4",
                 "--samples", "2", "--max-new-tokens", "8", "--device", "cuda", "--out", str(out)]) == 0
    io = capsys.readouterr()
    assert "win rate" in io.out and out.exists(), io.out + io.err
