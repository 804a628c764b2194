"""What happens to a training run when the world changes under it (hardening round eight), tested through the
shared pieces every training command goes through (the run lock and session, the metrics log, the
checkpointer, the shard loader, the fine-tuning resume path):

* the run directory deleted, moved, or moved with an empty folder put in its place, while the run trains:
  one line saying where the run went and how to continue (exit 2), nothing written into a new folder under
  the old name (a save made ``checkpoints/`` anew there, silently, and a deleted one ended in the CLI's raw
  "No such file or directory" for the run directory, raised by the lock's own tidying);
* the run directory made read-only mid-run (EACCES from chmod, EROFS from a remount): the metrics record
  that meets it is one line saying --resume (the append's open was outside the error translation: the CLI's
  generic "check the paths given"); a --resume into it is refused before any step, saying what to fix;
* metrics.jsonl deleted, emptied or cut inside a record mid-run: one line saying so and every record after
  it whole (an append to a file cut mid-record was glued to the torn record and both were lost); deleted
  between a run and its --resume: the resume says so, trains on, and plot reads the new file;
* a shard deleted, its folder removed, or a shard rewritten while the run trains (the loader opens shards
  when it reaches them): one line naming the shard and --resume, the last checkpoint resumable (a rewritten
  shard was read silently, and its checkpoints then claimed the old contents);
* a fine-tuning checkpoint's chat template gone from meta.json: one line naming it (sft died with an
  AttributeError traceback); the base model (--init-from) deleted between a run and its --resume: resumes;
* a checkpoint whose files are a mix of two saves: refused naming the file and the save it came from.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from gptforge.cli import main
from gptforge.data.shards import read_shard, write_shard
from gptforge.run import checkpoint as ckpt
from gptforge.run.metrics import read_metrics
from tests.run.faults import before_step as _before_step
from tests.run.faults import copy_run as _copy
from tests.run.faults import one_line as _one_line
from tests.run.faults import train_argv as _train
from tests.training.commands import RUNS


def _resume(run: Path, steps: int = 8) -> list[str]:
    return ["train", "--out", str(run), "--resume", "--train.max_steps", str(steps)]


def _steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


# --- 1. the run directory deleted or moved while the run trains ------------------------------------------------

@pytest.mark.parametrize("at", ["metrics record", "checkpoint"])
@pytest.mark.parametrize("how", ["deleted", "moved", "moved, an empty folder in its place"])
def test_a_run_directory_deleted_or_moved_mid_run_stops_in_one_line_and_writes_nothing_new(
        base_run, tmp_path, capsys, monkeypatch, how, at):
    """After step 5 (before its record) or between step 6's record and its save (an eval in between)."""
    from gptforge.training.pretrain import Pretrain

    run, moved = _copy(base_run, tmp_path), tmp_path / "moved"

    def change():
        if how == "deleted":
            shutil.rmtree(run)
        else:
            run.rename(moved)
            if how != "moved":
                run.mkdir()

    if at == "metrics record":
        _before_step(monkeypatch, 5, change)
    else:
        real = Pretrain.evaluate

        def evaluate(self, r, step, last):
            if step == 6:
                change()
            return real(self, r, step, last)

        monkeypatch.setattr(Pretrain, "evaluate", evaluate)
    capsys.readouterr()
    code = main(_resume(run))
    monkeypatch.undo()
    line = _one_line(capsys.readouterr().err)
    said = "a metrics.jsonl record (step 6)" if at == "metrics record" else "checkpoint step 6"
    assert code == 2 and f"cannot write {said}: the run directory was " in line, line
    if how == "deleted":
        assert "deleted" in line and "--resume" in line
        assert not run.exists()  # not made again, half a run in it
        return
    assert f"moved to {moved} while the run trained" in line and f"--out {moved} --resume" in line
    if how == "moved":
        assert not run.exists()
    else:
        assert list(run.iterdir()) == []  # the folder put in its place: nothing written into it
    assert _steps(moved) == ["step_000002", "step_000004"]  # what was saved is where the run went
    assert main(_resume(moved)) == 0  # and continues there, as the line says
    assert ckpt.latest_checkpoint(moved).name == "step_000008"


