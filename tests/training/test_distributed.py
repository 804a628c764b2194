"""Scale-out on CPU with gloo and 2 processes: DDP, ZeRO-1 and FSDP2 against one process with 2x
gradient accumulation; the GRPO, PPO, reward-model and DPO recipes against one process; sharded
checkpoints resumed at world 2 and world 1; a rank killed mid-run and restarted by torchrun; bad input
before training. One torchrun launch (the ``runs`` fixture) runs every world-2 job.

The reference for every distributed run is the single-process loop (itself tested for bit-exact
resume and split-independent gradients in test_training.py): same data, same total batch, float32.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gptforge.config import Config, ConfigError, DistConfig, apply_overrides
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import write_shard
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from gptforge.storage.digest import sha256_file
from gptforge.training.loop import train
from tests.conftest import child_env, make_shards, tiny_config
from tests.tolerances import assert_adam_trained_alike

HERE = Path(__file__).parent
STEPS = 8


def _cfg(data: Path, out: Path, **dist) -> Config:
    cfg = tiny_config(data, out, max_steps=STEPS, ckpt_every=4)
    cfg.model.dropout = 0.0  # ranks draw different dropout masks than one process would
    cfg.dist = DistConfig(**dist)
    return cfg


def _with(cfg: Config, recompute: str) -> Config:
    cfg.model.recompute = recompute
    return cfg


def _trusted(cfg: Config) -> Config:
    """Resuming a sharded (dcp/) checkpoint unpickles its metadata: these tests wrote it themselves."""
    cfg.train.trust_checkpoint = True
    return cfg


def _evals(cfg: Config) -> Config:
    """piqa's first 3 rows every 4 steps, one request per forward (eval.batch_tokens 1): rank 0's share is 4
    requests, rank 1's 2; and samples every 4 steps."""
    cfg.model.vocab_size = 50304  # the tasks are GPT-2 text
    cfg.eval.every, cfg.eval.tasks, cfg.eval.limit, cfg.eval.batch_tokens = 4, "piqa", 3, 1
    cfg.train.sample_every, cfg.train.sample_tokens = 4, 4
    return cfg


def _dropout(cfg: Config) -> Config:
    cfg.model.dropout = 0.1
    return cfg


