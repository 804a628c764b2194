"""The resume path's pieces (gptforge.run.resume) called directly, each against a hand-written expectation
(issue 36: the `run` mutation lane's fast tests): the notice's exact words and its learning rates from
llm.c's warmup + cosine (and modded-nanogpt's warmup-stable-decay) written out here in float64, the
recipe and config read from old meta.json layouts, model paths made absolute, model identity by the
weights' sha256 (hashlib), and a resumed config's overrides, frozen keys, output directory and trust.
No training runs; each test takes milliseconds."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil

import pytest
import torch

from gptforge.config import Config, ConfigError
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.run import resume


def _cfg(max_steps=10, lr=1e-3, warmup=2, min_frac=0.1, schedule="cosine", cooldown=0.4) -> Config:
    c = Config()
    c.train.max_steps = max_steps
    c.optim.lr, c.optim.warmup_steps, c.optim.min_lr_frac = lr, warmup, min_frac
    c.optim.schedule, c.optim.cooldown_frac = schedule, cooldown
    return c


def _cosine(step, lr, warmup, min_frac, max_steps):
    """llm.c's train_gpt2.cu get_learning_rate, 0-based step, written out."""
    lo = lr * min_frac
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= max_steps:
        return lo
    return lo + 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (max_steps - warmup))) * (lr - lo)


# --- the notice --------------------------------------------------------------------------------------


@pytest.mark.parametrize("under_checkpoints", [True, False])
def test_a_finished_run_is_complete_and_says_how_to_extend_it(tmp_path, under_checkpoints):
    run = tmp_path / "run"
    where = run / "checkpoints" / "step_000004" if under_checkpoints else run
    shown = run if under_checkpoints else where
    for step in (4, 5):  # at train.max_steps, or past it
        complete, msg = resume.resume_notice(_cfg(4), _cfg(4), step, where)
        assert complete is True
        assert msg == (f"run {shown} is complete: its newest checkpoint ({where.name}) is at step {step} of "
                       f"train.max_steps 4; nothing to train. To train further: gptforge train --out {shown} --resume "
                       f"--train.max_steps {2 * step} (the LR schedule is stretched to the new length). To use it: "
                       f"gptforge sample --ckpt {shown}")
    assert resume.resume_notice(_cfg(4), _cfg(4), 3, where) == (False, None)  # one step left: nothing to say
    assert resume.resume_notice(_cfg(1), _cfg(1), 1, where)[1].count("--train.max_steps 2 (") == 1  # 2 x 1


def test_a_changed_model_is_not_called_complete(tmp_path):
    saved, cfg = _cfg(4), _cfg(4)
    cfg.model = GPTConfig(n_layer=saved.model.n_layer + 1)
    assert resume.resume_notice(saved, cfg, 4, tmp_path / "run") == (False, None)  # checked against the weights later


@pytest.mark.parametrize("step", [1, 5, 10, 12])  # in the old warmup, in the old decay, at its end, past it
def test_extending_states_the_old_and_new_learning_rates(tmp_path, step):
    saved = _cfg(10, lr=1e-3, warmup=2, min_frac=0.1)
    cfg = _cfg(20, lr=3e-3, warmup=3, min_frac=0.2)  # overrides of the optimizer apply to the new schedule only
    complete, msg = resume.resume_notice(saved, cfg, step, tmp_path / "run" / "checkpoints" / "s")
    before = _cosine(step, 1e-3, 2, 0.1, 10) if step < 10 else 1e-3 * 0.1
    after = _cosine(step, 3e-3, 3, 0.2, 20)
    assert not complete
    assert msg == (f"extending the run from train.max_steps 10 to 20: the LR schedule (warmup + cosine) is stretched "
                   f"over 20 steps, so the log's first line (step {step + 1}) shows lr {after:.2e} (the old schedule "
                   f"had {before:.2e}); it decays to {3e-3 * 0.2:.2e} at step 20")


