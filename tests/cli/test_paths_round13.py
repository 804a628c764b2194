"""Paths and folders, round thirteen, each tested as a class: every ``prepare`` subcommand that writes a shard
folder holds it (a second prepare into the same folder is refused in one line naming the folder and the holder,
before any work); every safetensors file is opened through one function, so a Hugging Face folder or a run
folder whose path is not UTF-8 is read like any other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.cli.outputs import OUTPUTS
from gptforge.run.lock import PREPARE_LOCK_NAME, RunLock

# the arguments each shard-folder subcommand needs besides --out; a new one declared "shards" fails until it is here
ARGS = {"files": lambda corpus: ["files", str(corpus), "--no-progress"], "fineweb": lambda corpus: ["fineweb"],
        "shakespeare": lambda corpus: ["shakespeare"]}
SHARD_SUBCOMMANDS = sorted(k.split()[0] for k, kind in OUTPUTS["prepare"].items() if kind == "shards")


@pytest.fixture
def corpus(tmp_path) -> Path:
    f = tmp_path / "corpus.txt"
    f.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return f


def _one_line_refusal(capsys, folder: Path) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert str(folder) in err and f"pid {os.getpid()}" in err and "in use by another prepare" in err, err
    return err


def test_every_shard_subcommand_is_covered():
    assert SHARD_SUBCOMMANDS == sorted(ARGS)


@pytest.mark.parametrize("sub", SHARD_SUBCOMMANDS)
def test_a_second_prepare_into_a_held_folder_is_refused_before_any_work(sub, tmp_path, corpus, capsys):
    """The probe: two `prepare files` into one --out; the second deleted the first's unlisted shards as a killed
    run's leftovers and the first died on a raw "[Errno 2] No such file or directory". The lock is held here by
    another open file description, which flock treats as another holder, as it does another process."""
    out = tmp_path / "shards"
    with RunLock(out, "prepare", PREPARE_LOCK_NAME):
        rc = main(["prepare", *ARGS[sub](corpus), "--out", str(out)])
        assert rc == 2
        _one_line_refusal(capsys, out)
        assert sorted(p.name for p in out.iterdir()) == [PREPARE_LOCK_NAME]  # nothing written: refused first


@pytest.mark.parametrize("sub", ["shakespeare", "fineweb"])
def test_the_default_out_is_the_folder_held(sub, tmp_path, corpus, capsys, monkeypatch):
    """Without --out the subcommand's default folder (data/shakespeare, data/fineweb10B) is the one locked."""
    monkeypatch.chdir(tmp_path)
    folder = Path("data/shakespeare" if sub == "shakespeare" else "data/fineweb10B")
    with RunLock(folder, "prepare", PREPARE_LOCK_NAME):
        assert main(["prepare", *ARGS[sub](corpus)]) == 2
        _one_line_refusal(capsys, folder)


def test_a_held_folder_is_released_and_resumed(tmp_path, corpus, capsys):
    """After a prepare, the same command runs again (it resumes): the lock is released, and the file it leaves is
    not one that marks a run directory (a shard folder is refused inside a run's)."""
    out = tmp_path / "shards"
    argv = ["prepare", *ARGS["files"](corpus), "--out", str(out), "--shard-tokens", "1000"]
    assert main(argv) == 0
    assert main(argv) == 0, capsys.readouterr().err
    assert (out / "manifest.json").is_file()


def test_a_filesystem_without_flock_prepares_and_says_so(tmp_path, corpus, capsys, monkeypatch):
    """ENOLCK (some NFS and FUSE mounts) is not "held by another": the prepare goes on, saying once that it holds
    no lock."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "shards"
    assert main(["prepare", *ARGS["files"](corpus), "--out", str(out)]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "cannot lock files" in x]
    assert len(said) == 1 and "the prepare goes on without the lock" in said[0], said
    assert (out / "manifest.json").is_file()


def test_a_refused_prepare_leaves_no_folder(tmp_path, capsys):
    """The lock makes --out before any work; a prepare refused after it (here: no such input) leaves no folder."""
    out = tmp_path / "fresh"
    assert main(["prepare", "files", str(tmp_path / "missing.txt"), "--out", str(out), "--no-progress"]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert not out.exists()
