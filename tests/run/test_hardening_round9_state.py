"""A run's state on disk across its life (hardening round nine), tested through the shared pieces every command
that reads or continues a run goes through (``cli.common.resolve_run`` and ``run/resume.py``, the checkpoint
writer and ``run/weights.py``'s check before any model is built, the Checkpointer):

* an RL or DPO run whose ``--init-from`` model (also its frozen reference) was moved or deleted: its --resume
  names the key, the meta.json that recorded it and what to do, before any work; ``--init-from NEWPATH`` on the
  resume is taken when it holds the weights the run recorded (sha256 in meta.json's ``models``, so the check
  needs no copy at the old place), and another model is refused (``--dpo.init_from OTHER`` was taken silently:
  a DPO run's reference swapped mid-run);
* meta.json edited or damaged: every reader (sample, export, eval, serve, chat, --resume, --init-from) compares
  the model it describes with the copy the save wrote into model.safetensors' header, naming the field; an edit
  that kept every shape (n_head) built another model over the same weights without a word;
* ``RUN/checkpoints/`` deleted while the run trains: said once, at the save that makes it again;
* a step folder of another run copied into this run's checkpoints/: ``--resume`` skips it naming it (latest)
  or refuses it (named), by the run id every checkpoint records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from gptforge.run import identity
from tests.run.faults import before_step
from tests.run.faults import copy_run as _copy
from tests.run.faults import one_line as _one_line
from tests.training.commands import RUNS

# --- 1. the reference model of an RL / DPO run moved ---------------------------------------------------------

@pytest.fixture(scope="module")
def referenced(world, tmp_path_factory):
    """A 1-step rl (grpo, KL on) and dpo run, each from its own copy of the chat model: {command: (run, base)};
    and another model of the same shape (other weights)."""
    from tests.conftest import tiny_chat_checkpoint

    runs = {}
    for command, algo in (("rl", "grpo"), ("dpo", None)):
        tmp = tmp_path_factory.mktemp(command)
        base = _copy(Path(world["chat"]).parent.parent, tmp, "base")
        args = RUNS[command, algo]({**world, "chat": str(base)})
        args[args.index("--steps") + 1] = "1"
        assert main([*args, "--out", str(tmp / "run")]) == 0
        runs[command] = tmp / "run", base
    runs["other"] = tiny_chat_checkpoint(tmp_path_factory.mktemp("other") / "other", seed=1).parent.parent
    return runs


@pytest.mark.parametrize("command", ["rl", "dpo"])
def test_a_moved_reference_model_is_named_on_resume_and_its_new_place_is_taken_by_its_weights(
        referenced, tmp_path, capsys, command):
    src, base = referenced[command]
    run, moved = _copy(src, tmp_path), tmp_path / "moved"
    key = f"{command}.init_from"
    recorded = ckpt.latest_checkpoint(run) / "meta.json"
    assert json.loads(recorded.read_text())["config"][command]["init_from"] == str(base)
    resume = [command, "--out", str(run), "--resume", "--steps", "2"]
    base.rename(moved)  # the fixture's model: put back below
    try:
        capsys.readouterr()
        assert main(resume) == 2
        io = capsys.readouterr()
        line = _one_line(io.err)
        assert f"{key} = {str(base)!r} does not exist any more" in line, line  # the key and the path it held
        assert f"recorded in {recorded} (config.{key})" in line and "--init-from NEWPATH" in line  # where, what to do
        assert "resumed from" not in io.out + io.err  # before any work
        # another model given as its new place: refused (the reference a resume may not change), by the weights
        # the run recorded, with nothing left at the old place to compare with
        assert main([*resume, "--init-from", str(referenced["other"])]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"--{key} {str(referenced['other'])!r}: other weights than {str(base)!r}" in line, line
        assert f"sha256 is in {recorded}" in line
        assert ckpt.latest_checkpoint(run).name == "step_000001"
    finally:
        moved.rename(base)


@pytest.mark.parametrize("command", ["rl", "dpo"])
def test_the_reference_models_new_place_resumes_and_is_recorded(referenced, tmp_path, capsys, monkeypatch, command):
    src, base = referenced[command]
    run = _copy(src, tmp_path)
    moved = _copy(base, tmp_path, "moved")  # the model at another place (its old one stays: the shared fixture's)
    meta = ckpt.latest_checkpoint(run) / "meta.json"
    shas = json.loads(meta.read_text())["models"][f"{command}.init_from"]
    data = json.loads(meta.read_text())
    data["config"][command]["init_from"] = str(tmp_path / "gone")  # where the run's record says it was: gone
    meta.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([command, "--out", str(run), "--resume", "--steps", "2", "--init-from", "moved"]) == 0, \
        capsys.readouterr().err
    new = json.loads((ckpt.latest_checkpoint(run) / "meta.json").read_text())
    assert ckpt.latest_checkpoint(run).name == "step_000002"
    assert new["config"][command]["init_from"] == str(moved)  # absolute, as a fresh run records it
    assert new["models"][f"{command}.init_from"] == shas  # the identity is carried, never re-derived from a path


def test_a_dpo_resume_refuses_another_reference_model_given_by_its_key(referenced, tmp_path, capsys):
    """dpo.init_from was not frozen: --dpo.init_from OTHER on a resume swapped the run's reference silently."""
    run = _copy(referenced["dpo"][0], tmp_path)
    capsys.readouterr()
    assert main(["dpo", "--out", str(run), "--resume", "--steps", "2", "--dpo.init_from",
                 str(referenced["other"])]) == 2
    assert "other weights than" in _one_line(capsys.readouterr().err)
    assert ckpt.latest_checkpoint(run).name == "step_000001"


