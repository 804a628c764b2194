"""Round 6, model in/out: a gptforge checkpoint is data like any Hugging Face folder or GGUF file, and an output
folder named by a relative path is still a folder. Each class here was a traceback or silently wrong output:

* a meta.json dimension past any model's size (n_embd 2^40) overflowed torch's size arithmetic in a traceback
  before the weights were compared: gptforge's own configs now bound every dimension as the HF readers do
  (``numbers.MAX_DIM``, in models/gpt2.py and models/llama.py);
* a checkpoint's NaN, infinite or integer weights loaded without a word (NaN sampled garbage; integers were
  cast into the float model), where the HF and GGUF readers refuse them: ``restore.load_model_weights``,
  the one reader of a checkpoint's weights (sample, eval, export, --init-from, --resume, a LoRA run's adapters);
* a LoRA checkpoint whose meta.json ``lora`` record is not an object (AttributeError) or whose saved
  lora.rank is 0 (ZeroDivisionError in alpha / rank): ``checkpoint.read_meta`` and ``load.lora_merged``;
* ``export --out .`` (ValueError: empty name), ``--out ..`` (the temporary landed inside the folder it
  was to replace and the carry-over copied it into itself: OSError, name too long), ``--out /``:
  ``storage.named`` gives every atomic writer a path with a name, and ``atomic_dir`` refuses the folder
  the command runs in (swapping it would leave the shell in a deleted folder that looks empty).
Plants tried: each bound, check and refusal removed in turn; the tests below fail for each."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gptforge.cli import main
from tests.conftest import tiny_chat_checkpoint


def _one_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    return err


def _rehash(step: Path) -> None:
    """meta.json's checksums made to match what was written: the damage is in the content, not the bytes."""
    meta = json.loads((step / "meta.json").read_text())
    for name in meta.get("files", {}):
        meta["files"][name] = hashlib.sha256((step / name).read_bytes()).hexdigest()
    (step / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory) -> Path:
    return tiny_chat_checkpoint(tmp_path_factory.mktemp("base") / "run")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# every door that loads a checkpoint's weights (each reads load.load_model -> restore.load_model_weights)
DOORS = {
    "sample": lambda ck, tmp: ["sample", "--ckpt", str(ck), "--max-new-tokens", "1", "--num-samples", "1"],
    "export hf": lambda ck, tmp: ["export", "hf", "--ckpt", str(ck), "--out", str(tmp / "e")],
}


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("key", ["n_embd", "vocab_size", "block_size", "n_head"])  # n_layer: bounded by the file
def test_a_dimension_no_model_has_is_named_not_a_traceback(key, door, base_ckpt, tmp_path, capsys):
    step = _copy(base_ckpt, tmp_path / "ck")
    meta = json.loads((step / "meta.json").read_text())
    meta["config"]["model"][key] = 2**40
    (step / "meta.json").write_text(json.dumps(meta))
    err = _one_line(capsys, main(DOORS[door](step, tmp_path)))
    assert "meta.json" in err and f"model.{key}={2**40}" in err and "at most" in err, err


@pytest.mark.parametrize("key", ["n_kv_head", "head_size", "intermediate_size", "sliding_window", "n_embd"])
def test_llama_config_bounds_every_dimension(key):
    from gptforge.models.llama import LlamaConfig
    from gptforge.numbers import MAX_DIM

    with pytest.raises(ValueError, match=f"model.{key}={MAX_DIM + 1} must be at most {MAX_DIM}"):
        LlamaConfig(**{"n_layer": 1, "n_head": 2, "n_embd": 32, key: MAX_DIM + 1})
    LlamaConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=MAX_DIM)  # the bound itself is allowed


DAMAGE = {
    "nan": lambda t: t.fill_(float("nan")),
    "inf": lambda t: t.fill_(float("inf")),
    "int32": lambda t: t.to(torch.int32),
    "bool": lambda t: t.to(torch.bool),
}


