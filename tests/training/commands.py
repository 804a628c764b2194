"""The training commands, read from the CLI's own table, and a tiny fresh run of each: what the class
tests (Ctrl-C and resume in test_ctrl_c_every_command.py, hostile input in
tests/cli/test_hardening_training.py) iterate, so a new command is covered or fails them; and the check
that a stopped and resumed run ended exactly as the uninterrupted one (its history and its weights)."""

from __future__ import annotations

from pathlib import Path

from gptforge.cli import COMMANDS, build_parser

CPU = ["--device", "cpu", "--ckpt-every", "0"]
RL = ["--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2", "--steps", "3", *CPU]
PAIRS = ["--val-count", "4", "--micro-batch", "2", "--lr", "1e-3", "--steps", "3", *CPU]

# (command, --algo or None) -> the arguments of a fresh 3-step run (no --out), given world()'s files
RUNS = {
    ("train", None): lambda w: ["train", "--preset", "tiny", "--data.dir", w["shards"], "--model.vocab_size", "512",
                                "--train.max_steps", "3", "--train.val_every", "0", "--train.ckpt_every", "0",
                                "--train.device", "cpu"],
    ("sft", None): lambda w: ["sft", "--init-from", w["chat"], "--data", w["conv"], "--val-count", "4",
                              "--train.seq_len", "64", "--train.micro_batch", "2", "--train.total_batch_tokens", "128",
                              "--steps", "3", "--train.ckpt_every", "0", "--train.device", "cpu"],
    ("rl", "grpo"): lambda w: ["rl", "--init-from", w["chat"], "--algo", "grpo", *RL],
    ("rl", "ppo"): lambda w: ["rl", "--init-from", w["chat"], "--algo", "ppo", "--updates-per-batch", "2", *RL],
    ("rm", None): lambda w: ["rm", "--init-from", w["chat"], "--data", w["prefs"], *PAIRS],
    ("dpo", None): lambda w: ["dpo", "--init-from", w["chat"], "--data", w["prefs"], *PAIRS],
}


def subparsers() -> dict:
    return next(a for a in build_parser()._subparsers._group_actions if a.dest == "command").choices


def training_commands() -> list[tuple[str, str | None]]:
    """Every (command, algo) of the CLI's table whose parser has --resume (a command that trains and
    checkpoints); algo for each --algo choice, else None."""
    sub, out = subparsers(), []
    for name in COMMANDS:
        flags = sub[name]._option_string_actions
        if "--resume" in flags:
            out += [(name, algo) for algo in (flags["--algo"].choices if "--algo" in flags else [None])]
    return out


def case_id(case: tuple[str, str | None]) -> str:
    return case[0] if case[1] is None else f"{case[0]}-{case[1]}"


def make_world(tmp: Path) -> dict[str, str]:
    """A tiny chat checkpoint (GPT-2 vocabulary plus the chat tokens), token shards, a conversation
    file and a preference file: what every training command's fresh run starts from."""
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
    from tests.conftest import make_shards, tiny_chat_checkpoint

    chat = tiny_chat_checkpoint(tmp / "chat")
    return {"tmp": str(tmp), "chat": str(chat), "shards": str(make_shards(tmp / "shards", 20_000, 4_000)),
            "conv": str(write_conversations(arithmetic_problems(40, seed=2), tmp / "conv.jsonl")),
            "prefs": str(write_preferences(preference_set("compare", 24, seed=1), tmp / "prefs.jsonl"))}


# metrics record fields that measure time: the only ones two runs of the same steps may differ in
TIMINGS = {"dt_ms", "cpu_ms", "tokens_per_s", "mfu", "sample_ms", "seconds", "eval_ms", "time"}


def history(run: Path) -> list[dict]:
    """metrics.jsonl as the run's history: replayed records dropped, timings and start/end left out."""
    import json

    out = []
    for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if r.get("replayed") or r["kind"] in ("start", "end"):
            continue
        out.append({k: v for k, v in r.items() if k not in TIMINGS})
    return out


def assert_same_weights(a: Path, b: Path) -> None:
    """The newest checkpoints of runs ``a`` and ``b`` hold the same tensors, bit for bit."""
    import torch
    from safetensors.torch import load_file

    from gptforge.run import checkpoint as ckpt

    wa = load_file(str(ckpt.latest_checkpoint(a) / "model.safetensors"))
    wb = load_file(str(ckpt.latest_checkpoint(b) / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def assert_same_run(a: Path, b: Path) -> None:
    """Run ``b`` (stopped and resumed) ended exactly as ``a``: every metrics record but timings, every weight."""
    assert history(a) == history(b)
    assert_same_weights(a, b)
