"""Checkpoints from a hostile or unlucky world: no code runs from a pickled dcp/.metadata unless the
user trusts it, every file is checksummed and a damaged checkpoint is named (resume falls back past
it), and a full disk leaves the previous checkpoint intact with one clear message.

References: hashlib for the recorded checksums, an uninterrupted run for the fallback resume."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from gptforge.cli import main
from gptforge.load import ModelSource
from gptforge.load import load_model as _load
from gptforge.run import checkpoint as ckpt
from gptforge.run.identity import latest_intact_checkpoint
from gptforge.training.loop import train
from tests.conftest import tiny_config


def load_model(ckpt_dir: str, _hf=None):
    return _load(ModelSource(ckpt=ckpt_dir))


class _Marker:
    """Unpickling this creates a file: proof that the pickle was read."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _plant_dcp(ckpt_dir: Path, marker: Path) -> None:
    (ckpt_dir / "dcp").mkdir()
    (ckpt_dir / "dcp" / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 3 and 6, kept pristine (tests copy it)."""
    from tests.conftest import make_shards

    tmp = tmp_path_factory.mktemp("ckpt")
    data = make_shards(tmp / "data")
    res = train(tiny_config(data, tmp / "run", max_steps=6, ckpt_every=3))
    return {"data": data, "run": tmp / "run", "losses": res.train_losses}


def _copy(run, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run["run"], dst)
    return dst


def _cli_train(run, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data.dir", str(run["data"]), "--out", str(out),
            "--model.vocab_size", "512", "--train.device", "cpu", *extra]


# --- 1. no code from checkpoints ------------------------------------------------------------------

def test_weights_only_commands_never_unpickle_dcp_metadata(run, tmp_path, capsys):
    out = _copy(run, tmp_path)
    marker = tmp_path / "pwned"
    d = ckpt.latest_checkpoint(out)
    (d / "model.safetensors").unlink()  # a sharded checkpoint as older versions wrote it: dcp/ only
    _plant_dcp(d, marker)
    with pytest.raises(ckpt.CheckpointError, match="--trust-checkpoint"):
        load_model(str(d), None)
    for argv in (["sample", "--ckpt", str(out), "--num-samples", "1", "--max-new-tokens", "2"],
                 ["export", "hf", "--ckpt", str(out), "--out", str(tmp_path / "hf")],
                 ["eval", "--ckpt", str(out), "--limit", "1"],
                 _cli_train(run, tmp_path / "ft", "--init-from", str(out), "--train.max_steps", "1")):
        assert main(argv) == 2, argv
        assert "model.safetensors is missing" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "foreign", "wrong_table"])
def test_trusted_resume_from_a_damaged_dcp_metadata_is_one_line_naming_it(run, tmp_path, capsys, damage):
    """With --trust-checkpoint the pickle is read; a damaged one (not a pickle, empty, cut short, or a pickle
    of something else) is refused by name, exit 2, not a traceback."""
    import types

    out = _copy(run, tmp_path)
    d = ckpt.latest_checkpoint(out)
    (d / "dcp").mkdir()
    whole = pickle.dumps({"state_dict_metadata": {}})
    data = {"garbage": b"not a pickle at all", "empty": b"", "truncated": whole[: len(whole) // 2],
            "foreign": pickle.dumps({"a": 1}),
            "wrong_table": pickle.dumps(types.SimpleNamespace(state_dict_metadata=["model.x"]))}[damage]
    (d / "dcp" / ".metadata").write_bytes(data)
    assert main(_cli_train(run, out, "--resume", "--train.max_steps", "8", "--trust-checkpoint")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "dcp/.metadata" in err and "damaged" in err, err


def test_resume_from_dcp_needs_the_trust_flag_and_the_checkpoint_cannot_vouch_for_itself(run, tmp_path, capsys):
    out = _copy(run, tmp_path)
    marker = tmp_path / "pwned"
    d = ckpt.latest_checkpoint(out)
    _plant_dcp(d, marker)
    assert main(_cli_train(run, out, "--resume", "--train.max_steps", "8")) == 2
    err = capsys.readouterr().err
    assert "--trust-checkpoint" in err and "dcp/.metadata" in err
    assert not marker.exists()
    meta = json.loads((d / "meta.json").read_text())
    meta["config"]["train"]["trust_checkpoint"] = True  # a hostile checkpoint claims to be trusted
    (d / "meta.json").write_text(json.dumps(meta))
    assert main(_cli_train(run, out, "--resume", "--train.max_steps", "8")) == 2
    assert "--trust-checkpoint" in capsys.readouterr().err
    with pytest.raises(ckpt.CheckpointError, match="--trust-checkpoint"):  # the library refuses too
        train(tiny_config(run["data"], out, max_steps=8), resume="latest")
    assert not marker.exists()


# --- 3. checksums ------------------------------------------------------------------------------------

def test_meta_records_every_files_sha256(run):
    for d in ckpt.list_checkpoints(run["run"]):
        files = ckpt.read_meta(d)["files"]
        assert sorted(files) == ["model.safetensors", "optimizer.pt", "rng.pt"]
        for name, digest in files.items():
            assert digest == hashlib.sha256((d / name).read_bytes()).hexdigest()
        ckpt.verify_checkpoint(d)


def test_every_file_of_a_checkpoint_has_the_same_mode(run):
    import os

    from gptforge.storage import current_umask

    umask = os.umask(0o022)  # the umask as it is (read, then put back), compared with /proc's
    os.umask(umask)
    assert current_umask() == umask
    for d in ckpt.list_checkpoints(run["run"]):
        modes = {f.name: f.stat().st_mode & 0o777 for f in d.iterdir()}
        assert set(modes.values()) == {0o666 & ~umask}, modes  # model.safetensors too (safetensors: 0600)


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[-9] ^= 0x10  # inside the data, past every header: the file still parses
    f.write_bytes(bytes(b))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng.pt"])
@pytest.mark.parametrize("damage", [_truncate, _flip])
def test_verify_names_the_damaged_file(run, tmp_path, name, damage):
    out = _copy(run, tmp_path)
    d = ckpt.latest_checkpoint(out)
    damage(d / name)
    with pytest.raises(ckpt.CheckpointError, match=rf"{name} does not match the sha256"):
        ckpt.verify_checkpoint(d)


@pytest.mark.parametrize("damage", [_truncate, _flip])
def test_sample_and_eval_on_a_damaged_checkpoint_name_the_file(run, tmp_path, damage, capsys):
    out = _copy(run, tmp_path)
    damage(ckpt.latest_checkpoint(out) / "model.safetensors")
    assert main(["sample", "--ckpt", str(out), "--num-samples", "1", "--max-new-tokens", "2"]) == 2
    assert "step_000006/model.safetensors does not match the sha256" in capsys.readouterr().err
    assert main(["eval", "--ckpt", str(out), "--limit", "1"]) == 2
    assert "model.safetensors does not match the sha256" in capsys.readouterr().err


def test_resume_falls_back_past_a_damaged_checkpoint_and_continues_exactly(run, tmp_path, capsys):
    out = _copy(run, tmp_path)
    _truncate(out / "checkpoints" / "step_000006" / "optimizer.pt")
    assert latest_intact_checkpoint(out, warn=lambda m: None).name == "step_000003"
    code = main(_cli_train(run, out, "--resume", "--train.max_steps", "6", "--train.ckpt_every", "3"))
    io = capsys.readouterr()
    assert code == 0, io.err
    assert "skipping damaged checkpoint step_000006" in io.err and "optimizer.pt" in io.err
    assert "resumed from" in io.out and "step_000003 at step 3" in io.out
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    again = {r["step"]: r["loss"] for r in recs if r["kind"] == "train" and not r.get("replayed")}
    assert again == run["losses"]  # steps 4-6 retrained from step 3: the uninterrupted run's losses, exactly
    ckpt.verify_checkpoint(out / "checkpoints" / "step_000006")  # rewritten, intact


def test_resume_of_a_named_damaged_checkpoint_fails_naming_the_file(run, tmp_path, capsys):
    out = _copy(run, tmp_path)
    _flip(out / "checkpoints" / "step_000006" / "rng.pt")
    target = out / "checkpoints" / "step_000006"
    assert main(_cli_train(run, out, "--resume", str(target), "--train.max_steps", "8")) == 2
    assert "rng.pt does not match the sha256" in capsys.readouterr().err


def test_checkpoint_without_checksums_still_loads(run, tmp_path):
    out = _copy(run, tmp_path)
    for d in ckpt.list_checkpoints(out):
        meta = json.loads((d / "meta.json").read_text())
        del meta["files"]  # as written before checksums were recorded
        (d / "meta.json").write_text(json.dumps(meta))
    ref = load_model(str(run["run"]), None)
    got = load_model(str(out), None)
    for (k, a), (_, b) in zip(ref.state_dict().items(), got.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    res = train(tiny_config(run["data"], out, max_steps=7), resume="latest")
    assert res.steps_done == 7
    _truncate(ckpt.latest_checkpoint(out) / "model.safetensors")  # no checksum: still a named error
    meta = json.loads((ckpt.latest_checkpoint(out) / "meta.json").read_text())
    del meta["files"]
    (ckpt.latest_checkpoint(out) / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ckpt.CheckpointError, match=r"step_000007/model.safetensors cannot be read"):
        load_model(str(out), None)


# --- 7. disk full --------------------------------------------------------------------------------

def _enospc_on_second_save(monkeypatch, how: str) -> None:
    calls = {"n": 0}
    real_save_file, real_torch_save = ckpt.save_file, torch.save

    def save_file(tensors, path, metadata=None):
        calls["n"] += 1
        real_save_file(tensors, path, metadata=metadata)
        if calls["n"] == 2 and how == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", path)

    def torch_save(obj, f, *a, **k):
        real_torch_save(obj, f, *a, **k)
        if calls["n"] == 2 and how == "torch" and str(f).endswith("optimizer.pt"):
            raise RuntimeError("basic_ios::clear: iostream error")  # what torch.save says on a full disk

    monkeypatch.setattr(ckpt, "save_file", save_file)
    monkeypatch.setattr(ckpt.torch, "save", torch_save)
    if how == "torch":  # no errno: the filesystem is asked how much room is left
        monkeypatch.setattr("gptforge.storage.faults.free_bytes", lambda path: 4096)


@pytest.mark.parametrize("how", ["oserror", "torch"])
def test_disk_full_while_checkpointing_keeps_the_previous_one(run, tmp_path, monkeypatch, how):
    out = tmp_path / "run"
    _enospc_on_second_save(monkeypatch, how)
    with pytest.raises(ckpt.CheckpointError) as exc:
        train(tiny_config(run["data"], out, max_steps=6, ckpt_every=3))
    err = str(exc.value)
    m = re.search(r"no space left on device while writing checkpoint step 6 \(needs about ([0-9.e-]+) GB\)", err)
    assert m, err
    on_disk = sum(f.stat().st_size for f in (out / "checkpoints" / "step_000003").iterdir())
    assert 0.8 < float(m.group(1)) * 1e9 / on_disk < 1.25  # the estimate is what a checkpoint takes
    assert "again with --resume" in err  # how to continue (issue 21)
    assert not (out / "checkpoints" / "step_000006.tmp").exists()  # the partial directory is gone
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000003"]
    ckpt.verify_checkpoint(out / "checkpoints" / "step_000003")  # intact: resume works from it
    monkeypatch.undo()
    res = train(tiny_config(run["data"], out, max_steps=6, ckpt_every=3), resume="latest")
    assert res.steps_done == 6 and res.train_losses == {s: run["losses"][s] for s in (4, 5, 6)}


def test_other_write_errors_also_remove_the_partial_directory(run, tmp_path, monkeypatch):
    model = load_model(str(run["run"]), None)

    def broken(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ckpt, "save_file", broken)
    with pytest.raises(ckpt.CheckpointError, match="checkpoint step 9 .*: input/output error"):  # one line, named
        ckpt.save_checkpoint(tmp_path, 9, model, None, {})
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd's file through Linux's /proc")
@pytest.mark.parametrize("again", [False, True])
def test_a_checkpoint_is_durable_as_every_folder_output_is(tmp_path, monkeypatch, again):
    """A checkpoint is a folder built beside its place and renamed in, as storage.atomic_dir's outputs are; its
    writer fsynced the files but neither the folder (the files' names) nor checkpoints/ after the rename (the
    rename itself), so a power cut could lose a save that --resume had been told was there. Every fsync is
    seen here by the path it reaches (os.fsync on an fd, named through /proc)."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    if again:  # the same step saved again: the earlier folder swapped out
        ckpt.save_checkpoint(tmp_path, 3, model, None, {"config": {}})
    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    where = ckpt.save_checkpoint(tmp_path, 3, model, opt, {"config": {}})
    built = str(where) + ".tmp"
    names = sorted(p.name for p in where.iterdir())
    assert names == ["meta.json", "model.safetensors", "optimizer.pt"]
    assert [f"{built}/{n}" for n in names] == [p for p in synced if p.startswith(built + "/")]  # each file, once
    assert synced.index(built) > max(synced.index(f"{built}/{n}") for n in names)  # then the names in it
    assert synced[-1] == str(where.parent)  # and the rename, last
