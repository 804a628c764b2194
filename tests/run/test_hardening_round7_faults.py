"""Faults during and between runs (hardening round seven): what goes wrong while a run writes, after it
stopped and before its ``--resume``, and while another process reads it. Each class is tested through the
shared writer or reader that every recipe goes through:

* a write the process or the disk refuses for another reason than space or permission: a file past the
  process's size limit (``ulimit -f``: the kernel cuts the write, then says EFBIG, and torch.save reports only
  "unexpected pos"), an I/O error (EIO) - one line naming the path and what it means, the previous checkpoint
  intact and resumed, nothing half-written left (checkpoints, metrics.jsonl, the export writers, prepare);
* a run directory whose ``checkpoints`` is a file or a link to a missing disk: refused before any compute
  (it was found only at the first save, after the training it was to keep); one that turns into a file, or
  a disk that refuses the step's folder, mid-run: one line saying --resume, which then continues;
* token shards rewritten under the same names between a run and its ``--resume`` (truncated, extended,
  other tokens of the same count): refused naming the file (a truncated shard was a traceback from inside
  the loader, a longer one silently moved every later batch), and the same shards moved elsewhere resume;
  a shard added or removed is named (the refusal listed the first three names of both sets);
* a resume with another batch shape (micro_batch, seq_len, tokens per step): the loader reads on from the
  saved position exactly (checked against the token stream written out independently); it never left the
  shard when the position was no whole number of new steps, and the run died with a traceback;
* a reader (``export``, ``sample``) of a run still training, whose newest checkpoint is pruned while it is
  read: it reads the run's new newest one (it failed with a false "missing: the checkpoint is damaged");
* a loss gone non-finite at step k, on every training command: exit 3, nothing saved past the last good
  checkpoint, which verifies and resumes to the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main
from gptforge.data.shards import read_shard, write_shard
from gptforge.run import checkpoint as ckpt
from tests.run.faults import copy_run as _copy
from tests.run.faults import one_line as _one_line
from tests.run.faults import train_argv as _train
from tests.training.commands import RUNS, case_id, training_commands

RESUMABLE = training_commands()


@contextlib.contextmanager
def file_size_limit(limit: int):
    """``ulimit -f`` for this process: writes past ``limit`` bytes are cut there, then refused with EFBIG
    (Python ignores SIGXFSZ, which would otherwise kill it)."""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _fail_fsync(monkeypatch, inside: str, code: int = errno.EIO) -> None:
    """The disk fails (EIO, or ENOSPC: a filesystem that reserves space late) when the writer makes a file
    under a path containing ``inside`` durable."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if inside in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


# --- 1. writes the disk or the process refuses -------------------------------------------------------------