def _torchrun(args: list[str], env_extra: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    # PYTHONFAULTHANDLER: a worker that aborts (SIGABRT, e.g. the open "terminate called without an
    # active exception" at exit) also prints every Python thread's stack, so a sighting says where the
    # main thread was (still in train(), or already finalizing the interpreter)
    env = child_env(PYTHONFAULTHANDLER="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    # own process group: on a timeout (a hung run) the workers go too, not only the launcher
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout}s (hung?)\n{out[-2000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _read(path: Path) -> dict:
    d = json.loads(path.read_text())
    return {"train": {int(k): v for k, v in d["train"].items()}, "val": {int(k): v for k, v in d["val"].items()}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, eval_data):
    """One torchrun launch (world 2) running every distributed job in turn, plus the 1-process reference."""
    tmp = tmp_path_factory.mktemp("dist")
    data = make_shards(tmp / "data")
    jobs = [
        # FSDP with in-loop task scores whose rank shares take unequal forward counts, and samples on rank 0 only
        {"config": _evals(_cfg(data, tmp / "fsdp_eval", shard="fsdp")).to_dict(), "out": str(tmp / "fsdp_eval.json")},
        {"config": _cfg(data, tmp / "ddp").to_dict(), "out": str(tmp / "ddp.json")},
        {"config": _cfg(data, tmp / "zero", shard="zero1").to_dict(), "out": str(tmp / "zero.json")},
        {"config": _cfg(data, tmp / "fsdp", shard="fsdp").to_dict(), "out": str(tmp / "fsdp.json")},
        # FSDP with block recomputation, and ZeRO-2-like (gathered params kept) with MLP recomputation
        {"config": _with(_cfg(data, tmp / "fsdp_block", shard="fsdp"), recompute="block").to_dict(),
         "out": str(tmp / "fsdp_block.json")},
        {"config": _with(_cfg(data, tmp / "fsdp_keep", shard="fsdp", reshard_after_forward=False), recompute="mlp")
         .to_dict(), "out": str(tmp / "fsdp_keep.json")},
        # stopped after step 4, copied aside (to resume at world 1), then resumed at world 2
        {"config": _cfg(data, tmp / "fsdp_part", shard="fsdp").to_dict(), "out": str(tmp / "fsdp_part.json"),
         "stop_at_step": 4, "copy_to": [str(tmp / "fsdp_part_w1"), str(tmp / "fsdp_to_zero")]},
        {"config": _trusted(_cfg(data, tmp / "fsdp_part", shard="fsdp")).to_dict(), "out": str(tmp / "fsdp_rest.json"),
         "resume": "latest"},
        {"config": _cfg(data, tmp / "zero_part", shard="zero1").to_dict(), "out": str(tmp / "zero_part.json"),
         "stop_at_step": 4},
        # switching strategy on resume: a sharded (DCP) checkpoint into ZeRO-1, a single-file one into FSDP
        {"config": _trusted(_cfg(data, tmp / "fsdp_to_zero", shard="zero1")).to_dict(), "out": str(tmp / "fsdp_to_zero.json"),
         "resume": "latest"},
        # dropout on: each rank draws its own masks, and a resume continues every rank's stream exactly
        {"config": _dropout(_cfg(data, tmp / "drop")).to_dict(), "out": str(tmp / "drop.json")},
        {"config": _dropout(_cfg(data, tmp / "drop_part")).to_dict(), "out": str(tmp / "drop_part.json"),
         "stop_at_step": 4},
        {"config": _dropout(_cfg(data, tmp / "drop_part")).to_dict(), "out": str(tmp / "drop_rest.json"),
         "resume": "latest"},
        {"config": _cfg(data, tmp / "ddp_to_fsdp").to_dict(), "out": str(tmp / "ddp_part.json"), "stop_at_step": 4},
        {"config": _cfg(data, tmp / "ddp_to_fsdp", shard="fsdp").to_dict(), "out": str(tmp / "ddp_to_fsdp.json"),
         "resume": "latest"},
    ]
    # GRPO across ranks: each rank samples half of the problems' groups; compared with one process below
    chat, peaked = _chat_checkpoint(tmp), _chat_checkpoint(tmp, peaked=True)
    jobs.append({"cli": ["rl", "--init-from", str(peaked), "--out", str(tmp / "rl2"), *RL_ARGS]})
    # graded rewards (a random model scores 0 on the task's own): the advantages, and scale_rewards batch's
    # std over every rank's replies (count, sum and sum of squares all-reduced), against one process; and
    # resample_flat's rounds (every rank samples until no rank has a flat group), against one process
    for scale in GRADED:
        jobs.append({"cli": ["rl", "--init-from", str(peaked), "--out", str(tmp / f"rl_{scale}2"), *_graded(scale)]})
    # rm, dpo and PPO across ranks; each compared with one process accumulating the same global batch
    from gptforge.eval.tasks.preferences import preference_set, write_preferences

    prefs = write_preferences(preference_set("compare", 32, seed=1), tmp / "prefs.jsonl")
    # dpo starts from the chat model as an llm.c file: a model file the run hashes for meta.json's models record
    # (and for its reference log-probs' cache), which rank 0 alone reads (test_a_model_file_is_hashed_on_rank_0_only)
    chat_file = _llmc_copy(chat, tmp / "chat.bin")
    for name in ALIGN:
        jobs.append({"cli": _align_argv(name, chat_file if name == "dpo" else chat, prefs, tmp / f"{name}2", world=2),
                     **({"count_hashes": str(tmp / "dpo_hashes")} if name == "dpo" else {})})
    # dpo2 resumed (into another folder, dpo2 stays as trained) with its reference given anew (a copy): the models
    # it reads again are checked against its record once a machine, after the group is joined
    # (test_a_resume_hashes_its_models_once_a_machine)
    shutil.copyfile(chat_file, tmp / "chat_moved.bin")
    jobs.append({"cli": ["dpo", "--out", str(tmp / "dpo2_more"), "--resume", str(tmp / "dpo2"), "--steps", "4",
                         "--init-from", str(tmp / "chat_moved.bin")], "count_hashes": str(tmp / "dpo_resume_hashes")})
    # LoRA SFT under DDP: each rank a micro-batch, against one process accumulating both (below)
    lora_base, convs = _lora_world(tmp)
    jobs.append({"cli": _lora_sft_argv(lora_base, convs, tmp / "lora_sft2")})
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps(jobs))
    proc = _torchrun([str(HERE / "dist_worker.py"), str(spec)])  # child_env: tests.training.graded_reward imports
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    names = ("fsdp_eval", "ddp", "zero", "fsdp", "fsdp_block", "fsdp_keep", "fsdp_part", "fsdp_rest", "fsdp_to_zero",
             "ddp_to_fsdp", "drop", "drop_part", "drop_rest")
    out = {name: _read(tmp / f"{name}.json") for name in names}
    one = train(_cfg(data, tmp / "one"))  # world 1, gradient accumulation 2
    out["one"] = {"train": one.train_losses, "val": one.val_losses}
    out["one_eval"] = {"train": train(_evals(_cfg(data, tmp / "one_eval"))).train_losses}
    # world-2 checkpoints at step 4 resumed on one process
    with pytest.raises(ckpt.CheckpointError, match="--trust-checkpoint"):  # dcp/.metadata is a pickle
        train(_cfg(data, tmp / "fsdp_part_w1", shard="fsdp"), resume="latest")
    fsdp_w1 = train(_trusted(_cfg(data, tmp / "fsdp_part_w1", shard="fsdp")), resume="latest")
    out["fsdp_w1"] = {"train": fsdp_w1.train_losses, "val": fsdp_w1.val_losses}
    zero_w1 = train(_cfg(data, tmp / "zero_part", shard="zero1"), resume="latest")
    out["zero_w1"] = {"train": zero_w1.train_losses, "val": zero_w1.val_losses}
    from gptforge.cli import main as cli

    assert cli(["rl", "--init-from", str(peaked), "--out", str(tmp / "rl1"), *RL_ARGS]) == 0
    for scale in GRADED:
        assert cli(["rl", "--init-from", str(peaked), "--out", str(tmp / f"rl_{scale}1"), *_graded(scale)]) == 0
    for name in ALIGN:
        assert cli(_align_argv(name, chat_file if name == "dpo" else chat, prefs, tmp / f"{name}1", world=1)) == 0
    assert cli(_lora_sft_argv(lora_base, convs, tmp / "lora_sft1")) == 0
    out["dirs"] = tmp
    out["log"] = proc.stdout
    return out


# the floor for a logged metric near 0 (module docstring of tests/tolerances.py): rounding of a mean over the
# batch of per-token log-probs (|logp| <= ~16 for a 50,261-way softmax at random init) and rewards of size ~1, 4 x 64
# terms reordered: sum_tol(16, 256) = 1.2e-4 at worst; 1e-5 leaves rounding 30x room in practice (largest seen
# across the AVX-512, AVX2 and default ATen paths: 3.6e-7) and stays 100x under a trained step's change
METRIC_FLOOR = 1e-5

RL_ARGS = ["--task", "arithmetic", "--prompts", "4", "--group", "3", "--max-new-tokens", "5", "--eval-n", "6",
           "--steps", "3", "--lr", "3e-3", "--temperature", "1.5", "--device", "cpu", "--micro-batch", "4"]

# rl.scale_rewards under a graded reward; and rl.resample_flat under one that is flat for half the problems
GRADED = {"group": ["--rl.scale_rewards", "group"], "batch": ["--rl.scale_rewards", "batch"],
          "resample": ["--reward", "tests.training.graded_reward:flat_for_odd_answers", "--rl.resample_flat", "2"],
          # FSDP (a no-op at world 1): the reference copied from gathered weights, sampling and held-out replies
          # of unequal lengths on the ranks
          "fsdp": ["--dist.shard", "fsdp"]}


def _graded(name: str) -> list[str]:
    return [*RL_ARGS, "--reward", "tests.training.graded_reward:graded", *GRADED[name]]  # a later --reward wins


# world 2 takes 2 pairs (rm, dpo) or 2 problems' replies (ppo) per rank; world 1 accumulates both halves
ALIGN = {"rm": ["--micro-batch", "2", "--val-count", "6"], "dpo": ["--micro-batch", "2", "--val-count", "6"],
         "ppo": ["--algo", "ppo", "--task", "arithmetic", "--prompts", "4", "--group", "2", "--max-new-tokens", "5",
                 "--eval-n", "4", "--temperature", "1.5", "--micro-batch", "2", "--updates-per-batch", "2",
                 # the whitening's statistics and the adaptive KL coefficient are every rank's, not one rank's
                 "--reward-norm", "--kl-target", "0.01", "--rl.kl_horizon", "8"]}
# PPO with LoRA: the policy's adapters and the whole value model under DDP, the base frozen (and the reference)
ALIGN["ppo_lora"] = [*ALIGN["ppo"], "--lora.rank", "2", "--lora.targets", "c_attn"]
# under FSDP (a no-op at world 1): 5 held-out pairs (3 and 2 a rank: unequal forward counts), DPO's held-out
# task replies, PPO's policy and value called apart from the root, the references copied from gathered weights
FSDP = ["--dist.shard", "fsdp"]
ALIGN["rm_fsdp"] = [*ALIGN["rm"], "--val-count", "5", *FSDP]
ALIGN["dpo_fsdp"] = [*ALIGN["dpo"], "--val-count", "5", "--dpo.task", "arithmetic", "--dpo.eval_n", "5", *FSDP]
ALIGN["ppo_fsdp"] = [*ALIGN["ppo"], *FSDP]


def _align_argv(name: str, chat: Path, prefs: Path, out: Path, world: int) -> list[str]:
    common = ["--init-from", str(chat), "--out", str(out), "--lr", "3e-3", "--device", "cpu"]
    if name.startswith("ppo"):  # scored by the world-2 reward model (trained first): random replies all score 0 on a task.
        # 2 steps: step 3 samples from weights that differ by float noise (the gradients' sum order) and, at
        # temperature 1.5, a draw near a token boundary then picks another token (seen: step 3's rewards differ)
        return ["rl", *common, "--steps", "2", *ALIGN[name], "--reward-model", str(out.parent / "rm2")]
    common += ["--steps", "3"]
    cmd = name.split("_")[0]
    return [cmd, *common, "--data", str(prefs), *ALIGN[name], f"--{cmd}.grad_accum", str(3 - world)]


def _lora_world(tmp: Path) -> tuple[Path, Path]:
    """A tiny base model and arithmetic conversations for LoRA SFT."""
    from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    mcfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    base = ckpt.save_checkpoint(tmp / "lora_base", 0, GPT(mcfg), None, {"config": Config(model=mcfg).to_dict()})
    return base, write_conversations(arithmetic_problems(120, seed=2), tmp / "conv.jsonl")


def _lora_sft_argv(base: Path, convs: Path, out: Path) -> list[str]:
    """2 micro-batches of 2 conversations' tokens per step: one per rank at world 2, accumulated at world 1.
    No dropout (the ranks would draw other masks than one process)."""
    return ["sft", "--init-from", str(base), "--data", str(convs), "--out", str(out), "--val-count", "16",
            "--train.seq_len", "64", "--train.micro_batch", "2", "--train.total_batch_tokens", "256",
            "--train.device", "cpu", "--train.dtype", "float32", "--train.max_steps", "3", "--train.val_every", "3",
            "--train.sample_every", "0", "--optim.lr", "1e-2", "--optim.warmup_steps", "1",
            "--lora.rank", "4", "--lora.alpha", "8", "--lora.dropout", "0", "--lora.targets", "c_attn,c_fc"]


def _chat_checkpoint(tmp: Path, peaked: bool = False) -> Path:
    """A tiny chat model (random weights; the GPT-2 vocabulary plus the chat tokens) to start RL from.

    ``peaked``: the (tied) embedding scaled 50x, so the logits' spread is ~5.7 (0.02 x sqrt(32) x 50) instead of
    0.11, for the runs that compare sampled replies across world sizes. Their logits differ by rounding (the
    ranks pad to other lengths; after step 1 the gradients were summed in another order), and an inverse-CDF
    draw (generation.sample_from) flips to the next token when its uniform lies within that rounding of a
    boundary of the running sum: ~eps x V/2 per draw on a flat 50,261-way distribution (~2e-3 at eps 1e-7,
    ~60 draws a step: equal replies held on AVX-512 and failed under the AVX2 and default ATen paths). At
    temperature 1.5 the peaked model keeps ~10 tokens in play per position (the replies still differ within a
    group), so a flip needs the uniform within eps x ~10 of a boundary: ~1e-6 per draw."""
    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    t = ChatTemplate.gpt2()
    mcfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    model = GPT(mcfg)
    if peaked:
        with torch.no_grad():
            model.transformer.wte.weight.mul_(50.0)
    return ckpt.save_checkpoint(tmp / ("sft_peaked" if peaked else "sft"), 1, model, None,
                                {"config": Config(model=mcfg).to_dict(), "chat_template": t.to_dict()})


def _llmc_copy(checkpoint: Path, path: Path) -> Path:
    """The checkpoint's model as an llm.c file (the same weights: the chat model's vocabulary has no padding rows)."""
    from gptforge.interop.llmc import write_llmc_model
    from gptforge.load import ModelSource, load_model

    return write_llmc_model(load_model(ModelSource.from_path(str(checkpoint))), path)


@pytest.mark.parametrize("run", ["rl", *(f"rl_{s}" for s in GRADED)])
def test_grpo_on_two_ranks_equals_one_rank(runs, run):
    """Rollouts split by rank (each rank samples whole groups, with the random draws those rows get in
    the whole batch) and DDP's average of equal shares give the 1-process run: the same replies, so
    the same rewards and accuracies exactly; losses and weights to float tolerance (the ranks' batches
    are padded to other lengths, and the gradient is summed in another order). ``rl``: the task's
    reward (all 0 for this random model); ``rl_group``/``rl_batch``: a graded reward, with the advantages
    scaled by each group's std or by the std of the whole step's replies, gathered from both ranks;
    ``rl_resample``: flat groups redrawn position by position, every rank sampling each round until no
    rank has a flat group left, so the rounds, the groups kept and the update equal one process's."""
    from gptforge.run.metrics import read_metrics

    one, two = (read_metrics(runs["dirs"] / name / "metrics.jsonl") for name in (f"{run}1", f"{run}2"))
    steps = [[r for r in recs if r["kind"] == "rl"] for recs in (one, two)]
    assert [r["step"] for r in steps[0]] == [r["step"] for r in steps[1]] == [1, 2, 3]
    for a, b in zip(*steps, strict=True):
        assert (a["accuracy"], a["reply_len"]) == (b["accuracy"], b["reply_len"])
        assert a["reward"] == pytest.approx(b["reward"], rel=1e-6)  # equal rewards, averaged in float32 per rank
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=METRIC_FLOOR)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-3, abs=METRIC_FLOOR)  # a difference of log-probs, near 0
    if run == "rl_resample":
        keys = ("resample_rounds", "flat_groups", "flat_groups_drawn")
        assert [[r[k] for k in keys] for r in steps[0]] == [[r[k] for k in keys] for r in steps[1]]
        assert any(r["resample_rounds"] > 0 for r in steps[0])  # the path was taken
    if run != "rl":  # graded: the advantages are not all 0, so the update depends on their scale
        assert all(0 < r["reward"] for r in steps[0]) and len({r["loss"] for r in steps[0]}) == 3
    evals = [[(r["step"], r["acc"], r["n"]) for r in recs if r["kind"] == "eval"] for recs in (one, two)]
    assert evals[0] == evals[1] and [e[0] for e in evals[0]] == [0, 3]
    from gptforge.models.gpt2 import GPT

    w = []
    for name in (f"{run}1", f"{run}2"):
        last = ckpt.latest_checkpoint(runs["dirs"] / name)
        model = GPT(Config.from_dict(ckpt.read_meta(last)["config"]).model)
        restore.load_model_weights(model, last)
        w.append(model.state_dict())
    # lr 3e-3, 3 steps (RL_ARGS); the key bias is rounding noise under Adam (tests/tolerances.py)
    assert_adam_trained_alike(w[0], w[1], lr=3e-3, steps=3)


