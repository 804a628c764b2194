"""Paths and folders, round thirteen, each tested as a class: every ``prepare`` subcommand that writes a shard
folder holds it (a second prepare into the same folder is refused in one line naming the folder and the holder,
before any work); every safetensors file is opened through one function, so a Hugging Face folder or a run
folder whose path is not UTF-8 is read like any other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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


# --- safetensors through one opener --------------------------------------------------------------------------

NOT_UTF8 = b"e\xff"  # a Latin-1 'ÿ': the bytes of a folder name an old system made


def _not_utf8(tmp_path: Path) -> Path:
    return Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), NOT_UTF8)))


@pytest.mark.parametrize("kind", ["GPT2", "Llama"])
def test_an_hf_folder_whose_path_is_not_utf8_loads(kind, tmp_path):
    """`gptforge sample --hf $'/tmp/e\\xff'` was refused as "not a readable safetensors file (Path ... is not valid
    UTF-8)": safetensors takes a path as UTF-8 text. The same folder's weights from a UTF-8 path are the reference
    (that path is checked against transformers in tests/interop), so the two must be equal bit for bit."""
    pytest.importorskip("transformers")
    from gptforge.load import ModelSource, load_model
    from tests.models.hf_reference import random_hf_model

    if kind == "Llama":
        hf = random_hf_model(kind, vocab_size=64, hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                             intermediate_size=64, num_key_value_heads=2, max_position_embeddings=32)
    else:  # GPT-2's class is GPT2LMHeadModel, not {kind}ForCausalLM
        import transformers

        torch.manual_seed(0)
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_head=2, n_layer=2,
                                                                  n_positions=32, bos_token_id=0, eos_token_id=0))
    plain, odd = tmp_path / "plain", _not_utf8(tmp_path)
    hf.save_pretrained(plain)
    hf.save_pretrained(odd)
    want = load_model(ModelSource(hf=str(plain))).state_dict()
    got = load_model(ModelSource(hf=str(odd))).state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("proc", [True, False], ids=["fd-path", "symlink"])
def test_the_one_opener_reads_any_path(proc, tmp_path, monkeypatch):
    """Both of storage.tensors' doors (every tensor; a handle read after the opener returned) on a non-UTF-8 path,
    through the descriptor's path, and through the ASCII symlink where a platform has no /proc or /dev/fd."""
    from safetensors.torch import save_file

    from gptforge.storage import tensors

    want = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    odd = _not_utf8(tmp_path)
    odd.mkdir()
    path = odd / "model.safetensors"
    save_file(want, str(tmp_path / "x.safetensors"))  # (safetensors' writer takes UTF-8 paths only, too)
    os.rename(tmp_path / "x.safetensors", path)
    if not proc:
        real = os.path.exists
        monkeypatch.setattr(os.path, "exists", lambda p: False if str(p).startswith(("/proc/self/fd/", "/dev/fd/"))
                            else real(p))
    got = tensors.load_safetensors(path)
    h = tensors.open_safetensors(path)
    assert sorted(got) == sorted(h.keys()) == ["a", "b"]
    assert all(torch.equal(got[k], want[k]) and torch.equal(h.get_tensor(k), want[k]) for k in want)