@pytest.mark.parametrize("fault", ["file size limit", "I/O error"])
def test_a_refused_checkpoint_write_is_one_line_keeps_the_last_checkpoint_and_resumes(base_run, tmp_path, capsys,
                                                                                     monkeypatch, fault):
    run = _copy(base_run, tmp_path)
    weights = (run / "checkpoints" / "step_000004" / "model.safetensors").stat().st_size
    resume = ["train", *resume_args(run)]
    capsys.readouterr()
    if fault == "file size limit":
        with file_size_limit(weights // 2):  # metrics.jsonl and config.json fit; a checkpoint's weights do not
            code = main(resume)
        said = f"past this process's file size limit ({weights // 2:,} bytes, set by `ulimit -f`)"
    else:
        _fail_fsync(monkeypatch, "step_000006.tmp")
        code = main(resume)
        monkeypatch.undo()
        said = "input/output error"
    line = _one_line(capsys.readouterr().err)
    assert code == 2, line
    assert f"cannot write checkpoint step 6 to {run / 'checkpoints'}: " in line and said in line
    assert "--resume" in line  # what to do next
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000004"]  # no .tmp left
    ckpt.verify_checkpoint(run / "checkpoints" / "step_000004")
    assert main(resume) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000006"


def resume_args(run: Path) -> list[str]:
    return ["--out", str(run), "--resume", "--train.max_steps", "6"]


@pytest.mark.parametrize("fault", ["replaced by a file", "full disk at its mkdir"])
def test_a_checkpoints_folder_gone_wrong_mid_run_is_one_line_and_the_run_resumes(base_run, tmp_path, capsys,
                                                                                monkeypatch, fault):
    """After step 5, before the save of step 6: checkpoints/ is moved away and a file put in its place (a
    script, another tool), or the disk refuses the step's folder: one line naming it and saying --resume
    (it was the CLI's generic 'file exists', or 'run the same command again', which --resume alone continues)."""
    from gptforge.training import loop

    run = _copy(base_run, tmp_path)
    root, aside = run / "checkpoints", tmp_path / "aside"
    real_set_lr, real_mkdir = loop.set_lr, Path.mkdir

    def set_lr(optimizer, step, *a, **k):
        if step == 5 and fault == "replaced by a file":
            root.rename(aside)
            root.write_text("not a folder\n")
        return real_set_lr(optimizer, step, *a, **k)

    def mkdir(self, *a, **k):
        if self.name == "step_000006.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(loop, "set_lr", set_lr)
    if fault != "replaced by a file":
        monkeypatch.setattr(Path, "mkdir", mkdir)
    capsys.readouterr()
    code = main(["train", *resume_args(run)])
    monkeypatch.undo()
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "checkpoint step 6" in line and str(root) in line and "--resume" in line, line
    assert ("it is a file, not a folder" if fault == "replaced by a file" else "no space left on device") in line
    if fault == "replaced by a file":
        root.unlink()
        aside.rename(root)
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000004"]
    assert main(["train", *resume_args(run)]) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000006"


def test_a_metrics_record_past_the_file_size_limit_is_one_line_and_leaves_no_torn_record(base_run, tmp_path, capsys):
    run = _copy(base_run, tmp_path)
    size = (run / "metrics.jsonl").stat().st_size
    capsys.readouterr()
    limit = max(size, *((run / f).stat().st_size for f in ("config.json", "env.json"))) + 64  # the run files fit
    with file_size_limit(limit):  # then a metrics record, some steps on, is cut at the limit
        code = main(["train", *resume_args(run)[:-2], "--train.max_steps", "60", "--train.ckpt_every", "0"])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and f"cannot write a metrics.jsonl record to {run / 'metrics.jsonl'}: file too large" in line
    text = (run / "metrics.jsonl").read_text()
    assert text.endswith("\n") and all(isinstance(json.loads(x), dict) for x in text.splitlines())  # every line whole
    assert ckpt.latest_checkpoint(run).name == "step_000004"
    assert main(["train", *resume_args(run)]) == 0


@pytest.mark.parametrize("fmt", ["hf", "gguf", "llmc"])
@pytest.mark.parametrize("fault", ["file size limit", "I/O error", "full disk"])
def test_an_export_refused_mid_write_is_one_line_naming_the_output_and_leaves_nothing(world, tmp_path, capsys,
                                                                                     monkeypatch, fmt, fault):
    out = tmp_path / "exports" / fmt
    args = ["export", fmt, "--ckpt", world["chat"], "--out", str(out)]
    capsys.readouterr()
    if fault == "file size limit":
        with file_size_limit(1 << 20):  # the weights are 6 MB
            code = main(args)
        said = "file too large, past this process's file size limit"
    else:
        fails = errno.EIO if fault == "I/O error" else errno.ENOSPC
        _fail_fsync(monkeypatch, str(tmp_path / "exports"), fails)
        code = main(args)
        monkeypatch.undo()
        said = "input/output error" if fault == "I/O error" else "no space left on device"
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and said in line, line
    assert str(out) in line and ".tmp-" not in line  # the output, not the temporary it was built in
    assert list((tmp_path / "exports").iterdir()) == []  # no part of an export, no temporary
    assert main(args) == 0  # the same command, the limit gone, writes it


def test_prepare_past_the_file_size_limit_names_its_file_not_a_full_disk(tmp_path, capsys):
    src = tmp_path / "text"
    src.mkdir()
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "theta", "kappa"])
    (src / "a.txt").write_text("\n\n".join(" ".join(rng.choice(words, 200)) for _ in range(600)))
    out = tmp_path / "shards"
    args = ["prepare", "files", str(src), "--out", str(out), "--shard-tokens", "200000", "--val-tokens", "5000",
            "--workers", "1", "--no-progress"]
    capsys.readouterr()
    with file_size_limit(64 << 10):
        code = main(args)
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "file too large" in line and str(out) in line and "no space" not in line, line
    assert main(args) == 0