@pytest.mark.parametrize("name", list(ALIGN))
def test_rm_dpo_and_ppo_on_two_ranks_equal_one_rank_accumulating(runs, name):
    """Every step's metrics (losses, accuracies, margins, rewards, KL) and held-out eval to 1e-4, and
    the final weights to 1e-4 relative: the same global batch, split over ranks or accumulated."""
    from gptforge.run.metrics import read_metrics

    one, two = ([r for r in read_metrics(runs["dirs"] / f"{name}{w}") if r["kind"] not in ("start", "end")]
                for w in (1, 2))
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    steps = [r for r in one if r["kind"] != "eval"]
    n = 2 if name.startswith("ppo") else 3
    assert [r["step"] for r in steps] == list(range(1, n + 1)) and len({r["loss"] for r in steps}) == n  # it trains
    timings = {"dt_ms", "cpu_ms", "sample_ms", "time", "t"}
    for a, b in zip(one, two, strict=True):
        for k, v in a.items():
            if isinstance(v, float) and k not in timings:
                # a metric near 0 (a margin, KL, a whitened reward's mean) is rounding of the larger quantities
                # it is a difference of (METRIC_FLOOR)
                assert v == pytest.approx(b[k], rel=1e-4, abs=METRIC_FLOOR), (name, a["kind"], a["step"], k, v, b[k])
    w1, w2 = (load_file(str(ckpt.latest_checkpoint(runs["dirs"] / f"{name}{w}") / "model.safetensors"))
              for w in (1, 2))
    assert w1.keys() == w2.keys()
    if name == "ppo_lora":  # the policy's adapters (trained) and the value model; no frozen base weight
        assert sorted(k for k in w1 if not k.startswith("value.")) == [
            f"policy.transformer.h.0.attn.c_attn.lora_{x}.weight" for x in "AB"]
        assert w1["policy.transformer.h.0.attn.c_attn.lora_B.weight"].abs().max() > 0
    # lr 3e-3 (_align_argv), 2 steps for PPO and 3 for rm and dpo; the key bias is rounding noise under Adam.
    # So, for the reward model, is the final norm's bias: Bradley-Terry sees only score differences, and that bias
    # moves both scores of a pair by the same w.b through the linear head (seen: 6e-5 apart, one run in two)
    noise = ("transformer.ln_f.bias",) if name.startswith("rm") else ()
    assert_adam_trained_alike(w1, w2, lr=3e-3, steps=2 if name.startswith("ppo") else 3, noise_only=noise)


