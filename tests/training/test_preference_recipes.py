"""The preference commands end to end on a tiny chat model: ``prepare preferences``, ``rm`` (resume,
eval, refused by the text commands; `export hf` of either family to transformers with the same scores), ``dpo`` (resume, the
cached reference equals the frozen one, TRL's metric names) and ``rl --algo ppo`` / ``--reward-model``
(resume bit-exactly; the learned reward beside the true accuracy)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.eval.tasks.preferences import preference_set, write_preferences
from gptforge.run import checkpoint as ckpt
from tests.conftest import tiny_chat_checkpoint

CPU = ["--device", "cpu", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    """A tiny chat (SFT-like) checkpoint, a compare preference file and one trained reward model."""
    tmp = tmp_path_factory.mktemp("prefs")
    sft = tiny_chat_checkpoint(tmp / "sft")
    prefs = write_preferences(preference_set("compare", 48, seed=1), tmp / "prefs.jsonl")
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", str(tmp / "rm"), "--steps", "3",
                 "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", *CPU]) == 0
    return tmp, sft, prefs


def _rows(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == kind and not r.get("replayed")]


def _same_weights(a, b):
    sa = load_file(str(ckpt.latest_checkpoint(a) / "model.safetensors"))
    sb = load_file(str(ckpt.latest_checkpoint(b) / "model.safetensors"))
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_prepare_preferences(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert main(["prepare", "preferences", "arithmetic", "--n", "5", "--out", str(out), "--seed", "3"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 5 and {r["kind"] for r in rows} <= {"wrong_number", "wrong_operand", "broken_format"}
    assert rows == preference_set("arithmetic", 5, seed=3)
    assert main(["prepare", "preferences", "compare", "--n", "3", "--held-out", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and len(out.read_text().splitlines()) == 5  # not replaced silently
    assert main(["prepare", "preferences", "compare", "--n", "3", "--held-out", "--out", str(out), "--force"]) == 0
    assert [json.loads(x) for x in out.read_text().splitlines()] == preference_set("compare", 3, held_out=True)
    assert main(["prepare", "preferences", "compare", "--n", "3", "--kinds", "nope", "--out", str(tmp_path / "k.jsonl")]) == 2
    assert "--kinds" in capsys.readouterr().err


def test_rm_resumes_exactly_and_scores(world, tmp_path, capsys):
    tmp, sft, prefs = world
    args = ["--data", str(prefs), "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", *CPU]
    assert main(["rm", "--init-from", str(sft), "--out", str(tmp_path / "part"), "--steps", "2", *args]) == 0
    assert main(["rm", "--out", str(tmp_path / "part"), "--resume", "--steps", "3"]) == 0
    full, part = tmp / "rm", tmp_path / "part"
    keys = ("loss", "accuracy", "margin", "grad_norm", "lr")
    assert [{k: r[k] for k in keys} for r in _rows(full, "rm")] == [{k: r[k] for k in keys} for r in _rows(part, "rm")]
    assert [r["step"] for r in _rows(full, "eval")] == [0, 3] and "accuracy" in _rows(full, "eval")[-1]
    _same_weights(full, part)
    meta = ckpt.read_meta(ckpt.latest_checkpoint(full))
    assert meta["recipe"] == "rm" and meta["chat_template"] == ChatTemplate.gpt2().to_dict()

    # a reward model does not generate text: the text commands refuse it, naming why
    assert main(["sample", "--ckpt", str(full), "--prompt", "hi"]) == 2
    assert "a reward model does not generate text" in capsys.readouterr().err
    assert main(["export", "llmc", "--ckpt", str(full), "--out", str(tmp_path / "x")]) == 2
    # eval --preferences: the same numbers as scoring the pairs by hand
    assert main(["eval", "--ckpt", str(full), "--preferences", str(prefs), "--json", str(tmp_path / "e.json")]) == 0
    got = json.loads((tmp_path / "e.json").read_text())
    from gptforge.data.preference import read_preferences, render_pairs
    from gptforge.training.rm import load_reward_model, score_sequences

    rm, template = load_reward_model(str(full))
    pairs = render_pairs(read_preferences(str(prefs)), template, 64)
    c = score_sequences(rm, [p.chosen.ids.tolist() for p in pairs], template.bos)
    r = score_sequences(rm, [p.rejected.ids.tolist() for p in pairs], template.bos)
    assert got["n"] == 48 and got["accuracy"] == pytest.approx((c > r).float().mean().item())


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_export_hf_of_a_reward_model_scores_the_same_in_transformers(world, tmp_path, arch):
    """`gptforge export hf` of an rm run of either family -> transformers' *ForSequenceClassification
    directory; AutoModelForSequenceClassification gives the run's scores on a right-padded batch."""
    transformers = pytest.importorskip("transformers")
    from gptforge.data.preference import read_preferences, render_pairs
    from gptforge.training.rm import load_reward_model, score_sequences

    tmp, sft, prefs = world
    run = tmp / "rm"
    if arch == "llama":  # a Llama chat model (GQA, untied head), then a reward model trained from it
        from gptforge.models.registry import build_model, model_config

        torch.manual_seed(0)
        t = ChatTemplate.gpt2()
        cfg = model_config({"arch": "llama", "n_layer": 1, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
                            "block_size": 64, "vocab_size": t.vocab_size})
        chat = ckpt.save_checkpoint(tmp_path / "sft", 1, build_model(cfg), None,
                                    {"config": Config(model=cfg).to_dict(), "chat_template": t.to_dict()})
        run = tmp_path / "rm"
        assert main(["rm", "--init-from", str(chat), "--data", str(prefs), "--out", str(run), "--steps", "2",
                     "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", *CPU]) == 0
    rm, template = load_reward_model(str(run))
    assert rm.config.arch == arch
    pairs = render_pairs(read_preferences(str(prefs)), template, 64)[:4]
    seqs = [p.chosen.ids.tolist() for p in pairs] + [p.rejected.ids.tolist() for p in pairs]
    ours = score_sequences(rm, seqs, template.bos)
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == {"gpt2": "GPT2", "llama": "Llama"}[arch] + "ForSequenceClassification"
    L = max(map(len, seqs))
    assert len({len(s) for s in seqs}) > 1  # some rows padded: transformers must read each at its own end
    ids = torch.tensor([s + [template.bos] * (L - len(s)) for s in seqs])
    with torch.no_grad():
        theirs = hf(ids).logits[:, 0]
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert ours.std() > 0  # scores that differ, not one constant