def test_a_run_that_ended_inside_its_warmup_had_its_final_lr(tmp_path):
    """The old schedule at its end is min_lr, even where the warmup was longer than the run (the formula
    would still be warming up there)."""
    saved = _cfg(4, lr=1e-3, warmup=10, min_frac=0.1)
    cfg = _cfg(8, lr=1e-3, warmup=10, min_frac=0.1)
    _, msg = resume.resume_notice(saved, cfg, 4, tmp_path / "r")
    assert f"(the old schedule had {1e-4:.2e})" in msg and f"shows lr {1e-3 * 5 / 10:.2e}" in msg


def test_shortening_a_wsd_run_says_compressed(tmp_path):
    saved = _cfg(20, lr=1e-3, warmup=2, min_frac=0.0, schedule="wsd", cooldown=0.5)
    cfg = _cfg(12, lr=1e-3, warmup=2, min_frac=0.0, schedule="wsd", cooldown=0.5)
    # wsd at step 9 of 12: cooldown round(0.5 * 12) = 6 steps, 3 left -> lr * 3/6; of 20: 11 left > 10 -> lr
    complete, msg = resume.resume_notice(saved, cfg, 9, tmp_path / "r")
    assert not complete
    assert msg == ("shortening the run from train.max_steps 20 to 12: the LR schedule (warmup, stable, linear cooldown) "
                   f"is compressed over 12 steps, so the log's first line (step 10) shows lr {1e-3 * 3 / 6:.2e} (the old "
                   f"schedule had {1e-3:.2e}); it decays to {0.0:.2e} at step 12")


@pytest.mark.parametrize("rank,printed", [(None, True), ("0", True), ("1", False)])
def test_check_resume_prints_on_rank_0_only(tmp_path, capsys, monkeypatch, rank, printed):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert resume.check_resume(_cfg(4), _cfg(4), 4, tmp_path / "run") is True
    out = capsys.readouterr().out
    assert (out.startswith(f"run {tmp_path / 'run'} is complete") and out.endswith("\n")) == printed and \
        (out == "") != printed
    assert resume.check_resume(_cfg(4), _cfg(4), 3, tmp_path / "run") is False
    assert capsys.readouterr().out == ""


# --- what a checkpoint's meta.json says ----------------------------------------------------------------


def test_recipe_of_reads_the_recipe_or_the_old_keys():
    assert resume.recipe_of({"recipe": "dpo", "rl": {}}) == "dpo"
    assert resume.recipe_of({"recipe": None, "rl": {}}) == "grpo"  # only a string names a recipe
    assert resume.recipe_of({"rl": {}, "sft": {}}) == "grpo"
    assert resume.recipe_of({"sft": {}}) == "sft"
    assert resume.recipe_of({"config": {}}) == "pretrain"


def _old_config() -> dict:
    return {k: v for k, v in _cfg(10).to_dict().items() if k not in ("sft", "rl")}