def _damage(step: Path, kind: str, pick=lambda names: names[0]) -> str:
    sd = load_file(step / "model.safetensors")
    name = pick(sorted(sd))
    out = DAMAGE[kind](sd[name])
    sd[name] = out if out is not None else sd[name]
    save_file(sd, step / "model.safetensors", metadata={"format": "pt"})
    _rehash(step)
    return name


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_non_finite_or_integer_checkpoint_weights_are_refused(kind, door, base_ckpt, tmp_path, capsys):
    step = _copy(base_ckpt, tmp_path / "ck")
    name = _damage(step, kind)
    err = _one_line(capsys, main(DOORS[door](step, tmp_path)))
    assert "model.safetensors" in err and f"tensor {name}" in err, err
    assert ("NaN or infinite" in err) if kind in ("nan", "inf") else (kind in err and "floats" in err), err
    assert not (tmp_path / "e").exists()


@pytest.fixture(scope="module")
def lora_ckpt(tmp_path_factory, base_ckpt) -> Path:
    d = tmp_path_factory.mktemp("lora")
    data = d / "conv.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i}+1?"},
                                                     {"role": "assistant", "content": str(i + 1)}]}) + "\n"
                            for i in range(12)))
    assert main(["sft", "--init-from", str(base_ckpt), "--data", str(data), "--out", str(d / "run"), "--steps", "1",
                 "--val-count", "2", "--lora.rank", "2", "--train.micro_batch", "2", "--train.seq_len", "32",
                 "--train.total_batch_tokens", "64", "--train.device", "cpu", "--train.compile", "false"]) == 0
    from gptforge.run.checkpoint import latest_checkpoint

    return latest_checkpoint(d / "run")


def _edit_meta(step: Path, edit) -> None:
    meta = json.loads((step / "meta.json").read_text())
    edit(meta)
    (step / "meta.json").write_text(json.dumps(meta))


LORA_DAMAGE = {
    "record a list": (lambda m: m.__setitem__("lora", [1]), "'lora' is list, not an object"),
    "record a string": (lambda m: m.__setitem__("lora", "yes"), "'lora' is str, not an object"),
    "record a number": (lambda m: m.__setitem__("lora", 3), "'lora' is int, not an object"),
    # named either where the header's record is compared (config.lora.rank = 0, but ... saved with 2: sample) or
    # by the LoRA reader's own check (lora.rank=0 in a LoRA checkpoint: export --adapters-only)
    "rank 0": (lambda m: m["config"]["lora"].__setitem__("rank", 0), re.compile(r"lora\.rank ?= ?0\b")),
}
LORA_DOORS = {
    "sample": DOORS["sample"],
    "export hf --adapters-only": lambda ck, tmp: ["export", "hf", "--ckpt", str(ck), "--out", str(tmp / "e"),
                                                  "--adapters-only"],
}


@pytest.mark.parametrize("door", list(LORA_DOORS))
@pytest.mark.parametrize("damage", list(LORA_DAMAGE))
def test_a_damaged_lora_record_is_named(damage, door, lora_ckpt, tmp_path, capsys):
    step = _copy(lora_ckpt, tmp_path / "ck")
    edit, words = LORA_DAMAGE[damage]
    _edit_meta(step, edit)
    err = _one_line(capsys, main(LORA_DOORS[door](step, tmp_path)))
    assert "meta.json" in err and (words.search(err) if isinstance(words, re.Pattern) else words in err), err


@pytest.mark.parametrize("kind", ["nan", "int32"])
def test_damaged_lora_adapters_are_refused(kind, lora_ckpt, tmp_path, capsys):
    step = _copy(lora_ckpt, tmp_path / "ck")
    name = _damage(step, kind, pick=lambda names: next(n for n in names if "lora_A" in n))
    err = _one_line(capsys, main(DOORS["sample"](step, tmp_path)))
    assert f"tensor {name}" in err, err