def test_dpo_resumes_exactly_with_cached_reference(world, tmp_path, capsys):
    _, sft, prefs = world
    args = ["--data", str(prefs), "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", "--task", "compare",
            "--eval-n", "2", *CPU]
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "full"), "--steps", "3", *args]) == 0
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "part"), "--steps", "2", *args]) == 0
    (tmp_path / "part" / "ref_logps.pt").write_bytes(b"damaged")  # a damaged cache is recomputed
    assert main(["dpo", "--out", str(tmp_path / "part"), "--resume", "--steps", "3"]) == 0
    assert "recomputing" in capsys.readouterr().out
    full, part = _rows(tmp_path / "full", "dpo"), _rows(tmp_path / "part", "dpo")
    trl = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")
    assert [{k: r[k] for k in trl} for r in full] == [{k: r[k] for k in trl} for r in part]
    assert full[-1]["rewards/margins"] != 0.0
    assert "compare_acc" in _rows(tmp_path / "full", "eval")[-1]
    _same_weights(tmp_path / "full", tmp_path / "part")
    # a cache with the right fingerprints and a wrong number is still only a cache: recomputed, same run
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "nan"), "--steps", "2", *args]) == 0
    cache = torch.load(tmp_path / "nan" / "ref_logps.pt", weights_only=True)
    cache["train"][0, 0] = float("nan")
    torch.save(cache, tmp_path / "nan" / "ref_logps.pt")
    capsys.readouterr()
    assert main(["dpo", "--out", str(tmp_path / "nan"), "--resume", "--steps", "3"]) == 0
    assert "non-finite" in capsys.readouterr().out
    assert [{k: r[k] for k in trl} for r in full] == [{k: r[k] for k in trl} for r in _rows(tmp_path / "nan", "dpo")]
    from gptforge.training.dpo import _table_fits

    good = cache["val"]
    assert _table_fits(good, len(good)) and not _table_fits(good, len(good) + 1)
    for bad in (good[1:], good.long(), -good, good[:, :1], good.clone().fill_(float("-inf")), "x", None):
        assert not _table_fits(bad, len(good)), bad
    # the frozen reference model beside the policy gives the cached reference's numbers
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "frozen"), "--steps", "3", *args,
                 "--dpo.precompute_ref", "false"]) == 0
    for a, b in zip(full, _rows(tmp_path / "frozen", "dpo"), strict=True):
        for k in trl:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k
    assert not (tmp_path / "frozen" / "ref_logps.pt").exists()
    # bad input names the flag, exit 2, before any run directory is made
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "bad"), *args, "--beta", "0"]) == 2
    assert "dpo.beta" in capsys.readouterr().err
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "bad"), "--data", str(tmp_path / "no.jsonl"),
                 *CPU]) == 2
    assert not (tmp_path / "bad").exists()
    # IPO runs on the same path
    assert main(["dpo", "--init-from", str(sft), "--out", str(tmp_path / "ipo"), "--steps", "1", *args,
                 "--loss-type", "ipo"]) == 0


