"""Hardening round ten, a hostile user's probes of round nine's mechanisms.

* A run directory given to a reader (``sample/export/eval/serve --ckpt RUN``, ``--init-from RUN``) means the
  newest checkpoint that is the run's own save of its step, as ``--resume`` takes it: a step folder copied in
  from another run (its run id), or another step's save under a newer name, was read silently as the run's
  newest. ``run/identity.py``'s ``resolve_checkpoint`` (every reader's one resolution) skips it, said once on
  stderr naming it and why.
* A LoRA checkpoint's meta.json is checked against model.safetensors' header as every other checkpoint's is
  (load.py's adapters branch skipped it), and the header records the adapters' rank, alpha and targets; so is a
  reward model's where reward models load (training/rm.py).
* `torchrun ... train | head`: every rank stops at one step, one checkpoint, and the workers exit 0 (rank 0's 141 was
  torchrun's "gptforge FAILED").
* OMP_NUM_THREADS as libgomp reads it (nested "2,1", "+3"): kept, and the run's thread count, by one parse
  (environment.omp_threads).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main
from gptforge.run import checkpoint as ckpt
from gptforge.run.identity import resolve_checkpoint
from tests.conftest import child_env
from tests.run.faults import train_argv


@pytest.fixture(scope="module")
def runs(world, base_run, tmp_path_factory):
    """Run ``own`` (the shared base run: saves at steps 2 and 4) and run ``other`` (another seed; saves at 3 and 6),
    over the shared world's shards."""
    other = tmp_path_factory.mktemp("probe10") / "other"
    assert main(train_argv(world["shards"], other, "--train.max_steps", "6", "--train.ckpt_every", "3",
                           "--train.seed", "7")) == 0
    return {"shards": world["shards"], "own": base_run, "other": other}


def _exported_wte(run: Path, out: Path) -> torch.Tensor:
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(out), "--no-tokenizer"]) == 0
    return load_file(str(out / "model.safetensors"))["transformer.wte.weight"]


def _wte(step_dir: Path) -> torch.Tensor:
    return load_file(str(step_dir / "model.safetensors"))["transformer.wte.weight"]


def test_a_run_path_skips_another_runs_step_folder_and_another_steps_save_saying_each_once(runs, tmp_path,
                                                                                         capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["own"], run)
    cks = run / "checkpoints"
    shutil.copytree(runs["other"] / "checkpoints" / "step_000006", cks / "step_000006")  # another run's, newest
    ckpt.verify_checkpoint(cks / "step_000006")  # whole in itself: only its run id tells it
    capsys.readouterr()
    assert torch.equal(_exported_wte(run, tmp_path / "hf"), _wte(cks / "step_000004"))
    err = capsys.readouterr().err
    said = [x for x in err.splitlines() if x.startswith(f"{run}: skipping checkpoint step_000006: ")]
    assert len(said) == 1 and "a checkpoint of another run" in said[0], err  # once, though export resolves often
    # step 2's save copied under a newer name (step_000008): not the run's step 8, skipped too
    shutil.copytree(cks / "step_000002", cks / "step_000008")
    assert resolve_checkpoint(run, warn=lambda m: None) == cks / "step_000004"
    # nothing left but the renamed save: one line naming what was skipped, not a model under a false step
    for name in ("step_000002", "step_000004", "step_000006"):
        shutil.rmtree(cks / name)
    capsys.readouterr()
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "hf2"), "--no-tokenizer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"gptforge export: error: {run} holds no checkpoint of its own run (looked in {cks}: "
                       "step_000008, each skipped above)"), err
    assert "step = 2, but the checkpoint directory is step_000008" in err[-2] and not (tmp_path / "hf2").exists()
    # a step folder named directly is read as given (the user chose it)
    assert resolve_checkpoint(cks / "step_000008") == cks / "step_000008"