def test_saved_config_reads_the_flat_rl_settings_of_old_checkpoints():
    legacy = {"steps": 4, "lr": 2e-4, "warmup_steps": 3, "weight_decay": 0.05, "grad_clip": 0.5, "ckpt_every": 7,
              "keep_ckpts": 5, "seed": 11, "device": "cpu", "micro_batch": 6, "out_dir": "elsewhere",
              "group": 3, "kl_coef": 0.02}
    meta = {"config": _old_config(), "rl": dict(legacy), "sft": {"val_count": 16, "seed": 3}}
    before = json.dumps(meta, sort_keys=True)
    cfg = resume.saved_config(meta)
    assert json.dumps(meta, sort_keys=True) == before  # the meta it was given is not modified
    assert (cfg.train.max_steps, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.weight_decay, cfg.optim.grad_clip,
            cfg.train.ckpt_every, cfg.train.keep_ckpts, cfg.train.seed, cfg.train.device, cfg.train.micro_batch,
            cfg.train.out_dir) == (4, 2e-4, 3, 0.05, 0.5, 7, 5, 11, "cpu", 6, "elsewhere")
    assert (cfg.rl.group, cfg.rl.kl_coef) == (3, 0.02)
    assert (cfg.sft.val_count, cfg.sft.seed) == (16, 3)
    # the config's own sections win over settings beside it
    new = _cfg(10).to_dict()
    new["rl"]["group"], new["sft"]["val_count"], new["train"]["max_steps"] = 5, 8, 9
    cfg = resume.saved_config({"config": new, "rl": {"group": 7, "steps": 4}, "sft": {"val_count": 16}})
    assert (cfg.rl.group, cfg.sft.val_count, cfg.train.max_steps) == (5, 8, 9)
    # a config without the sections the flat settings move to: they are made
    bare = {k: v for k, v in _old_config().items() if k not in ("train", "optim")}
    cfg = resume.saved_config({"config": bare, "rl": {"steps": 4, "lr": 2e-4, "group": 3}})
    assert (cfg.train.max_steps, cfg.optim.lr, cfg.rl.group, cfg.train.seq_len) == (4, 2e-4, 3, Config().train.seq_len)
    defaults = Config()
    cfg = resume.saved_config({"config": _old_config(), "sft": None})  # null: no settings beside the config
    assert (cfg.rl.group, cfg.sft.val_count) == (defaults.rl.group, defaults.sft.val_count)
    for key, bad in (("rl", "not a dict"), ("sft", [16]), ("rl", 3)):  # damaged: refused, not defaults in silence
        with pytest.raises(ConfigError, match=rf"^m/meta.json: {key} = {re.escape(repr(bad))}: expected an object"):
            resume.saved_config({"config": _old_config(), key: bad}, where="m/meta.json")
    # where the config has the section, the flat settings beside it are never read, damaged or not
    assert resume.saved_config({"config": _cfg(10).to_dict(), "rl": "x"}).rl.group == _cfg(10).rl.group



@pytest.mark.parametrize("conf,field,shown", [([1, 2], "config", "[1, 2]"), ("optim", "config", "'optim'"),
                                              (None, "config", "None"), ("missing", "config", "None")])
def test_a_saved_config_that_is_not_an_object_is_refused_naming_the_file(conf, field, shown):
    meta = {"step": 1} if conf == "missing" else {"config": conf, "step": 1}
    with pytest.raises(ConfigError) as e:
        resume.saved_config(meta, "run/checkpoints/step_000001/meta.json")
    assert str(e.value) == (f"run/checkpoints/step_000001/meta.json: {field} = {shown}: expected an object "
                            "(the saved config is damaged)")


@pytest.mark.parametrize("section", ["model", "optim", "train", "rl", "lora"])
@pytest.mark.parametrize("value", [[1], "x", True, None])
def test_a_saved_config_section_or_value_of_the_wrong_type_is_refused_naming_the_file_and_the_field(section, value):
    d = _cfg(10).to_dict()
    d[section] = value
    with pytest.raises(ConfigError) as e:
        resume.saved_config({"config": d}, "R/meta.json")
    assert str(e.value) == f"R/meta.json: config.{section} = {value!r}: expected an object (the saved config is damaged)"
    d = _cfg(10).to_dict()
    d["optim"]["lr"], d["extra"] = value, "an unknown section is not read"
    with pytest.raises(ConfigError) as e:
        resume.saved_config({"config": d}, "R/meta.json")
    assert str(e.value) == f"R/meta.json: optim.lr = {value!r}: expected a number (the saved config is damaged)"
    d = _cfg(10).to_dict()
    d["model"]["arch"] = value
    with pytest.raises(ConfigError) as e:  # a list here was a TypeError (unhashable) inside the family lookup
        resume.saved_config({"config": d}, "R/meta.json")
    assert str(e.value) == f"R/meta.json: model.arch={value!r} is not a known model family; known: gpt2, llama"
    with pytest.raises(ConfigError, match=r"^meta\.json: optim\.lr = "):  # without a path: the file's name
        d = _cfg(10).to_dict()
        d["optim"]["lr"] = [value]
        resume.saved_config({"config": d})