@pytest.mark.parametrize("command", ["rl", "dpo"])
def test_a_reference_model_changed_in_place_is_refused_on_resume(referenced, tmp_path, capsys, command):
    """The same path holding other weights (a model re-exported or replaced there): the resume went on silently
    with another reference; refused before any work, naming the key, the path and the meta.json's record."""
    src, base = referenced[command]
    run, mine = _copy(src, tmp_path), _copy(base, tmp_path, "mine")  # the run's model, at a place this test owns
    meta = ckpt.latest_checkpoint(run) / "meta.json"
    data = json.loads(meta.read_text())
    data["config"][command]["init_from"] = str(mine)
    meta.write_text(json.dumps(data))
    shutil.rmtree(mine)
    _copy(referenced["other"], tmp_path, "mine")  # other weights, same path
    capsys.readouterr()
    assert main([command, "--out", str(run), "--resume", "--steps", "2"]) == 2
    io = capsys.readouterr()
    line = _one_line(io.err)
    assert f"{command}.init_from = {str(mine)!r} holds other weights than this run was trained with" in line, line
    assert f"{meta} records" in line and "resumed from" not in io.out + io.err
    assert ckpt.latest_checkpoint(run).name == "step_000001"


# --- 2. meta.json edited or damaged ---------------------------------------------------------------------------

def _n_head(m):  # a flipped bit that keeps every shape: 2 -> 4 heads over the same 32 widths (silent before)
    m["config"]["model"]["n_head"] = 4


def _roles_swapped(m):  # two valid ids exchanged: every prompt built with the roles the other way round
    r = m["chat_template"]["roles"]
    r["user"], r["assistant"] = r["assistant"], r["user"]


def _bias_removed(m):
    del m["config"]["model"]["bias"]


EDITS = {"n_head": (_n_head, "config.model.n_head = 4, but "),
         "chat template roles swapped": (_roles_swapped, "chat_template.roles.assistant = 50258, but "),
         "key removed": (_bias_removed, "config.model.bias missing, but ")}
