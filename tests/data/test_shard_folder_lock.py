"""One writer or many readers of a shard folder, never both; one writer of a generated data file.

``prepare --force`` rewrote a shard folder a running ``train`` was reading (its loader opens shards over epochs),
and the Python ``prepare()`` took no lock at all (only the command line did). Now every door of the library holds
the folder: ``prepare`` exclusive (``data.shards.writing``), every reader shared (``list_shards``' list, the
loader). ``flock`` belongs to an open file description, so a hold in this process on another open of the file
stands for another process, as the kernel treats it; the cross-process cases use a real second process.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import PrepareSettings
from gptforge.data.prepare.sources import FilesSource
from gptforge.data.shards import SHARD_LOCK_NAME, ShardError, list_shards, reading, writing
from gptforge.storage.faults import OutputError

SETTINGS = dict(shard_tokens=400, val_tokens=100, workers=1)


@pytest.fixture
def prepared(tmp_path) -> tuple[Path, Path]:
    """(corpus file, a shard folder prepared from it)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 300)
    out = tmp_path / "shards"
    prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), progress=False)
    return corpus, out


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != SHARD_LOCK_NAME}


READER = """
import sys
from gptforge.data.shards import list_shards
files = list_shards(sys.argv[1], "train", "val")
print(len(files), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def reader_process():
    """Start a real second process holding a shard folder through list_shards, as train's loader does."""
    procs = []

    def start(folder: Path) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                            os.environ.get("PYTHONPATH", "")])}
        p = subprocess.Popen([sys.executable, "-c", READER, str(folder)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        procs.append(p)
        assert int(p.stdout.readline()) > 0, p.stderr.read()  # it holds the folder now
        return p

    yield start
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)


def test_a_prepare_meeting_a_reading_process_is_refused_naming_it_before_any_work(prepared, reader_process):
    corpus, out = prepared
    before = _tree(out)
    reader = reader_process(out)
    with pytest.raises(ShardError) as e:
        prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)
    line = str(e.value)
    assert "\n" not in line and str(out) in line and f"pid {reader.pid}" in line and "being read by" in line, line
    assert _tree(out) == before  # --force deleted nothing: refused first
    reader.stdin.close()
    reader.wait(timeout=30)  # the reader gone (its lock with it): the same prepare goes on
    prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)


@pytest.mark.parametrize("proc", [None, []], ids=["no-proc-locks", "proc-locks-on-other-device-numbers"])
def test_without_proc_locks_the_kind_of_holder_is_still_told(proc, prepared, reader_process, monkeypatch):
    """Where /proc/locks cannot say (not Linux; an overlay mount whose device numbers are not fstat's), a probe
    tells readers from a prepare: the refusal is the reader's, not "in use by another prepare"."""
    from gptforge.storage import lock

    corpus, out = prepared
    reader = reader_process(out)
    monkeypatch.setattr(lock, "locks_on", lambda fd: proc)
    with pytest.raises(ShardError, match="being read by another process"):
        prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)
    reader.stdin.close()
    reader.wait(timeout=30)
    with writing(out), pytest.raises(ShardError, match=f"a `gptforge prepare` is writing it now \\(pid {os.getpid()}"):
        list_shards(out, "train", "val")


def test_two_reading_processes_share_the_folder(prepared, reader_process):
    """DDP: every rank holds the folder shared; none refuses another."""
    _, out = prepared
    reader_process(out)
    files = list_shards(out, "train", "val")  # this process: a second reader
    assert files and files.hold is not None


def test_a_loader_holds_its_folder_while_it_lives(prepared):
    """The loader (here one given plain paths, not list_shards' list) holds the folder as long as it lives; a
    prepare in the same process meanwhile is refused, naming this process; once the loader is gone it goes on."""
    from gptforge.data.loader import ShardLoader

    corpus, out = prepared
    loader = ShardLoader([Path(f) for f in list_shards(out, "train", "val")], B=1, T=8)
    with pytest.raises(ShardError, match=f"being read by pid {os.getpid()}"):
        prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)
    loader.itself = loader  # unused but in a reference cycle (as a finished run's objects can be): the prepare
    del loader  # collects this process's garbage once before it refuses
    assert prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)["complete"]


