"""What a user sees around training: retention in every preset, --help-config showing the preset's
values, a finished run that says it is complete, and an extended run that says what its LR does."""

from __future__ import annotations

import json
import math
import os

import pytest

from gptforge.cli import main
from gptforge.presets import PRESETS, get_preset


def _ckpts(run) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))


def _train_argv(shard_dir, run, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(run), "--model.vocab_size", "512",
            "--train.device", "cpu", "--train.val_every", "0", *extra]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_keeps_a_bounded_number_of_checkpoints(name):
    cfg = get_preset(name)
    assert cfg.train.keep_ckpts >= 1, f"{name}: train.keep_ckpts={cfg.train.keep_ckpts} keeps every checkpoint"


def test_tiny_run_leaves_at_most_keep_ckpts(shard_dir, tmp_path):
    run = tmp_path / "run"
    assert main(_train_argv(shard_dir, run, "--train.max_steps", "5", "--train.ckpt_every", "1")) == 0
    assert _ckpts(run) == ["step_000004", "step_000005"][-get_preset("tiny").train.keep_ckpts:]


def _config_line(out: str, key: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith(f"--{key} "))


def test_help_config_shows_the_presets_resolved_values(capsys):
    assert main(["train", "--preset", "tiny", "--help-config", "--train.max_steps", "7"]) == 0
    out = capsys.readouterr().out
    assert "preset 'tiny'" in out.splitlines()[0]
    assert _config_line(out, "train.micro_batch").split()[-1] == "4"  # the preset's, not the general 64
    assert _config_line(out, "train.seq_len").split()[-1] == "32"
    assert _config_line(out, "train.max_steps").split()[-1] == "7"  # the override, on the same line
    assert main(["train", "--preset", "tiny", "--help-config", "--train.nope", "1"]) == 2  # still checked