DAMAGE = {"truncated": lambda t: t[: len(t) // 2], "emptied": lambda t: "", "a JSON array": lambda t: "[1, 2]",
          "model a string": lambda t: json.dumps({**json.loads(t), "config": {**json.loads(t)["config"],
                                                                                 "model": "gpt2"}})}
READERS = {"sample": lambda m, tmp: ["sample", "--ckpt", str(m), "--prompt", "hi", "--max-new-tokens", "2",
                                     "--device", "cpu"],
           "export": lambda m, tmp: ["export", "hf", "--ckpt", str(m), "--out", str(tmp / "hf")],
           "dpo --init-from": lambda m, tmp: ["dpo", "--init-from", str(m), "--data", str(tmp / "none.jsonl"),
                                              "--out", str(tmp / "dpo"), "--device", "cpu"]}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("change", [*EDITS, *DAMAGE])
def test_meta_json_edited_or_damaged_is_refused_by_every_reader_naming_the_file_and_field(world, tmp_path, capsys,
                                                                                         reader, change):
    model = _copy(Path(world["chat"]).parent.parent, tmp_path, "model")
    meta = ckpt.latest_checkpoint(model) / "meta.json"
    text = meta.read_text()
    if change in EDITS:
        data = json.loads(text)
        EDITS[change][0](data)
        meta.write_text(json.dumps(data))
    else:
        meta.write_text(DAMAGE[change](text))
    capsys.readouterr()
    assert main(READERS[reader](model, tmp_path)) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(meta) in line, line
    if change in EDITS:
        assert EDITS[change][1] in line and "was saved with" in line and "meta.json was edited" in line, line
    assert not (tmp_path / "hf").exists() and not (tmp_path / "dpo").exists()


def test_meta_json_n_head_edit_is_refused_on_resume_and_a_run_knob_edit_is_not(base_run, tmp_path, capsys):
    run = _copy(base_run, tmp_path)
    meta = ckpt.latest_checkpoint(run) / "meta.json"
    text = meta.read_text()
    data = json.loads(text)
    _n_head(data)
    meta.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "6"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"gptforge train: error: {meta}: config.model.n_head = 4, but ") and "put back 2" in line
    data = json.loads(text)
    data["config"]["model"]["dropout"] = 0.1  # how it trains, not what it computes: not refused
    meta.write_text(json.dumps(data))
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "6"]) == 0


# --- 3. RUN/checkpoints deleted while the run trains ----------------------------------------------------------

def test_the_checkpoints_folder_deleted_mid_run_is_said_once_and_the_run_resumes_from_its_new_saves(
        base_run, tmp_path, capsys, monkeypatch):
    run = _copy(base_run, tmp_path)
    root = run / "checkpoints"
    before_step(monkeypatch, 5, lambda: shutil.rmtree(root))  # after step 5, before step 6's save
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "10"]) == 0
    monkeypatch.undo()
    out = capsys.readouterr().out
    said = [x for x in out.splitlines() if x.startswith(f"{root}: ")]
    assert len(said) == 1, out  # once: not again at steps 8 and 10
    assert "deleted while the run trained" in said[0] and "up to step 4" in said[0] and "step 6" in said[0]
    steps = [int(p.name[len("step_"):]) for p in ckpt.list_checkpoints(run)]
    assert steps[-1] == 10 and min(steps) >= 6  # made anew from step 6 (train.keep_ckpts prunes the oldest)
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "12"]) == 0
    assert f"resumed from {root / 'step_000010'}" in capsys.readouterr().out


# --- 4. a step folder of another run copied in ----------------------------------------------------------------