def test_a_fresh_run_whose_directory_is_deleted_mid_run_says_so_not_no_such_file(world, tmp_path, capsys,
                                                                                 monkeypatch):
    """A run that made its directory tidies it at the end when it wrote nothing else there: that tidying
    listed the deleted folder and its FileNotFoundError replaced the run's own line."""
    run = tmp_path / "run"
    _before_step(monkeypatch, 3, lambda: shutil.rmtree(run))
    capsys.readouterr()
    code = main(_train(world["shards"], run, "--train.max_steps", "6", "--train.ckpt_every", "2"))
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "cannot write a metrics.jsonl record (step 4): the run directory was deleted" in line, line
    assert not run.exists()


# --- 2. the run directory made read-only ---------------------------------------------------------------------

@pytest.mark.parametrize("code_", [errno.EACCES, errno.EROFS], ids=["chmod", "read-only remount"])
def test_a_run_directory_made_read_only_mid_run_is_one_line_and_the_run_resumes(base_run, tmp_path, capsys,
                                                                                monkeypatch, code_):
    """chmod -R a-w (or a remount) after step 5: the open of metrics.jsonl for step 6's record is refused.
    (Root ignores modes, so the refusal is the kernel's errno, raised where the kernel would raise it.)"""
    run = _copy(base_run, tmp_path)
    metrics, real_open, armed = run / "metrics.jsonl", os.open, []

    def refusing_open(path, flags, *a, **k):
        if armed and os.fspath(path) == str(metrics):
            raise OSError(code_, os.strerror(code_), str(path))
        return real_open(path, flags, *a, **k)

    _before_step(monkeypatch, 5, lambda: armed.append(1))
    monkeypatch.setattr(os, "open", refusing_open)
    capsys.readouterr()
    code = main(_resume(run))
    monkeypatch.undo()
    line = _one_line(capsys.readouterr().err)
    reason = "permission denied" if code_ == errno.EACCES else "read-only file system"
    assert code == 2 and f"cannot write a metrics.jsonl record to {metrics}: {reason}" in line, line
    assert "--resume" in line
    assert _steps(run) == ["step_000002", "step_000004"]
    assert all(isinstance(r, dict) for r in read_metrics(run))  # no torn record
    assert main(_resume(run)) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000008"


@pytest.mark.parametrize("code_", [errno.EACCES, errno.EROFS], ids=["chmod", "read-only remount"])
def test_a_resume_into_a_read_only_run_directory_is_refused_before_any_step(base_run, tmp_path, capsys,
                                                                            monkeypatch, code_):
    run = _copy(base_run, tmp_path)
    before = (run / "metrics.jsonl").read_bytes()
    real = tempfile.TemporaryFile

    def refusing(*a, dir=None, **k):
        if dir is not None and Path(dir) in (run, run / "checkpoints"):
            raise OSError(code_, os.strerror(code_), str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "TemporaryFile", refusing)
    capsys.readouterr()
    code = main(_resume(run))
    monkeypatch.undo()
    io = capsys.readouterr()
    line = _one_line(io.err)
    assert code == 2 and f"train.out_dir='{run}' cannot be written" in line, line
    assert ("chmod -R u+w" if code_ == errno.EACCES else "a writable filesystem") in line  # what to fix
    assert not re.search(r"^step +\d+/", io.out, re.M) and (run / "metrics.jsonl").read_bytes() == before  # no step
    assert main(_resume(run)) == 0


def test_a_resume_whose_metrics_file_is_read_only_is_refused_before_any_step(base_run, tmp_path, capsys,
                                                                             monkeypatch):
    """chmod a-w RUN/metrics.jsonl, the folder still writable: the probe of the folder passes, and the file's
    first append (after step 5's compute) was the refusal. (Root's access() says yes to any mode: the
    kernel's answer for another user is given here.)"""
    run = _copy(base_run, tmp_path)
    metrics, real = run / "metrics.jsonl", os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if (Path(p) == metrics and mode & os.W_OK)
                        else real(p, mode, *a, **k))
    capsys.readouterr()
    code = main(_resume(run))
    monkeypatch.undo()
    io = capsys.readouterr()
    line = _one_line(io.err)
    assert code == 2 and f"{metrics} is read-only" in line and "chmod u+w" in line, line
    assert not re.search(r"^step +\d+/", io.out, re.M)