def test_a_cached_reference_belongs_to_its_reference_model(world, tmp_path, capsys):
    """RUN/ref_logps.pt is keyed by the reference model too: a run started over in the same directory from
    another model (--force), or from the same path after that model was replaced, computes its reference
    again. The numbers are checked against the frozen reference computed beside the policy (no cache)."""
    import shutil

    _, sft, prefs = world
    other = tiny_chat_checkpoint(tmp_path / "other", seed=7)
    args = ["--data", str(prefs), "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", "--steps", "2", *CPU]
    trl = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins")
    live = tmp_path / "live"
    assert main(["dpo", "--init-from", str(other), "--out", str(live), *args, "--dpo.precompute_ref", "false"]) == 0

    def same_as_live_reference(run, model):
        assert model == other
        for a, b in zip(_rows(run, "dpo"), _rows(live, "dpo"), strict=True):
            for k in trl:
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (run, k)

    run = tmp_path / "run"
    assert main(["dpo", "--init-from", str(sft), "--out", str(run), *args]) == 0
    capsys.readouterr()
    assert main(["dpo", "--init-from", str(other), "--out", str(run), "--force", *args]) == 0
    assert "another reference model" in capsys.readouterr().out
    (run / "metrics.jsonl").unlink()  # this attempt's rows only
    assert main(["dpo", "--init-from", str(other), "--out", str(run), "--force", *args]) == 0
    assert "reference log-probs from" in capsys.readouterr().out  # the same model again: the cache serves
    same_as_live_reference(run, other)
    # the same path, its model replaced (trained again into the same directory)
    moved = tmp_path / "moved"
    shutil.copytree(sft, moved)
    run2 = tmp_path / "run2"
    assert main(["dpo", "--init-from", str(moved), "--out", str(run2), *args]) == 0
    shutil.rmtree(moved)
    shutil.copytree(other, moved)
    (run2 / "metrics.jsonl").unlink()
    capsys.readouterr()
    assert main(["dpo", "--init-from", str(moved), "--out", str(run2), "--force", *args]) == 0
    assert "another reference model" in capsys.readouterr().out
    same_as_live_reference(run2, other)


def test_reference_identity_of_files_and_directories_follows_their_weights(tmp_path):
    """A GGUF or llm.c file and a Hugging Face directory are known by their bytes (no meta.json to read)."""
    from gptforge.training.dpo import reference_identity

    cfg = Config()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"a" * 100)
    (hf / "README.md").write_text("not weights")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 50)
    seen = set()
    for src, change in ((hf, lambda: (hf / "model.safetensors").write_bytes(b"b" * 100)),
                        (gguf, lambda: gguf.write_bytes(b"GGUF" + b"\1" * 50))):
        cfg.dpo.init_from = str(src)
        before = reference_identity(cfg)
        if src == hf:
            (hf / "README.md").write_text("edited")  # not a weight or config file: the same model
            assert reference_identity(cfg) == before
        change()
        after = reference_identity(cfg)
        assert after != before and after["dtype"] == before["dtype"]
        seen |= {before["reference"], after["reference"]}
    assert len(seen) == 4
    cfg.train.dtype = "bfloat16" if cfg.train.dtype != "bfloat16" else "float32"
    assert reference_identity(cfg)["dtype"] != after["dtype"]