def test_a_checkpoint_of_another_run_copied_in_is_skipped_or_refused_by_its_run_id(world, base_run, tmp_path,
                                                                                   capsys):
    run = _copy(base_run, tmp_path)
    other = tmp_path / "other"
    assert main(["train", "--preset", "tiny", "--data.dir", world["shards"], "--out", str(other),
                 "--model.vocab_size", "512", "--train.device", "cpu", "--train.val_every", "0",
                 "--train.sample_every", "0", "--train.max_steps", "6", "--train.ckpt_every", "3",
                 "--train.seed", "7"]) == 0
    foreign = run / "checkpoints" / "step_000006"
    shutil.copytree(other / "checkpoints" / "step_000006", foreign)  # verifies whole: its own files, its own step
    ckpt.verify_checkpoint(foreign)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", str(foreign), "--train.max_steps", "8"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{foreign}: a checkpoint of another run" in line and "step_000002, step_000004" in line, line
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "8"]) == 0
    io = capsys.readouterr()
    assert "skipping checkpoint step_000006: " in io.out + io.err
    assert f"resumed from {run / 'checkpoints' / 'step_000004'}" in io.out


def test_the_advice_for_another_runs_checkpoint_fits_the_command_that_meets_it(tmp_path, capsys):
    """The line said "Move it out of ..., then resume" from sample, export and eval too, which skip it and read
    the run's own newest: there it says only where to move it from; a --resume that names it is refused, with
    how to resume after."""
    import torch

    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run.checkpointer import Checkpointer

    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    run, other = tmp_path / "run", tmp_path / "other"
    for where, steps, rid in ((run, (2, 4), "aaaa"), (other, (6,), "bbbb")):
        for step in steps:
            torch.manual_seed(step)
            ckpt.save_checkpoint(where, step, GPT(mcfg), None, {"config": Config(model=mcfg).to_dict(), "run_id": rid})
    foreign = run / "checkpoints" / "step_000006"
    shutil.copytree(other / "checkpoints" / "step_000006", foreign)
    said = f"{run}: skipping checkpoint step_000006: {foreign}: a checkpoint of another run"
    move = f"copied in from elsewhere? Move it out of {run / 'checkpoints'}"
    capsys.readouterr()
    assert identity.resolve_checkpoint(run) == run / "checkpoints" / "step_000004"  # what sample, export, eval read
    err = capsys.readouterr().err.strip()
    assert err.startswith(said) and err.endswith(move), err
    with pytest.raises(ckpt.CheckpointError) as e:
        Checkpointer.find(run, str(foreign))
    assert str(e.value).endswith(f"{move}, then resume (or --resume without a path: the run's own newest)")


def test_one_own_save_beside_one_copied_in_is_told_apart_by_the_runs_metrics_log(tmp_path):
    """A run with one checkpoint of its own (step 2) and one copied in from another run (step 6): each had only
    the other as a sibling, so each was judged another run's and sample/export said the run held no checkpoint
    of its own. The run that last trained in the folder (metrics.jsonl's last start record) breaks the tie;
    without a log naming a run there is nothing to break it with, and both stay refused as before."""
    import json

    import torch

    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig

    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    run, other = tmp_path / "run", tmp_path / "other"
    for where, step, rid in ((run, 2, "aaaa"), (other, 6, "bbbb")):
        torch.manual_seed(step)
        ckpt.save_checkpoint(where, step, GPT(mcfg), None, {"config": Config(model=mcfg).to_dict(), "run_id": rid})
    own, foreign = run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000006"
    shutil.copytree(other / "checkpoints" / "step_000006", foreign)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint of its own run|another run"):
        identity.resolve_checkpoint(run)  # no log: the tie stands, as before
    log = [{"kind": "start", "step": 0, "run": "bbbb"}, {"kind": "train", "step": 1, "loss": 3.0},
           {"kind": "start", "step": 0, "run": "aaaa"}, {"kind": "train", "step": 1, "loss": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    assert identity.resolve_checkpoint(run) == own  # the last start is run aaaa's: step 2 is the run's own
    assert identity.not_this_runs(own) is None and "another run" in identity.not_this_runs(foreign)
    log.append({"kind": "start", "step": 0, "run": "bbbb"})  # the log's last start names the other run now
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    assert identity.not_this_runs(foreign) is None and "another run" in identity.not_this_runs(own)


# --- 5. the clock set back while the run trains; a resume on another torch or thread count ------------------

def test_the_wall_clock_set_back_mid_run_never_makes_record_times_go_backwards(base_run, tmp_path, monkeypatch):
    """After step 5 the system clock is set back an hour (by hand, or NTP stepping it): the records' times
    went back with it, and what subtracts them (race's wall_seconds, a curve by time) came out negative."""
    import time

    from gptforge.run.metrics import read_metrics

    run, real, back = _copy(base_run, tmp_path), time.time, []
    monkeypatch.setattr(time, "time", lambda: real() - 3600.0 * len(back))
    before_step(monkeypatch, 5, lambda: back.append(1))
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "8"]) == 0
    monkeypatch.undo()
    assert back  # the clock was set back mid-run
    times = [r["time"] for r in read_metrics(run) if r["kind"] == "train" and r["step"] > 4]  # this invocation's
    assert len(times) == 4 and times == sorted(times), times