@pytest.mark.parametrize("out", [".", "..", "sub/..", "/"])
def test_an_output_folder_without_a_name_of_its_own(out, base_ckpt, tmp_path, monkeypatch, capsys):
    here = tmp_path / "parent" / "here"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    err = _one_line(capsys, main(["export", "llmc", "--ckpt", str(base_ckpt), "--out", out, "--force"]))
    assert f"--out {out}" in err, err
    assert "root of the filesystem" in err if out == "/" else "the folder this command runs in" in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written, nothing left


def test_storage_named_resolves_dots_and_refuses_the_root(tmp_path, monkeypatch):
    from gptforge.storage.guards import OutputExistsError, named

    monkeypatch.chdir(tmp_path)
    assert named(".") == tmp_path.resolve() and named("a/..") == tmp_path.resolve()
    assert named("..") == tmp_path.resolve().parent and named("x") == Path("x")
    with pytest.raises(OutputExistsError, match="root of the filesystem"):
        named("/")


# --- a tokenizer_config.json's named templates (transformers' list form) -----------------------------------

def _tokenizer_dir(tmp_path: Path, chat_template) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["the quick brown fox"] * 20, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path / "tok"
    d.mkdir()
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "chat_template": chat_template}))
    return d


USER_ONLY = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TEMPLATE_LISTS = {  # what transformers refuses, and the words gptforge's refusal carries
    "no default": ([{"name": "tool_use", "template": "x"}, {"name": "rag", "template": "y"}],
                   "none is named 'default'"),
    "an entry without its template": ([{"name": "default"}], "chat_template[0]"),
    "an entry that is text": (["{{ x }}"], "chat_template[0]"),
    "a template that is not text": ([{"name": "default", "template": 5}], "chat_template[0]"),
}


@pytest.mark.parametrize("case", list(TEMPLATE_LISTS))
def test_a_template_list_transformers_refuses_is_refused_not_dropped(case, tmp_path):
    """It was read as no template: the model's chat format silently replaced by whatever a command falls back to."""
    from gptforge.data.tokenizer import TokenizerError, load_tokenizer

    templates, words = TEMPLATE_LISTS[case]
    d = _tokenizer_dir(tmp_path, templates)
    with pytest.raises(TokenizerError, match="tokenizer_config.json") as e:
        load_tokenizer(d)
    assert words in str(e.value) and "\n" not in str(e.value)
    transformers = pytest.importorskip("transformers")  # the reference refuses the same lists
    with pytest.raises((ValueError, KeyError, TypeError)):
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_the_default_of_a_template_list_is_the_template(tmp_path):
    from gptforge.data.tokenizer import load_tokenizer

    d = _tokenizer_dir(tmp_path, [{"name": "tool_use", "template": "T"}, {"name": "default", "template": USER_ONLY}])
    assert load_tokenizer(d).chat_template == USER_ONLY
    transformers = pytest.importorskip("transformers")
    ref = transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
    assert ref.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"


def test_a_template_list_without_default_is_one_line_at_the_door(tmp_path, capsys):
    """Through `import hf` (the door that carries a model's template into a checkpoint): one line, no checkpoint."""
    hf = tmp_path / "hf"
    assert main(["export", "hf", "--random", "d2", "--out", str(hf)]) == 0
    tok = _tokenizer_dir(tmp_path, TEMPLATE_LISTS["no default"][0])
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (hf / f).write_bytes((tok / f).read_bytes())
    for f in ("vocab.json", "merges.txt"):
        (hf / f).unlink(missing_ok=True)
    capsys.readouterr()
    err = _one_line(capsys, main(["import", "hf", "--model", str(hf), "--out", str(tmp_path / "run")]))
    assert "tokenizer_config.json" in err and "none is named 'default'" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


# --- a sharded Hugging Face folder: its index and its shards --------------------------------------------------

@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf") / "llama"
    assert main(["export", "hf", "--random", "llama-tiny", "--out", str(d)]) == 0
    return d