def test_ppo_with_reward_model_resumes_exactly(world, tmp_path, capsys):
    tmp, sft, _ = world
    args = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2",
            "--lr", "1e-3", "--algo", "ppo", "--reward-model", str(tmp / "rm"), "--updates-per-batch", "2", *CPU]
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "full"), "--steps", "3", *args]) == 0
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "part"), "--steps", "2", *args]) == 0
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "3"]) == 0
    keys = ("loss", "policy_loss", "value_loss", "reward", "accuracy", "kl", "grad_norm", "reply_len")
    full, part = _rows(tmp_path / "full", "rl"), _rows(tmp_path / "part", "rl")
    assert [{k: r[k] for k in keys} for r in full] == [{k: r[k] for k in keys} for r in part]
    assert all(r["reward"] != 0.0 for r in full) and full[-1]["value_loss"] > 0  # the learned reward is in use
    _same_weights(tmp_path / "full", tmp_path / "part")
    assert ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "full"))["recipe"] == "ppo"
    # every model command reads a PPO checkpoint's policy
    from gptforge.load import ModelSource, load_model

    policy = load_model(ModelSource(ckpt=str(tmp_path / "full")))
    sd = load_file(str(ckpt.latest_checkpoint(tmp_path / "full") / "model.safetensors"))
    assert torch.equal(policy.state_dict()["transformer.h.0.attn.c_attn.weight"],
                       sd["policy.transformer.h.0.attn.c_attn.weight"])
    # the algorithm and the reward model are frozen on resume; GRPO refuses to continue a PPO run
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "4", "--algo", "grpo"]) == 2
    assert "rl.algo" in capsys.readouterr().err
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "x"), "--reward-model", str(sft), *CPU]) == 2
    assert "not a reward model" in capsys.readouterr().err


def test_grpo_with_reward_model_logs_score_beside_accuracy(world, tmp_path):
    tmp, sft, _ = world
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "g"), "--steps", "1", "--task", "compare",
                 "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2",
                 "--reward-model", str(tmp / "rm"), *CPU]) == 0
    (row,) = _rows(tmp_path / "g", "rl")
    assert row["reward"] != 0.0 and 0.0 <= row["accuracy"] <= 1.0


def test_reward_and_value_bodies_freeze_only_an_untied_head():
    """hidden_states never runs the LM head: Llama's untied head is frozen (no optimizer state, no DDP
    wait); GPT-2's tied head is the input embedding and trains."""
    from gptforge.config import OptimConfig
    from gptforge.models.registry import model_config
    from gptforge.optim import build_optimizer
    from gptforge.training.rm import RM

    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}
    llama = RM.build_model(RM.__new__(RM), model_config({"arch": "llama", **shape}))
    assert [n for n, p in llama.named_parameters() if not p.requires_grad] == ["body.lm_head.weight"]
    opt = build_optimizer(llama, OptimConfig(), "cpu")
    assert all(p is not llama.body.lm_head.weight for g in opt.param_groups for p in g["params"])
    gpt = RM.build_model(RM.__new__(RM), model_config({"arch": "gpt2", **shape}))
    assert all(p.requires_grad for p in gpt.parameters())