@pytest.mark.parametrize("value,threads", [("2,1", 2), (" +3 ", 3), ("1,1,1", 1)])
def test_omp_num_threads_as_libgomp_reads_it_is_kept_and_is_the_runs_thread_count(monkeypatch, capsys, value,
                                                                                  threads):
    """Nested "2,1" (one count per nesting level) and "+3" are values libgomp takes (torch's pool gets the first
    level): round nine dropped "2,1" as 'not a positive whole number', and train.threads auto read "+3" as unset
    (1 thread) where torch's own default took 3."""
    from gptforge.runtime import auto_threads

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert main(["presets"]) == 0
    assert "OMP_NUM_THREADS" not in capsys.readouterr().err and "OMP_NUM_THREADS" in os.environ
    assert auto_threads(torch.device("cpu")) == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "2,0")  # a level of none: libgomp refuses it, so is it here
    assert main(["presets"]) == 0
    assert "OMP_NUM_THREADS='2,0' is not a positive whole number" in capsys.readouterr().err


@pytest.fixture(scope="module")
def lora_run(world, tmp_path_factory):
    """A 1-step LoRA sft run over the tiny chat model."""
    from tests.training.commands import RUNS

    args = RUNS["sft", None](world)
    args[args.index("--steps") + 1] = "1"
    out = tmp_path_factory.mktemp("lora") / "lora"
    assert main([*args, "--lora.rank", "2", "--out", str(out)]) == 0
    return out


def _n_head(m):  # keeps every shape: the base's weights loaded into a 4-head model (silent for LoRA before)
    m["config"]["model"]["n_head"] = 4


def _alpha(m):  # the adapters' scale alpha / rank: another model from the same files, no shape tells it
    m["config"]["lora"]["alpha"] *= 100


@pytest.mark.parametrize("edit,field,saved", [(_n_head, "config.model.n_head = 4", "2"),
                                              (_alpha, "config.lora.alpha = 1600.0", "16.0")])