# --- 3. metrics.jsonl deleted or cut ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["deleted", "emptied", "cut inside a record"])
def test_metrics_deleted_or_cut_mid_run_is_said_once_and_every_later_record_is_whole(base_run, tmp_path, capsys,
                                                                                    monkeypatch, how):
    run = _copy(base_run, tmp_path)
    metrics = run / "metrics.jsonl"

    def change():
        if how == "deleted":
            metrics.unlink()
        else:
            os.truncate(metrics, 0 if how == "emptied" else metrics.stat().st_size - 40)

    _before_step(monkeypatch, 5, change)
    capsys.readouterr()
    assert main(_resume(run)) == 0
    monkeypatch.undo()
    io = capsys.readouterr()
    said = [x for x in io.out.splitlines() if x.startswith(f"{metrics}: ")]
    assert len(said) == 1 and "while the run trained" in said[0] and "from step 6" in said[0], io.out
    lines = metrics.read_text().splitlines()
    assert all(isinstance(json.loads(x), dict) for x in lines)  # nothing glued to a cut record
    steps = [r["step"] for r in read_metrics(run) if r["kind"] == "train"]
    assert steps[-3:] == [6, 7, 8] and steps == sorted(steps)
    if how == "cut inside a record":  # the whole records before the cut are kept
        assert steps == [1, 2, 3, 4, 5, 6, 7, 8][: len(steps) - 3] + [6, 7, 8]


def test_metrics_deleted_between_a_run_and_its_resume_is_said_and_plot_reads_the_new_file(base_run, tmp_path,
                                                                                           capsys):
    run = _copy(base_run, tmp_path)
    (run / "metrics.jsonl").unlink()
    capsys.readouterr()
    assert main(_resume(run, 6)) == 0
    out = capsys.readouterr().out
    assert f"{run / 'metrics.jsonl'}: not there; a new one starts at step 4" in out
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [5, 6]
    assert main(["plot", str(run), "--image", str(tmp_path / "curves.png")]) == 0


# --- 4. the data shards changed while the run trains -------------------------------------------------------------

@pytest.mark.parametrize("how", ["shard deleted", "folder removed", "shard rewritten"])
def test_a_shard_gone_or_rewritten_mid_run_is_named_and_the_last_checkpoint_resumes(world, tmp_path, capsys,
                                                                                   monkeypatch, how):
    """2,048 tokens a step: shard 0 (10,000 tokens) serves steps 1-4, shard 1 is opened for step 5; the
    change comes after step 2."""
    shards, run = _copy(Path(world["shards"]), tmp_path, "shards"), tmp_path / "run"
    shard, aside = shards / "toy_train_000001.bin", tmp_path / "aside"
    args = _train(shards, run, "--train.max_steps", "8", "--train.ckpt_every", "2", "--train.total_batch_tokens",
                  "2048")

    def change():
        shutil.copytree(shards, aside)
        if how == "shard deleted":
            shard.unlink()
        elif how == "folder removed":
            shutil.rmtree(shards)
        else:
            write_shard(shard, np.asarray(read_shard(aside / shard.name))[::-1].copy())

    _before_step(monkeypatch, 2, change)
    capsys.readouterr()
    code = main(args)
    monkeypatch.undo()
    io = capsys.readouterr()
    line = _one_line(io.err)
    assert code == 2 and line.startswith(f"gptforge train: error: {shard}: ") and "--resume" in line, line
    assert ("holds other tokens" if how == "shard rewritten" else "deleted or moved while the run trained") in line
    assert not re.search(r"^step +5/", io.out, re.M) and _steps(run) == ["step_000002", "step_000004"]
    shutil.rmtree(shards, ignore_errors=True)
    aside.rename(shards)  # put back as they were: the run continues from step 4
    assert main([*args, "--resume"]) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000008"


