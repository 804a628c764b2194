"""An option the run would silently ignore is refused, for every command that starts or resumes a run.

Two classes, each walked from the tables in ``gptforge.config`` (so a new section or a new dependent key is
covered without a new test): a key of a section the command never reads (``train --rl.kl_coef 0.1``,
``sft --dpo.beta 0.5``: before, the run went on without it), and a key that acts only under a setting
this run lacks (``--lora.alpha`` at ``lora.rank`` 0, ``rl --gamma`` under GRPO, ``--rl.kl_horizon``
without ``--kl-target``, ``--rl.reward_reduce`` without ``--reward-model``). Each refusal is one line,
exit 2, naming the key; the same key with its setting given is accepted and reaches the config. Both on a
fresh run (``--dry-run``) and on ``--resume``. A key at its default value passes (nothing would be lost).

``train --init-from M --lora.rank R`` is LoRA continued pretraining, so train reads lora.* (the walk checks it).

Planted bugs these catch: the check skipped on resume; the check skipped on a fresh run; plan or bench unchecked; a command's own
section refused (``rl`` told it never reads ``rl.*``); a dependent key refused even with its setting.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from gptforge.cli import main
from gptforge.config_inert import ACTS_ONLY_WITH, RECIPE_SECTIONS, SECTION_OWNER

COMMANDS = {"train": "pretrain", "sft": "sft", "rl": "grpo", "rm": "rm", "dpo": "dpo"}
NEEDS_DATA = {"sft": "conv", "rm": "prefs", "dpo": "prefs"}
# what makes each dependent key act: the setting its message names, as command-line arguments
# a valid value other than the default for each dependent key
VALUE_OF = {"lora.alpha": "4.0", "lora.dropout": "0.1", "lora.targets": "c_attn", "lora.base": "@chat",
            "rl.gamma": "0.9", "rl.lam": "0.8", "rl.vf_coef": "0.3", "rl.clip_value": "0.3", "rl.value_init": "policy",
            "rl.kl_horizon": "50", "rl.reward_reduce": "min", "rl.reward_norm": "true"}
ENABLE = {"lora.rank": ["--lora.rank", "2"], "rl.algo": ["--algo", "ppo"], "rl.kl_target": ["--kl-target", "0.5"],
          "rl.reward_model": ["--reward-model", "@chat"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
    from tests.conftest import tiny_chat_checkpoint

    tmp = tmp_path_factory.mktemp("inert")
    return {"tmp": tmp, "chat": str(tiny_chat_checkpoint(tmp / "chat")),
            "conv": str(write_conversations(arithmetic_problems(30, seed=2), tmp / "conv.jsonl")),
            "prefs": str(write_preferences(preference_set("compare", 24, seed=1), tmp / "prefs.jsonl"))}


def _argv(world, command: str, out) -> list[str]:
    if command == "train":
        return ["train", "--out", str(out), "--dry-run"]
    argv = [command, "--init-from", world["chat"], "--out", str(out), "--dry-run"]
    return argv + (["--data", world[NEEDS_DATA[command]]] if command in NEEDS_DATA else [])


# a key of each recipe section and a valid value other than its default (every section the tables name needs one)
KEY_OF = {"lora": ("lora.rank", "2"), "rl": ("rl.kl_coef", "0.5"), "sft": ("sft.val_count", "7"),
          "rm": ("rm.val_count", "7"), "dpo": ("dpo.beta", "0.5")}


def _refused(argv, capsys, *words) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_section_the_command_never_reads_is_refused(world, tmp_path, capsys, command):
    reads = RECIPE_SECTIONS[COMMANDS[command]]
    others = [s for s in SECTION_OWNER if s not in reads]
    assert others, command
    assert set(SECTION_OWNER) <= set(KEY_OF), "a new recipe section: give it a key in KEY_OF"
    for section in others:
        key, value = KEY_OF[section]
        _refused([*_argv(world, command, tmp_path / "r"), f"--{key}", value], capsys, f"--{key}", "never reads",
                 "drop it")
    for section in reads:  # its own sections are read: a key of each reaches the printed config
        key, value = KEY_OF[section]
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main([*_argv(world, command, tmp_path / "r"), f"--{key}", value]) == 0, (command, key)
        got = json.loads(buf.getvalue())[section][key.split(".")[1]]
        assert str(got) == value, (command, key, got)
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize("keys,acts,needs", ACTS_ONLY_WITH, ids=[k[0] for k, _, _ in ACTS_ONLY_WITH])
def test_a_key_without_the_setting_it_acts_under_is_refused(world, tmp_path, capsys, keys, acts, needs):
    command = "rl" if keys[0].startswith("rl.") else "sft"
    (setting,) = [s for s in ENABLE if f"--{s}" in needs or ENABLE[s][0] in needs]
    enable = [world["chat"] if a == "@chat" else a for a in ENABLE[setting]]
    for key in keys:
        section, name = key.split(".")
        assert key in VALUE_OF, f"a new dependent key: give {key} a valid value in VALUE_OF"
        value = world["chat"] if VALUE_OF[key] == "@chat" else VALUE_OF[key]
        _refused([*_argv(world, command, tmp_path / "r"), f"--{key}", value], capsys, key, "no effect", needs)
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main([*_argv(world, command, tmp_path / "r"), *enable, f"--{key}", value]) == 0, key
        got = json.loads(buf.getvalue())[section][name]
        assert str(got).lower() == value.lower() or got == type(got)(value), (key, got)


def test_a_resume_refuses_them_too(world, tmp_path, capsys):
    run = tmp_path / "sft"
    assert main(["sft", "--init-from", world["chat"], "--data", world["conv"], "--out", str(run), "--val-count", "4",
                 "--train.max_steps", "1", "--train.seq_len", "32", "--train.micro_batch", "2",
                 "--train.total_batch_tokens", "64", "--train.device", "cpu", "--train.sample_every", "0"]) == 0
    capsys.readouterr()
    resume = ["sft", "--out", str(run), "--resume", "--train.max_steps", "2"]
    _refused([*resume, "--rl.kl_coef", "0.5"], capsys, "--rl.kl_coef", "`gptforge sft` never reads rl.*")
    _refused([*resume, "--lora.alpha", "4"], capsys, "--lora.alpha", "--lora.rank")
    assert not (run / "checkpoints" / "step_000002").exists()
    assert main(resume) == 0 and (run / "checkpoints" / "step_000002").exists()


def test_plan_and_bench_refuse_them_too(capsys):
    """plan reads lora.* (a LoRA run's memory) and no other recipe section; bench times pretraining steps."""
    _refused(["plan", "--preset", "tiny", "--rl.kl_coef", "0.5"], capsys, "--rl.kl_coef", "`gptforge plan` never reads")
    _refused(["plan", "--preset", "tiny", "--lora.alpha", "4"], capsys, "--lora.alpha", "--lora.rank")
    _refused(["bench", "--preset", "tiny", "--lora.rank", "2"], capsys, "--lora.rank", "`gptforge bench` never reads")
    assert main(["plan", "--preset", "tiny", "--lora.rank", "2", "--lora.targets", "c_attn"]) == 0
    assert "LoRA rank 2" in capsys.readouterr().out


def test_a_default_value_changes_nothing_and_passes(world, tmp_path):
    """Every key of a whole config written out as overrides (how test_distributed reproduces a run through
    the CLI, or a user copying meta.json's config) names sections the command does not read, at their
    defaults: nothing would be lost, so nothing is refused."""
    for argv in ([*_argv(world, "sft", tmp_path / "r"), "--rl.kl_coef", "0.02", "--dpo.beta", "0.1"],
                 [*_argv(world, "rl", tmp_path / "r"), "--gamma", "1.0", "--lora.alpha", "16"],
                 [*_argv(world, "train", tmp_path / "r"), "--rl.kl_horizon", "10000", "--sft.val_count", "200"]):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main(argv) == 0, argv