def test_a_resume_from_a_damaged_config_exits_2_with_one_line_naming_the_meta_json(tmp_path, monkeypatch, capsys):
    from gptforge.cli import main

    monkeypatch.chdir(tmp_path)
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    d = Config(model=mcfg).to_dict()
    d["optim"] = "adamw"
    where = ckpt.save_checkpoint(tmp_path / "run", 1, GPT(mcfg), None, {"config": d, "step": 1})
    assert main(["train", "--out", "run", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gptforge train: error: {where.relative_to(tmp_path) / 'meta.json'}: config.optim = 'adamw': "
                   "expected an object (the saved config is damaged)"], err
    meta = {"config": Config(model=mcfg).to_dict(), "step": 1}
    meta["config"]["train"]["max_steps"] = "ten"
    with pytest.raises(ConfigError, match=r"^S/meta\.json: train\.max_steps = 'ten': expected an integer"):
        resume.resume_config(meta, [], str(tmp_path), where="S/meta.json")

def test_model_paths_become_absolute_part_by_part(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = Config()
    cfg.rl.reward_model, cfg.rl.init_from, cfg.dpo.init_from, cfg.lora.base = " a, ,b/c", "sft", str(tmp_path), ""
    resume.absolute_model_paths(cfg)
    assert cfg.rl.reward_model == f"{tmp_path}/a, ,{tmp_path}/b/c"
    assert (cfg.rl.init_from, cfg.dpo.init_from, cfg.lora.base) == (f"{tmp_path}/sft", str(tmp_path), "")


# --- model identity, and a resumed run's config -----------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Runs A and B (the same weights, in different places) and C (other weights)."""
    tmp = tmp_path_factory.mktemp("ids")
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    out = {}
    for name, seed in (("A", 0), ("C", 1)):
        torch.manual_seed(seed)
        ckpt.save_checkpoint(tmp / name, 1, GPT(mcfg), None, {"config": Config(model=mcfg).to_dict()})
        out[name] = tmp / name
    shutil.copytree(tmp / "A", tmp / "B")
    out["B"] = tmp / "B"
    return out


def _sha(run) -> str:
    return hashlib.sha256((ckpt.latest_checkpoint(run) / "model.safetensors").read_bytes()).hexdigest()


def test_model_identity_is_the_weights_sha256(models, tmp_path):
    a = models["A"]
    assert resume.model_identity(str(a)) == _sha(a) == resume.model_identity(str(ckpt.latest_checkpoint(a)))
    assert resume.model_identity(str(models["C"])) == _sha(models["C"]) != _sha(a)
    old = tmp_path / "old"  # a checkpoint from before meta.json recorded checksums: the file is hashed
    shutil.copytree(a, old)
    meta_path = ckpt.latest_checkpoint(old) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("files", None)
    meta_path.write_text(json.dumps(meta))
    assert resume.model_identity(str(old)) == _sha(a)
    # the checksum meta.json records is read, not recomputed (a big model is not hashed on every resume)
    meta["files"] = {"model.safetensors": "recorded"}
    meta_path.write_text(json.dumps(meta))
    assert resume.model_identity(str(old)) == "recorded"
    assert resume.model_identity(str(tmp_path / "nothing")) is None
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "meta.json").write_text("{not json")
    assert resume.model_identity(str(tmp_path / "junk")) is None


def test_same_models_compares_weights_in_order(models, tmp_path):
    a, b, c = (str(models[k]) for k in "ABC")
    assert resume.same_models(a, b, "rl.reward_model")
    assert resume.same_models(f"{a},{c}", f" {b} , {c}", "rl.reward_model")
    assert not resume.same_models(f"{a},{c}", f"{c},{a}", "rl.reward_model")
    assert not resume.same_models(a, c, "rl.reward_model")
    assert not resume.same_models(a, f"{a},{b}", "rl.reward_model")
    gone = str(tmp_path / "gone")
    with pytest.raises(ConfigError) as e:
        resume.same_models(a, gone, "rl.reward_model")
    assert str(e.value) == f"--rl.reward_model {gone!r}: no readable checkpoint there to compare with the run's {a!r}"
    with pytest.raises(ConfigError) as e:
        resume.same_models(gone, gone + "2", "dpo.init_from")  # both unreadable: the new one is named first
    assert str(e.value).startswith(f"--dpo.init_from {gone + '2'!r}: no readable checkpoint there")
    with pytest.raises(ConfigError) as e:
        resume.same_models(gone, a, "lora.base")
    assert str(e.value) == (f"--lora.base: this run was trained with {gone!r}, which cannot be read any more, so {a!r} "
                            "cannot be checked to be the same model; put it back, or start a new run")


def _hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _hf_folder(tmp_path, name: str, weights: bytes, shards: int = 1):
    """A Hugging Face folder as the loader reads it: config.json and model.safetensors (or shards named by
    model.safetensors.index.json), and a README the loader never reads. model_identity needs the files only."""
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "gpt2"}')
    (d / "README.md").write_text("words")
    if shards == 1:
        (d / "model.safetensors").write_bytes(weights)
    else:
        names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        cut = len(weights) // shards
        for i, n in enumerate(names):
            (d / n).write_bytes(weights[i * cut:(i + 1) * cut if i < shards - 1 else None])
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": n for i, n in
                                                                                    enumerate(names)}}))
    return d


