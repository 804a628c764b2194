"""Ctrl-C on every training command, by construction: each command of the CLI's table that offers
``--resume`` (and each ``--algo`` it can run) gets a real SIGINT after step 2 of 3, must exit 130 with
an intact step-2 checkpoint, and ``--resume`` must then finish bit-exactly as the uninterrupted run
(every metrics record but timings, and every weight). A new resumable command without a case here
fails :func:`test_every_resumable_command_has_a_case`.

The signal is ``GPTFORGE_FAULT_INJECT=0:2:int``: ``os.kill(own pid, SIGINT)`` right after step 2's
optimizer step, through the real handler (:mod:`gptforge.run.signals`) and the real exit status, in
this process so each case costs three tiny runs and no interpreter start. A signal at an arbitrary
moment of a real subprocess is covered for ``train`` (test_training.py, test_run_endings.py) and
``rl`` (test_rl_guards.py).
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

from gptforge.cli import COMMANDS, build_parser, main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.eval.tasks.preferences import preference_set, write_preferences
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from tests.conftest import make_shards

CPU = ["--device", "cpu", "--ckpt-every", "0"]
RL = ["--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--steps", "3", *CPU]
PAIRS = ["--val-count", "4", "--micro-batch", "2", "--lr", "1e-3", "--steps", "3", *CPU]

# (command, --algo or None) -> the arguments of a fresh 3-step run, given the fixture's files
CASES = {
    ("train", None): lambda w: ["train", "--preset", "tiny", "--data.dir", w["shards"], "--model.vocab_size", "512",
                                "--train.max_steps", "3", "--train.val_every", "0", "--train.ckpt_every", "0",
                                "--train.device", "cpu"],
    ("sft", None): lambda w: ["sft", "--init-from", w["chat"], "--data", w["conv"], "--val-count", "4",
                              "--train.seq_len", "64", "--train.micro_batch", "2", "--train.total_batch_tokens", "128",
                              "--train.max_steps", "3", "--train.ckpt_every", "0", "--train.device", "cpu"],
    ("rl", "grpo"): lambda w: ["rl", "--init-from", w["chat"], "--algo", "grpo", *RL],
    ("rl", "ppo"): lambda w: ["rl", "--init-from", w["chat"], "--algo", "ppo", "--updates-per-batch", "2", *RL],
    ("rm", None): lambda w: ["rm", "--init-from", w["chat"], "--data", w["prefs"], *PAIRS],
    ("dpo", None): lambda w: ["dpo", "--init-from", w["chat"], "--data", w["prefs"], *PAIRS],
}
TIMINGS = {"dt_ms", "cpu_ms", "tokens_per_s", "mfu", "sample_ms", "seconds", "eval_ms"}


def resumable_commands() -> list[tuple[str, str | None]]:
    """Every (command, algo) of the CLI's table whose parser has --resume; algo for each --algo choice."""
    sub = next(a for a in build_parser()._subparsers._group_actions if a.dest == "command").choices
    out = []
    for name in COMMANDS:
        flags = sub[name]._option_string_actions
        if "--resume" not in flags:
            continue
        algos = flags["--algo"].choices if "--algo" in flags else [None]
        out += [(name, algo) for algo in algos]
    return out


RESUMABLE = resumable_commands()


def test_every_resumable_command_has_a_case():
    assert {c for c, _ in RESUMABLE} >= {"train", "sft", "rl", "rm", "dpo"}  # the enumeration itself works
    missing = [c for c in RESUMABLE if c not in CASES]
    assert not missing, f"add a Ctrl-C case for {missing} to CASES"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    tmp = tmp_path_factory.mktemp("ctrlc")
    torch.manual_seed(0)
    t = ChatTemplate.gpt2()
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    chat = ckpt.save_checkpoint(tmp / "chat", 1, GPT(cfg), None,
                                {"config": Config(model=cfg).to_dict(), "chat_template": t.to_dict()})
    return {"tmp": tmp, "chat": str(chat), "shards": str(make_shards(tmp / "shards", 20_000, 4_000)),
            "conv": str(write_conversations(arithmetic_problems(40, seed=2), tmp / "conv.jsonl")),
            "prefs": str(write_preferences(preference_set("compare", 24, seed=1), tmp / "prefs.jsonl"))}


def _records(run) -> list[dict]:
    """metrics.jsonl as the run's history: replayed records dropped, timings and start/end left out."""
    out = []
    for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if r.get("replayed") or r["kind"] in ("start", "end"):
            continue
        out.append({k: v for k, v in r.items() if k not in TIMINGS and k != "time"})
    return out


@pytest.mark.parametrize("command,algo", RESUMABLE, ids=[c if a is None else f"{c}-{a}" for c, a in RESUMABLE])
def test_ctrl_c_saves_exits_130_and_resumes_bit_exactly(world, tmp_path, monkeypatch, capsys, command, algo):
    if (command, algo) not in CASES:
        pytest.fail(f"no Ctrl-C case for {command} {algo or ''}: add one to CASES")
    argv = CASES[command, algo](world)
    full, part = tmp_path / "full", tmp_path / "part"
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main([*argv, "--out", str(full)]) == 0
        monkeypatch.setenv("GPTFORGE_FAULT_INJECT", "0:2:int")
        capsys.readouterr()
        assert main([*argv, "--out", str(part)]) == 130
        io = capsys.readouterr()
        assert "got SIGINT" in io.err and "stopped at step 2; continue with --resume" in io.out, io.out + io.err
        saved = ckpt.latest_checkpoint(part)
        assert saved is not None and ckpt.read_meta(saved)["step"] == 2
        ckpt.verify_checkpoint(saved)
        monkeypatch.delenv("GPTFORGE_FAULT_INJECT")
        assert main([command, "--out", str(part), "--resume"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)  # a stopped run leaves its handler for the grace window
    assert f"resumed from {saved}" in capsys.readouterr().out
    assert ckpt.read_meta(ckpt.latest_checkpoint(part))["step"] == 3
    a, b = _records(full), _records(part)
    assert {1, 2, 3} <= {r["step"] for r in a} and len(a) == len(b)
    assert a == b
    wa = ckpt.load_file(str(ckpt.latest_checkpoint(full) / "model.safetensors"))
    wb = ckpt.load_file(str(ckpt.latest_checkpoint(part) / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