# --- 5. what a fine-tuning run's --resume reads changed --------------------------------------------------------

FINE_TUNING = [("sft", None), ("rm", None), ("dpo", None), ("rl", "grpo")]


@pytest.fixture(scope="module")
def fine_tuned(world, tmp_path_factory):
    """A 1-step run of each fine-tuning command from a copy of the chat model: {command: (run, base)}."""
    runs = {}
    for command, algo in FINE_TUNING:
        tmp = tmp_path_factory.mktemp(command)
        base = _copy(Path(world["chat"]).parent.parent, tmp, "base")
        args = RUNS[command, algo]({**world, "chat": str(base)})
        args[next(i for i, a in enumerate(args) if a in ("--steps", "--train.max_steps")) + 1] = "1"
        assert main([*args, "--out", str(tmp / "run")]) == 0
        runs[command] = tmp / "run", base
    return runs


# rl and dpo: their base model is also the frozen reference the run scores against, an input like the data (a
# resume without it is refused naming it); an RL run's template is null under --raw, which it then needs
TEMPLATE_CASES = [(c, change) for c, _ in FINE_TUNING for change in ("template removed", "template null",
                                                                      "base model deleted")
                  if not (c == "rl" and change == "template null") and not (c in ("rl", "dpo") and change.startswith("base"))]


@pytest.mark.parametrize("command,change", TEMPLATE_CASES)
def test_a_fine_tuning_resume_whose_template_is_gone_is_one_line(fine_tuned, tmp_path, capsys, command, change):
    src, base = fine_tuned[command]
    run = _copy(src, tmp_path)
    last = ckpt.latest_checkpoint(run)
    meta = json.loads((last / "meta.json").read_text())
    if change == "base model deleted":  # a resume reads the run's own checkpoint, never --init-from's files
        shutil.rmtree(base)
        capsys.readouterr()
        assert main([command, "--out", str(run), "--resume", "--steps", "2"]) == 0, capsys.readouterr().err
        assert ckpt.latest_checkpoint(run).name == "step_000002"
        return
    if change == "template removed":
        del meta["chat_template"]
    else:
        meta["chat_template"] = None
    (last / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main([command, "--out", str(run), "--resume", "--steps", "2"]) == 2
    line = _one_line(capsys.readouterr().err)
    # refused where the model's weights are checked against meta.json (the template is recorded in their header,
    # round nine), or by the fine-tuning reader of the template itself (checkpoints without that record)
    assert f"{last}/meta.json" in line and "chat_template" in line and "damaged" in line, line


# --- 6. a checkpoint whose files come from two saves ------------------------------------------------------------

@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_a_checkpoint_mixing_two_saves_is_refused_naming_the_file_and_its_save(base_run, tmp_path, capsys, name):
    run = _copy(base_run, tmp_path)
    step2, step4 = run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000004"
    shutil.copy2(step2 / name, step4 / name)  # step 4's folder, one file of step 2's save
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", str(step4), "--train.max_steps", "6"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{step4 / name} does not match" in line and f"it is step_000002's {name}: a file from another save" in line
    assert main(_resume(run, 6)) == 0  # --resume (latest) skips it, naming it, and continues from step 2
    io = capsys.readouterr()
    out = io.err + io.out
    assert f"skipping damaged checkpoint step_000004: {step4 / name}" in out and f"resumed from {step2}" in out


def test_a_file_swapped_in_with_its_times_kept_is_not_passed_by_the_verified_cache(base_run, tmp_path):
    """verify_checkpoint hashes each file once per process; a file from another save copied over with the same
    size and modification time (cp -p, rsync -t) is a new file all the same: hashed again, refused."""
    run = _copy(base_run, tmp_path)
    step2, step4 = run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000004"
    ckpt.verify_checkpoint(step4)
    f = step4 / "model.safetensors"
    st = f.stat()
    f.write_bytes((step2 / "model.safetensors").read_bytes())  # same size: the same tensors' shapes
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(ckpt.CheckpointError, match="a file from another save"):
        ckpt.verify_checkpoint(step4)
