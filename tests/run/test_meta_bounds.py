"""Numbers in meta.json are bounded by the weights file before a model is built (issue 21, class 2):
a small checkpoint whose meta.json claims a huge model is refused in one line naming the file and
the field, by every command that reads checkpoints, and nothing of that size is ever allocated."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

import gptforge.load
import gptforge.training.recipe
from gptforge.cli import main
from gptforge.config import Config
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.run.weights import check_weights_fit, weights_header

HUGE = [("n_layer", 10**6), ("vocab_size", 2**40), ("block_size", 2**20), ("n_embd", 2**20)]


def _ckpt(tmp_path: Path, **model) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512, **model)
    return ckpt.save_checkpoint(tmp_path / "run", 1, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})


def _lie(where: Path, key: str, value: int) -> None:
    meta = json.loads((where / "meta.json").read_text())
    meta["config"]["model"][key] = value
    (where / "meta.json").write_text(json.dumps(meta))


def no_build(monkeypatch):
    """Building the model described by meta.json is the allocation: it must never be reached."""
    def refuse(cfg):
        raise AssertionError(f"build_model reached with {cfg}")

    monkeypatch.setattr(gptforge.load, "build_model", refuse)
    monkeypatch.setattr(gptforge.training.recipe.Recipe, "build_model", lambda self, cfg: refuse(cfg))  # every recipe


@pytest.fixture(name="no_build")
def _no_build(monkeypatch):
    no_build(monkeypatch)


def test_the_header_is_read_without_loading_a_tensor(tmp_path):
    where = _ckpt(tmp_path)
    head = weights_header(where / "model.safetensors")
    sd = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512)).state_dict()
    assert head == {k: tuple(v.shape) for k, v in sd.items() if k != ckpt.TIED}
    check_weights_fit(where, GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512))


@pytest.mark.parametrize("key,value", HUGE)
@pytest.mark.parametrize("command", [["sample", "--max-new-tokens", "2", "--device", "cpu"], ["export", "hf"],
                                     ["eval", "--tasks", "arithmetic"]])
def test_a_huge_shape_in_meta_json_is_refused_naming_file_and_field(tmp_path, capsys, no_build, key, value, command):
    where = _ckpt(tmp_path)
    _lie(where, key, value)
    if command[0] == "export":
        command = [*command, "--out", str(tmp_path / "hf")]
    code = main([command[0], "--ckpt", str(where), *command[1:]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(where / "meta.json") in err and f"model.{key}={value}" in err


@pytest.mark.parametrize("key,value", HUGE)
def test_init_from_and_resume_check_the_shape_before_building(shard_dir, tmp_path, capsys, monkeypatch, key, value):
    from gptforge.training.loop import train
    from tests.conftest import tiny_config

    where = train(tiny_config(shard_dir, tmp_path / "run", max_steps=1)).last_checkpoint
    _lie(where, key, value)
    base = ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--train.device", "cpu",
            "--model.vocab_size", "512"]
    no_build(monkeypatch)
    assert main([*base, "--out", str(tmp_path / "ft"), "--init-from", str(where)]) == 2
    err = capsys.readouterr().err
    assert str(where / "meta.json") in err and f"model.{key}={value}" in err
    assert main(["train", "--resume", str(where), "--out", str(tmp_path / "cont")]) == 2  # the checkpoint's own model
    err = capsys.readouterr().err
    assert str(where / "meta.json") in err and f"model.{key}={value}" in err and len(err.strip().splitlines()) == 1


def test_a_tied_or_untied_head_and_a_missing_tensor(tmp_path):
    from gptforge.models.llama import LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=64, tie_embeddings=False)
    from gptforge.models.llama import Llama

    where = ckpt.save_checkpoint(tmp_path / "ll", 1, Llama(cfg), None, {"config": Config(model=cfg).to_dict()})
    check_weights_fit(where, cfg)  # an untied head is in the file, and expected
    with pytest.raises(ckpt.CheckpointError, match="model.intermediate_size=4096"):
        check_weights_fit(where, LlamaConfig(**{**cfg.__dict__, "intermediate_size": 4096}))
    with pytest.raises(ckpt.CheckpointError, match="ties lm_head.weight.*model.tie_embeddings"):
        check_weights_fit(where, LlamaConfig(**{**cfg.__dict__, "tie_embeddings": True}))


@pytest.mark.parametrize("damage", ["huge_header_length", "not_json", "offsets_past_the_end"])
def test_a_damaged_header_is_named(tmp_path, damage, capsys):
    where = _ckpt(tmp_path)
    f = where / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    if damage == "huge_header_length":
        raw = struct.pack("<Q", 1 << 60) + raw[8:]
    elif damage == "not_json":
        raw = raw[:8] + b"\xff" * n + raw[8 + n:]
    else:
        head = json.loads(raw[8:8 + n])
        name = next(k for k in head if k != "__metadata__")
        head[name]["data_offsets"][1] = 1 << 50
        body = json.dumps(head).encode().ljust(n)
        raw = raw[:8] + body[:n] + raw[8 + n:] if len(body) == n else struct.pack("<Q", len(body)) + body + raw[8 + n:]
    f.write_bytes(raw)
    meta = json.loads((where / "meta.json").read_text())
    meta.pop("files", None)  # an old checkpoint without checksums: the header check is what catches it
    (where / "meta.json").write_text(json.dumps(meta))
    assert main(["sample", "--ckpt", str(where), "--max-new-tokens", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "damaged" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("layers", [[999_999], list(range(20_000))])
def test_a_header_naming_many_layers_never_makes_the_model_that_large(tmp_path, monkeypatch, layers):
    """A hostile file whose header lists empty tensors for many layers (a few hundred KB): the work done
    is bounded by the file, and the model is never built with meta.json's n_layer (only one block)."""
    from safetensors.torch import save_file

    import gptforge.models.registry as registry

    where = _ckpt(tmp_path)
    save_file({f"transformer.h.{i}.ln_1.weight": torch.zeros(0) for i in layers}, str(where / "model.safetensors"))
    meta = json.loads((where / "meta.json").read_text())
    meta.pop("files")
    (where / "meta.json").write_text(json.dumps(meta))
    _lie(where, "n_layer", len(layers) if len(layers) > 1 else 10**6)
    built = []
    real = registry.build_model
    monkeypatch.setattr(registry, "build_model", lambda cfg: built.append(cfg.n_layer) or real(cfg))
    cfg = GPTConfig(**{**json.loads((where / "meta.json").read_text())["config"]["model"]})
    with pytest.raises(ckpt.CheckpointError, match=f"model.n_layer={cfg.n_layer}"):
        check_weights_fit(where, cfg)
    assert built in ([], [1])
