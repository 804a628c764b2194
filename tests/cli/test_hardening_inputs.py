"""Issue 11 (hardening), data / config / operator mistakes: bad input is refused before any compute
with one line that names the file, key or flag; diverged numbers are written as standard JSON."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config, ConfigError, OptimConfig, apply_overrides
from gptforge.presets import get_preset
from gptforge.run.metrics import MetricsLog, read_metrics


def _strict_json(line: str) -> dict:
    """Python's json accepts NaN/Infinity; standard JSON (jq, browsers) does not."""
    def refuse(token: str):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(line, parse_constant=refuse)


# --- item 6: non-finite config floats, standard JSON in metrics.jsonl --------------------------------

@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "1e999"])
@pytest.mark.parametrize("key", ["optim.lr", "optim.grad_clip", "dist.timeout", "train.peak_flops",
                                 "model.dropout"])
def test_non_finite_float_override_is_refused_naming_the_key(key, raw):
    with pytest.raises(ConfigError, match=f"--{key} .*finite"):
        apply_overrides(get_preset("tiny"), [f"--{key}", raw])


def test_non_finite_float_in_a_saved_config_is_refused():
    d = Config().to_dict()
    d["optim"]["eps"] = math.nan  # e.g. a hand-edited meta.json / config.json
    with pytest.raises(ConfigError, match="optim.eps=nan"):
        Config.from_dict(d)
    cfg = Config()
    cfg.optim = OptimConfig()
    cfg.optim.weight_decay = math.inf  # set after construction, as a preset function could
    with pytest.raises(ConfigError, match="optim.weight_decay=inf"):
        cfg.validate()


def test_cli_lr_inf_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "tiny", "--optim.lr", "inf"]) == 2
    assert "--optim.lr 'inf'" in capsys.readouterr().err


