"""Issue 32's doors (a Hugging Face directory or GGUF file as a model source, import, export, LoRA) tried
as a careless and a hostile user: every damaged input is one line naming the file and the field, exit 2,
no traceback, before any weight is read. The tiny models are written by transformers' save_pretrained."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gptforge.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A 2-layer GQA LlamaForCausalLM, tied, saved by transformers (the reference writer of the format)."""
    d = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    c = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 tie_word_embeddings=True)
    transformers.LlamaForCausalLM(c).save_pretrained(d)
    return d


def _variant(src, dst, **fields):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# every field llama_config_from_hf reads, each given a value of the wrong kind: before the shared type gate
# a string rms_norm_eps or max_position_embeddings was a TypeError traceback, num_attention_heads 0 a
# ZeroDivisionError, tie_word_embeddings "no" a tied model, and a context of 10**15 loaded
@pytest.mark.parametrize("field, value", [
    ("num_attention_heads", 0), ("hidden_size", -32), ("vocab_size", 10**12), ("num_hidden_layers", True),
    ("intermediate_size", "64"), ("rms_norm_eps", "x"), ("rms_norm_eps", float("nan")), ("rms_norm_eps", -1.0),
    ("max_position_embeddings", "64"), ("max_position_embeddings", 10**15), ("num_key_value_heads", "2"),
    ("num_key_value_heads", 0), ("head_dim", 0.5), ("rope_theta", "x"), ("rope_theta", float("inf")),
    ("tie_word_embeddings", "no"), ("mlp_bias", "false"), ("max_window_layers", "2"), ("sliding_window", -1),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "x"}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": float("nan")}),
])
def test_a_config_field_of_the_wrong_kind_is_one_line_naming_it(llama_dir, tmp_path, capsys, field, value):
    d = _variant(llama_dir, tmp_path / "bad", **{field: value})
    assert main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    err = _one_line(capsys)
    named = f"{field}.rope_theta" if isinstance(value, dict) else field
    assert str(d / "config.json") in err and named in err, err


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64,
                                                         vocab_size=50257)).save_pretrained(d)
    return d


# a NaN layer_norm_epsilon passed the 1e-5 check (NaN compares false) and loaded with 1e-5, where
# transformers computes NaN; a tie_word_embeddings of "no" loaded tied
@pytest.mark.parametrize("field, value", [("layer_norm_epsilon", float("nan")), ("layer_norm_epsilon", True),
                                          ("tie_word_embeddings", "no")])
def test_a_gpt2_config_field_of_the_wrong_kind_is_one_line_naming_it(gpt2_dir, tmp_path, capsys, field, value):
    d = _variant(gpt2_dir, tmp_path / "bad", **{field: value})
    assert main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    err = _one_line(capsys)
    assert str(d / "config.json") in err and field in err, err


# a file given as --hf (its config.json, its weights) went to transformers' hub loader, which read config.json
# as the config and then torch.load-ed it as weights: a traceback, and a pickle reader gptforge never runs
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_file_given_as_a_hugging_face_directory_is_one_line(llama_dir, tmp_path, capsys, name):
    f = llama_dir / name
    assert main(["sample", "--hf", str(f), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    assert str(f) in _one_line(capsys)
    assert main(["import", "hf", "--model", str(f), "--out", str(tmp_path / "run")]) == 2
    assert str(f) in _one_line(capsys) and not (tmp_path / "run").exists()


# shapes were checked from the header, dtypes not: int8 or bool tensors were cast into the float model and sampled
@pytest.mark.parametrize("dtype, name", [(torch.int8, "I8"), (torch.bool, "BOOL"), (torch.int64, "I64")])
def test_weights_that_are_not_floats_are_refused_naming_the_tensor(llama_dir, gpt2_dir, tmp_path, capsys, dtype, name):
    from safetensors.torch import load_file, save_file

    for src in (llama_dir, gpt2_dir):
        d = _variant(src, tmp_path / src.name)
        sd = load_file(d / "model.safetensors")
        first = sorted(sd)[0]
        save_file({**sd, first: sd[first].to(dtype)}, d / "model.safetensors")
        assert main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
        err = _one_line(capsys)
        assert str(d / "model.safetensors") in err and first in err and name in err, err


@pytest.mark.parametrize("shard", ["..", ".", ""])
def test_a_weight_index_naming_a_folder_is_refused(llama_dir, tmp_path, capsys, shard):
    d = _variant(llama_dir, tmp_path / "sharded")
    (d / "model.safetensors").rename(d / "a.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
    assert main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    assert "model.safetensors.index.json" in _one_line(capsys)


# Ctrl-C during import/export/sample (a model being read, a file being written) was a KeyboardInterrupt
# traceback through whatever ran; only prepare, race and the training loop said so in one line
@pytest.mark.parametrize("argv", [["import", "hf", "--model", "M", "--out", "OUT"],
                                  ["export", "hf", "--hf", "M", "--out", "OUT"],
                                  ["sample", "--hf", "M", "--max-new-tokens", "1"]])
def test_ctrl_c_in_a_command_is_one_line_and_exit_130(llama_dir, tmp_path, capsys, monkeypatch, argv):
    import gptforge.load

    def interrupted(source, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(gptforge.load, "load_model", interrupted)
    argv = [str(llama_dir) if a == "M" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 130
    assert "interrupted" in _one_line(capsys)
    assert not (tmp_path / "out").exists()


# a local path that is not a folder (a symlink loop, a missing ./dir) went to the hub (network, a long wait
# offline) and came back as transformers' multi-line message
@pytest.mark.parametrize("kind", ["loop", "missing"])
def test_a_local_path_that_is_no_folder_never_reaches_the_hub(tmp_path, capsys, monkeypatch, kind):
    import transformers as tf

    def no_hub(*a, **k):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(tf.AutoConfig, "from_pretrained", no_hub)
    p = tmp_path / "m"
    if kind == "loop":
        p.symlink_to(p)
    assert main(["sample", "--hf", str(p), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    assert str(p) in _one_line(capsys)
    assert main(["sample", "--hf", "./nope/dir", "--max-new-tokens", "1"]) == 2
    assert "./nope/dir" in _one_line(capsys)


# the GGUF reader refused NaN or infinite weights; a save_pretrained directory holding them loaded and sampled
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(llama_dir, tmp_path, capsys, bad):
    from safetensors.torch import load_file, save_file

    d = _variant(llama_dir, tmp_path / "nan")
    sd = load_file(d / "model.safetensors")
    sd["model.norm.weight"][3] = bad
    save_file(sd, d / "model.safetensors")
    assert main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]) == 2
    err = _one_line(capsys)
    assert str(d / "model.safetensors") in err and "model.norm.weight" in err, err


# `import hf --model D --out D` wrote checkpoints/ into the Hugging Face folder it read (and --out D/sub
# inside it): a folder that is then both a model and a run. Refused before anything is read or written.
@pytest.mark.parametrize("out", [".", "sub", "sub/deeper"])
def test_import_never_writes_into_the_model_it_reads(llama_dir, tmp_path, capsys, out):
    d = shutil.copytree(llama_dir, tmp_path / "llama")
    before = sorted(p.name for p in d.iterdir())
    assert main(["import", "hf", "--model", str(d), "--out", str(d / out)]) == 2
    assert "--out" in (err := _one_line(capsys)) and "inside --model" in err
    assert sorted(p.name for p in d.iterdir()) == before
    assert main(["import", "hf", "--model", str(d), "--out", str(tmp_path / "run")]) == 0  # a folder of its own