def test_a_lora_checkpoints_meta_json_edit_is_refused_by_its_readers(lora_run, tmp_path, capsys, edit, field, saved):
    """Round nine's check of meta.json against model.safetensors' header was skipped for LoRA checkpoints on every
    reader (load.py took the adapters' branch first) and never covered the adapters' own settings."""
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    meta = ckpt.latest_checkpoint(run) / "meta.json"
    data = json.loads(meta.read_text())
    edit(data)
    meta.write_text(json.dumps(data))
    capsys.readouterr()
    for argv in (["sample", "--ckpt", str(run), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"],
                 ["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "hf")]):
        assert main(argv) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"gptforge {argv[0]}: error: {meta}: {field}, but ") \
            and f"was saved with {saved} " in line, line
    assert not (tmp_path / "hf").exists()


def test_a_lora_checkpoint_saved_before_its_settings_were_recorded_still_loads(lora_run, tmp_path, capsys):
    """A header record without "lora" (saved by round nine): the adapters' settings are not compared, the rest is."""
    from safetensors.torch import save_file

    from gptforge.run.checkpoint import MODEL_RECORD
    from gptforge.sizecheck import header_metadata
    from gptforge.storage.digest import sha256_file

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    ck = ckpt.latest_checkpoint(run)
    weights = ck / "model.safetensors"
    header = header_metadata(weights)
    record = json.loads(header[MODEL_RECORD])
    assert record["lora"] == {"rank": 2, "alpha": 16.0, "targets": ""}  # what this round records
    del record["lora"]
    save_file(load_file(str(weights)), str(weights), metadata={**header, MODEL_RECORD: json.dumps(record)})
    data = json.loads((ck / "meta.json").read_text())
    data["files"]["model.safetensors"] = sha256_file(weights)
    (ck / "meta.json").write_text(json.dumps(data))
    assert main(["sample", "--ckpt", str(run), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"]) == 0


def test_chat_reads_a_line_no_further_than_its_bound(world, monkeypatch, capsys):
    """`chat < /dev/zero` (or a binary file): readline held the whole endless "line" in memory before the first
    message. A line past LINE_MAX characters is one error line, read no further; a long one within it is taken."""
    import io

    from gptforge.cli import chat

    monkeypatch.setattr(chat, "LINE_MAX", 1000)  # the bound, small: what is read past it is what is tested
    endless = io.StringIO("\0" * 5000)
    monkeypatch.setattr(sys, "stdin", endless)
    assert main(["chat", "--ckpt", world["chat"], "--max-new-tokens", "2", "--device", "cpu"]) == 2
    assert endless.tell() == 1001  # LINE_MAX + 1 characters read, not the rest
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptforge chat: error: stdin: a line longer than 1,000 characters (no newline in sight: a binary file or a "
        "device such as /dev/zero?); chat reads one message a line")
    for within in ("x" * 1000 + "\n/quit\n", "x" * 1000):  # exactly the bound, with its newline or at the end
        monkeypatch.setattr(sys, "stdin", io.StringIO(within))
        assert main(["chat", "--ckpt", world["chat"], "--max-new-tokens", "2", "--device", "cpu"]) == 0


def test_an_error_handler_python_does_not_know_is_met_as_an_encoding_that_cannot_hold_the_text(world, monkeypatch):
    """PYTHONIOENCODING=ascii:bogus: Python starts, and the first character the encoding cannot hold raised
    LookupError (unknown error handler) as a traceback out of sample; now replaced as for a plain ascii stream."""
    import io

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="bogus", write_through=True)  # (kept: closes raw at gc)
    monkeypatch.setattr(sys, "stdout", stream)
    code = main(["sample", "--ckpt", world["chat"], "--prompt", "caf\u00e9 \u2192", "--max-new-tokens", "2",
                 "--device", "cpu"])
    monkeypatch.undo()
    assert code == 0 and "caf? ?" in raw.getvalue().decode("ascii")


def test_under_torchrun_a_closed_stdout_pipe_stops_every_rank_at_one_checkpoint_and_exits_0(runs, tmp_path):
    """`torchrun --nproc_per_node 2 -m gptforge train ... | head -3`: the ranks agreed on the stop (one checkpoint),
    but rank 0 exited 141, which torchrun reports as "gptforge FAILED" with a traceback (and with --max-restarts
    restarts the group, which resumes and trains on), although rank 0 had just said the workers exit 0. A stop
    under torchrun exits 0 (run/faults.py's exit_status), a closed pipe's as a signal's."""
    import subprocess

    env = child_env()
    out = tmp_path / "dist"
    argv = train_argv(runs["shards"], out, "--train.max_steps", "400", "--train.ckpt_every", "0",
                      "--train.log_every", "1")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "gptforge", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True)
    try:
        for _ in range(3):  # `head -3`
            assert p.stdout.readline()
        p.stdout.close()
        err = p.communicate(timeout=300)[1].decode(errors="replace")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    assert p.returncode == 0 and "FAILED" not in err, err[-3000:]
    assert "stdout's reader left (a closed pipe): finishing this step, saving a checkpoint" in err
    saved = ckpt.list_checkpoints(out)
    assert len(saved) == 1 and 2 <= ckpt.read_meta(saved[0])["step"] < 400, saved  # one save, by all ranks at once
    ckpt.verify_checkpoint(saved[0])


def test_a_reward_models_meta_json_edit_is_refused_where_reward_models_load(world, tmp_path, capsys):
    """training/rm.py's loader (eval --preferences, export of an rm, rl --reward-model, prepare --judge) built the
    model from meta.json without round nine's check against the weights' header: n_head 2 -> 4 scored silently."""
    from tests.training.commands import RUNS

    args = RUNS["rm", None](world)
    args[args.index("--steps") + 1] = "1"
    run = tmp_path / "rm"
    assert main([*args, "--out", str(run)]) == 0
    meta = ckpt.latest_checkpoint(run) / "meta.json"
    data = json.loads(meta.read_text())
    _n_head(data)
    meta.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(run), "--preferences", world["prefs"], "--device", "cpu"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"gptforge eval: error: {meta}: config.model.n_head = 4, but "), line
