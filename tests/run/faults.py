"""What the run-time fault tests (tests/run/test_hardening_round*.py) share: a tiny pretraining
command line over the shards of ``tests.training.commands.make_world``, a finished 4-step run to copy,
a hook that acts between two steps of a running run, and the one-error-line check."""

from __future__ import annotations

import shutil
from pathlib import Path

from gptforge.cli import main


def train_argv(shards: str | Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data.dir", str(shards), "--out", str(out), "--model.vocab_size", "512",
            "--train.device", "cpu", "--train.val_every", "0", "--train.sample_every", "0", *extra]


def finished_run(shards: str | Path, out: Path) -> Path:
    """A finished 4-step pretraining run with checkpoints at steps 2 and 4, copied by each test."""
    assert main(train_argv(shards, out, "--train.max_steps", "4", "--train.ckpt_every", "2")) == 0
    return out


def copy_run(src: Path, tmp_path: Path, name: str = "run") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def one_line(err: str) -> str:
    """The one error line (a progress line before it, such as export's "writing ...", is fine)."""
    errors = [x for x in err.strip().splitlines() if ": error: " in x]
    assert "Traceback" not in err and len(errors) == 1 and err.strip().endswith(errors[0]), err
    return errors[0]


def before_step(monkeypatch, k: int, do) -> None:
    """``do()`` once, just before step ``k + 1`` computes (after step k's record and checkpoint)."""
    from gptforge.training import loop

    real = loop.set_lr

    def set_lr(optimizer, step, *a, **kw):
        if step == k:
            do()
        return real(optimizer, step, *a, **kw)

    monkeypatch.setattr(loop, "set_lr", set_lr)


def rewrite_meta(ck: Path, edit) -> None:
    """Edit checkpoint ``ck``'s meta.json as its author could, self-consistently: the model record that the
    save wrote into model.safetensors' header (run/checkpoint.py's model_record) and that file's sha256 are
    rewritten to match, so what is tested is how a reader treats the values (a hostile or odd checkpoint),
    not the check that refuses a meta.json edited on its own (tests/run/test_hardening_round9_state.py)."""
    import json

    from safetensors.torch import load_file, save_file

    from gptforge.run.checkpoint import weights_metadata
    from gptforge.storage.digest import sha256_file

    meta = json.loads((ck / "meta.json").read_text())
    edit(meta)
    weights = ck / "model.safetensors"
    if weights.is_file() and isinstance(meta, dict):
        save_file(load_file(weights), str(weights), metadata=weights_metadata(meta))
        if isinstance(meta.get("files"), dict) and "model.safetensors" in meta["files"]:
            meta["files"]["model.safetensors"] = sha256_file(weights)
    (ck / "meta.json").write_text(json.dumps(meta))
