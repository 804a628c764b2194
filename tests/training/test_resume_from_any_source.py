"""A run started ``--init-from`` a Hugging Face directory (or a GGUF file: the same path through
``ModelSource.from_path``) resumes: the recipes with a frozen reference (GRPO, PPO, DPO) reload it from
``*.init_from`` on ``--resume``, and that reload must read every model source ``--init-from`` reads.
GRPO's and PPO's took it as a gptforge checkpoint ("holds no complete checkpoint"), so an RL run from
SmolLM2's GGUF could not resume (found by tests/interop/test_smollm_fidelity.py). Here: a tiny chat
model exported to a Hugging Face directory, each such recipe stopped by SIGINT after step 1 of 2 and
resumed, ends with the uninterrupted run's weights exactly."""

from __future__ import annotations

import signal

import pytest

from gptforge.cli import main
from tests.training.commands import RUNS, assert_same_weights

CASES = [("rl", "grpo"), ("rl", "ppo"), ("dpo", None)]


@pytest.fixture(scope="module")
def world(world, tmp_path_factory):
    hf = str(tmp_path_factory.mktemp("any_source") / "hf")
    assert main(["export", "hf", "--ckpt", world["chat"], "--out", hf]) == 0
    return {**world, "chat": hf}  # every run below starts --init-from the Hugging Face directory


@pytest.mark.parametrize("command,algo", CASES, ids=[c if a is None else f"{c}-{a}" for c, a in CASES])
def test_resume_of_a_run_from_a_hf_directory_is_bit_exact(world, tmp_path, monkeypatch, capsys, command, algo):
    argv = _two_steps(RUNS[command, algo](world))
    full, part = tmp_path / "full", tmp_path / "part"
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main([*argv, "--out", str(full)]) == 0
        monkeypatch.setenv("GPTFORGE_FAULT_INJECT", "0:1:int")
        assert main([*argv, "--out", str(part)]) == 130
        monkeypatch.delenv("GPTFORGE_FAULT_INJECT")
        capsys.readouterr()
        rc = main([command, "--out", str(part), "--resume"])
        assert rc == 0, capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, before)
    assert_same_weights(full, part)


def _two_steps(argv: list[str]) -> list[str]:
    i = argv.index("--steps")
    return [*argv[:i + 1], "2", *argv[i + 2:]]