def test_win_rate_against_the_reference_judged_by_a_reward_model(world, tmp_path, capsys):
    tmp, sft, _ = world
    out = tmp_path / "w.json"
    assert main(["eval", "--tasks", "compare", "--limit", "3", "--ckpt", str(sft), "--against", str(sft),
                 "--reward-model", str(tmp / "rm"), "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert r["n"] == 3 and r["win_rate"] == 0.5 and r["policy_score"] == r["reference_score"]  # itself: all ties
    assert main(["eval", "--tasks", "compare", "--ckpt", str(sft), "--against", str(sft)]) == 2
    assert "--reward-model" in capsys.readouterr().err


def test_reward_model_ensemble_is_the_members_mean_or_min_in_every_reader(world, tmp_path, capsys):
    """``RUN1,RUN2`` names an ensemble wherever a reward model is read (rl, eval, prepare --judge): its
    score is the members' mean (or min under rl.reward_reduce min), checked against each member's own."""
    from gptforge.data.preference import read_preferences, render_pairs
    from gptforge.training.rm import RewardEnsemble, load_reward_model, score_sequences

    tmp, sft, prefs = world
    a, b = str(tmp / "rm"), str(tmp_path / "rm2")
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", b, "--steps", "2", "--seed", "5",
                 "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", *CPU]) == 0
    ens, template = load_reward_model(f"{a},{b}")
    assert isinstance(ens, RewardEnsemble) and template.to_dict() == ChatTemplate.gpt2().to_dict()
    seqs = [p.chosen.ids.tolist() for p in render_pairs(read_preferences(str(prefs)), template, 64)[:6]]
    each = torch.stack([score_sequences(load_reward_model(x)[0], seqs, template.bos) for x in (a, b)])
    assert (each[0] - each[1]).abs().max() > 1e-3  # two different members, or the test proves nothing
    torch.testing.assert_close(score_sequences(ens, seqs, template.bos), each.mean(0))
    ens.reduce = "min"
    torch.testing.assert_close(score_sequences(ens, seqs, template.bos), each.min(0).values)

    # every reader takes it: PPO (value model from the first member), eval, win rate, on-policy pairs
    rl = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--steps",
          "1", "--algo", "ppo", *CPU]
    for reduce in ("mean", "min"):
        assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / reduce), "--reward-model", f"{a},{b}",
                     "--rl.reward_reduce", reduce, *rl]) == 0
        assert _rows(tmp_path / reduce, "rl")[0]["reward"] != 0.0
    assert main(["eval", "--ckpt", f"{a},{b}", "--preferences", str(prefs)]) == 0
    assert main(["eval", "--tasks", "compare", "--limit", "2", "--ckpt", str(sft), "--against", str(sft),
                 "--reward-model", f"{a},{b}"]) == 0
    assert main(["prepare", "preferences", "compare", "--policy", str(sft), "--judge", f"{a},{b}", "--n", "2",
                 "--samples", "2", "--max-new-tokens", "4", "--device", "cpu", "--out", str(tmp_path / "p.jsonl")]) == 0
    capsys.readouterr()

    # careless lists are refused, naming what is wrong, by every reader
    bad = {f"{a},,{b}": "empty name", f"{a},{a}": "named twice", f"{a},{sft}": "not a reward model",
           f"{a},{tmp_path / 'nope'}": "nope"}
    for spec, why in bad.items():
        for argv in (["rl", "--init-from", str(sft), "--out", str(tmp_path / "bad"), "--reward-model", spec, *rl],
                     ["eval", "--ckpt", spec, "--preferences", str(prefs)],
                     ["eval", "--tasks", "compare", "--limit", "2", "--ckpt", str(sft), "--against", str(sft),
                      "--reward-model", spec],
                     ["prepare", "preferences", "compare", "--policy", str(sft), "--judge", spec, "--n", "2",
                      "--out", str(tmp_path / "q.jsonl")]):
            assert main(argv) == 2, (argv, spec)
            err = capsys.readouterr().err
            assert why in err and "Traceback" not in err, (argv, err)
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "one"), "--reward-model", a,
                 "--rl.reward_reduce", "min", *rl]) == 2
    assert "ensemble" in capsys.readouterr().err


