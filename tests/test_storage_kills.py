"""Issue 56 class 7: what the atomic writers leave after a failure or a kill at each of their steps.

Each step of each writer is made to fail (an exception from that call) and to be killed (SIGKILL in a
child process at that call, before or after it runs). Expected, by the writers' contract: under NAME the
old output intact or the new one complete, never a part of one; a failure the writer sees leaves no
temporary; what a kill leaves is put back (an earlier folder) or removed (a temporary) by the next write,
and a checkpoint re-save killed between its renames still lists step N, readable whole.

Plants tried (each fails here): atomic_path's ``tmp.unlink()`` on failure dropped; ``remove_stale_temporaries``
not called; atomic_dir's in-process restore after a failed second rename dropped (this test added it: NAME
was missing until the next write); ``_restore_interrupted`` not called; finalize_checkpoint's restore
dropped (added here too) and list_checkpoints reading only ``step_N`` (a killed re-save lost step N, and
``step_N.old`` made it raise ValueError: int('000010.old')); begin_checkpoint's removal of leftovers
dropped, made to remove every ``.old`` (a lone one is step N), or to keep other steps' ``.tmp``;
mark_replayed back to its own ``.tmp`` writer. Survived: list_checkpoints reading ``step_N.old`` as a
final name (the directory's order decides which of the two it lists when both are there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gptforge import storage


def _listing(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


class Boom(OSError):
    pass


def _fail_at(monkeypatch, module, name: str, nth: int) -> None:
    """``module.name`` raises at its ``nth`` call (1-based) and runs as itself otherwise."""
    real, calls = getattr(module, name), [0]

    def wrapped(*a, **kw):
        calls[0] += 1
        if calls[0] == nth:
            raise Boom(f"injected failure of {name} call {nth}")
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapped)


# --- a file --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", ["write", "fsync", "rename"])
def test_a_file_write_failing_at_each_step_keeps_the_old_file_and_leaves_no_temporary(step, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    storage.write_text(out, "old")
    if step == "fsync":
        _fail_at(monkeypatch, storage, "fsync_file", 1)
    if step == "rename":
        _fail_at(monkeypatch, storage.os, "replace", 1)
    with pytest.raises(Exception, match="injected|midway"):
        with storage.atomic_open(out, "w") as f:
            f.write("ne")
            if step == "write":
                raise Boom("midway")
            f.write("w")
    assert _listing(tmp_path) == {"r.json": "old"} and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


KILL = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from gptforge import storage
    storage.exchange = lambda a, b: False  # the two-rename path, the one with a window
    nth, when, what, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    real, calls = os.replace, [0]
    def replace(a, b):
        calls[0] += 1
        if calls[0] == nth and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real(a, b)
        if calls[0] == nth and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    if what == "file":
        storage.write_text(out, "new")
    elif what == "dir":
        with storage.atomic_dir(out, force=True) as t:
            (t / "a").write_text("new a")
            (t / "b").write_text("new b")
    else:  # a checkpoint re-saved at the same step (ckpt), or a first save of step 20 (ckpt20)
        from gptforge.run import checkpoint as ckpt
        tmp = ckpt.begin_checkpoint(out, 20 if what == "ckpt20" else 10)
        (tmp / "model.safetensors").write_text("new")
        ckpt.finalize_checkpoint(out, tmp, {"config": {}, "note": "new"})
    print("finished")
""")