def test_a_model_file_is_hashed_on_rank_0_only(runs):
    """A fresh 2-rank run from a model file (dpo --init-from an llm.c file): rank 0 reads its sha256 (meta.json's
    models record, the reference cache's key) and the other rank is sent it, never hashing the same multi-GB
    file again on the same disk. The record is the one a 1-process run writes."""
    tmp = runs["dirs"]
    hashed = [json.loads((tmp / f"dpo_hashes.rank{r}").read_text()) for r in (0, 1)]
    assert str(tmp / "chat.bin") in hashed[0] and hashed[1] == [], hashed
    models = [ckpt.read_meta(ckpt.latest_checkpoint(tmp / f"dpo{w}"))["models"] for w in (1, 2)]
    assert models[0] == models[1] == {"dpo.init_from": [sha256_file(tmp / "chat.bin")]}


def test_a_resume_hashes_its_models_once_a_machine(runs):
    """A 2-rank resume checks that the models it reads again (dpo.init_from: its reference, an llm.c file, here
    given anew at another place) hold the weights its meta.json records once a machine, after the process group
    is joined: rank 0 here. The check ran in the command line before the group existed, so every rank hashed the
    same multi-GB file on one disk."""
    tmp = runs["dirs"]
    hashed = [json.loads((tmp / f"dpo_resume_hashes.rank{r}").read_text()) for r in (0, 1)]
    assert str(tmp / "chat_moved.bin") in hashed[0] and hashed[1] == [], hashed
    more = ckpt.read_meta(ckpt.latest_checkpoint(tmp / "dpo2_more"))
    assert more["step"] == 4 and more["config"]["dpo"]["init_from"] == str(tmp / "chat_moved.bin")
    assert more["models"] == ckpt.read_meta(ckpt.latest_checkpoint(tmp / "dpo2"))["models"]  # carried, same weights


