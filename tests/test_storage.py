"""A full disk while preparing shards: one clear line (what, how much), no partial file, and the
finished shards kept so the same command resumes. (Checkpoints: tests/run/test_checkpoint_safety.py.)"""

from __future__ import annotations

import errno
import os
import re

import pytest

from gptforge.cli import main
from gptforge.data.prepare import pipeline
from gptforge.data.shards import read_shard
from gptforge.storage.faults import is_disk_full


def test_disk_full_is_recognised_in_every_writers_dialect(tmp_path, monkeypatch):
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    # safetensors' Rust error, as it reads on a real full tmpfs
    assert is_disk_full(Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
                        tmp_path)
    assert not is_disk_full(OSError(errno.EIO, "Input/output error"), tmp_path)
    # torch.save: a RuntimeError with no errno; the answer depends on the room left
    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert not is_disk_full(torch_says, tmp_path, needed=1000)  # this disk has room: some other failure
    monkeypatch.setattr("gptforge.storage.faults.free_bytes", lambda path: 0)
    assert is_disk_full(torch_says, tmp_path, needed=1000)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (a device that is always full)")
def test_numpys_short_write_is_a_full_disk(tmp_path):
    """numpy's tofile on a full disk: an OSError with no errno, only "N requested and M written" (issue 56,
    class 4: `export gguf` printed it as a traceback). Taken from a real write to /dev/full, not typed here."""
    import numpy as np

    from gptforge.storage.faults import DiskFullError, output_error

    with pytest.raises(OSError) as e, open("/dev/full", "wb") as f:
        np.zeros(1 << 16, dtype=np.float32).tofile(f)
    assert e.value.errno is None and "requested and" in str(e.value)  # the dialect, as numpy speaks it
    err = output_error(e.value, tmp_path / "model.gguf", "the GGUF export", needed=1 << 18)
    assert isinstance(err, DiskFullError) and str(err).startswith("no space left on device while writing the GGUF")
    assert not is_disk_full(OSError("the file requested was not written by this test"), tmp_path)  # words alone


def test_prepare_on_a_full_disk_says_so_and_keeps_finished_shards(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i}: " + "words and more words " * 40 for i in range(40)))
    real_write, calls = pipeline.write_shard, {"n": 0}

    def write_shard(path, tokens, magic=None):
        calls["n"] += 1
        if calls["n"] == 3:  # the third shard: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, tokens, magic=magic)

    monkeypatch.setattr(pipeline, "write_shard", write_shard)
    out = tmp_path / "out"
    argv = ["prepare", "files", str(corpus), "--out", str(out), "--shard-tokens", "1000", "--workers", "1",
            "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    m = re.search(r"no space left on device while writing shard data_train_000002\.bin \(needs about ([0-9.e-]+) GB\)",
                  err)
    assert m, err
    assert float(m.group(1)) == pytest.approx((1024 + 1000 * 2) / 1e9, rel=0.05)  # header + 1000 uint16 tokens
    assert "the same command resumes" in err
    assert sorted(p.name for p in out.glob("*.bin")) == ["data_train_000001.bin", "data_val_000000.bin"]
    monkeypatch.undo()
    assert main(argv) == 0  # room again: it resumes
    capsys.readouterr()
    assert len(read_shard(out / "data_train_000002.bin")) == 1000



# --- the one writer's own rules (the commands are walked in tests/cli/test_writers.py) ------------------

def test_a_folder_replaced_with_force_keeps_other_entries_and_replaces_subfolders_whole(tmp_path):
    from gptforge.storage import atomic_dir
    from gptforge.storage.guards import OutputExistsError

    out = tmp_path / "exp"
    with atomic_dir(out) as t:
        (t / "model.bin").write_text("old")
        (t / "tokenizer").mkdir()
        (t / "tokenizer" / "ranks.tiktoken").write_text("old kind")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="--force"):
        with atomic_dir(out) as t:
            pass
    with atomic_dir(out, force=True) as t:
        (t / "model.bin").write_text("new")
        (t / "tokenizer").mkdir()
        (t / "tokenizer" / "tokenizer.json").write_text("new kind")
    assert {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()} == {
        "model.bin": "new", "notes.txt": "mine", "tokenizer/tokenizer.json": "new kind"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # no temporary left


def test_a_swap_without_renameat2_and_a_kill_between_its_renames(tmp_path, monkeypatch):
    import gptforge.storage as storage
    from gptforge.storage.guards import OutputExistsError

    monkeypatch.setattr(storage, "exchange", lambda a, b: False)  # another platform: two renames
    out = tmp_path / "exp"
    with storage.atomic_dir(out) as t:
        (t / "a").write_text("1")
    with storage.atomic_dir(out, force=True) as t:
        (t / "a").write_text("2")
    assert (out / "a").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["exp"]
    # a kill between the two renames: NAME missing, the old folder whole beside it; the next write restores
    os.rename(out, tmp_path / ".exp.old-999999999-abcdef")
    with pytest.raises(OutputExistsError):
        with storage.atomic_dir(out) as t:
            pass
    assert (out / "a").read_text() == "2"


def test_a_killed_writers_temporaries_are_removed_by_the_next_write(tmp_path):
    from gptforge.storage import write_text

    stale = tmp_path / ".r.json.tmp-999999999-abcdef.json"  # no such process
    stale.write_text("half")
    live = tmp_path / f".r.json.tmp-{os.getpid()}-abcdef.json"  # a writer still running: left alone
    live.write_text("half")
    write_text(tmp_path / "r.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", live.name])


def test_force_never_reaches_a_run_or_a_checkpoint(tmp_path):
    from gptforge.storage.guards import OutputExistsError, check_output

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    for p, kind in [(run, "dir"), (step, "dir"), (run / "checkpoints", "dir"), (step / "model.safetensors", "file"),
                    (step / "new.json", "file"), (run / "metrics.jsonl", "file"), (run / "config.json", "file")]:
        with pytest.raises(OutputExistsError, match="--force never"):
            check_output(p, True, kind)
    assert check_output(run / "curves.png", True, "file") == run / "curves.png"  # a new report beside a run: fine
    assert check_output(run / "exports" / "hf", True, "dir") == run / "exports" / "hf"
