"""PPO with LoRA (``rl --algo ppo --lora.rank R``), as TRL's ``PPOTrainer`` with a ``peft_config``: the
policy trains its adapters only (its base stays bit-identical), the value model trains in full, the KL's
reference is the base itself (the policy with its adapters off, no second copy), checkpoints hold the
adapters and the value model with the base's fingerprint, a resume is bit-exact and refuses another base.

The step's quantities go through the same code as full PPO, and are checked the same way
(tests/training/test_recipe_quantities.py): recomputed by hand in float64 from the rollouts and weight
snapshots, with the reference log-probs from the base model read independently from its file.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main
from gptforge.config import Config, LoRAConfig, RLConfig
from gptforge.eval.tasks.verifiable import Problem
from gptforge.models.gpt2 import GPT
from gptforge.models.lora import is_adapter_key
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from gptforge.training.grpo import rl_config
from gptforge.training.loop import train
from gptforge.training.ppo import PPO
from tests.conftest import tiny_chat_checkpoint
from tests.training.test_recipe_quantities import (
    T_SAMPLE,
    PPOSpy,
    _small,
    close,
    graded,
    hand_experience,
    hand_ppo_loss,
    rows_of,
)

ADAPTERS = ["policy.transformer.h.0.attn.c_attn.lora_A.weight", "policy.transformer.h.0.attn.c_attn.lora_B.weight"]


def reward(problem, reply: str) -> float:
    """A reward with spread between replies (random replies to a task all score 0 on exact match)."""
    return graded(problem, reply)


# ---------------------------------------------------------------- one LoRA PPO step, by hand in float64
def _base_file(tmp_path):
    mcfg, _ = _small()
    torch.manual_seed(1)
    return ckpt.save_checkpoint(tmp_path / "base", 0, GPT(mcfg), None, {"config": Config(model=mcfg).to_dict()})


def test_lora_ppo_step_against_a_hand_computation(tmp_path, tokenizer, monkeypatch):
    """Two steps of two updates: every experience tensor, the logged KL, each loss call (ratios clipped,
    values clipped) equal a float64 recomputation whose reference is the base read from its file; the
    policy's base weights are bit-identical after the updates while its adapters and the value model moved."""
    base_dir = _base_file(tmp_path)
    base = GPT(_small()[0])
    restore.load_model_weights(base, base_dir)
    spy = PPOSpy(monkeypatch)
    mcfg, t = _small()
    cfg = rl_config(mcfg, str(tmp_path / "ppo"), "")
    cfg.rl = RLConfig(prompts=2, group=4, max_new_tokens=4, eval_n=0, temperature=T_SAMPLE, algo="ppo", kl_coef=0.1,
                      updates_per_batch=2, gamma=0.9, lam=0.8, clip_eps=0.05, clip_value=0.05, vf_coef=0.3)
    cfg.lora = LoRAConfig(rank=2, alpha=4.0, targets="c_attn,c_fc", base=str(base_dir))
    cfg.optim.lr, cfg.train.max_steps, cfg.train.ckpt_every, cfg.train.device = 3e-2, 2, 0, "cpu"
    cfg.train.micro_batch, cfg.optim.grad_clip = 4, 0.0
    recipe = PPO(cfg, t, tokenizer, graded, problems_at=lambda step: [Problem("!", ""), Problem("?", "")], held_out=[])
    recipe.words_unknown = True
    torch.manual_seed(0)
    train(cfg, recipe)
    logged = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()
              if json.loads(x)["kind"] == "rl"]
    assert len(spy.steps) == len(logged) == 2
    for i_step, (s, rec) in enumerate(zip(spy.steps, logged, strict=True)):
        exp, H = s["exp"], hand_experience({**s, "ref": base}, T_SAMPLE)  # the reference: the base, from its file
        for name, key in (("logprobs", "lp"), ("ref_logprobs", "ref"), ("values", "v"), ("rewards", "rew"),
                          ("advantages", "white"), ("returns", "ret")):
            for k, row in enumerate(rows_of(getattr(exp, name), exp.mask)):
                close(row, H[k][key], 5e-5)
        if i_step == 1:  # the adapters have moved the policy off its base: KL and values are not 0
            assert torch.cat([h["lp"] - h["ref"] for h in H]).abs().max() > 1e-3
            assert torch.cat([h["v"] for h in H]).abs().max() > 1e-3
        close(rec["kl"], torch.stack([(h["lp"] - h["ref"]).sum() for h in H]).mean(), 1e-5)
        assert len(s["calls"]) == 4
        for i, call in enumerate(s["calls"]):
            rows = range((i % 2) * 4, (i % 2) * 4 + 4)
            want, ratios = hand_ppo_loss(s, H, call, rows, clip_eps=0.05, clip_value=0.05, vf_coef=0.3)
            close(call["loss"], want, 5e-5)
            if i // 2 == 1:
                assert (ratios - 1).abs().max() > 0.05  # the second update clips
        close(rec["loss"], sum(c["loss"] for c in s["calls"][-2:]) / 2, 1e-6)
    # after 2 steps x 2 updates: the policy's base is the file's bit for bit, its adapters and the value model moved
    last = spy.steps[-1]["calls"][-1]
    policy, value = last["policy"], last["value"]
    want = base.state_dict()
    frozen = {n: p for n, p in policy.state_dict().items() if not is_adapter_key(n)}
    assert frozen.keys() == want.keys() and all(torch.equal(frozen[n], want[n]) for n in want)
    assert all(policy.state_dict()[n].abs().max() > 0 for n in policy.state_dict() if ".lora_B." in n)
    v0 = spy.steps[0]["value"].state_dict()
    assert not torch.equal(value.state_dict()["body.transformer.h.0.attn.c_attn.weight"],
                           v0["body.transformer.h.0.attn.c_attn.weight"])
    assert not torch.equal(value.state_dict()["score.weight"], v0["score.weight"])