# --- 2. the run directory changed between runs --------------------------------------------------------------

@pytest.mark.parametrize("entry", ["a file", "a broken link"])
def test_a_checkpoints_entry_that_is_no_folder_is_refused_before_any_training(world, tmp_path, capsys, entry):
    run = tmp_path / "run"
    run.mkdir()
    if entry == "a file":
        (run / "checkpoints").write_text("not a folder\n")
        said = f"{run / 'checkpoints'} is a file"
    else:
        (run / "checkpoints").symlink_to(tmp_path / "unmounted" / "ckpts")
        said = "which does not exist (a disk not mounted?)"
    capsys.readouterr()
    assert main(_train(world["shards"], run, "--train.max_steps", "3")) == 2
    io = capsys.readouterr()
    assert said in _one_line(io.err) and "step " not in io.out  # refused before the first step, not at its save
    assert not (run / "metrics.jsonl").exists()
    assert main(_train(world["shards"], run, "--resume")) == 2  # nothing to resume: says why
    assert f"no complete checkpoint in {run / 'checkpoints'} (it is a " in _one_line(capsys.readouterr().err)


def _rewrite(shard: Path, how: str) -> None:
    tokens = np.asarray(read_shard(shard))
    changed = {"truncated": tokens[:1100], "shortened": tokens[:3000], "extended": np.concatenate([tokens, tokens]),
               "same count, other tokens": tokens[::-1].copy()}[how]
    write_shard(shard, changed)


