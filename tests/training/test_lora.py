"""LoRA on the run stack (``--lora.rank``): only the adapters train and are checkpointed, with the base's
fingerprint; a resume is bit-exact and refuses another base; bad ranks, targets and adapters are one-line
refusals (exit 2); rm trains its score head beside the adapters, dpo and rl (GRPO) train adapters only
(PPO, whose value model trains in full beside the policy's adapters: test_lora_ppo.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main
from gptforge.config import Config
from gptforge.eval.tasks.preferences import preference_set, write_preferences
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from tests.conftest import tiny_chat_checkpoint

ADAPTERS = ["transformer.h.0.attn.c_attn.lora_A.weight", "transformer.h.0.attn.c_attn.lora_B.weight",
            "transformer.h.0.mlp.c_fc.lora_A.weight", "transformer.h.0.mlp.c_fc.lora_B.weight"]


def _base(path, seed: int = 0):
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    return ckpt.save_checkpoint(path, 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})


def _sft(base, data, out, *extra):
    return ["sft", "--init-from", str(base), "--data", str(data), "--out", str(out), "--val-count", "16",
            "--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens", "256",
            "--train.device", "cpu", "--train.dtype", "float32", "--train.log_every", "100", "--train.val_every", "0",
            "--train.sample_every", "0", "--optim.lr", "1e-2", "--optim.warmup_steps", "2",
            "--lora.rank", "4", "--lora.alpha", "8", "--lora.dropout", "0.1", "--lora.targets", "c_attn,c_fc", *extra]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("lora")
    base = _base(root / "base")
    data = write_conversations(arithmetic_problems(120, seed=2), root / "conv.jsonl")
    return root, base, data


def _latest(run):
    return ckpt.latest_checkpoint(run)


def test_only_adapters_train_and_are_saved_with_the_base_fingerprint(world, tmp_path, capsys):
    _, base, data = world
    assert main(_sft(base, data, tmp_path / "run", "--train.max_steps", "3")) == 0
    out = capsys.readouterr().out
    assert "LoRA rank 4 (alpha 8) on c_attn,c_fc (2 layers): 1,152 of 1.63M parameters train (0.07%)" in out
    where = _latest(tmp_path / "run")
    weights = load_file(str(where / "model.safetensors"))
    assert sorted(weights) == ADAPTERS  # no base weight in the checkpoint
    assert weights[ADAPTERS[1]].abs().max() > 0  # B left zero: it trained
    opt = torch.load(where / "optimizer.pt", weights_only=True)
    assert len(opt["state"]) == 4 and sum(len(g["params"]) for g in opt["param_groups"]) == 4  # adapters only
    meta = ckpt.read_meta(where)
    from gptforge.load import ModelSource, load_model
    from gptforge.models.lora import weights_fingerprint

    assert meta["lora"]["base_sha256"] == weights_fingerprint(load_model(ModelSource(ckpt=str(base))))
    assert meta["config"]["lora"]["base"] == str(base.resolve()) and meta["lora"]["trainable"] == 1152
    # the base is a model the run reads: in meta.json's models record, by its weights' sha256, as --init-from is
    assert meta["models"] == {"lora.base": [ckpt.read_meta(base)["files"]["model.safetensors"]]}


def test_the_base_is_recorded_when_the_run_starts(world, tmp_path, monkeypatch):
    """lora.base (the starting model where none is given) is settled before the run takes its models record, so
    the base is hashed when it is read, with the others, not first at a save (the save's own fill-in is off here)."""
    from gptforge.run.checkpointer import Checkpointer

    _, base, data = world
    monkeypatch.setattr(Checkpointer, "_record_models", lambda self: None)
    assert main(_sft(base, data, tmp_path / "run", "--train.max_steps", "1")) == 0
    assert ckpt.read_meta(_latest(tmp_path / "run"))["models"] == {
        "lora.base": [ckpt.read_meta(base)["files"]["model.safetensors"]]}


def test_lora_resume_is_bit_exact(world, tmp_path):
    _, base, data = world
    assert main(_sft(base, data, tmp_path / "full", "--train.max_steps", "6")) == 0
    assert main(_sft(base, data, tmp_path / "part", "--train.max_steps", "3")) == 0
    assert main(["sft", "--out", str(tmp_path / "part"), "--resume", "--train.max_steps", "6"]) == 0
    full, part = _latest(tmp_path / "full"), _latest(tmp_path / "part")
    assert ckpt.read_meta(full)["train_loss"] == ckpt.read_meta(part)["train_loss"]
    a, b = load_file(str(full / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert sorted(a) == sorted(b) == ADAPTERS and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_or_load_on_another_base_is_refused(world, tmp_path, capsys):
    _, _, data = world
    base, other = _base(tmp_path / "base"), _base(tmp_path / "other", seed=1)
    run = tmp_path / "run"
    assert main(_sft(base, data, run, "--train.max_steps", "2")) == 0
    capsys.readouterr()
    assert main(["sft", "--out", str(run), "--resume", "--train.max_steps", "4", "--lora.base", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(base.resolve()) in err and str(other) in err and "sha256" in err, err
    # the base replaced under the run (the same path): the resume refuses by the run's models record, before any
    # model is built; sample and the adapter export by the base's fingerprint, naming the checkpoint
    for name in ("model.safetensors", "meta.json"):
        (base / name).write_bytes((other / name).read_bytes())
    assert main(["sft", "--out", str(run), "--resume", "--train.max_steps", "4"]) == 2
    io = capsys.readouterr()
    err = io.err.strip()
    assert len(err.splitlines()) == 1 and f"lora.base = {str(base.resolve())!r} holds other weights than this run was " \
        "trained with" in err and "the frozen base model its adapters are trained on" in err, err
    assert "LoRA rank" not in io.out and _latest(run).name == "step_000002"
    for cmd in (["sample", "--ckpt", str(run), "--max-new-tokens", "2"],
                ["export", "hf", "--ckpt", str(run), "--adapters-only", "--out", str(tmp_path / "ad")]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "trained on" in err and "sha256" in err, err


@pytest.mark.parametrize("flags, words", [
    (["--lora.rank", "33"], ["lora.rank=33", "at most 32"]),
    (["--lora.targets", "q_proj"], ["lora.targets", "q_proj", "c_attn, c_proj, c_fc"]),
])
def test_bad_rank_or_target_is_one_line(world, tmp_path, capsys, flags, words):
    _, base, data = world
    assert main(_sft(base, data, tmp_path / "bad", "--train.max_steps", "1", *flags)) == 2
    said, err = capsys.readouterr().err.strip().splitlines()  # _sft's own value replaced (said), then the refusal
    assert f"{flags[0]} given twice" in said and all(w in err for w in words), err


def test_a_resume_cannot_change_the_adapters(world, tmp_path, capsys):
    _, base, data = world
    run = tmp_path / "run"
    assert main(_sft(base, data, run, "--train.max_steps", "1")) == 0
    capsys.readouterr()
    for flag, value in (("--lora.alpha", "4"), ("--lora.rank", "2"), ("--lora.targets", "c_attn")):
        assert main(["sft", "--out", str(run), "--resume", "--train.max_steps", "2", flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{flag} " in err and "resume cannot change it" in err, err
    assert main(_sft(base, data, tmp_path / "two", "--train.max_steps", "1", "--lora.base", str(run))) == 2
    assert "name different models" in capsys.readouterr().err


def test_adapters_of_another_shape_are_refused(world, tmp_path, capsys):
    _, base, data = world
    run = tmp_path / "run"
    assert main(_sft(base, data, run, "--train.max_steps", "2")) == 0
    meta_path = _latest(run) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["lora"]["rank"] = 8  # the adapters on disk are rank 4
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    # meta.json edited on its own: refused where it is compared with the record in the weights file's header
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.lora.rank = 8" in err and "saved with 4" in err, err
    # the same edit made self-consistently (the header's record and the file's sha256 rewritten to match, as a
    # hostile or pre-record checkpoint has it): the adapters' own shapes still refuse it
    from tests.run.faults import rewrite_meta

    rewrite_meta(meta_path.parent, lambda m: None)
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "shapes differ" in err and "lora_A" in err, err


def test_rm_dpo_and_rl_train_adapters(tmp_path, tokenizer):
    sft = tiny_chat_checkpoint(tmp_path / "sft")
    prefs = write_preferences(preference_set("compare", 24, seed=1), tmp_path / "prefs.jsonl")
    lora = ["--lora.rank", "2", "--lora.targets", "c_attn", "--device", "cpu", "--ckpt-every", "0"]
    pair = ["--data", str(prefs), "--val-count", "8", "--micro-batch", "4", "--lr", "1e-2", "--steps", "2", *lora]
    assert main(["rm", "--init-from", str(sft), "--out", str(tmp_path / "rm"), *pair]) == 0
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "dpo"), *pair]) == 0
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "rl"), "--steps", "1", "--prompts", "2",
                 "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--lr", "1e-2", *lora]) == 0
    keys = {k: sorted(load_file(str(_latest(tmp_path / k) / "model.safetensors"))) for k in ("rm", "dpo", "rl")}
    adapters = ["transformer.h.0.attn.c_attn.lora_A.weight", "transformer.h.0.attn.c_attn.lora_B.weight"]
    assert keys["dpo"] == keys["rl"] == adapters
    assert keys["rm"] == ["body." + k for k in adapters] + ["score.weight"]  # the reward head trains too
    from gptforge.training.rm import load_reward_model

    rm, _ = load_reward_model(str(tmp_path / "rm"))  # merged onto its base: a plain reward model, trained head
    saved = load_file(str(_latest(tmp_path / "rm") / "model.safetensors"))
    assert torch.equal(rm.score.weight, saved["score.weight"]) and not any(".lora_" in n for n, _ in rm.named_parameters())
    assert main(["export", "hf", "--ckpt", str(tmp_path / "rm"), "--out", str(tmp_path / "rm_hf")]) == 0

def test_plan_gives_the_frozen_base_no_gradients_or_optimizer_state():
    import copy

    from gptforge.models.lora import adapter_params, add_lora
    from gptforge.models.registry import build_model, size_config
    from gptforge.plan.memory import estimate

    cfg = Config(model=size_config("llama-tiny", block_size=64))
    cfg.train.seq_len = 64
    full = estimate(cfg, micro_batch=2)
    lora = copy.deepcopy(cfg)
    lora.lora.rank, lora.lora.targets = 8, "q_proj,v_proj,down_proj"
    est = estimate(lora, micro_batch=2)
    model = build_model(cfg.model)
    add_lora(model, "llama", 8, 16.0, 0.0, ["q_proj", "v_proj", "down_proj"])
    n = sum(p.numel() for n_, p in model.named_parameters() if ".lora_" in n_)
    assert adapter_params(cfg.model, 8, ["q_proj", "v_proj", "down_proj"]) == n
    assert est.grads == 4 * n and est.optimizer == 8 * n and est.weights == full.weights + 4 * n
    assert est.activations == full.activations and est.peak < full.peak


def test_train_init_from_with_lora_is_continued_pretraining_of_the_adapters(tmp_path, shard_dir):
    """``train --init-from BASE --lora.rank 2``: pretraining on shards through adapters on a frozen base. Its
    first loss is the base's own on the first batch (B starts at zero), computed here with the base and the
    loader directly; only c_attn's adapters are saved, with the base's fingerprint; the model it loads is
    the base with (alpha / rank) B A added to c_attn and every other weight the base's, bit for bit."""
    from gptforge.data.loader import ShardLoader
    from gptforge.data.shards import list_shards
    from gptforge.load import ModelSource, load_model
    from gptforge.run.metrics import read_metrics
    from tests.training.test_lora_mutants import hand_fingerprint

    base_dir = _base(tmp_path / "base", seed=3)
    base = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64))
    restore.load_model_weights(base, base_dir)
    base.eval()
    out = tmp_path / "cpt"
    assert main(["train", "--preset", "tiny", "--init-from", str(base_dir), "--out", str(out), "--data.dir",
                 str(shard_dir), "--train.max_steps", "3", "--train.val_every", "0", "--train.ckpt_every", "3",
                 "--train.device", "cpu", "--model.dropout", "0", "--lora.rank", "2", "--lora.alpha", "4",
                 "--lora.targets", "c_attn"]) == 0
    first = next(r for r in read_metrics(out) if r["kind"] == "train")
    loader = ShardLoader(list_shards(str(shard_dir), "train"), 4, 32)
    with torch.no_grad():
        want = sum(base(*loader.next_batch())[1].item() for _ in range(2)) / 2  # the tiny preset: 2 micro-batches
    assert abs(first["loss"] - want) < 1e-4, (first["loss"], want)
    last = _latest(out)
    saved = load_file(str(last / "model.safetensors"))
    assert sorted(saved) == ["transformer.h.0.attn.c_attn.lora_A.weight", "transformer.h.0.attn.c_attn.lora_B.weight"]
    assert saved["transformer.h.0.attn.c_attn.lora_B.weight"].abs().max() > 0  # they trained
    assert ckpt.read_meta(last)["lora"]["base_sha256"] == hand_fingerprint(base)
    merged = load_model(ModelSource(ckpt=str(last)))
    theirs, ours = base.state_dict(), merged.state_dict()
    delta = (saved["transformer.h.0.attn.c_attn.lora_B.weight"] @ saved["transformer.h.0.attn.c_attn.lora_A.weight"]) * 2
    for k, v in theirs.items():
        if k == "transformer.h.0.attn.c_attn.weight":
            torch.testing.assert_close(ours[k], v + delta, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(ours[k], v), k