def _hf_digest(d, names) -> str:
    """The identity written out: sha256 over each loaded file's name and sha256, in the loader's order."""
    return _hex("".join(f"{n}|{_hex((d / n).read_bytes())}|" for n in names).encode())


def test_model_identity_of_every_source_kind_is_the_sha256_of_what_its_loader_reads(models, tmp_path):
    """A Hugging Face folder or a GGUF / llm.c file given as --init-from had no identity (None): a resume after
    it changed went on silently with other weights."""
    for name, head in (("m.gguf", b"GGUF"), ("gpt2_124M.bin", b"llmc")):
        f = tmp_path / name
        f.write_bytes(head + bytes(range(60)))
        assert resume.model_identity(str(f)) == _hex(f.read_bytes())
        f.write_bytes(head + bytes(range(1, 61)))  # same size, other weights
        assert resume.model_identity(str(f)) == _hex(f.read_bytes())
    hf = _hf_folder(tmp_path, "hf", b"weights!")
    want = _hf_digest(hf, ["config.json", "model.safetensors"])
    assert resume.model_identity(str(hf)) == want
    (hf / "README.md").write_text("edited")  # not read by the loader: the same model
    assert resume.model_identity(str(hf)) == want
    (hf / "model.safetensors").write_bytes(b"weights?")  # same size, other weights
    assert resume.model_identity(str(hf)) == _hf_digest(hf, ["config.json", "model.safetensors"]) != want
    (hf / "config.json").write_text('{"model_type": "gpt2", "n_head": 4}')  # the same weights read as another model
    assert resume.model_identity(str(hf)) == _hf_digest(hf, ["config.json", "model.safetensors"])
    sharded = _hf_folder(tmp_path, "sharded", b"weights!", shards=2)
    names = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert resume.model_identity(str(sharded)) == _hf_digest(sharded, names)
    (sharded / "model-00002-of-00002.safetensors").write_bytes(b"ght?")
    assert resume.model_identity(str(sharded)) == _hf_digest(sharded, names)
    (hf / "model.safetensors").unlink()  # nothing the loader could read: no identity
    assert resume.model_identity(str(hf)) is None
    run = tmp_path / "run"  # a run directory has a config.json beside checkpoints/: a checkpoint, not an HF folder
    shutil.copytree(models["A"], run)
    (run / "config.json").write_text("{}")
    assert resume.model_identity(str(run)) == _sha(models["A"])


