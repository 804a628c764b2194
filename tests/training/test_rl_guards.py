"""RL has the run stack's guards (issue 21, class 4): a non-finite reward or weight stops the run with
exit 3 and saves or prunes nothing; signals save and exit 130; a second run on the same directory is
refused; numeric flags are checked (exit 2) before any compute; numpy rewards are numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.eval.tasks.verifiable import Problem
from gptforge.run import checkpoint as ckpt
from gptforge.training.rewards import score
from tests.conftest import tiny_chat_checkpoint

SMALL = ["--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--device", "cpu", "--lr", "1e-3"]


def _reward_module(tmp_path: Path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:reward"


def _steps(run: Path) -> list[int]:
    return [int(p.name.split("_")[1]) for p in ckpt.list_checkpoints(run)]


@pytest.mark.parametrize("algo,bad", [*(("grpo", b) for b in ("1e308", "float('inf')", "float('nan')",
                                                             "np.float32(1e38) * np.float32(10)")),
                                      ("ppo", "float('nan')")])
def test_a_non_finite_reward_stops_with_exit_3_and_keeps_the_good_checkpoints(tmp_path, monkeypatch, capsys, algo,
                                                                               bad):
    src = tiny_chat_checkpoint(tmp_path / "sft")
    spec = _reward_module(tmp_path, monkeypatch, f"reward_{algo}_{abs(hash(bad))}", f"""
import numpy as np
calls = 0
def reward(problem, reply):
    global calls
    calls += 1
    return {bad} if calls > 8 else float(len(reply) % 2)  # 4 replies a step: step 3 goes bad
""")
    out = tmp_path / "rl"
    with np.errstate(over="ignore"):
        code = main(["rl", "--init-from", str(src), "--out", str(out), "--steps", "6", "--reward", spec,
                     "--ckpt-every", "1", "--keep-ckpts", "2", "--algo", algo, *SMALL])
    io = capsys.readouterr()
    assert code == 3, io.err
    assert "diverged (not finite) at step 3" in io.err and "Traceback" not in io.err
    assert "loss is nan" in io.out and "reward is" in io.out  # the stopping step's loss and mean reward
    assert _steps(out) == [1, 2]  # nothing written at step 3, and neither good one pruned
    for d in ckpt.list_checkpoints(out):
        ckpt.verify_checkpoint(d)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "rl"] == [1, 2, 3]
    # the stopping step's row: its loss (nan) and its reward (the bad batch's mean) are written as null
    assert rows[-2]["step"] == 3 and rows[-2]["loss"] is None and rows[-2]["reward"] is None, rows[-2]
    assert rows[-1]["kind"] == "end" and rows[-1]["diverged"] is True


def test_numpy_rewards_are_numbers(tmp_path, monkeypatch, capsys):
    assert score(lambda p, r: np.float32(0.5), [Problem("q", "1")], ["x"]) == [0.5]
    assert score(lambda p, r: np.int64(2), [Problem("q", "1")], ["x"]) == [2.0]
    for not_a_number in ("0.5", None, np.bool_(True), True):
        with pytest.raises(Exception, match="expected a number"):
            score(lambda p, r, v=not_a_number: v, [Problem("q", "1")], ["x"])
    src = tiny_chat_checkpoint(tmp_path / "sft")
    spec = _reward_module(tmp_path, monkeypatch, "reward_np32", """
import numpy as np
def reward(problem, reply):
    return np.float32(len(reply) % 3)
""")
    assert main(["rl", "--init-from", str(src), "--out", str(tmp_path / "rl"), "--steps", "2", "--reward", spec,
                 *SMALL]) == 0, capsys.readouterr().err


def test_nan_weights_are_never_saved(shard_dir, tmp_path):
    from gptforge.training.loop import train
    from gptforge.training.pretrain import Pretrain
    from tests.conftest import tiny_config

    class Poisoned(Pretrain):  # a step whose loss is finite but leaves a weight nan (an update gone wrong)
        def step(self, run, step):
            stats = super().step(run, step)
            if step == 2:
                with torch.no_grad():
                    next(run.model.parameters())[0].fill_(float("nan"))
            return stats

    out = tmp_path / "run"
    result = train(tiny_config(shard_dir, out, max_steps=6, ckpt_every=1, keep_ckpts=2), Poisoned())
    assert result.diverged_at == 3 and result.steps_done == 3
    assert _steps(out) == [1, 2]


@pytest.mark.parametrize("flag,value,says", [
    ("--lr", "nan", "argument --lr: 'nan' is not a finite number"),
    ("--temperature", "nan", "argument --temperature: 'nan' is not a finite number"),
    ("--kl-coef", "inf", "argument --kl-coef: 'inf' is not a finite number"),
    ("--top-k", "-5", "rl.top_k=-5"),
    ("--max-new-tokens", "1000", "--max-new-tokens 1000 (rl.max_new_tokens)"),
    ("--max-new-tokens", "60", "--max-new-tokens 60 (rl.max_new_tokens)"),  # 60 + the prompt > 64
])
def test_numeric_flags_are_refused_before_any_compute(tmp_path, capsys, monkeypatch, flag, value, says):
    import gptforge.training.loop

    monkeypatch.setattr(gptforge.training.loop, "RunSession", None)  # nothing may start a run
    src = tiny_chat_checkpoint(tmp_path / "sft")
    out = tmp_path / "rl"
    try:
        code = main(["rl", "--init-from", str(src), "--out", str(out), *SMALL, flag, value])
    except SystemExit as e:  # argparse's own refusal of a flag's value
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert says in err.strip().splitlines()[-1] and "Traceback" not in err  # argparse prints its usage above
    assert not out.exists()


def _spawn(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-u", "-m", "gptforge", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_step(proc: subprocess.Popen, seen: list[str]) -> None:
    deadline = time.time() + 180
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step ") and "reward" in line:
            return
        assert time.time() < deadline, "".join(seen)
    raise AssertionError("the run ended before its first step:\n" + "".join(seen))


@pytest.mark.slow
def test_signals_save_and_exit_130_and_the_run_dir_is_locked_meanwhile(tmp_path, capsys):
    """A real `gptforge rl`: SIGTERM, then a resumed one SIGINT (Ctrl-C), each saving a checkpoint
    and exiting 130 without a traceback; while one runs, a second run on its --out is refused."""
    src = tiny_chat_checkpoint(tmp_path / "sft")
    out = tmp_path / "rl"
    long = ["--steps", "100000", "--ckpt-every", "0", *SMALL]
    for sig, args in [(signal.SIGTERM, ["rl", "--init-from", str(src), "--out", str(out), *long]),
                      (signal.SIGINT, ["rl", "--out", str(out), "--resume"])]:
        before = max(_steps(out), default=0)
        proc, seen = _spawn(args), []
        try:
            _wait_for_step(proc, seen)
            if sig == signal.SIGTERM:  # meanwhile, the directory is taken
                code = main(["rl", "--init-from", str(src), "--out", str(out), "--force", *long])
                err = capsys.readouterr().err
                assert code == 2 and f"pid {proc.pid}" in err, err
            proc.send_signal(sig)
            rest = proc.stdout.read()
            assert proc.wait(timeout=120) == 130, "".join(seen) + rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "Traceback" not in rest and "KeyboardInterrupt" not in rest and "continue with --resume" in rest
        assert max(_steps(out)) > before
        ckpt.verify_checkpoint(ckpt.latest_checkpoint(out))