def test_a_resume_on_another_thread_count_says_its_numbers_are_not_bit_for_bit(base_run, tmp_path, capsys):
    run = _copy(base_run, tmp_path)
    meta = json.loads((ckpt.latest_checkpoint(run) / "meta.json").read_text())
    saved = meta["threads"]  # what the save recorded (train.threads auto: 1, or OMP_NUM_THREADS)
    assert isinstance(saved, int) and isinstance(meta["torch"], str)
    more = str(saved + 1)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "6", "--train.threads", more]) == 0
    out = capsys.readouterr().out
    assert (f"(saved with {saved} CPU thread{'s' * (saved != 1)}, resumed with {more}: the run continues, but its "
            "numbers will not be bit for bit") in out, out
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "8", "--train.threads", more]) == 0
    assert "saved with" not in capsys.readouterr().out  # the same count as the checkpoint's: nothing to say


# --- 6. a filesystem without file locks or fsync ------------------------------------------------------------

def _resume_where(module, name: str, code: int, base_run, tmp_path, capsys, monkeypatch) -> tuple[Path, str]:
    """A copy of ``base_run`` resumed to step 6 on a filesystem whose ``module.name`` call answers errno ``code``
    (every call): it must finish and save step 6. The run, and what it printed."""
    import os

    def refused(*a, **k):
        raise OSError(code, os.strerror(code))

    run = _copy(base_run, tmp_path)
    monkeypatch.setattr(module, name, refused)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "6"]) == 0, capsys.readouterr().err
    monkeypatch.undo()
    assert ckpt.latest_checkpoint(run).name == "step_000006"
    return run, capsys.readouterr().out


def test_a_run_on_a_filesystem_without_flock_goes_on_and_says_it_holds_no_lock(base_run, tmp_path, capsys,
                                                                                monkeypatch):
    """Some NFS and FUSE mounts answer flock with ENOLCK (or EOPNOTSUPP): that was read as the lock being held,
    'in use by another run (pid N: ...)' naming whatever process last wrote the file, and the run refused."""
    import errno
    import fcntl

    run, out = _resume_where(fcntl, "flock", errno.ENOLCK, base_run, tmp_path, capsys, monkeypatch)
    said = [x for x in out.splitlines() if x.startswith(str(run / ".gptforge.lock"))]
    assert len(said) == 1 and "cannot lock files (no locks available)" in said[0] and "start only one" in said[0]


def test_a_run_on_a_filesystem_without_fsync_saves_its_checkpoints(base_run, tmp_path, capsys, monkeypatch):
    """fsync answered EINVAL (a filesystem that cannot sync) was a traceback at the first checkpoint."""
    import errno
    import os

    run, _ = _resume_where(os, "fsync", errno.EINVAL, base_run, tmp_path, capsys, monkeypatch)
    ckpt.verify_checkpoint(ckpt.latest_checkpoint(run))