def test_lora_sft_on_two_ranks_equals_one_rank_accumulating(runs):
    """DDP over a LoRA model (frozen base, adapters trainable): the same losses and the same trained
    adapters as one process accumulating both ranks' micro-batches, and only the adapters are saved."""
    from gptforge.run.metrics import read_metrics

    one, two = ([r for r in read_metrics(runs["dirs"] / f"lora_sft{w}") if r["kind"] in ("train", "val")]
                for w in (1, 2))
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two] and len(one) == 4
    for a, b in zip(one, two, strict=True):
        key = "loss" if a["kind"] == "train" else "val_loss"
        assert a[key] == pytest.approx(b[key], rel=1e-5), (a, b)
    assert len({r["loss"] for r in one if r["kind"] == "train"}) == 3  # it trains
    w1, w2 = (load_file(str(ckpt.latest_checkpoint(runs["dirs"] / f"lora_sft{w}") / "model.safetensors"))
              for w in (1, 2))
    assert sorted(w1) == sorted(w2) and len(w1) == 4 and all(".lora_" in k for k in w1)  # adapters only
    assert all(w1[k].abs().max() > 0 for k in w1 if ".lora_B." in k)  # B left zero: they trained
    assert_adam_trained_alike(w1, w2, lr=1e-2, steps=3)  # _lora_sft_argv's lr and steps


