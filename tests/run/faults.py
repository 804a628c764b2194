"""What the run-time fault tests (tests/run/test_hardening_round*_faults.py) share: a tiny pretraining
command line over the shards of ``tests.training.commands.make_world``, a finished 4-step run to copy,
and the one-error-line check."""

from __future__ import annotations

import shutil
from pathlib import Path

from gptforge.cli import main


def train_argv(shards: str | Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data.dir", str(shards), "--out", str(out), "--model.vocab_size", "512",
            "--train.device", "cpu", "--train.val_every", "0", "--train.sample_every", "0", *extra]


def finished_run(shards: str | Path, out: Path) -> Path:
    """A finished 4-step pretraining run with checkpoints at steps 2 and 4, copied by each test."""
    assert main(train_argv(shards, out, "--train.max_steps", "4", "--train.ckpt_every", "2")) == 0
    return out


def copy_run(src: Path, tmp_path: Path, name: str = "run") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def one_line(err: str) -> str:
    """The one error line (a progress line before it, such as export's "writing ...", is fine)."""
    errors = [x for x in err.strip().splitlines() if ": error: " in x]
    assert "Traceback" not in err and len(errors) == 1 and err.strip().endswith(errors[0]), err
    return errors[0]