@pytest.mark.parametrize("how", ["truncated", "shortened", "extended", "same count, other tokens"])
def test_a_shard_rewritten_between_a_run_and_its_resume_is_refused_naming_it(world, base_run, tmp_path, capsys, how):
    run, shards = _copy(base_run, tmp_path), _copy(Path(world["shards"]), tmp_path, "shards")
    shard = shards / "toy_train_000000.bin"  # the one the saved position points into
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["loader"]["shard"] == 0
    _rewrite(shard, how)
    capsys.readouterr()
    assert main(["train", *resume_args(run), "--data.dir", str(shards)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"gptforge train: error: {shard}: holds ") and "when the checkpoint was saved" in line
    assert ckpt.latest_checkpoint(run).name == "step_000004"


@pytest.mark.parametrize("how", ["added", "missing"])
def test_a_shard_added_or_removed_between_a_run_and_its_resume_is_named(world, base_run, tmp_path, capsys, how):
    run, shards = _copy(base_run, tmp_path), _copy(Path(world["shards"]), tmp_path, "shards")
    if how == "added":
        shutil.copy(shards / "toy_train_000001.bin", shards / "toy_train_000002.bin")
        name = "toy_train_000002.bin"
    else:
        (shards / "toy_train_000001.bin").unlink()
        name = "toy_train_000001.bin"
    capsys.readouterr()
    assert main(["train", *resume_args(run), "--data.dir", str(shards)]) == 2
    line = _one_line(capsys.readouterr().err)  # it listed the first three names of both sets, which could agree
    assert line.startswith(f"gptforge train: error: {shards}: {name} {how} since the checkpoint was saved"), line


def test_the_same_shards_moved_elsewhere_resume_exactly(world, base_run, tmp_path):
    run, shards = _copy(base_run, tmp_path), _copy(Path(world["shards"]), tmp_path, "moved")
    assert main(["train", *resume_args(run), "--data.dir", str(shards)]) == 0
    straight = _copy(base_run, tmp_path, "straight")  # the same resume on the shards where they were
    assert main(["train", *resume_args(straight)]) == 0
    a, b = (load_file(str(r / "checkpoints" / "step_000006" / "model.safetensors")) for r in (run, straight))
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- 3. a resume with another batch shape ------------------------------------------------------------------

def _reference_steps(shards: list[np.ndarray], shard: int, pos: int, T: int, step: int, n: int,
                     eot: int | None) -> list[np.ndarray]:
    """The rows (step // T of T + 1 tokens) each of ``n`` steps reads, written out independently of the
    loaders: whole steps of ``step`` tokens from ``pos`` of shard ``shard``, moving to the next shard
    (wrapping) when a step no longer fits. ``eot`` None: contiguous rows (data.align off); else rows that
    start at its BOS tokens (data.align bos: ``pos`` counts rows * T)."""
    from gptforge.data.aligned import row_starts

    rows = row_starts(shards[shard], T, eot) if eot is not None else None
    out = []
    for _ in range(n):
        fits = pos + step + 1 <= len(shards[shard]) if eot is None else pos + step <= len(rows) * T
        if not fits:
            shard, pos = (shard + 1) % len(shards), 0
            rows = row_starts(shards[shard], T, eot) if eot is not None else None
        first = [pos + i * T for i in range(step // T)] if eot is None else rows[pos // T : pos // T + step // T]
        out.append(np.stack([shards[shard][r : r + T + 1] for r in first]))
        pos += step
    return out


CASES = [((4, 32, 256), (2, 48, 768)), ((4, 32, 256), (2, 48, 192)), ((4, 32, 256), (8, 32, 2048)),
         ((4, 32, 256), (10, 24, 240)), ((4, 32, 256), (2, 32, 256)), ((4, 32, 256), (2, 32, 192))]


# data.align bos: its position counts rows of seq_len, so only a resume that keeps seq_len is compared
SHAPES = [pytest.param(old, new, align, id="B{}xT{}={}-to-B{}xT{}={}-{}".format(*old, *new, align))
          for old, new in CASES for align in ("off", "bos") if align == "off" or old[1] == new[1]]


@pytest.mark.parametrize("old,new,align", SHAPES)
@pytest.mark.parametrize("steps_before", [7, 36])  # 36: 9,216 of shard 0's 10,000 tokens, a larger step won't fit
def test_a_resume_with_another_batch_shape_reads_on_from_the_saved_position(world, old, new, steps_before, align):
    """(micro_batch, seq_len, tokens per step) saved and resumed with: the saved position is a whole number of
    old steps, not of new ones. The loader never left its shard then (its test was pos % step == 0) and a
    batch ran past the shard's end: a traceback hours in; a larger step did so at once."""
    from gptforge.data.aligned import make_loader
    from gptforge.data.shards import list_shards

    (b0, t0, s0), (b1, t1, s1) = old, new
    files = list_shards(world["shards"], "train")
    shards = [np.asarray(read_shard(f)).astype(np.int64) for f in files]
    eot = 7 if align == "bos" else None  # a token of the pattern: rows start at its occurrences
    kw = {"align": align, **({"eot": eot} if eot is not None else {})}
    before = make_loader(files, b0, t0, 0, 1, step_tokens=s0, **kw)
    for _ in range(steps_before * s0 // (b0 * t0)):
        before.next_batch()
    state = json.loads(json.dumps(before.state_dict()))  # as meta.json holds it
    after = make_loader(files, b1, t1, 0, 1, step_tokens=s1, **kw)
    after.load_state_dict(state)
    want = _reference_steps(shards, state["shard"], state["pos"], t1, s1, 3 * sum(len(x) for x in shards) // s1, eot)
    for k, ref in enumerate(want):  # three epochs of steps
        got = [after.next_batch() for _ in range(s1 // (b1 * t1))]
        x, y = torch.cat([g[0] for g in got]), torch.cat([g[1] for g in got])
        assert torch.equal(x.reshape(-1, t1), torch.from_numpy(ref[:, :-1])), k
        assert torch.equal(y.reshape(-1, t1), torch.from_numpy(ref[:, 1:])), k


def test_a_run_resumed_with_a_step_its_position_does_not_divide_trains_to_the_end(base_run, tmp_path, capsys):
    run = _copy(base_run, tmp_path)  # saved at 1,024 tokens into shard 0 (10,000 tokens), 256 a step
    capsys.readouterr()
    assert main(["train", *resume_args(run)[:-2], "--train.max_steps", "20", "--train.total_batch_tokens", "768",
                 "--train.seq_len", "48", "--train.micro_batch", "2"]) == 0, capsys.readouterr().err
    assert ckpt.latest_checkpoint(run).name == "step_000020"
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["loader"]["shard"] == 1  # it moved on to the next shard


def test_a_resume_with_another_step_size_keeps_counting_tokens_from_the_checkpoint(base_run, tmp_path):
    """metrics.jsonl's ``tokens`` (the x-axis of a curve by tokens) was recomputed on resume as steps x the
    new step size: 4 steps of 256 then 2 of 512 said 2,560 and 3,072 instead of 1,536 and 2,048."""
    from gptforge.run.metrics import read_metrics

    run = _copy(base_run, tmp_path)
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["tokens_seen"] == 4 * 256
    assert main(["train", *resume_args(run), "--train.total_batch_tokens", "512"]) == 0
    tokens = {r["step"]: r["tokens"] for r in read_metrics(run) if r["kind"] == "train"}
    assert tokens == {1: 256, 2: 512, 3: 768, 4: 1024, 5: 1536, 6: 2048}
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["tokens_seen"] == 2048


# --- 4. a reader of a run that is still training --------------------------------------------------------------

@pytest.fixture(scope="module")
def live_run(world, tmp_path_factory):
    """An sft run with checkpoints at steps 1, 2 and 3 (all kept)."""
    out = tmp_path_factory.mktemp("live") / "run"
    args = RUNS["sft", None](world)
    args[args.index("--train.ckpt_every") + 1] = "1"
    assert main([*args, "--train.keep_ckpts", "0", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("during", ["weights", "tokenizer", "meta after the tokenizer"])
@pytest.mark.parametrize("command", ["export", "sample"])
def test_a_checkpoint_pruned_while_it_is_read_is_replaced_by_the_runs_newest(live_run, tmp_path, capsys, monkeypatch,
                                                                             command, during):
    """What the trainer does between two reads (save step 3, prune step 1: train.keep_ckpts) is done here at
    the moment the reader opens step 1's weights or tokenizer, or, once the tokenizer is read, its meta.json
    again (the chat template, the stored dtype)."""
    run = _copy(live_run, tmp_path)
    aside = tmp_path / "newer"
    aside.mkdir()
    for step in ("step_000002", "step_000003"):
        (run / "checkpoints" / step).rename(aside / step)
    target = {"weights": "gptforge.run.restore.load_model_weights",
              "tokenizer": "gptforge.data.tokenizer.tokenizer_from_meta",
              "meta after the tokenizer": "gptforge.run.checkpoint.read_meta"}[during]
    module, name = target.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)
    pruned, armed = [], [during != "meta after the tokenizer"]

    def reader(*a, **k):
        if not pruned and armed[0]:  # the run saves its newer checkpoints and prunes the one being read
            for step in ("step_000002", "step_000003"):
                (aside / step).rename(run / "checkpoints" / step)
            shutil.rmtree(run / "checkpoints" / "step_000001")
            pruned.append(1)
        return real(*a, **k)

    monkeypatch.setattr(target, reader)
    if not armed[0]:  # armed once the tokenizer has been read whole
        from gptforge.data import tokenizer as tk

        real_tok = tk.tokenizer_from_meta

        def tokenizer_from_meta(*a, **k):
            tok = real_tok(*a, **k)
            armed[0] = True
            return tok

        monkeypatch.setattr(tk, "tokenizer_from_meta", tokenizer_from_meta)
    out = tmp_path / "export"
    args = {"export": ["export", "hf", "--ckpt", str(run), "--out", str(out)],
            "sample": ["sample", "--ckpt", str(run), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"]}
    capsys.readouterr()
    code = main(args[command])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert pruned  # the prune happened, under that read
    if command == "export":  # the weights of the checkpoint the model was read from whole: step 3 when it was
        # pruned under the weights' read, step 1 (read before) when under the tokenizer's
        read = live_run / "checkpoints" / ("step_000003" if during == "weights" else "step_000001")
        key = "transformer.h.0.mlp.c_fc.weight"
        want, got = load_file(str(read / "model.safetensors"))[key], load_file(str(out / "model.safetensors"))[key]
        assert torch.equal(got, want) or torch.equal(got.T, want)  # (HF's Conv1D stores it transposed)


def test_a_damaged_newest_checkpoint_of_an_idle_run_still_fails_naming_it(live_run, tmp_path, capsys):
    """The retry is for a checkpoint that went away or was superseded; one that is there, newest and damaged
    fails as before."""
    run = _copy(live_run, tmp_path)
    weights = run / "checkpoints" / "step_000003" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    capsys.readouterr()
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "x")]) == 2
    assert str(weights) in _one_line(capsys.readouterr().err)


# --- 5. numeric faults mid-run --------------------------------------------------------------------------------

def _set(args: list[str], flags: tuple[str, ...], value: str) -> list[str]:
    args = list(args)
    args[next(i for i, a in enumerate(args) if a in flags) + 1] = value
    return args


@pytest.mark.parametrize("fault", ["nan weight", "inf gradient on one micro-step"])
@pytest.mark.parametrize("command,algo", RESUMABLE, ids=[case_id(c) for c in RESUMABLE])
def test_a_step_gone_non_finite_keeps_the_last_good_checkpoint_resumable(world, tmp_path, capsys, monkeypatch,
                                                                         command, algo, fault):
    """Before step 3 a weight becomes NaN, or step 3's first backward leaves an inf in one gradient (each
    recipe's own step then computes the rest): the run must stop at step 3 with exit 3 before saving or
    pruning anything, saying to resume; the step-2 checkpoint verifies and a plain --resume trains to the end."""
    from gptforge.training import loop

    run = tmp_path / "run"
    args = _set(_set(RUNS[command, algo](world), ("--steps", "--train.max_steps"), "4"),
                ("--ckpt-every", "--train.ckpt_every"), "2") + ["--out", str(run)]
    real_set_lr, real_backward, armed = loop.set_lr, torch.Tensor.backward, []

    def set_lr(optimizer, step, *a, **k):
        if step == 2:  # before step 3
            first = optimizer.param_groups[0]["params"][0]
            if fault == "nan weight":
                with torch.no_grad():
                    first.fill_(float("nan"))
            else:
                armed.append(first)
        return real_set_lr(optimizer, step, *a, **k)

    def backward(self, *a, **k):
        real_backward(self, *a, **k)
        if armed:
            p = armed.pop()
            if p.grad is not None:
                p.grad.view(-1)[0] = float("inf")

    monkeypatch.setattr(loop, "set_lr", set_lr)
    monkeypatch.setattr(torch.Tensor, "backward", backward)
    capsys.readouterr()
    code = main(args)
    io = capsys.readouterr()
    assert code == 3, io.err
    assert "diverged (not finite) at step 3" in io.err and "--resume" in io.err and "Traceback" not in io.err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    ckpt.verify_checkpoint(run / "checkpoints" / "step_000002")
    monkeypatch.undo()
    assert main([command, "--out", str(run), "--resume"]) == 0
    assert ckpt.latest_checkpoint(run).name == "step_000004"
    assert all(bool(torch.isfinite(v).all()) for v in
               load_file(str(run / "checkpoints" / "step_000004" / "model.safetensors")).values())
