"""A run directory has one writer: a lock while a run writes (a second run fails at once, naming the
holder; a killed holder never blocks), ``--force`` through a symlinked ``checkpoints/`` really starts
over, and a disk that fills during a metrics write is a one-line error with no torn record (issue 21)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from gptforge.run.lock import RunLock


def _train(shard_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(out), "--model.vocab_size", "512",
            "--train.device", "cpu", "--train.val_every", "0", "--train.sample_every", "0", *extra]


def test_a_second_run_on_the_same_out_fails_at_once_naming_the_holder(shard_dir, tmp_path, capsys):
    """The holder here is this process through another open file (flock is per open file, so it
    conflicts exactly as another process would); tests/training/test_rl_guards.py has a real one."""
    out = tmp_path / "run"
    with RunLock(out):
        code = main(_train(shard_dir, out, "--train.max_steps", "2"))
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"pid {os.getpid()}" in err and str(out) in err and "another --out" in err
        assert len(err.strip().splitlines()) == 1
        assert sorted(p.name for p in out.iterdir()) == [".gptforge.lock"]  # the refused run wrote nothing
    assert main(_train(shard_dir, out, "--train.max_steps", "2")) == 0  # released: runs


def test_a_lock_file_left_by_a_killed_run_does_not_block(shard_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".gptforge.lock").write_text("pid 999999: gptforge train --out run\n")  # what SIGKILL leaves: no flock
    assert main(_train(shard_dir, out, "--train.max_steps", "2")) == 0
    assert f"pid {os.getpid()}" in (out / ".gptforge.lock").read_text()


def test_a_refused_run_leaves_no_directory_behind(tmp_path, capsys):
    out = tmp_path / "new"
    assert main(_train(tmp_path / "no_data", out, "--train.max_steps", "2")) == 2
    assert not out.exists(), list(out.iterdir())


def test_force_through_a_symlinked_checkpoints_dir_starts_over(shard_dir, tmp_path, capsys):
    out, disk = tmp_path / "run", tmp_path / "big_disk" / "ckpts"
    disk.mkdir(parents=True)
    out.mkdir()
    (out / "checkpoints").symlink_to(disk, target_is_directory=True)  # checkpoints on another disk
    (disk / "notes.txt").write_text("not gptforge's")
    assert main(_train(shard_dir, out, "--train.max_steps", "6", "--train.ckpt_every", "2")) == 0
    assert ckpt.latest_checkpoint(out).name == "step_000006"
    # start over with a shorter run that keeps one checkpoint: the old step 6 must not survive and win
    assert main(_train(shard_dir, out, "--train.max_steps", "2", "--train.ckpt_every", "1",
                       "--train.keep_ckpts", "1", "--force")) == 0
    assert (out / "checkpoints").is_symlink() and (disk / "notes.txt").exists()
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_000002"]  # the new run's, not pruned away
    assert sorted(p.name for p in disk.iterdir()) == ["notes.txt", "step_000002"]
    latest = ckpt.latest_checkpoint(out)
    assert ckpt.read_meta(latest)["config"]["train"]["max_steps"] == 2
    capsys.readouterr()
    assert main(_train(shard_dir, out, "--resume")) == 0  # resumes the new run: complete at step 2
    assert "complete" in capsys.readouterr().out


def test_a_disk_that_fills_during_a_metrics_write_is_one_line_and_leaves_no_torn_record(
        shard_dir, tmp_path, monkeypatch, capsys):
    real_write, calls = os.write, []

    def write(fd: int, data: bytes) -> int:
        if bytes(data).startswith(b'{"kind": "train"'):
            calls.append(1)
            if len(calls) == 3:  # the third step's record: half of it lands, then the disk is full
                real_write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    out = tmp_path / "run"
    code = main(_train(shard_dir, out, "--train.max_steps", "6"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "no space left on device while writing a metrics.jsonl record" in err and "Traceback" not in err
    text = (out / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    rows = [json.loads(x) for x in text.splitlines()]  # every line whole
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]


@pytest.mark.parametrize("what", ["config.json", "env.json"])
def test_a_full_disk_writing_the_run_files_is_the_same_error(shard_dir, tmp_path, monkeypatch, capsys, what):
    import builtins

    real = builtins.open

    def open_(file, mode="r", *a, **k):  # the one writer's temporary for ``what``: .config.json.tmp-...
        if "w" in mode and not isinstance(file, int) and Path(os.fsdecode(file)).name.startswith(f".{what}.tmp-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", open_)
    assert main(_train(shard_dir, tmp_path / "run", "--train.max_steps", "2")) == 2
    assert f"no space left on device while writing {what}" in capsys.readouterr().err


def test_a_hand_edited_config_json_is_named_before_a_resume_rewrites_it(shard_dir, tmp_path, capsys):
    """config.json is a record: a resume reads the checkpoint's config and the command's flags, never the file,
    and rewrites it. Keys edited there by hand are named with the flags that would set them, before the rewrite;
    the run itself goes on with the checkpoint's values (the file's edit changes nothing)."""
    out = tmp_path / "run"
    assert main(_train(shard_dir, out, "--train.max_steps", "2", "--train.ckpt_every", "2")) == 0
    conf = json.loads((out / "config.json").read_text())
    lr = conf["optim"]["lr"]
    conf["optim"]["lr"], conf["train"]["micro_batch"] = lr * 10, conf["train"]["micro_batch"] * 2
    (out / "config.json").write_text(json.dumps(conf))
    capsys.readouterr()
    assert main(_train(shard_dir, out, "--resume", "--train.max_steps", "3", "--train.ckpt_every", "3")) == 0
    got = capsys.readouterr()
    err = got.out + got.err  # run.log's lines go where the run's lines go
    named = [line for line in err.splitlines() if "config.json" in line]
    assert len(named) == 1, err
    assert "optim.lr" in named[0] and "train.micro_batch" in named[0], named[0]
    assert f"--optim.lr {json.dumps(lr * 10)}" in named[0], named[0]
    after = json.loads((out / "config.json").read_text())
    assert after["optim"]["lr"] == lr  # rewritten with what the run used: the checkpoint's value
    assert json.loads((ckpt.latest_checkpoint(out) / "meta.json").read_text())["config"]["optim"]["lr"] == lr
    capsys.readouterr()  # a file nobody edited: no word about it
    assert main(_train(shard_dir, out, "--resume", "--train.max_steps", "4", "--train.ckpt_every", "4")) == 0
    got = capsys.readouterr()
    assert "config.json" not in got.out + got.err