def test_reward_norm_whitens_each_member_by_the_first_batch_then_keeps_it():
    """rl.reward_norm: each member's score is whitened by the mean and (population) std it gave the first
    batch, then the members are reduced; later batches reuse those numbers. Checked against the members
    scored one sequence at a time, whitened in float64."""
    from types import SimpleNamespace

    from gptforge.models.registry import build_model, model_config
    from gptforge.parallel.distributed import DistInfo
    from gptforge.training.grpo import GRPO
    from gptforge.training.rl_state import RLState
    from gptforge.training.rm import RewardEnsemble, RewardModel
    from gptforge.training.rollouts import Rollouts

    shape = model_config({"arch": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64})
    torch.manual_seed(0)
    members = [RewardModel(build_model(shape)).eval() for _ in range(3)]
    g = torch.Generator().manual_seed(1)

    def batch(n):
        prompts = [torch.randint(1, 64, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
        replies = [torch.randint(1, 64, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
        return Rollouts([None] * n, prompts, replies, [""] * n)

    def one_by_one(rollouts):  # (members, n) float64, each sequence alone (no padding at all)
        return torch.tensor([[m(torch.tensor([p + r]), torch.tensor([len(p + r) - 1])).item()
                              for p, r in zip(rollouts.prompts, rollouts.replies, strict=True)] for m in members],
                            dtype=torch.float64)

    logs: list[str] = []
    run = SimpleNamespace(cfg=SimpleNamespace(rl=SimpleNamespace(reward_norm=True)), info=DistInfo(), log=logs.append)
    for reduce in ("mean", "min"):
        recipe = GRPO.__new__(GRPO)
        recipe.reward_model, recipe.pad, recipe.state = RewardEnsemble(members, reduce), 0, RLState()
        first, second = batch(12), batch(7)
        ref1, ref2 = one_by_one(first), one_by_one(second)
        mean, std = ref1.mean(1, keepdim=True), ref1.std(1, unbiased=False, keepdim=True)
        red = (lambda s: s.mean(0)) if reduce == "mean" else (lambda s: s.min(0).values)
        torch.testing.assert_close(recipe.rewards(first, run).double(), red((ref1 - mean) / std), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(recipe.rewards(second, run).double(), red((ref2 - mean) / std), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(recipe.state.reward_norm["scale"], dtype=torch.float64), std[:, 0])
    assert "whitened" in logs[0]


def test_adaptive_kl_and_reward_norm_resume_exactly_and_refuse_bad_state(world, tmp_path, capsys):
    """rl.kl_target moves the KL coefficient by Ziegler et al.'s rule (checked by hand each step, GRPO and
    PPO); it and rl.reward_norm's whitening live in the checkpoint, so a resumed run equals an
    uninterrupted one; a damaged or foreign value there is refused, naming meta.json's field."""
    tmp, sft, _ = world
    rm = str(tmp / "rm")
    args = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2",
            "--lr", "1e-3", "--algo", "ppo", "--reward-model", rm, "--reward-norm", "--kl-coef", "0.05",
            "--kl-target", "0.001", "--rl.kl_horizon", "8", *CPU]
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "full"), "--steps", "3", *args]) == 0
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "part"), "--steps", "2", *args]) == 0
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "3"]) == 0
    keys = ("loss", "reward", "kl", "kl_coef", "grad_norm")
    full, part = _rows(tmp_path / "full", "rl"), _rows(tmp_path / "part", "rl")
    assert [{k: r[k] for k in keys} for r in full] == [{k: r[k] for k in keys} for r in part]
    _same_weights(tmp_path / "full", tmp_path / "part")
    assert abs(full[0]["reward"]) < 1e-5  # one reward model, whitened on step 1's own replies: mean 0
    assert full[0]["kl_coef"] == 0.05
    for a, b in zip(full[:-1], full[1:], strict=True):  # c * (1 + clip(kl / target - 1, -0.2, 0.2) * replies / horizon)
        err = min(max(a["kl"] / 0.001 - 1, -0.2), 0.2)
        assert b["kl_coef"] == pytest.approx(a["kl_coef"] * (1 + err * 4 / 8), rel=1e-12)
    assert len({r["kl_coef"] for r in full}) == 3  # it moved every step
    grpo = [*args[: args.index("--algo")], *args[args.index("--algo") + 2 :]]
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "g"), "--steps", "2", *grpo]) == 0
    g = _rows(tmp_path / "g", "rl")
    err = min(max(g[0]["kl"] / 0.001 - 1, -0.2), 0.2)
    assert g[1]["kl_coef"] == pytest.approx(0.05 * (1 + err * 4 / 8), rel=1e-12) and g[1]["kl_coef"] != 0.05
    capsys.readouterr()

    # what the checkpoint carries is checked on the way back in
    meta_path = ckpt.latest_checkpoint(tmp_path / "part") / "meta.json"
    good = json.loads(meta_path.read_text())
    assert set(good["loader"]) == {"kl_coef", "kl_start", "reward_norm"}  # kl_start: where the coefficient started
    damaged = {"kl_coef": [-1, 0, "0.1", True, None, [1]], "kl_start": [-1, 0, "0.05", True, [1]], "reward_norm": [
        {"shift": [0.0], "scale": [0.0]}, {"shift": [0.0, 1.0], "scale": [1.0, 1.0]}, {"shift": [], "scale": []},
        {"shift": ["a"], "scale": [1.0]}, {"shift": [0.0]}, [0.0, 1.0], {"shift": [1e400], "scale": [1.0]}]}
    for field, values in damaged.items():
        for v in values:
            meta = json.loads(json.dumps(good))
            meta["loader"][field] = v
            if v is None:
                del meta["loader"][field]
                if field == "kl_coef":
                    continue  # no coefficient saved: the run starts from rl.kl_coef again (a run from before this)
            meta_path.write_text(json.dumps(meta))
            assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "4"]) == 2, (field, v)
            err = capsys.readouterr().err
            assert ("loader" in err or "reward_norm" in err) and "Traceback" not in err, (field, v, err)
    meta_path.write_text(json.dumps({**good, "loader": {}}))  # a run that never set its whitening
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "4"]) == 2
    assert "reward_norm" in capsys.readouterr().err
    meta_path.write_text(json.dumps(good))

    # careless settings are refused before any work, naming the key
    refusals = [(["--resume", "--steps", "4", "--rl.reward_norm", "false"], "rl.reward_norm"),  # frozen
                (["--resume", "--steps", "4", "--kl-target", "-1"], "rl.kl_target"),
                (["--resume", "--steps", "4", "--rl.kl_horizon", "0"], "rl.kl_horizon")]
    for extra, key in refusals:
        assert main(["rl", "--out", str(tmp_path / "part"), *extra]) == 2, extra
        assert key in capsys.readouterr().err
    one = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", *CPU]
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "x"), "--reward-norm", *one]) == 2
    assert "--reward-model" in capsys.readouterr().err
    assert main(["rl", "--init-from", str(sft), "--out", str(tmp_path / "x"), "--kl-target", "1", "--kl-coef", "0",
                 *one]) == 2
    assert "rl.kl_coef" in capsys.readouterr().err
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_a_reward_model_is_known_by_its_weights_not_its_spelling(world, tmp_path, capsys, monkeypatch):
    """issue 33, class 4: a run started with a relative --reward-model resumes from another directory,
    with the same model named by its absolute path; another model with the same spelling is refused,
    naming both."""
    import shutil

    tmp, sft, prefs = world
    shutil.copytree(tmp / "rm", tmp_path / "rm")
    rl = ["--task", "compare", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", *CPU]
    monkeypatch.chdir(tmp_path)
    assert main(["rl", "--init-from", str(sft), "--out", "run", "--reward-model", "rm", "--steps", "1", *rl]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["rl", "--out", str(tmp_path / "run"), "--resume", "--steps", "2", *CPU]) == 0  # saved absolute
    assert main(["rl", "--out", str(tmp_path / "run"), "--resume", "--steps", "3", "--reward-model",
                 "../rm", *CPU]) == 0  # the same weights, spelled another way
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", str(tmp_path / "rm_other"), "--steps",
                 "2", "--seed", "9", "--val-count", "8", "--micro-batch", "4", "--lr", "1e-3", *CPU]) == 0
    capsys.readouterr()
    assert main(["rl", "--out", str(tmp_path / "run"), "--resume", "--steps", "4", "--reward-model",
                 str(tmp_path / "rm_other"), *CPU]) == 2
    err = capsys.readouterr().err
    assert "rm_other" in err and "this run was trained with" in err and str(tmp_path / "rm") in err