@pytest.mark.parametrize("kind", ["checkpoint", "hf", "gguf"])
def test_a_resume_refuses_a_model_changed_in_place_whatever_its_kind(models, tmp_path, kind):
    """The same path, other weights (a folder re-exported, a file replaced): refused by the key and the path
    before any work; the record a fresh run writes holds a sha256 for every kind."""
    if kind == "checkpoint":
        path = shutil.copytree(models["A"], tmp_path / "rm")

        def change():
            shutil.rmtree(path)
            shutil.copytree(models["C"], path)
    elif kind == "hf":
        path = _hf_folder(tmp_path, "rm", b"weights!")

        def change():
            (path / "model.safetensors").write_bytes(b"weights?")
    else:
        path = tmp_path / "rm.gguf"
        path.write_bytes(b"GGUF" + bytes(60))

        def change():
            path.write_bytes(b"GGUF" + bytes(59) + b"\1")
    cfg = _cfg()
    cfg.rl.reward_model = str(path)
    meta = {"models": resume.recorded_models(cfg)}
    recorded = meta["models"]["rl.reward_model"]
    assert recorded == [resume.model_identity(str(path))] and isinstance(recorded[0], str)
    resume.check_models_present(cfg, "RUN/meta.json")  # there: passes
    assert resume.changed_model(cfg, "RUN/meta.json", meta) is None  # unchanged
    change()
    resume.check_models_present(cfg, "RUN/meta.json")  # still there: the weights are changed_model's
    why = resume.changed_model(cfg, "RUN/meta.json", meta)
    now = resume.model_identity(str(path))
    assert why == (
        f"--resume: rl.reward_model = {str(path)!r} holds other weights than this run was trained with (sha256 "
        f"{now[:12]}, but RUN/meta.json records {recorded[0][:12]}: replaced or changed since); it is a reward model "
        "the run scores with, which a resume cannot change: put that model back as it was, or start a new run with "
        "--out elsewhere")
    assert resume.changed_model(cfg, "RUN/meta.json", {"models": {"rl.reward_model": [None]}}) is None  # no record
    # a record written before a Hugging Face folder or GGUF file had one: filled at the next resume, and a sha256
    # recorded is carried as it is, never re-derived from the path
    assert resume.recorded_models(cfg, {"models": {"rl.reward_model": [None]}}) == {"rl.reward_model": [now]}
    assert resume.recorded_models(cfg, meta) == {"rl.reward_model": recorded}


def test_a_long_hash_says_what_it_reads_and_a_model_is_hashed_once(tmp_path, monkeypatch, capsys):
    """A model of GBs takes seconds to hash: past SAY_AFTER_S it says so on stderr (what, how big) with a bar.
    The record, the resume check and DPO's cache ask for the same model: its bytes are read once while its
    files are unchanged, and a file written within a clock tick (RACY_NS) is never remembered."""
    f = tmp_path / "big.gguf"
    f.write_bytes(bytes(3 * resume.MIB + 5))
    reads = []
    real_open = open
    from gptforge.storage import digest

    monkeypatch.setattr(digest, "open", lambda p, mode: reads.append(p) or real_open(p, mode), raising=False)
    monkeypatch.setattr(resume, "SAY_AFTER_S", 0.0)
    resume._digests.clear()
    capsys.readouterr()
    assert resume.model_identity(str(f)) == _hex(f.read_bytes())
    err = capsys.readouterr().err
    assert f"hashing {f} (0.00 GB): the run's meta.json names the weights it uses by their sha256" in err
    assert "sha256 big.gguf" in err and "/4" in err  # the bar over 4 MiB
    assert resume._digests == {}  # written just now: hashed, not remembered (it may change within the tick)
    monkeypatch.setattr(resume, "RACY_NS", -10**12)  # every stamp counts as old
    reads.clear()
    assert resume.model_identity(str(f)) == resume.model_identity(str(f)) == _hex(f.read_bytes())
    assert reads == [f]
    f.write_bytes(bytes(3 * resume.MIB + 4) + b"x")  # changed: read again (its stamp differs)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 7))
    assert resume.model_identity(str(f)) == _hex(f.read_bytes())
    assert reads == [f, f]
    monkeypatch.setattr(resume, "SAY_AFTER_S", 3600.0)  # quick: not a word
    resume._digests.clear()
    capsys.readouterr()
    resume.model_identity(str(f))
    assert capsys.readouterr().err == ""