def _close(a: dict[int, float], b: dict[int, float], steps, rtol=2e-5):
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=rtol, abs=1e-6), (s, a[s], b[s])


def test_ddp_two_ranks_matches_one_rank_with_twice_the_accumulation(runs):
    _close(runs["ddp"]["train"], runs["one"]["train"], range(1, STEPS + 1))
    _close(runs["ddp"]["val"], runs["one"]["val"], [4, 8])
    assert runs["one"]["train"][STEPS] < runs["one"]["train"][1] - 0.3  # it is learning, not a constant
    assert "world 2 (none) | B 4 T 16 x accum 1" in runs["log"]


def test_zero1_and_fsdp_match_ddp_also_with_recompute(runs):
    for name in ("zero", "fsdp", "fsdp_block", "fsdp_keep"):
        _close(runs[name]["train"], runs["ddp"]["train"], range(1, STEPS + 1))
        _close(runs[name]["val"], runs["ddp"]["val"], [4, 8])
    assert "world 2 (zero1)" in runs["log"] and "world 2 (fsdp)" in runs["log"]


def test_fsdp_scores_tasks_and_samples_in_the_loop_as_one_process_does(runs):
    """Under FSDP a forward all-gathers, so ranks that ran unequal numbers of them (rank 0's share of piqa is
    4 one-request forwards, rank 1's 2; samples on rank 0 alone) waited on each other for ever. Evaluation and
    sampling now run on weights gathered once (``gathered``): the task scores equal one process's, and the
    samples are written."""
    from gptforge.run.metrics import read_metrics

    two, one = (read_metrics(runs["dirs"] / name / "metrics.jsonl") for name in ("fsdp_eval", "one_eval"))
    evals = [[(r["step"], r["task"], r["n"], r["acc"], r["acc_norm"]) for r in recs if r["kind"] == "eval"]
             for recs in (two, one)]
    assert evals[0] == evals[1] and [e[0] for e in evals[0]] == [4, 8]
    assert [(r["step"], r["index"]) for r in two if r["kind"] == "sample"] == [(4, 0), (4, 1), (8, 0), (8, 1)]
    _close(runs["fsdp_eval"]["train"], runs["one_eval"]["train"], range(1, STEPS + 1))


def test_sharded_checkpoint_layout(runs):
    fsdp = ckpt.latest_checkpoint(runs["dirs"] / "fsdp")
    assert (fsdp / "dcp" / ".metadata").exists() and (fsdp / "model.safetensors").exists()  # + consolidated
    assert ckpt.read_meta(fsdp)["sharding"] == "fsdp" and ckpt.read_meta(fsdp)["world"] == 2
    files = ckpt.read_meta(fsdp)["files"]  # every rank's shards are checksummed too
    assert "dcp/.metadata" in files and sum(n.startswith("dcp/") and n.endswith(".distcp") for n in files) == 2
    ckpt.verify_checkpoint(fsdp)
    zero = ckpt.latest_checkpoint(runs["dirs"] / "zero")  # ZeRO-1 consolidates into the single-file format
    assert (zero / "optimizer.pt").exists() and ckpt.read_meta(zero)["sharding"] == "zero1"
    opt = torch.load(zero / "optimizer.pt", weights_only=True)
    assert len(opt["state"]) == len(opt["param_groups"][0]["params"]) + len(opt["param_groups"][1]["params"])


def test_save_at_world_2_resume_at_world_2_and_world_1_continues_the_curve(runs):
    full = runs["fsdp"]
    assert set(runs["fsdp_part"]["train"]) == {1, 2, 3, 4}
    _close(runs["fsdp_part"]["train"], full["train"], range(1, 5))
    assert set(runs["fsdp_rest"]["train"]) == set(range(5, STEPS + 1))
    _close(runs["fsdp_rest"]["train"], full["train"], range(5, STEPS + 1))  # world 2 -> world 2
    _close(runs["fsdp_w1"]["train"], full["train"], range(5, STEPS + 1))  # world 2 -> world 1
    _close(runs["fsdp_w1"]["val"], full["val"], [8])
    _close(runs["zero_w1"]["train"], runs["zero"]["train"], range(5, STEPS + 1))  # ZeRO-1 world 2 -> 1


def test_resume_with_dropout_is_bit_exact_per_rank(runs):
    full, part, rest = runs["drop"]["train"], runs["drop_part"]["train"], runs["drop_rest"]["train"]
    for s in range(1, STEPS + 1):
        assert (part.get(s) if s <= 4 else rest[s]) == full[s], s
    assert full != runs["ddp"]["train"]  # dropout is really on
    rng = torch.load(ckpt.latest_checkpoint(runs["dirs"] / "drop") / "rng.pt", weights_only=True)
    assert not torch.equal(rng["rank0.cpu"], rng["rank1.cpu"])  # one stream per rank


def test_resume_may_switch_sharding_strategy(runs):
    for name in ("fsdp_to_zero", "ddp_to_fsdp"):
        assert set(runs[name]["train"]) == set(range(5, STEPS + 1)), name
        _close(runs[name]["train"], runs["ddp"]["train"], range(5, STEPS + 1))