def test_a_reader_meeting_a_running_prepare_is_refused_in_one_line(prepared):
    """train started while a prepare writes the folder: one line naming the prepare's pid, not the manifest's
    "has not finished" (a running prepare is not one to run again)."""
    _, out = prepared
    with writing(out):  # another open file description: another holder
        with pytest.raises(ShardError) as e:
            list_shards(out, "train", "val")
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"data directory {out}: a `gptforge prepare` is writing it now "
                                                 f"(pid {os.getpid()}: "), line
    assert "has not finished" not in line
    assert list_shards(out, "train", "val")  # released: read again


@pytest.mark.parametrize("door", ["files", "shakespeare"])
def test_every_library_door_holds_the_folder(door, tmp_path, prepared):
    """The Python API, not only the command line: a second prepare (here: held in this process on another open
    of the lock file) is refused before any work, whichever library function writes the shard folder."""
    from gptforge.data.prepare import shakespeare

    corpus, _ = prepared
    out = tmp_path / f"held_{door}"
    with writing(out), pytest.raises(ShardError, match="in use by another prepare"):
        if door == "files":
            prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), progress=False)
        else:
            shakespeare.prepare(out, "plays")
    assert not out.exists()  # made by the hold, removed with it: nothing was written


def _read_only_mount(monkeypatch, folder) -> None:
    """``folder`` as on a read-only mount: any open of a file in it that would create or write is EROFS."""
    real_open = os.open

    def read_only(path, flags, *a, **k):
        if flags & (os.O_CREAT | os.O_RDWR | os.O_WRONLY) and str(path).startswith(str(folder)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)


def test_a_folder_that_cannot_hold_a_lock_is_read_and_said_once(prepared, monkeypatch, capsys):
    """A read-only mount (EROFS making the lock file) with no lock file, and a filesystem without flock
    (ENOLCK): the shards are read, one warning line per folder."""
    import fcntl

    _, out = prepared
    (out / SHARD_LOCK_NAME).unlink()
    _read_only_mount(monkeypatch, out)
    assert list_shards(out, "train", "val") and list_shards(out, "val", "train")
    monkeypatch.undo()
    said = [x for x in capsys.readouterr().err.splitlines() if str(out) in x]
    assert len(said) == 1 and "read-only file system" in said[0] and "read without the lock" in said[0], said

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    other = out.parent / "nolocks"
    out.rename(other)
    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert list_shards(other, "train", "val") and list_shards(other, "train", "val")
    said = [x for x in capsys.readouterr().err.splitlines() if str(other) in x]
    assert len(said) == 1 and "cannot lock files (no locks available)" in said[0], said


def test_a_read_only_folder_with_its_lock_file_is_still_held(prepared, monkeypatch):
    """Where the lock file is there but cannot be opened for writing (a read-only mount of a prepared folder), the
    reader locks it read-only: a prepare on another mount of the same files is still refused."""
    corpus, out = prepared
    _read_only_mount(monkeypatch, out)
    hold = reading(out)
    monkeypatch.undo()
    with pytest.raises(ShardError, match="being read by"):
        prepare(FilesSource([corpus]), out, PrepareSettings(**SETTINGS), force=True, progress=False)
    hold.close()


# --- one writer of a generated data file ------------------------------------------------------------------------

def _writers():
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import training_problems, write_conversations

    return {"conversations": lambda p: write_conversations(training_problems(3, 0), p),
            "preferences": lambda p: write_preferences(preference_set("arithmetic", 3, 0, ["wrong_number"]), p)}


@pytest.mark.parametrize("kind", ["conversations", "preferences"])
def test_a_second_writer_of_a_data_file_is_refused_while_the_first_writes(kind, tmp_path):
    """Two `prepare conversations --force --out same.jsonl` at once: the last whole write won, silently. The first
    writer here is inside the one writer's sole claim (its temporary locked), on another open file description."""
    from gptforge.storage import atomic_open

    write = _writers()[kind]
    path = tmp_path / f"{kind}.jsonl"
    with atomic_open(path, "w", sole=True) as f:
        f.write("first\n")
        with pytest.raises(OutputError) as e:
            write(path)
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"{path}: another process is writing it now (pid {os.getpid()}"), line
    assert path.read_text() == "first\n"  # the first writer's, whole; the refused one left no temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    write(path)  # the first finished: the next one writes
    assert path.read_text() != "first\n"
