"""How a run ends: signals (a repeated SIGTERM must not lose the checkpoint; only a deliberate second
Ctrl-C aborts) and divergence (a non-finite loss exits 3, naming the step)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from gptforge.run.signals import StopFlag


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_second_signal_inside_the_grace_window_is_ignored():
    clock, said = _Clock(), []
    flag = StopFlag(grace_s=2.0, clock=clock, say=said.append)
    flag._handle(signal.SIGTERM, None)
    assert flag.stop and "finishing this step, saving a checkpoint" in said[0]
    clock.t += 0.05
    flag._handle(signal.SIGTERM, None)  # timeout / a process-group kill delivering twice
    clock.t += 0.5
    flag._handle(signal.SIGINT, None)  # Ctrl-C reaching the process a second time right away
    assert flag.stop and len(said) == 1


def test_after_the_window_ctrl_c_aborts_and_sigterm_does_not():
    clock, said = _Clock(), []
    flag = StopFlag(grace_s=2.0, clock=clock, say=said.append)
    flag._handle(signal.SIGINT, None)
    clock.t += 2.5
    flag._handle(signal.SIGTERM, None)  # a scheduler repeating itself: keep saving
    assert "still saving" in said[-1]
    with pytest.raises(KeyboardInterrupt):
        flag._handle(signal.SIGINT, None)  # a deliberate second Ctrl-C


def test_stop_flag_installs_and_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopFlag() as flag:
        assert signal.getsignal(signal.SIGTERM) == flag._handle
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_late_duplicate_is_ignored_even_after_the_run_then_the_old_handler_is_back():
    clock, seen = _Clock(), []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with StopFlag(grace_s=2.0, clock=clock, say=lambda m: None) as flag:
            flag._handle(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == flag._handle  # the process may still be exiting
        clock.t += 1.0
        flag._handle(signal.SIGTERM, None)
        assert seen == []
        clock.t += 1.5
        flag._handle(signal.SIGTERM, None)  # past the window: what the previous handler does
        assert seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) != flag._handle
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_two_sigterms_50ms_apart_still_leave_a_checkpoint(shard_dir, tmp_path):
    """A real training process gets SIGTERM twice in quick succession (what `timeout` or a
    process-group kill can deliver): it finishes the step, saves, and exits 130."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-u", "-m", "gptforge", "train", "--preset", "tiny", "--data.dir", str(shard_dir),
           "--out", str(out), "--model.vocab_size", "512", "--train.max_steps", "100000",
           "--train.val_every", "0", "--train.ckpt_every", "0", "--train.device", "cpu",
           # steps of ~0.5 s, so the second signal lands inside a step, not after the run
           "--model.n_layer", "4", "--model.n_embd", "256", "--model.n_head", "4", "--model.block_size", "256",
           "--train.seq_len", "256", "--train.micro_batch", "4", "--train.total_batch_tokens", "1024"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 120
        for line in proc.stdout:  # wait until training is really under way
            if line.startswith("step      1/"):
                break
            assert time.time() < deadline, "training did not start"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" not in rest and "continue with --resume" in rest
    saved = ckpt.latest_checkpoint(out)
    assert saved is not None and ckpt.read_meta(saved)["step"] >= 1
    ckpt.verify_checkpoint(saved)


def test_a_diverged_run_exits_3_naming_the_step(shard_dir, tmp_path, capsys):
    # lr 1e30 is finite (accepted by the config) but sends the weights to inf: the loss is nan at step 2
    code = main(["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(tmp_path / "run"),
                 "--model.vocab_size", "512", "--train.max_steps", "20", "--train.device", "cpu",
                 "--optim.lr", "1e30", "--optim.warmup_steps", "0"])
    io = capsys.readouterr()
    assert code == 3, io.err
    assert "diverged (not finite) at step" in io.err
    assert "loss is nan" in io.out