def _sharded(src: Path, dst: Path, second_gets=None) -> Path:
    """``src`` split in two shards with an index; ``second_gets``: names the second shard holds (default: its half)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    sd = load_file(src / "model.safetensors")
    keys = sorted(sd)
    a, b = keys[: len(keys) // 2], keys[len(keys) // 2:]
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    save_file({k: sd[k] for k in a}, dst / names[0], metadata={"format": "pt"})
    save_file({k: sd[k] for k in (second_gets(keys) if second_gets else b)}, dst / names[1], metadata={"format": "pt"})
    wm = {**{k: names[0] for k in a}, **{k: names[1] for k in b}}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return dst


SHARD_DAMAGE = {
    "a shard missing": (lambda d: (d / "model-00002-of-00002.safetensors").unlink(),
                        "names 1 weight file(s) this directory lacks (model-00002-of-00002.safetensors)"),
    "a weight in two shards": (None, "refusing to pick one of two copies"),
}


@pytest.mark.parametrize("damage", list(SHARD_DAMAGE))
def test_a_sharded_folder_that_is_incomplete_or_ambiguous(damage, hf_llama, tmp_path, capsys):
    edit, words = SHARD_DAMAGE[damage]
    second = (lambda keys: keys) if damage == "a weight in two shards" else None  # the second shard holds every weight
    d = _sharded(hf_llama, tmp_path / "hf", second)
    if edit:
        edit(d)
    capsys.readouterr()
    err = _one_line(capsys, main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]))
    assert words in err, err


def test_a_sharded_folder_that_is_whole_loads(hf_llama, tmp_path):
    from gptforge.load import ModelSource, load_model

    d = _sharded(hf_llama, tmp_path / "hf")
    one = load_model(ModelSource(hf=str(hf_llama)))
    two = load_model(ModelSource(hf=str(d)))
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values(), strict=True))


def test_a_gpt2_weight_under_both_of_its_names_is_refused(tmp_path, capsys):
    """GPT2Model's files name blocks h.0.*, GPT2LMHeadModel's transformer.h.0.*: both in one file was a silent pick."""
    d = tmp_path / "hf"
    assert main(["export", "hf", "--random", "d2", "--out", str(d)]) == 0
    sd = load_file(d / "model.safetensors")
    sd["h.0.ln_1.weight"] = torch.zeros_like(sd["transformer.h.0.ln_1.weight"])
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    err = _one_line(capsys, main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]))
    assert "ln_1.weight" in err and "two copies" in err, err


# --- NaN weights, whatever the file they come in -------------------------------------------------------------

def _nan_llmc(tmp_path: Path) -> list[str]:
    import struct

    d = tmp_path / "llmc"
    assert main(["export", "llmc", "--random", "d2", "--out", str(d)]) == 0
    raw = bytearray((d / "model.bin").read_bytes())
    raw[1024 + 4 * 100: 1024 + 4 * 101] = struct.pack("<f", float("nan"))  # one weight of wte
    (d / "model.bin").write_bytes(bytes(raw))
    return ["--llmc", str(d / "model.bin")]


def _nan_hf(tmp_path: Path) -> list[str]:
    d = tmp_path / "hf"
    assert main(["export", "hf", "--random", "d2", "--out", str(d)]) == 0
    sd = load_file(d / "model.safetensors")
    sd["transformer.wte.weight"][3, 3] = float("inf")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    return ["--hf", str(d)]


def _nan_ckpt(tmp_path: Path) -> list[str]:
    step = tiny_chat_checkpoint(tmp_path / "run")
    sd = load_file(step / "model.safetensors")
    sd["transformer.wte.weight"][3, 3] = float("nan")
    save_file(sd, step / "model.safetensors", metadata={"format": "pt"})
    _rehash(step)
    return ["--ckpt", str(step)]


NAN_SOURCES = {"llm.c": _nan_llmc, "Hugging Face": _nan_hf, "checkpoint": _nan_ckpt}


@pytest.mark.parametrize("source", list(NAN_SOURCES))
def test_one_non_finite_weight_is_refused_by_every_reader(source, tmp_path, capsys):
    """The GGUF reader's own test is tests/interop (its dequantizer checks each tensor); these are the others."""
    flags = NAN_SOURCES[source](tmp_path)
    capsys.readouterr()
    err = _one_line(capsys, main(["sample", *flags, "--max-new-tokens", "1", "--num-samples", "1"]))
    assert "NaN or infinite" in err and "wte" in err, err


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["folder", "dangling link"])
def test_a_weights_file_that_is_not_a_file_is_called_what_it_is(name, kind, hf_llama, tmp_path, capsys):
    """It was "no model.safetensors (or model.safetensors.index.json)": the entry is there."""
    d = tmp_path / "hf"
    d.mkdir()
    for f in hf_llama.iterdir():
        if f.name != "model.safetensors":
            (d / f.name).write_bytes(f.read_bytes())
    if kind == "folder":
        (d / name).mkdir()
    else:
        (d / name).symlink_to(tmp_path / "gone")
    capsys.readouterr()
    err = _one_line(capsys, main(["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"]))
    assert str(d / name) in err and ("a folder, not a file" if kind == "folder" else "a symlink to a missing file") in err
    assert "no model.safetensors" not in err, err