def test_metrics_log_writes_standard_json_for_non_finite_values(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write("train", 3, loss=math.nan, lr=1e-3, grad_norm=math.inf, mfu=None,
              tasks={"hellaswag": -math.inf}, hist=[1.0, math.nan])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rec = _strict_json(lines[0])
    assert rec["loss"] is None and rec["loss_str"] == "nan"
    assert rec["grad_norm"] is None and rec["grad_norm_str"] == "inf"
    assert rec["tasks"] == {"hellaswag": None, "hellaswag_str": "-inf"}
    assert rec["hist"] == [1.0, None] and rec["lr"] == 1e-3 and rec["mfu"] is None
    assert read_metrics(tmp_path)[0]["loss_str"] == "nan"  # the reader everything else uses


# --- item 2: token ids against the model's vocabulary, checked when the shards are opened ------------

def _bad_val(shard_dir, bad_id: int, at: int = 1234):
    from gptforge.data.shards import read_shard, write_shard

    path = shard_dir / "toy_val_000000.bin"
    toks = np.array(read_shard(path, mmap=False), dtype=np.int64)
    toks[at] = bad_id
    write_shard(path, toks)
    return path


def test_out_of_vocab_id_in_the_val_shard_is_refused_before_any_step(shard_dir, tmp_path):
    from gptforge.data.shards import TokenRangeError
    from gptforge.training.loop import train
    from tests.conftest import tiny_config

    path = _bad_val(shard_dir, 600)  # the model has 512 ids
    cfg = tiny_config(shard_dir, tmp_path / "run")
    with pytest.raises(TokenRangeError) as e:
        train(cfg)
    msg = str(e.value)
    assert str(path) in msg and "token id 600 at token offset 1234" in msg and "model.vocab_size=512" in msg
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before the first step


def test_ids_in_the_padded_vocabulary_range_are_refused(tmp_path):
    from gptforge.data.loader import ShardLoader
    from gptforge.data.shards import TokenRangeError, write_shard
    from gptforge.models.gpt2 import GPTConfig

    cfg = GPTConfig(vocab_size=50257, pad_vocab=True)
    assert cfg.padded_vocab_size == 50304  # the model has rows for 50300, but they are padding
    toks = np.full(1000, 50256, dtype=np.int64)
    toks[777] = 50300
    path = write_shard(tmp_path / "x_train_000000.bin", toks)
    with pytest.raises(TokenRangeError, match="token id 50300 at token offset 777"):
        ShardLoader([path], B=2, T=8, vocab_size=cfg.vocab_size)
    ShardLoader([path], B=2, T=8, vocab_size=50301)  # in range: accepted


def test_cli_vocab_smaller_than_the_data_exits_2_naming_both(shard_dir, tmp_path, capsys, monkeypatch):
    """Item 8: --model.vocab_size below the data's largest id (here 511) names both numbers."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--model.vocab_size", "300",
            "--train.device", "cpu", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "model.vocab_size=300" in err and "largest id in this shard is 511" in err
    assert len(err.strip().splitlines()) == 1


# --- item 8: operator mistakes, one line and exit 2 before compute -----------------------------------

def _train_argv(shard_dir, out, *extra):
    device = [] if "--train.device" in extra else ["--train.device", "cpu"]  # a key given twice is refused
    return ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--model.vocab_size", "512",
            *device, "--out", str(out), *extra]


def _one_line_exit_2(argv, capsys, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def test_out_is_a_file(shard_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    _one_line_exit_2(_train_argv(shard_dir, tmp_path / "afile"), capsys, "train.out_dir=", "afile", "is a file")
    _one_line_exit_2(_train_argv(shard_dir, tmp_path / "afile" / "run"), capsys, "cannot be created", "is a file")


def test_out_on_a_filesystem_that_cannot_be_written(shard_dir, tmp_path, capsys, monkeypatch):
    """sysfs refuses new entries even to root (chmod would not stop root)."""
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(_train_argv(shard_dir, "/sys/gptforge-run"), capsys, "/sys/gptforge-run", "cannot be written")


def test_out_on_a_read_only_filesystem(shard_dir, tmp_path, capsys, monkeypatch):
    import errno
    import tempfile

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    _one_line_exit_2(_train_argv(shard_dir, tmp_path / "run"), capsys, "Read-only file system")
    assert not (tmp_path / "run").exists()


def test_device_cuda_without_cuda(shard_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    _one_line_exit_2(_train_argv(shard_dir, tmp_path / "run", "--train.device", "cuda"), capsys,
                     "train.device='cuda'", "CUDA is not available")
    _one_line_exit_2(_train_argv(shard_dir, tmp_path / "run", "--train.device", "gpu0"), capsys,
                     "train.device='gpu0' is not a device")


def test_device_refusals_name_the_flag_the_command_takes(tmp_path, capsys, monkeypatch):
    """Commands with ``--device`` (eval, sample, chat, export, prepare preferences --policy) name it when they
    refuse a device, not the training config key they do not have."""
    from tests.conftest import tiny_chat_checkpoint

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    ck = str(tiny_chat_checkpoint(tmp_path / "m"))
    for argv in (["eval", "--ckpt", ck, "--tasks", "arithmetic", "--limit", "1"],
                 ["eval", "--ckpt", ck, "--tasks", "hellaswag", "--limit", "1"],
                 ["sample", "--ckpt", ck, "--max-new-tokens", "1"],
                 ["chat", "--ckpt", ck, "--max-new-tokens", "1"]):
        for dev, words in (("cuda", "CUDA is not available here; use --device cpu or auto"),
                           ("gpu0", "is not a device")):
            _one_line_exit_2([*argv, "--device", dev], capsys, f"--device={dev!r}", words)


def test_meta_json_missing_keys(shard_dir, tmp_path, capsys, monkeypatch):
    from gptforge.training.loop import train
    from tests.conftest import tiny_config

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    train(tiny_config(shard_dir, run, max_steps=2, val_every=0))
    meta_path = next((run / "checkpoints").glob("step_*")) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "loader"}))
    _one_line_exit_2(["train", "--out", str(run), "--resume", "--train.max_steps", "3"], capsys,
                     "meta.json: missing key(s) 'loader'")
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    _one_line_exit_2(["sample", "--ckpt", str(run)], capsys, "meta.json: missing key(s) 'config'")


def test_llmc_header_sizes_are_exact_past_int64(tmp_path):
    """(L, 3C, C) with C = 2^31-1 is ~1.4e19 parameters: past int64, where numpy's product wraps."""
    from gptforge.interop.llmc import LlmcFormatError, read_model_header

    C = 2**31 - 1
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, 3, 1, 1, 1, 1, C, 1]  # magic, version, maxT, V, L, NH, C, Vp
    path = tmp_path / "model.bin"
    path.write_bytes(header.tobytes() + bytes(64))
    exact = sum(math.prod(s) for s in [(1, C), (1, C), (C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,),
                                       (4 * C, C), (4 * C,), (C, 4 * C), (C,), (C,), (C,)])
    assert exact > 2**63
    with pytest.raises(LlmcFormatError, match=f"implies {exact:,} parameters"):
        read_model_header(path)