def test_sharded_checkpoint_that_does_not_fit_is_rejected(runs):
    from gptforge.models.gpt2 import GPT
    from gptforge.run.dcp import load_sharded

    cfg = _cfg(runs["dirs"] / "data", runs["dirs"] / "x")
    cfg.model.n_embd = 64
    with pytest.raises(ckpt.CheckpointError, match="--trust-checkpoint"):
        load_sharded(GPT(cfg.model), None, ckpt.latest_checkpoint(runs["dirs"] / "fsdp"))
    with pytest.raises(ckpt.CheckpointError, match="shapes differ"):
        load_sharded(GPT(cfg.model), None, ckpt.latest_checkpoint(runs["dirs"] / "fsdp"), trusted=True)


def test_sharded_checkpoint_loads_for_sampling(runs, monkeypatch):
    """From the consolidated model.safetensors, never from dcp/ (whose metadata is a pickle)."""
    from gptforge.load import ModelSource, load_model
    from gptforge.run import dcp as dist_checkpoint

    def no_dcp(*a, **k):
        raise AssertionError("a weights-only load read dcp/")

    monkeypatch.setattr(dist_checkpoint, "load_sharded", no_dcp)
    monkeypatch.setattr(dist_checkpoint, "_dcp", no_dcp)

    model = load_model(ModelSource(ckpt=str(runs["dirs"] / "fsdp")))
    ref = load_model(ModelSource(ckpt=str(runs["dirs"] / "ddp")))  # same training, single-file checkpoint
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-5), n


def test_loader_position_does_not_depend_on_world(tmp_path):
    """Two ranks together read exactly the tokens one rank reads, across a shard boundary, and the
    saved position resumes at the other world size; reference: slices of the raw token stream."""
    tokens = [np.arange(1000) % 500, (np.arange(700) * 3) % 500]
    files = [write_shard(tmp_path / f"t_train_{i:06d}.bin", t) for i, t in enumerate(tokens)]
    B, T, step = 2, 8, 64  # 4 micro-batches of 16 per step at world 1, 2 per rank at world 2
    one = ShardLoader(files, B, T, step_tokens=step)
    two = [ShardLoader(files, B, T, r, 2, step_tokens=step) for r in range(2)]
    expect_shard, expect_pos = 0, 0
    for _ in range(20):  # 20 steps: crosses both shard ends and wraps
        t = tokens[expect_shard]
        ref = [t[expect_pos + k * 16: expect_pos + k * 16 + 17] for k in range(4)]
        got1 = [one.next_batch() for _ in range(4)]
        got2 = [rank.next_batch() for _ in range(2) for rank in two]  # rank r, micro m = global chunk 2m+r
        for k in range(4):
            assert got1[k][0].flatten().tolist() == ref[k][:-1].tolist()
            assert got1[k][1].flatten().tolist() == ref[k][1:].tolist()
            assert got2[k][0].flatten().tolist() == ref[k][:-1].tolist()
        expect_pos += step
        if expect_pos + step + 1 > len(t):
            expect_shard, expect_pos = (expect_shard + 1) % 2, 0
        assert one.state_dict() == two[0].state_dict() == two[1].state_dict()
        assert (one.shard, one.pos) == (expect_shard, expect_pos)
    resumed = [ShardLoader(files, B, T, r, 2, step_tokens=step) for r in range(2)]
    for r in resumed:
        r.load_state_dict(one.state_dict())
    assert torch.equal(torch.cat([resumed[0].next_batch()[0], resumed[1].next_batch()[0]]),
                       torch.cat([one.next_batch()[0], one.next_batch()[0]]))


def _cli_overrides(cfg: Config) -> list[str]:
    """Every key of cfg as --section.key value (so the CLI reproduces a test config exactly)."""
    out = []
    for section, values in cfg.to_dict().items():
        for k, v in values.items():
            v = "auto" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            out += [f"--{section}.{k}", v]
    return out