# --- an export never writes a value its type cannot hold ------------------------------------------------------

@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("value", [1e5, -7e4])
def test_a_float16_export_of_a_weight_past_its_range_is_refused(fmt, value, base_ckpt, tmp_path, capsys):
    """It was written as inf (hf silently; gguf with numpy's overflow warning): a file every reader refuses."""
    if fmt == "gguf":
        pytest.importorskip("gguf")
    step = _copy(base_ckpt, tmp_path / "ck")
    sd = load_file(step / "model.safetensors")
    sd["transformer.h.0.mlp.c_fc.weight"][0, 0] = value
    save_file(sd, step / "model.safetensors", metadata={"format": "pt"})
    _rehash(step)
    capsys.readouterr()
    err = _one_line(capsys, main(["export", fmt, "--ckpt", str(step), "--out", str(tmp_path / "e"), "--dtype", "float16"]))
    assert "c_fc.weight" in err and "65504" in err and "bfloat16" in err, err
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e.*"))
    # the same weight at float16's largest value is exported, and read back as written
    sd["transformer.h.0.mlp.c_fc.weight"][0, 0] = 65504.0 if value > 0 else -65504.0
    save_file(sd, step / "model.safetensors", metadata={"format": "pt"})
    _rehash(step)
    assert main(["export", "hf", "--ckpt", str(step), "--out", str(tmp_path / "ok"), "--dtype", "float16"]) == 0
    back = load_file(tmp_path / "ok" / "model.safetensors")["transformer.h.0.mlp.c_fc.weight"]
    assert back.dtype == torch.float16 and float(back.T[0, 0]) == sd["transformer.h.0.mlp.c_fc.weight"][0, 0].item()


def test_a_reward_model_export_refuses_a_dtype_it_would_not_write(base_ckpt, tmp_path, capsys):
    """export_reward_hf writes float32 whatever --dtype said: the flag was dropped without a word."""
    from gptforge.eval.tasks.preferences import preference_set, write_preferences

    prefs = write_preferences(preference_set("compare", 12, seed=1), tmp_path / "prefs.jsonl")
    assert main(["rm", "--init-from", str(base_ckpt), "--out", str(tmp_path / "rm"), "--data", str(prefs),
                 "--val-count", "4", "--micro-batch", "4", "--steps", "1", "--device", "cpu", "--ckpt-every", "0"]) == 0
    capsys.readouterr()
    for dtype in ("float16", "bf16"):
        err = _one_line(capsys, main(["export", "hf", "--ckpt", str(tmp_path / "rm"), "--out", str(tmp_path / "e"),
                                      "--dtype", dtype]))
        assert f"--dtype {dtype}" in err and "float32 only" in err, err
        assert not (tmp_path / "e").exists()
    assert main(["export", "hf", "--ckpt", str(tmp_path / "rm"), "--out", str(tmp_path / "e"), "--dtype", "float32"]) == 0
    assert {t.dtype for t in load_file(tmp_path / "e" / "model.safetensors").values()} == {torch.float32}