def _records(run, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def test_finished_run_says_complete_then_extends_with_a_stretched_schedule(shard_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_train_argv(shard_dir, run, "--train.max_steps", "4")) == 0
    starts = len(_records(run, "start"))
    capsys.readouterr()
    # the default job's second run: nothing to train, and it says so and how to extend it
    assert main(_train_argv(shard_dir, run, "--resume")) == 0
    out = capsys.readouterr().out
    assert "is complete" in out and "step 4 of train.max_steps 4" in out and "--train.max_steps 8" in out
    assert "resumed" not in out
    assert len(_records(run, "start")) == starts and _ckpts(run) == ["step_000004"]
    # extending: the cosine is stretched over the new length, and the message says so with the values
    assert main(_train_argv(shard_dir, run, "--resume", "--train.max_steps", "6")) == 0
    out = capsys.readouterr().out
    o = get_preset("tiny").optim
    min_lr = o.lr * o.min_lr_frac
    stretched = min_lr + 0.5 * (1 + math.cos(math.pi * (4 - o.warmup_steps) / (6 - o.warmup_steps))) * (o.lr - min_lr)
    assert "from train.max_steps 4 to 6" in out and "stretched" in out and f"{stretched:.2e}" in out
    assert f"old schedule had {min_lr:.2e}" in out
    # the figure is the one the log prints on the first resumed step's line
    step5 = next(ln for ln in out.splitlines() if ln.startswith("step      5/6"))
    assert f"shows lr {stretched:.2e}" in out and f"lr {stretched:.2e}" in step5
    lrs = {r["step"]: r["lr"] for r in _records(run, "train")}
    assert lrs[5] == pytest.approx(stretched, rel=1e-12) and lrs[6] > min_lr
    assert _ckpts(run)[-1] == "step_000006"


def test_a_run_ends_with_a_summary_and_raw_text_samples(shard_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = _train_argv(shard_dir, run, "--train.max_steps", "2", "--train.val_every", "1")
    argv[argv.index("--model.vocab_size") + 1] = "50304"  # the GPT-2 vocabulary, so samples decode
    assert main(argv) == 0
    out = capsys.readouterr().out
    # train.threads auto on CPU: one thread, or OMP_NUM_THREADS where the user set it
    n = int(os.environ.get("OMP_NUM_THREADS") or 1)
    assert f"| {n} CPU thread{'s' if n > 1 else ''} |" in out.splitlines()[0]
    lines = out[out.index("--- sample 0 (step 2; sampled at temperature 1, top-k 50)"):].splitlines()
    assert not lines[1].startswith(("'", '"')) and "sample 0:" not in out  # printed as text, not a repr
    summary = out[out.index("--- train summary"):]
    vals = {r["step"]: r["val_loss"] for r in _records(run, "val")}
    best = min(vals, key=vals.get)
    assert f"val loss    best {vals[best]:.4f} (step {best}), final {vals[2]:.4f} (step 2)" in summary
    assert "tokens      512" in summary  # 2 steps x 256 tokens
    assert f"checkpoint  {run / 'checkpoints' / 'step_000002'}" in summary
    for cmd in (f"gptforge sample --ckpt {run}", f"gptforge eval --ckpt {run}", f"gptforge export hf --ckpt {run}"):
        assert cmd in summary
    assert "gptforge chat" not in summary and "--resume" not in summary


def test_rl_summary_reports_reward_and_held_out_accuracy(tmp_path):
    from gptforge.cli.common import summary
    from gptforge.training.loop import RunResult

    recs = [{"kind": "eval", "step": 0, "task": "compare", "acc": 0.25, "n": 40},
            {"kind": "eval", "step": 6, "task": "compare", "acc": 0.5, "n": 40}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = RunResult(run_dir=tmp_path, steps_done=6, last_stats={"reward": 0.625, "loss": 0.1}, seconds=75,
                    interrupted=True, stop_reason="signal")
    text = summary(res, "rl")
    assert "reward      final 0.625 (step 6, training problems; reward function: " in text
    # every held-out rate with its interval, n and chance level (eval.stats.fmt_rate)
    assert "held-out    compare: accuracy (step 0) 0.250 (95% CI 0.142-0.402, n 40, chance 0.500)" in text
    assert "held-out    compare: accuracy (step 6) 0.500 (95% CI 0.352-0.648, n 40, chance 0.500)" in text
    assert "time        1m15s" in text and f"continue    gptforge rl --out {tmp_path} --resume" in text
    assert f"gptforge chat --ckpt {tmp_path}" in text and "--tasks compare" in text


def test_train_threads_auto_takes_omp_num_threads_else_one_on_cpu(monkeypatch):
    import torch

    from gptforge.runtime import set_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_threads(0, torch.device("cpu")) == 1 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_threads(0, torch.device("cpu")) == 2 == torch.get_num_threads()
        assert set_threads(3, torch.device("cpu")) == 3 == torch.get_num_threads()  # an explicit value wins
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="train.threads"):
        get_preset("tiny").train.__class__(threads=-1)


@pytest.mark.parametrize("command", sorted(set(__import__("gptforge.run.resume", fromlist=["x"]).COMMAND_OF.values())))
def test_every_training_commands_next_steps_parse_and_suit_the_checkpoint(command, tmp_path):
    """Every training command's end-of-run summary offers only commands that exist, parse, and accept
    that run's checkpoint kind: a reward model is never offered sample/chat (they refuse it)."""
    import shlex

    from gptforge.cli import build_parser
    from gptforge.cli.hints import next_commands

    cmds = next_commands(command, str(tmp_path / "run"), "compare")
    assert cmds and all(c.startswith("gptforge ") for c in cmds)
    for c in cmds:
        try:
            build_parser().parse_args(shlex.split(c)[1:])
        except SystemExit:
            pytest.fail(f"{command}'s summary offers `{c}`, which does not parse")
    verbs = {shlex.split(c)[1] for c in cmds}
    if command == "rm":
        assert not verbs & {"sample", "chat"} and {"eval", "rl", "export"} <= verbs
    else:
        assert {"sample", "eval", "export"} <= verbs


def test_next_steps_come_from_the_runs_own_task_and_paths(tmp_path):
    """Issue 34: `dpo --task compare` suggests `eval --tasks compare`; `rm` on compare pairs suggests
    `rl --task compare` from the model it started from, and a held-out compare file, not placeholders."""
    from gptforge.cli.common import summary
    from gptforge.config import Config
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.training.loop import RunResult

    prefs = write_preferences(preference_set("compare", 2), tmp_path / "p.jsonl")
    res = RunResult(run_dir=tmp_path / "run", steps_done=1)
    cfg = Config()
    cfg.dpo.task, cfg.dpo.init_from, cfg.dpo.data = "compare", "runs/my_sft", str(prefs)
    text = summary(res, "dpo", cfg, "runs/my_sft")
    assert "--tasks compare" in text and "arithmetic" not in text
    cfg.rm.data = str(prefs)
    text = summary(res, "rm", cfg, "runs/my_sft")
    assert "rl --init-from runs/my_sft --task compare" in text and "preferences compare --policy runs/my_sft" in text
    assert "SFT_RUN" not in text and "PREFS_EVAL" not in text and "--held-out" in text
    cfg.rl.task = "compare"
    assert "--tasks compare" in summary(res, "rl", cfg, "runs/my_sft")
    from gptforge.eval.tasks.synthetic import write_conversations
    from gptforge.eval.tasks.verifiable import compare_problems

    cfg.sft.data = str(write_conversations(compare_problems(2), tmp_path / "conv.jsonl"))
    assert "--tasks compare --limit" in summary(res, "sft", cfg, "runs/base")  # the task its conversations teach