def test_resume_config_applies_overrides_refuses_frozen_changes_and_never_trusts(models, tmp_path):
    saved = _cfg(10)
    saved.train.out_dir, saved.train.trust_checkpoint = "where/it/was", True
    saved.rl.task, saved.rl.reward_model = "compare", str(models["A"])
    meta = {"config": saved.to_dict()}
    frozen = ("rl.task", "rl.reward_model")
    cfg = resume.resume_config(meta, ["--train.max_steps", "12", "--rl.task", "compare"], "here", frozen)
    assert (cfg.train.max_steps, cfg.train.out_dir, cfg.train.trust_checkpoint) == (12, "here", False)
    assert meta["config"]["train"]["max_steps"] == 10
    # the same weights under another name pass, and the new name is kept
    cfg = resume.resume_config(meta, ["--rl.reward_model", str(models["B"])], "here", frozen)
    assert cfg.rl.reward_model == str(models["B"])
    with pytest.raises(ConfigError) as e:
        resume.resume_config(meta, ["--rl.reward_model", str(models["C"])], "here", frozen)
    assert str(e.value) == (f"--rl.reward_model {str(models['C'])!r}: other weights than {str(models['A'])!r}, which "
                            "this run was trained with (their sha256 is in meta.json); it is a reward model the run "
                            "scores with, which a resume cannot change: give that model (--reward-model PATH where it "
                            "is now), or start a new run with --out elsewhere")
    gone = str(tmp_path / "gone")
    with pytest.raises(ConfigError) as e:  # a frozen model path that cannot be read: named by its key
        resume.resume_config(meta, ["--rl.reward_model", gone], "here", frozen)
    assert str(e.value).startswith(f"--rl.reward_model {gone!r}: no readable checkpoint there")
    with pytest.raises(ConfigError, match=r"^--rl.task 'arithmetic': this run was trained with 'compare', and a resume"):
        resume.resume_config(meta, ["--rl.task", "arithmetic"], "here", frozen)
    with pytest.raises(ConfigError, match=r"^--rl.task 'arithmetic'"):  # a model path passing goes on to the next key
        resume.resume_config(meta, ["--rl.reward_model", str(models["B"]), "--rl.task", "arithmetic"], "here",
                             ("rl.reward_model", "rl.task"))
    # a key not frozen changes freely; a model the run read is compared whatever the command freezes (a LoRA
    # base was frozen by no command: swapped silently until attach_lora's fingerprint); one it did not read is not
    assert resume.resume_config(meta, ["--rl.task", "arithmetic"], "o").rl.task == "arithmetic"
    with pytest.raises(ConfigError, match=r"^--rl.reward_model .*: no readable checkpoint there"):
        resume.resume_config(meta, ["--rl.reward_model", gone], "o")
    assert resume.resume_config(meta, ["--dpo.init_from", gone], "o").dpo.init_from == gone


def test_a_model_path_named_after_the_run_started_is_recorded_at_the_save(tmp_path):
    """meta.json's models record is of the config the same meta.json holds: a LoRA run's lora.base was filled in
    after the Checkpointer took its record, so the base went unrecorded and a resume never checked its weights.
    A key named late is hashed at the save; one recorded is carried as it is, never hashed again."""
    from gptforge.parallel.distributed import DistInfo
    from gptforge.run.checkpointer import Checkpointer, TrainState

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=16))
    cfg = _cfg()
    cfg.model = model.config
    early, late = tmp_path / "early.gguf", tmp_path / "late.gguf"
    early.write_bytes(b"GGUF early")
    late.write_bytes(b"GGUF late")
    cfg.rl.reward_model = str(early)
    saver = Checkpointer(cfg, DistInfo(), tmp_path / "run")
    assert saver.extra_meta["models"] == {"rl.reward_model": [_hex(b"GGUF early")]}
    cfg.lora.base = str(late)  # named after the Checkpointer was made (attach_lora did)
    early.write_bytes(b"GGUF other")  # recorded already: carried, not read again
    loader = type("L", (), {"state_dict": lambda self: {}})()
    where = saver.save(TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, step=1))
    assert ckpt.read_meta(where)["models"] == {"rl.reward_model": [_hex(b"GGUF early")],
                                               "lora.base": [_hex(b"GGUF late")]}