# A worker of a torchrun group on gloo/CPU sometimes dies at exit with "terminate called without an
# active exception" (SIGABRT, after its training finished: seen about 1 run in 7 of this file on the
# 2-core machine, 2026-11-23). With --max-restarts that abort makes torchrun restart the group, which
# these two tests would report as their own failure. Rerun them (at most twice) while the abort is
# open; the cause is not yet found (see the issue notes).
@pytest.mark.flaky(reruns=2)
def test_killed_rank_is_restarted_by_torchrun_and_finishes(runs, tmp_path):
    cfg = _cfg(runs["dirs"] / "data", tmp_path / "elastic")
    cfg.train.ckpt_every = 2
    argv = ["--max-restarts", "1", "-m", "gptforge", "train", "--preset", "tiny", *_cli_overrides(cfg)]
    assert apply_overrides(Config(), _cli_overrides(cfg)).to_dict() == cfg.to_dict()
    proc = _torchrun(argv, {"GPTFORGE_FAULT_INJECT": "1:5"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "sending SIGKILL to rank 1 after step 5" in proc.stderr
    assert "resumed from" in proc.stdout and "step_000004" in proc.stdout
    assert ckpt.latest_checkpoint(tmp_path / "elastic").name == f"step_{STEPS:06d}"
    events = [json.loads(line) for line in (tmp_path / "elastic" / "metrics.jsonl").read_text().splitlines()]
    starts = [e["step"] for e in events if e["kind"] == "start"]
    assert starts == [0, 4]  # the first attempt, then the restart from the step-4 checkpoint
    final = {e["step"]: e["loss"] for e in events if e["kind"] == "train"}  # later lines win
    _close(final, runs["ddp"]["train"], range(1, STEPS + 1))  # same curve as the uninterrupted run


# A worker of a torchrun group on gloo/CPU sometimes dies at exit with "terminate called without an
# active exception" (SIGABRT, after its training finished: seen about 1 run in 7 of this file on the
# 2-core machine, 2026-11-23). With --max-restarts that abort makes torchrun restart the group, which
# these two tests would report as their own failure. Rerun them (at most twice) while the abort is
# open; the cause is not yet found (see the issue notes).
@pytest.mark.flaky(reruns=2)
def test_a_signal_to_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    """...and torchrun reports a stop, not a failure: the workers exit 0 after a clean stop, so even
    with --max-restarts the group is not restarted (it would resume and train on)."""
    cfg = _cfg(make_shards(tmp_path / "data"), tmp_path / "stop")
    proc = _torchrun(["--max-restarts", "1", "-m", "gptforge", "train", "--preset", "tiny", *_cli_overrides(cfg)],
                     {"GPTFORGE_FAULT_INJECT": "1:3:term"}, timeout=120)
    assert "sending SIGTERM to rank 1 after step 3" in proc.stderr
    assert "stopped at step 3; continue with --resume" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ChildFailedError" not in proc.stderr and "FAILED" not in proc.stderr and "Traceback" not in proc.stderr
    events = [json.loads(line) for line in (tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()]
    log = proc.stdout[-3000:] + proc.stderr[-5000:]
    assert [e["step"] for e in events if e["kind"] == "start"] == [0], log  # not restarted
    assert ckpt.latest_checkpoint(tmp_path / "stop").name == "step_000003", log


# --- bad input, before training ---------------------------------------------------------------------

def test_dist_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="dist.shard"):
        DistConfig(shard="zero2")
    # a config from before dist.shard (dist.zero / dist.fsdp) still loads, as the same sharding
    assert Config.from_dict({"dist": {"zero": 1, "fsdp": False}}).dist.shard == "zero1"
    assert Config.from_dict({"dist": {"zero": 0, "fsdp": True}}).dist.shard == "fsdp"
    with pytest.raises(ConfigError, match="dist.timeout"):
        DistConfig(timeout=0)


def test_world_that_does_not_divide_the_batch_exits_2(monkeypatch, capsys):
    from gptforge.cli import main

    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--preset", "tiny", "--dry-run"]) == 2
    assert "micro_batch*seq_len*world = 4*32*3" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--preset", "tiny", "--dry-run"]) == 0
    assert main(["train", "--preset", "tiny", "--dist.shard", "zero3", "--dry-run"]) == 2


def test_checkpoint_that_does_not_fit_the_model_is_rejected(shard_dir, tmp_path, capsys):
    from gptforge.cli import main

    train(_cfg(shard_dir, tmp_path / "run", shard="fsdp"))  # world 1: fsdp has no effect, single-file ckpt
    cfg = _cfg(shard_dir, tmp_path / "run")
    cfg.model.n_embd = 64
    with pytest.raises(ckpt.CheckpointError, match="shapes differ"):
        train(cfg, resume="latest")
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--model.n_embd", "64"]) == 2
    assert "shapes differ" in capsys.readouterr().err


def test_out_of_memory_names_the_knobs(shard_dir, tmp_path, monkeypatch):
    from gptforge.models.gpt2 import GPT

    def oom(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(GPT, "forward", oom)
    with pytest.raises(torch.OutOfMemoryError) as e:
        train(_cfg(shard_dir, tmp_path / "run"))
    msg = str(e.value)
    assert "--train.micro_batch 2" in msg and "--model.recompute mlp" in msg and "gptforge plan" in msg
    assert "Tried to allocate 2.00 GiB" in msg


def test_bad_fault_injection_spec(shard_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTFORGE_FAULT_INJECT", "five")
    with pytest.raises(ConfigError, match="RANK:STEP"):
        train(_cfg(shard_dir, tmp_path / "run"))
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


# --- GPU paths (NCCL, bf16 mixed precision); skipped on machines without two GPUs ---------------------

@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_ddp_zero_fsdp_bf16_agree(tmp_path):
    data = make_shards(tmp_path / "data")
    jobs, names = [], {"ddp": {}, "zero": {"shard": "zero1"}, "fsdp": {"shard": "fsdp"}}
    for name, dist in names.items():
        cfg = _cfg(data, tmp_path / name, **dist)
        cfg.train.device, cfg.train.dtype, cfg.train.compile = "cuda", "bfloat16", False
        jobs.append({"config": cfg.to_dict(), "out": str(tmp_path / f"{name}.json")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = _torchrun([str(HERE / "dist_worker.py"), str(tmp_path / "jobs.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = {name: _read(tmp_path / f"{name}.json") for name in names}
    # bf16: DDP/ZeRO autocast from fp32 weights, FSDP all-gathers bf16 weights; agree to bf16 precision
    _close(res["zero"]["train"], res["ddp"]["train"], range(1, STEPS + 1), rtol=1e-5)
    _close(res["fsdp"]["train"], res["ddp"]["train"], range(1, STEPS + 1), rtol=2e-2)