# --- item 10: a Hugging Face directory of another architecture is refused, not sampled at random ---

def test_hf_directory_of_another_family_is_refused_naming_its_model_type(tmp_path, capsys, monkeypatch):
    """A family gptforge does not implement (Mixtral: experts; Llama, Qwen2/3, Mistral, Phi-3 and Gemma 2/3
    now load, see test_llama.py and test_llama_families.py)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    monkeypatch.chdir(tmp_path)
    cfg = MixtralConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                        num_local_experts=2, num_experts_per_tok=1)
    MixtralForCausalLM(cfg).save_pretrained(tmp_path / "mixtral")
    capsys.readouterr()  # save_pretrained's progress bar
    _one_line_exit_2(["sample", "--hf", str(tmp_path / "mixtral"), "--max-new-tokens", "2"], capsys,
                     "model_type 'mixtral'", "gpt2")


def test_hf_gpt2_directory_with_missing_weights_is_refused(tmp_path, capsys, monkeypatch):
    from safetensors.torch import load_file, save_file

    from gptforge.interop.hf import export_hf
    from gptforge.models.gpt2 import GPT, GPTConfig

    monkeypatch.chdir(tmp_path)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    export_hf(model, tmp_path / "hf", tokenizer=False)
    assert main(["sample", "--hf", str(tmp_path / "hf"), "--max-new-tokens", "2", "--seed", "1"]) == 0  # intact
    capsys.readouterr()
    weights = tmp_path / "hf" / "model.safetensors"
    sd = load_file(weights)
    sd = {k: v for k, v in sd.items() if ".h.1.mlp.c_fc" not in k}
    save_file(sd, weights, metadata={"format": "pt"})
    _one_line_exit_2(["sample", "--hf", str(tmp_path / "hf"), "--max-new-tokens", "2"], capsys,
                     "do not fit GPT-2", "h.1.mlp.c_fc")


def test_readers_accept_a_diverged_runs_metrics(tmp_path):
    """plot and the web page's loss curve read the null + loss_str records without failing."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("fastapi")
    from gptforge.plot import plot_runs
    from gptforge.serve.app import read_loss_curve

    run = tmp_path / "run"
    run.mkdir()
    log = MetricsLog(run / "metrics.jsonl")
    for step, loss in [(1, 5.0), (2, 4.0), (3, math.nan), (4, math.inf)]:
        log.write("train", step, loss=loss, lr=1e-3, tokens=step * 100)
    log.write("val", 2, val_loss=math.nan, tokens=200)
    curve = read_loss_curve(run / "metrics.jsonl")
    assert curve["train"] == [[1, 5.0], [2, 4.0]] and curve["val"] == []
    assert plot_runs([str(run)], tmp_path / "curves.png").stat().st_size > 0