def _killed(nth: int, when: str, what: str, out: Path) -> bool:
    """Run one write in a child killed at its ``nth`` os.replace; True if it was killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", KILL, str(nth), when, what, str(out)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode in (0, -9), r.stderr[-2000:]
    return r.returncode == -9


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_file_write_killed_at_its_rename_leaves_old_or_new_and_the_next_write_clears_its_temporary(when, tmp_path):
    out = tmp_path / "r.json"
    storage.write_text(out, "old")
    assert _killed(1, when, "file", out)
    assert out.read_text() == ("old" if when == "before" else "new")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "r.json")
    assert len(left) == (1 if when == "before" else 0) and all(storage.is_temporary(n) for n in left)
    storage.write_text(out, "next")  # the killed writer's temporary goes with the next write of NAME
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"] and out.read_text() == "next"


# --- a folder ------------------------------------------------------------------------------------------------

def _old_dir(out: Path) -> None:
    with storage.atomic_dir(out) as t:
        (t / "a").write_text("old a")
        (t / "b").write_text("old b")


OLD = {"a": "old a", "b": "old b"}
NEW = {"a": "new a", "b": "new b"}


@pytest.mark.parametrize(("swap", "nth"), [("exchange", 1), ("two renames", 1), ("two renames", 2)])  # exchange: one step
def test_a_folder_replace_failing_at_each_rename_keeps_the_old_folder_whole_and_leaves_nothing(swap, nth, tmp_path,
                                                                                               monkeypatch):
    out = tmp_path / "exp"
    _old_dir(out)
    if swap == "two renames":
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
        _fail_at(monkeypatch, storage.os, "replace", nth)
    else:
        _fail_at(monkeypatch, storage, "exchange", 1)
    with pytest.raises(Exception, match="injected"):
        with storage.atomic_dir(out, force=True) as t:
            (t / "a").write_text("new a")
            (t / "b").write_text("new b")
    assert _listing(out) == OLD and sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


@pytest.mark.parametrize(("nth", "when"), [(1, "before"), (1, "after"), (2, "before"), (2, "after")])
def test_a_folder_replace_killed_at_each_rename_is_restored_or_cleaned_by_the_next_write(nth, when, tmp_path):
    out = tmp_path / "exp"
    _old_dir(out)
    assert _killed(nth, when, "dir", out)
    entries = {p.name: p for p in tmp_path.iterdir()}
    if (nth, when) == (2, "after"):  # the new folder in place, the old one not yet deleted
        assert _listing(out) == NEW
    elif out.exists():
        assert _listing(out) == OLD
    else:  # between the two renames: NAME missing, the old folder whole beside it
        olds = [p for n, p in entries.items() if n.startswith(".exp.old-")]
        assert len(olds) == 1 and _listing(olds[0]) == OLD
    want = NEW if (nth, when) == (2, "after") else OLD
    with storage.atomic_dir(out, force=True) as t:  # the next write: restores first, then replaces
        (t / "c").write_text("c")
    assert _listing(out) == {**want, "c": "c"} and sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


# --- a checkpoint re-saved at the same step ------------------------------------------------------------------

def _first_save(run: Path) -> None:
    from gptforge.run import checkpoint as ckpt

    tmp = ckpt.begin_checkpoint(run, 10)
    (tmp / "model.safetensors").write_text("old")
    ckpt.finalize_checkpoint(run, tmp, {"config": {}, "note": "old"})


def _listed(run: Path) -> list[tuple[int, str, str]]:
    from gptforge.run import checkpoint as ckpt

    return [(json.loads((p / "meta.json").read_text())["step"], json.loads((p / "meta.json").read_text())["note"],
             (p / "model.safetensors").read_text()) for p in ckpt.list_checkpoints(run)]


@pytest.mark.parametrize(("nth", "when"), [(1, "before"), (1, "after"), (2, "before"), (2, "after")])
def test_a_checkpoint_resave_killed_at_each_rename_still_lists_step_n_whole(nth, when, tmp_path):
    from gptforge.run import checkpoint as ckpt

    run = tmp_path / "run"
    _first_save(run)
    assert _killed(nth, when, "ckpt", run)
    done = (nth, when) == (2, "after")  # the new folder renamed in; else the earlier one is step 10
    assert _listed(run) == [(10, "new", "new") if done else (10, "old", "old")]
    between = (nth, when) in ((1, "after"), (2, "before"))  # step_N missing: its earlier folder, read in place
    assert ckpt.latest_checkpoint(run).name == ("step_000010.old" if between else "step_000010")
    ckpt.verify_checkpoint(ckpt.latest_checkpoint(run))  # every file matches its meta.json checksum
    _first_save(run)  # the next save of the step replaces whatever the kill left
    assert _listed(run) == [(10, "old", "old")]
    assert sorted(p.name for p in ckpt.ckpt_root(run).iterdir()) == ["step_000010"]


@pytest.mark.parametrize("swap", ["exchange", "two renames"])
def test_a_checkpoint_resave_failing_at_its_second_rename_keeps_the_earlier_save(swap, tmp_path, monkeypatch):
    from gptforge.run import checkpoint as ckpt

    run = tmp_path / "run"
    _first_save(run)
    if swap == "two renames":
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
        _fail_at(monkeypatch, ckpt.os, "replace", 2)
    else:
        _fail_at(monkeypatch, storage, "exchange", 1)
    tmp = ckpt.begin_checkpoint(run, 10)
    (tmp / "model.safetensors").write_text("new")
    with pytest.raises(Boom):
        ckpt.finalize_checkpoint(run, tmp, {"config": {}, "note": "new"})
    assert _listed(run) == [(10, "old", "old")] and ckpt.latest_checkpoint(run).name == "step_000010"  # in place
    monkeypatch.undo()
    tmp = ckpt.begin_checkpoint(run, 10)  # a later save goes through, with or without renameat2
    (tmp / "model.safetensors").write_text("new")
    ckpt.finalize_checkpoint(run, tmp, {"config": {}, "note": "new"})
    assert _listed(run) == [(10, "new", "new")]
    assert sorted(p.name for p in ckpt.ckpt_root(run).iterdir()) == ["step_000010"]


def test_a_resumes_rewrite_of_metrics_failing_at_its_rename_keeps_the_file_and_leaves_no_temporary(tmp_path,
                                                                                                    monkeypatch):
    """mark_replayed rewrites metrics.jsonl at a resume; it wrote ``metrics.jsonl.tmp`` by hand, left it on a
    failure and never fsynced it. Through the one writer now."""
    from gptforge.run.metrics import mark_replayed

    path = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps({"kind": "train", "step": s, "loss": 1.0}) + "\n" for s in range(1, 5))
    path.write_text(text)
    _fail_at(monkeypatch, storage.os, "replace", 1)
    with pytest.raises(Exception, match="injected"):
        mark_replayed(path, 2)
    assert path.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    monkeypatch.undo()
    assert mark_replayed(path, 2) == 2  # steps 3 and 4
    assert [json.loads(line).get("replayed", False) for line in path.read_text().splitlines()] == [False, False, True, True]


@pytest.mark.parametrize(("what", "nth", "when"), [("ckpt20", 1, "before"), ("ckpt", 2, "after"), ("ckpt", 2, "before")])
def test_a_save_of_another_step_removes_what_a_killed_save_left(what, nth, when, tmp_path):
    """A save killed before its rename leaves step_20.tmp; a re-save killed after it leaves step_10.old
    beside the new step_10. Neither is a checkpoint; the run's next save (of any step) removes them. A
    re-save killed between its renames leaves step_10.old alone: that is step 10, and it is kept."""
    from gptforge.run import checkpoint as ckpt

    run = tmp_path / "run"
    _first_save(run)
    assert _killed(nth, when, what, run)
    left = "step_000020.tmp" if what == "ckpt20" else "step_000010.old"
    assert (ckpt.ckpt_root(run) / left).is_dir()
    tmp = ckpt.begin_checkpoint(run, 30)
    (tmp / "model.safetensors").write_text("thirty")
    ckpt.finalize_checkpoint(run, tmp, {"config": {}, "note": "thirty"})
    lone = when == "before" and what == "ckpt"
    step10 = "step_000010.old" if lone else "step_000010"
    assert sorted(p.name for p in ckpt.ckpt_root(run).iterdir()) == [step10, "step_000030"]  # every .tmp gone
    assert [p.name for p in ckpt.list_checkpoints(run)] == [step10, "step_000030"]