# --- a peft adapter folder given where a model is read ----------------------------------------------------------

PEFT_DOORS = {
    "sample --hf": lambda d, tmp: ["sample", "--hf", str(d), "--max-new-tokens", "1", "--num-samples", "1"],
    "import hf": lambda d, tmp: ["import", "hf", "--model", str(d), "--out", str(tmp / "imp")],
    "export gguf --hf": lambda d, tmp: ["export", "gguf", "--hf", str(d), "--out", str(tmp / "exp")],
    "sft --init-from": lambda d, tmp: ["sft", "--init-from", str(d), "--data", str(tmp / "none.jsonl"), "--out",
                                       str(tmp / "sft")],
}


@pytest.fixture(scope="module")
def peft_dir(lora_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("peft") / "adapters"
    assert main(["export", "hf", "--ckpt", str(lora_ckpt), "--out", str(out), "--adapters-only"]) == 0
    assert (out / "adapter_config.json").is_file() and not (out / "config.json").exists()
    return out


@pytest.mark.parametrize("door", list(PEFT_DOORS))
def test_a_peft_adapter_folder_is_called_what_it_is(door, peft_dir, tmp_path, capsys):
    """It was "no config.json" (sample, import, export) or "holds no complete checkpoint" (--init-from)."""
    if door.startswith("export gguf"):
        pytest.importorskip("gguf")
    capsys.readouterr()
    err = _one_line(capsys, main(PEFT_DOORS[door](peft_dir, tmp_path)))
    assert f"{peft_dir}: a peft LoRA adapter folder" in err and "merge_and_unload" in err, err
    assert "no complete checkpoint" not in err and "no config.json" not in err, err


# --- an export written over the model it reads -----------------------------------------------------------------

def _source(kind: str, tmp_path: Path) -> tuple[list[str], Path]:
    """A model of each file kind export reads: (its flags, the folder holding it)."""
    d = tmp_path / "model"
    fmt = {"--hf": "hf", "--gguf": "gguf", "--llmc": "llmc"}[kind]
    assert main(["export", fmt, "--random", "d2", "--out", str(d), "--no-tokenizer"] if fmt == "hf" else
                ["export", fmt, "--random", "d2", "--out", str(d)]) == 0
    path = d if fmt == "hf" else next(p for p in d.iterdir() if p.suffix in (".gguf", ".bin") and p.name != "tokenizer.bin")
    return [kind, str(path)], d


# (source kind, where --out is relative to the folder holding the model, what the refusal says): an HF folder
# is the model, so --out may be neither it, inside it, nor around it; a file model's folder holds it
OWN = [("--hf", ".", "is"), ("--hf", "sub", "is inside"), ("--hf", "..", "holds"),
       ("--gguf", ".", "holds"), ("--gguf", "..", "holds"), ("--llmc", ".", "holds"), ("--llmc", "..", "holds")]


@pytest.mark.parametrize("kind,rel,how", OWN)
def test_an_export_over_its_own_source_is_refused(kind, rel, how, tmp_path, capsys):
    """--out the model's own folder, a folder inside it, or one around it: the export is swapped in over --out, so
    with --force it replaced the files it read (an HF folder's float32 weights rewritten as float16). Refused
    before loading, with --force, for each format written, the source untouched; a folder beside a file model
    (it does not hold it) and a folder elsewhere are fine."""
    flags, d = _source(kind, tmp_path)
    out = d.parent if rel == ".." else d / rel if rel != "." else d
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    capsys.readouterr()
    for fmt in ("hf", "gguf"):
        err = _one_line(capsys, main(["export", fmt, *flags, "--out", str(out), "--force", "--dtype", "float16"]))
        assert f"{how} {kind} {flags[1]}" in err and "folder of its own" in err, err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before and not (d / "sub").exists()
    ok = d / "beside" if kind != "--hf" else tmp_path / "elsewhere"
    assert main(["export", "hf", *flags, "--out", str(ok), "--dtype", "float16"]) == 0