def test_a_step_folder_holding_another_steps_save_is_skipped_by_resume_latest(base_run, tmp_path, capsys):
    """step_000006 holding step 2's save (renamed or copied under another name): --resume named it and
    stopped (resume from another one), where a damaged newest checkpoint is skipped, naming it."""
    run = _copy(base_run, tmp_path)
    shutil.copytree(run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000006")
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "8"]) == 0
    io = capsys.readouterr()
    assert "skipping damaged checkpoint step_000006: " in io.out + io.err and "step = 2, but" in io.out + io.err
    assert f"resumed from {run / 'checkpoints' / 'step_000004'}" in io.out
    assert ckpt.read_meta(run / "checkpoints" / "step_000006")["step"] == 6  # saved again, whole, by the run


# --- 7. the run directory gone: deleted, or moved where this process cannot see ---------------------------------

@pytest.mark.parametrize("how", ["deleted (or moved to another disk)", "moved, the platform cannot say where"])
def test_a_run_directory_gone_mid_run_says_what_can_be_known_and_how_to_continue(base_run, tmp_path, capsys,
                                                                                 monkeypatch, how):
    """A move to another disk copies, then deletes: from the run's side it is a deletion (the locked file has
    no name left on this disk), so the line gives both ways on; a move on the same disk keeps the file's name
    (where /proc cannot say where, the line said 'deleted')."""
    from gptforge.run import lock

    run, moved = _copy(base_run, tmp_path), tmp_path / "moved"
    if how.startswith("moved"):
        monkeypatch.setattr(lock, "_where_now", lambda fd: None)  # no /proc/self/fd to ask
    before_step(monkeypatch, 5, (lambda: shutil.rmtree(run)) if how.startswith("deleted") else
                (lambda: run.rename(moved)))
    capsys.readouterr()
    code = main(["train", "--out", str(run), "--resume", "--train.max_steps", "8"])
    monkeypatch.undo()
    line = _one_line(capsys.readouterr().err)
    assert code == 2, line
    if how.startswith("deleted"):
        assert "was deleted, or moved to another disk" in line and "If you moved it, continue with --out NEWPLACE --resume" in line
    else:
        assert "was moved while the run trained" in line and "deleted" not in line and "--out NEWPLACE --resume" in line


# --- 8. two runs' metrics.jsonl in one file --------------------------------------------------------------------

def test_another_runs_metrics_appended_to_this_runs_file_are_said_on_resume(world, base_run, tmp_path, capsys):
    """cat other/metrics.jsonl >> run/metrics.jsonl: plot drew both runs' curves as one, zigzagging, without a
    word. Each start record names its run (the id its checkpoints record); a resume names the lines."""
    run, other = _copy(base_run, tmp_path), tmp_path / "other"
    assert main(["train", "--preset", "tiny", "--data.dir", world["shards"], "--out", str(other),
                 "--model.vocab_size", "512", "--train.device", "cpu", "--train.val_every", "0",
                 "--train.sample_every", "0", "--train.max_steps", "3", "--train.ckpt_every", "0"]) == 0
    own = (run / "metrics.jsonl").read_text()
    with open(run / "metrics.jsonl", "a") as f:
        f.write((other / "metrics.jsonl").read_text())
    theirs = [n for n, x in enumerate((other / "metrics.jsonl").read_text().splitlines(), len(own.splitlines()) + 1)
              if json.loads(x)["kind"] in ("train", "val", "eval", "sample", "rl")]  # its step records' line numbers
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.max_steps", "6"]) == 0
    said = [x for x in capsys.readouterr().out.splitlines() if x.startswith(f"{run / 'metrics.jsonl'}: lines")]
    assert len(said) == 1 and f"lines {theirs[0]}-{theirs[-1]} hold {len(theirs)} records of another run" in said[0]
    # its own file, resumed: nothing to say
    run2 = _copy(base_run, tmp_path, "run2")
    assert main(["train", "--out", str(run2), "--resume", "--train.max_steps", "6"]) == 0
    assert "records of another run" not in capsys.readouterr().out
