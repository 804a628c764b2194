"""A run directory never decides what code runs or where a run writes (issue 21, class 1): on
``--resume``, trust (``--trust-checkpoint``), reward code (``--reward module:function``) and the output
folder come only from the current command line, for train, sft and rl alike."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest
import torch

from gptforge.cli import build_parser, main
from gptforge.config import Config
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from tests.conftest import tiny_chat_checkpoint


class _Marker:
    """Unpickling this creates a file: proof that the pickle was read."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _self_trusting_dcp(run: Path, marker: Path) -> None:
    """The newest checkpoint becomes a hostile sharded one that claims to be trusted."""
    d = ckpt.latest_checkpoint(run)
    (d / "dcp").mkdir()
    (d / "dcp" / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    meta = json.loads((d / "meta.json").read_text())
    meta["config"]["train"]["trust_checkpoint"] = True
    (d / "meta.json").write_text(json.dumps(meta))


def _base(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    return ckpt.save_checkpoint(tmp_path / "base", 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})


@pytest.mark.parametrize("command", ["sft", "rl"])
def test_the_trust_flag_exists_where_the_refusal_names_it(command):
    sub = next(a for a in build_parser()._subparsers._group_actions if a.dest == "command").choices[command]
    assert "--trust-checkpoint" in sub.format_help()


def test_sft_resume_never_takes_trust_from_the_checkpoint(tmp_path, tokenizer, capsys):
    data = write_conversations(arithmetic_problems(60, seed=2), tmp_path / "conv.jsonl")
    out, marker = tmp_path / "sft", tmp_path / "pwned"
    assert main(["sft", "--init-from", str(_base(tmp_path)), "--data", str(data), "--out", str(out),
                 "--val-count", "8", "--train.seq_len", "64", "--train.micro_batch", "2",
                 "--train.total_batch_tokens", "128", "--train.max_steps", "2", "--train.device", "cpu"]) == 0
    _self_trusting_dcp(out, marker)
    capsys.readouterr()
    assert main(["sft", "--out", str(out), "--resume", "--train.max_steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "--trust-checkpoint" in err and "dcp/.metadata" in err
    assert not marker.exists()


def test_rl_resume_never_imports_the_reward_the_checkpoint_names(tmp_path, tokenizer, capsys, monkeypatch):
    """A foreign RL checkpoint names a module:function; resuming it must not import that module. The
    reward given on this command line is the one used, and the trust flag is never the checkpoint's."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_reward_i21.py").write_text(
        f"open({str(marker)!r}, 'w').close()  # importing this module is running its code\n"
        "def reward(problem, reply):\n    return float(len(reply) % 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "rl"
    small = ["--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--device", "cpu"]
    assert main(["rl", "--init-from", str(tiny_chat_checkpoint(tmp_path / "sft")), "--out", str(out), "--steps", "2",
                 "--reward", "evil_reward_i21:reward", *small]) == 0
    marker.unlink()
    monkeypatch.delitem(sys.modules, "evil_reward_i21")
    capsys.readouterr()
    assert main(["rl", "--out", str(out), "--resume", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "--reward evil_reward_i21:reward" in err and "never decides what code runs" in err
    assert not marker.exists()
    assert main(["rl", "--out", str(out), "--resume", "--steps", "3", "--reward", "exact_match", "--task", "compare"]) == 2
    assert "--rl.task 'compare'" in capsys.readouterr().err  # what is trained cannot change on resume: refused
    assert main(["rl", "--out", str(out), "--resume", "--steps", "3", "--reward", "exact_match",
                 "--lr", "5e-4", "--temperature", "0.7"]) == 0
    assert not marker.exists()
    cfg = ckpt.read_meta(ckpt.latest_checkpoint(out))["config"]
    assert cfg["rl"]["reward"] == "exact_match"  # flags given with --resume apply, none silently dropped
    assert cfg["optim"]["lr"] == 5e-4 and cfg["rl"]["temperature"] == 0.7 and cfg["train"]["max_steps"] == 3
    _self_trusting_dcp(out, tmp_path / "pwned")
    assert main(["rl", "--out", str(out), "--resume", "--steps", "4", "--reward", "exact_match"]) == 2
    assert "--trust-checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def test_train_resume_of_a_checkpoint_never_writes_where_its_meta_says(shard_dir, tmp_path, capsys):
    from gptforge.training.loop import train
    from tests.conftest import tiny_config

    run = tmp_path / "run"
    where = train(tiny_config(shard_dir, run, max_steps=2, ckpt_every=1)).last_checkpoint
    victim = tmp_path / "victim"  # someone else's run that the checkpoint's meta.json points at
    victim.mkdir()
    (victim / "config.json").write_text("theirs\n")
    (victim / "metrics.jsonl").write_text('{"kind": "train", "step": 9}\n' * 3)
    for d in ckpt.list_checkpoints(run):
        meta = json.loads((d / "meta.json").read_text())
        meta["config"]["train"]["out_dir"] = str(victim)
        (d / "meta.json").write_text(json.dumps(meta))
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    assert main(["train", "--resume", str(where), "--train.max_steps", "3"]) == 0  # no --out
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before  # untouched, no checkpoints/
    assert ckpt.read_meta(ckpt.latest_checkpoint(run))["step"] == 3  # continued in the run the path is in
    assert json.loads((run / "config.json").read_text())["train"]["out_dir"] == str(run)
    # --out wins over both
    assert main(["train", "--resume", str(where), "--train.max_steps", "3", "--out", str(tmp_path / "new")]) == 0
    assert ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "new"))["step"] == 3
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before