def test_the_reference_is_the_base_bit_for_bit_and_leaves_the_policy_as_it_was():
    """BaseOf(policy): the base model's output exactly (a plain copy taken before the adapters went on),
    in eval mode and without autograd, whatever mode the policy is in; afterwards the policy is in its
    mode again with its adapters on."""
    import copy

    from gptforge.models.gpt2 import GPTConfig
    from gptforge.models.lora import BaseOf, add_lora

    torch.manual_seed(0)
    policy = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, pad_vocab=False,
                           dropout=0.2))
    plain = copy.deepcopy(policy).eval()
    add_lora(policy, "gpt2", 2, 4.0, 0.3, ["c_attn", "c_fc"])
    for n, p in policy.named_parameters():
        if ".lora_B." in n:
            torch.nn.init.normal_(p)
    x = torch.randint(0, 64, (2, 16))
    policy.train()
    ref, _ = BaseOf(policy)(x)
    assert torch.equal(ref, plain(x)[0]) and not ref.requires_grad
    assert policy.training and all(m.training for m in policy.modules())
    policy.eval()
    assert not torch.allclose(policy(x)[0], ref, atol=1e-3)  # the adapters are on again


# ---------------------------------------------------------------- the command: checkpoints, resume, bases
def _ppo(sft, out, *extra):
    return ["rl", "--init-from", str(sft), "--out", str(out), "--algo", "ppo", "--prompts", "2", "--group", "2",
            "--max-new-tokens", "4", "--eval-n", "2", "--lr", "1e-2", "--temperature", "1.5", "--device", "cpu",
            "--reward", f"{__name__}:reward", "--lora.rank", "2", "--lora.targets", "c_attn", *extra]


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    return tiny_chat_checkpoint(tmp_path_factory.mktemp("ppo_lora") / "sft")


def test_lora_ppo_checkpoints_adapters_and_value_model_and_resumes_bit_exactly(sft, tmp_path, tokenizer, capsys):
    assert main(_ppo(sft, tmp_path / "full", "--steps", "4")) == 0
    out = capsys.readouterr().out
    assert ("LoRA rank 2 (alpha 16) on c_attn (1 layer): 256 of the 1.62M policy parameters train (0.02%), and the "
            "value model trains in full (1.62M, as TRL's PPO with peft)") in out
    assert main(_ppo(sft, tmp_path / "part", "--steps", "2")) == 0
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "4", "--reward", f"{__name__}:reward"]) == 0
    full, part = ckpt.latest_checkpoint(tmp_path / "full"), ckpt.latest_checkpoint(tmp_path / "part")
    a, b = load_file(str(full / "model.safetensors")), load_file(str(part / "model.safetensors"))
    value = GPT(Config.from_dict(ckpt.read_meta(full)["config"]).model).state_dict()
    value.pop("lm_head.weight")  # tied: stored once, as the embedding
    assert sorted(a) == sorted(b) == sorted(ADAPTERS + ["value.score.weight"] + [f"value.body.{k}" for k in value])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a[ADAPTERS[1]].abs().max() > 0  # B left zero: the adapters trained
    opt = torch.load(full / "optimizer.pt", weights_only=True)
    assert sum(len(g["params"]) for g in opt["param_groups"]) == len(a)  # no optimizer state for the frozen base
    meta = ckpt.read_meta(full)
    from gptforge.load import ModelSource, load_model
    from gptforge.models.lora import weights_fingerprint

    base = load_model(ModelSource(ckpt=str(sft)))
    assert meta["lora"]["base_sha256"] == weights_fingerprint(base) and meta["recipe"] == "ppo"
    # every command that loads the model (chat, eval, export) gets the policy: W + (alpha / r) B A on the base
    merged = load_model(ModelSource(ckpt=str(tmp_path / "full")))
    w = base.transformer.h[0].attn.c_attn.weight
    delta = (a[ADAPTERS[1]].double() @ a[ADAPTERS[0]].double()) * (16 / 2)  # (alpha / r) B A, as the weight (out, in)
    assert delta.abs().max() > 0
    torch.testing.assert_close(merged.transformer.h[0].attn.c_attn.weight.double(), w.double() + delta,
                               rtol=0, atol=1e-6)
    assert main(["export", "hf", "--ckpt", str(tmp_path / "full"), "--adapters-only", "--out", str(tmp_path / "ad")]) == 0
    assert sorted(load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))) == [
        "base_model.model." + k.removeprefix("policy.") for k in ADAPTERS]


def test_lora_ppo_resume_on_another_base_is_refused(sft, tmp_path, capsys):
    other = tiny_chat_checkpoint(tmp_path / "other", seed=1)
    run = tmp_path / "run"
    assert main(_ppo(sft, run, "--steps", "1")) == 0
    capsys.readouterr()
    assert main(["rl", "--out", str(run), "--resume", "--steps", "2", "--reward", f"{__name__}:reward",
                 "--lora.base", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(sft.resolve()) in err and str(other) in err and "sha256" in err, err