def test_once_per_machine_runs_on_each_machines_first_process_only():
    """The resume's weights check (GBs hashed) runs where LOCAL_RANK is 0; the other ranks of a machine get its
    answer through the gather (tests/training/test_distributed.py), and an exception is raised, not swallowed."""
    from gptforge.parallel.distributed import DistInfo, once_per_machine

    calls = []
    assert once_per_machine(lambda: calls.append(1) or "said", DistInfo()) == ["said"] and calls == [1]
    assert once_per_machine(lambda: calls.append(2) or "said", DistInfo(rank=1, local_rank=1)) == [None]
    assert calls == [1]
    with pytest.raises(ConfigError, match="^boom$"):
        once_per_machine(lambda: (_ for _ in ()).throw(ConfigError("boom")), DistInfo())


def test_a_name_given_anew_is_compared_with_the_record_not_with_what_the_old_path_holds_now(models, tmp_path):
    """The run's record stands for the old path: the old path's files are not hashed again (a second multi-GB
    read), and a model changed there since does not make the same weights at a new place look different."""
    saved = _cfg()
    old = tmp_path / "old"
    shutil.copytree(models["A"], old)
    saved.rl.reward_model = str(old)
    sha = resume.model_identity(str(old))
    meta = {"config": saved.to_dict(), "models": {"rl.reward_model": [sha]}}
    shutil.rmtree(old)
    shutil.copytree(models["C"], old)  # other weights at the old place now
    cfg = resume.resume_config(meta, ["--rl.reward_model", str(models["B"])], "here", ("rl.reward_model",))
    assert cfg.rl.reward_model == str(models["B"]) and resume.changed_model(cfg, "RUN/meta.json", meta) is None
    # a record with a gap (a model that could not be read then) is compared by same_models, the record first
    assert resume.same_models(str(old), str(models["B"]), "rl.reward_model", [sha])


def test_a_model_named_anew_is_compared_once_the_group_exists(models, tmp_path, monkeypatch):
    """``--init-from NEWPATH`` on a resume whose run recorded the model's sha256: resume_config (every rank, in the
    command line, before the process group) reads no model; changed_model (the Checkpointer's, once a machine)
    refuses another model or an unreadable one in the words resume_config used, and takes the same weights."""
    saved = _cfg()
    saved.rl.reward_model, saved.rl.init_from, saved.rl.kl_coef = str(models["A"]), str(models["A"]), 0.0
    sha = resume.model_identity(str(models["A"]))
    meta = {"config": saved.to_dict(), "models": {"rl.reward_model": [sha], "rl.init_from": [sha]}}
    hashed, real = [], resume.model_identity
    monkeypatch.setattr(resume, "model_identity", lambda p: hashed.append(p) or real(p))
    junk = tmp_path / "junk"
    junk.mkdir()
    for key in ("rl.reward_model", "rl.init_from"):  # rl.init_from at kl_coef 0: not read again, still compared
        frozen = (key,)
        for given, want in ((models["C"], resume.other_weights(key, str(models["C"]), str(models["A"]), "M")),
                            (junk, f"--{key} {str(junk)!r}: no readable checkpoint there to compare with the run's "
                                   f"{str(models['A'])!r}"),
                            (models["B"], None)):
            hashed.clear()
            cfg = resume.resume_config(meta, [f"--{key}", str(given)], "here", frozen, where="M")
            assert hashed == [] and resume.changed_model(cfg, "M", meta) == want, (key, given)
    with pytest.raises(ConfigError, match="no readable checkpoint there"):  # not there at all: refused at once
        resume.resume_config(meta, ["--rl.reward_model", str(tmp_path / "gone")], "here", ("rl.reward_model",))
