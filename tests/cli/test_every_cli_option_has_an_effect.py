"""Every option of every ``gptforge`` command tested through to its effect (issue 36), not only its refusal.

``test_every_cli_option_has_an_effect_test`` walks ``build_parser()``: every command, every sub-command
(``prepare SOURCE``, ``tokenizer train``) and every option string and positional of each. Each must be
in ``EFFECTS`` (the pytest node ids of the tests that show its effect: the option changes something
observable and the test checks it), or in ``OUTPUT_ONLY`` (it only selects what is printed, with a
reason), or in ``NOT_YET`` (no effect test yet: a list that may only shrink, capped by ``NOT_YET_MAX``).
An option the parser gains in none of them fails the walk; every node id named is looked up in its file
with ``ast`` (no import, no collection), so an entry cannot point at nothing.

The recipe commands' short flags (``rl --gamma`` = ``--rl.gamma``, ``dpo --val-count`` =
``--dpo.val_count``, ...) are covered by two links: ``test_recipe_flags_reach_their_config_keys`` (every
short flag, typed with a value other than the default, is in the resolved config ``--dry-run``
prints, under the key its help names) and a test of that key's effect on the recipe (most of them the
float64 hand computations of test_recipe_quantities.py). The ``--section.key`` overrides themselves are
``apply_overrides`` (config.py), one code path for every key, tested by tests/cli/test_cli.py's
test_overrides_parse_types for each value type.

The effect tests here run tiny models (one layer, 32 wide) for a few steps each and compare with what
the options promise, counted from the inputs: held-out rows counted from the file, problems per step
and replies per problem from the calls of a recording reward, the logged learning rate from the
warmup's formula, eval and checkpoint steps from the flags, greedy replies from a decoder written out
here, shards from test_prepare.py's single-process reference, weights from the files they came from.
``--device`` is the one option checked by a refusal on a machine without CUDA: ``--device cuda`` is
refused there by name, where the default (auto) would have run, so the value reached device selection.

Planted bugs these catch (each planted in a copy of src/ and seen to fail): a recipe's short flag left
out of what it sets (``rl --seed``, ``rl --warmup-steps``, ``dpo --val-count``, ``rm --micro-batch``,
``sft --skip-bad``, ``dpo --task``); ``rl.top_k`` not passed to sampling; the pairs' held-out split
ignoring its seed; the pair recipes' ``eval_every`` ignored; ``--base-loss`` never computed; the
--init-from weights not loaded (every recipe), or not into a reward model's body; ``sft.split`` or the
pairs' split not passed to the reader; --force not passed (sft, rm, dpo, import, every --json/--out
file); --trust-checkpoint dropped (train, sft, rl); train --preset ignored; an llm.c reader zeroing one
tensor; --gguf not read; eval's --system or --raw dropped; chat's --top-p, --top-k, --seed, --system,
--repetition-penalty dropped; serve's --max-batch, --api-key, --metrics, --max-queue dropped; prepare
conversations' --seed or --digits, preferences' --kinds and every --policy sampling knob dropped;
prepare files' --text-field, --val-tokens, --name dropped; export --no-tokenizer ignored; tokenizer
train's --held-out or --max-chars dropped. The tool commands' options (plan, bench, bench-generate, bench-prepare,
plot, prepare fineweb and the prepare --workers/--start-method, tokenizer train --hf-dataset/--hf-config/--split,
--random, chat --hf, eval --batch-tokens/--repeats/--reward-model, prepare shakespeare, race --target/--no-plot,
assets NAME and --online) are tested in test_tool_option_effects.py, whose docstring lists its plants.
"""

from __future__ import annotations

import ast
import io
import json
import os
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptforge.cli import main

ROOT = Path(__file__).resolve().parents[2]
ME = "tests/cli/test_every_cli_option_has_an_effect.py"
CPU = ["--device", "cpu"]


# ---------------------------------------------------------------- the world: a tiny chat model and its data
@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
    from tests.conftest import tiny_chat_checkpoint

    tmp = tmp_path_factory.mktemp("opts")
    conv = write_conversations(arithmetic_problems(30, seed=2), tmp / "conv.jsonl")
    prefs = write_preferences(preference_set("compare", 24, seed=1), tmp / "prefs.jsonl")
    for good in (conv, prefs):  # the same rows and one that is not JSON: --skip-bad's input
        bad = tmp / f"bad_{good.name}"
        lines = good.read_text().splitlines(keepends=True)
        bad.write_text("".join(lines[:5]) + "{not json\n" + "".join(lines[5:]))
    return {"tmp": tmp, "chat": str(tiny_chat_checkpoint(tmp / "chat")), "conv": str(conv), "prefs": str(prefs),
            "bad_conv": str(tmp / "bad_conv.jsonl"), "bad_prefs": str(tmp / "bad_prefs.jsonl")}


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _ckpt_steps(run: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))


def _dry(argv: list[str]) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(argv) == 0, argv
    return json.loads(buf.getvalue())


# ---------------------------------------------------------------- link 1: every short flag reaches its key
# (command, flag) -> (the config key the flag's help names, a value other than the default), written out
# here from the help texts, not read from the CLI's own tables
SHORT = {
    "sft": {"--data": ("sft.data", "@bad_conv"), "--val-count": ("sft.val_count", 7), "--split": ("sft.split", "dev"),
            "--seed": ("sft.seed", 11), "--skip-bad": ("sft.skip_bad", True), "--steps": ("train.max_steps", 9)},
    "rl": {"--task": ("rl.task", "compare"), "--reward": ("rl.reward", "numeric_closeness"),
           "--steps": ("train.max_steps", 9), "--prompts": ("rl.prompts", 3), "--group": ("rl.group", 5),
           "--max-new-tokens": ("rl.max_new_tokens", 7), "--temperature": ("rl.temperature", 0.55),
           "--top-k": ("rl.top_k", 3), "--lr": ("optim.lr", 0.00123), "--warmup-steps": ("optim.warmup_steps", 4),
           "--kl-coef": ("rl.kl_coef", 0.033), "--kl-target": ("rl.kl_target", 0.7), "--clip-eps": ("rl.clip_eps", 0.07),
           "--updates-per-batch": ("rl.updates_per_batch", 3), "--micro-batch": ("train.micro_batch", 5),
           "--eval-every": ("rl.eval_every", 6), "--eval-n": ("rl.eval_n", 13), "--ckpt-every": ("train.ckpt_every", 8),
           "--keep-ckpts": ("train.keep_ckpts", 6), "--seed": ("train.seed", 17), "--algo": ("rl.algo", "ppo"),
           "--reward-model": ("rl.reward_model", "@chat"), "--gamma": ("rl.gamma", 0.91), "--lam": ("rl.lam", 0.81),
           "--vf-coef": ("rl.vf_coef", 0.37), "--clip-value": ("rl.clip_value", 0.29),
           "--reward-norm": ("rl.reward_norm", True), "--raw": ("rl.raw", True), "--device": ("train.device", "cpu")},
}
for _s in ("rm", "dpo"):
    SHORT[_s] = {"--data": (f"{_s}.data", "@bad_prefs"), "--split": (f"{_s}.split", "dev"),
                 "--val-count": (f"{_s}.val_count", 7), "--seed": (f"{_s}.seed", 11),
                 "--skip-bad": (f"{_s}.skip_bad", True), "--eval-every": (f"{_s}.eval_every", 6),
                 "--steps": ("train.max_steps", 9), "--lr": ("optim.lr", 0.00123),
                 "--micro-batch": ("train.micro_batch", 3), "--ckpt-every": ("train.ckpt_every", 8),
                 "--device": ("train.device", "cpu")}
SHORT["dpo"].update({"--beta": ("dpo.beta", 0.37), "--loss-type": ("dpo.loss_type", "ipo"),
                     "--sft-coef": ("dpo.sft_coef", 0.25), "--task": ("dpo.task", "compare"),
                     "--eval-n": ("dpo.eval_n", 13)})
NEEDS_DATA = {"sft": "conv", "rm": "prefs", "dpo": "prefs"}


@pytest.mark.parametrize("command", sorted(SHORT))
def test_recipe_flags_reach_their_config_keys(world, tmp_path, command):
    """Each short flag of sft/rl/rm/dpo, typed with a value other than the default, is the resolved config's
    value of the key its help names; and --dry-run prints that config and trains nothing."""
    base = [command, "--init-from", world["chat"], "--out", str(tmp_path / "r"), "--dry-run"]
    if command in NEEDS_DATA:
        base += ["--data", world[NEEDS_DATA[command]]]
    default = _dry(base)
    argv = list(base)
    want = {}
    for flag, (key, value) in SHORT[command].items():
        value = world[value[1:]] if isinstance(value, str) and value.startswith("@") else value
        if flag == "--data":
            argv[argv.index("--data") + 1] = value
        elif value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
        want[key] = value
    got = _dry(argv)
    for key, value in want.items():
        section, name = key.split(".")
        assert got[section][name] == value, (command, key)
        assert default[section][name] != value, f"{command} {key}: pick a test value other than the default"
    assert not (tmp_path / "r" / "metrics.jsonl").exists() and not (tmp_path / "r" / "checkpoints").exists()


# ---------------------------------------------------------------- rl: the rollout's shape, from a recording reward
def recording_reward(problem, reply: str) -> float:
    """A graded reward that writes each (problem, reply) it scores to $GPTFORGE_TEST_REWARD_LOG."""
    with open(os.environ["GPTFORGE_TEST_REWARD_LOG"], "a") as f:
        f.write(json.dumps({"q": problem.question, "r": reply}) + "\n")
    return float(len(reply) % 3)


def _rl(world, tmp_path, monkeypatch, name, *flags) -> tuple[Path, list[dict]]:
    log = tmp_path / f"{name}.jsonl"
    log.write_text("")
    monkeypatch.setenv("GPTFORGE_TEST_REWARD_LOG", str(log))
    out = tmp_path / name
    assert main(["rl", "--init-from", world["chat"], "--out", str(out), "--reward", f"{__name__}:recording_reward",
                 *CPU, *flags]) == 0
    return out, [json.loads(x) for x in log.read_text().splitlines()]


def test_rl_rollout_options_shape_what_is_sampled_scored_and_logged(world, tmp_path, monkeypatch):
    """--steps, --prompts, --group, --max-new-tokens, --seed, --task, --top-k, --reward, --lr, --warmup-steps,
    --eval-every, --eval-n, --ckpt-every, --keep-ckpts, --algo, --out: each checked against what it promises."""
    a, calls_a = _rl(world, tmp_path, monkeypatch, "a", "--steps", "3", "--prompts", "3", "--group", "2",
                     "--max-new-tokens", "5", "--seed", "5", "--lr", "2e-3", "--warmup-steps", "4",
                     "--eval-every", "2", "--eval-n", "3", "--ckpt-every", "2", "--keep-ckpts", "1")
    b, calls_b = _rl(world, tmp_path, monkeypatch, "b", "--steps", "2", "--prompts", "2", "--group", "3",
                     "--max-new-tokens", "3", "--seed", "6", "--lr", "1e-3", "--warmup-steps", "2", "--eval-n", "2",
                     "--eval-every", "0", "--ckpt-every", "1", "--keep-ckpts", "5", "--top-k", "1")
    one = ["--steps", "1", "--prompts", "3", "--group", "2", "--max-new-tokens", "5", "--eval-n", "2"]
    c, calls_c = _rl(world, tmp_path, monkeypatch, "c", *one, "--seed", "5", "--task", "compare", "--ckpt-every", "0")
    _, calls_d = _rl(world, tmp_path, monkeypatch, "d", *one, "--seed", "5")
    _, calls_e = _rl(world, tmp_path, monkeypatch, "e", *one, "--seed", "6")
    f, _ = _rl(world, tmp_path, monkeypatch, "f", *one, "--algo", "ppo")
    for run, calls, steps, prompts, group, new in ((a, calls_a, 3, 3, 2, 5), (b, calls_b, 2, 2, 3, 3)):
        recs = _records(run, "rl")
        assert [r["step"] for r in recs] == list(range(1, steps + 1))  # --steps
        assert len(calls) == steps * prompts * group  # --reward scores every reply, and only those
        for s, rec in enumerate(recs):
            mine = calls[s * prompts * group:(s + 1) * prompts * group]
            assert sorted(Counter(x["q"] for x in mine).values()) == [group] * prompts  # --prompts x --group
            assert rec["reward"] == pytest.approx(sum(len(x["r"]) % 3 for x in mine) / len(mine))  # --reward's mean
            assert rec["reply_len"] <= new  # --max-new-tokens caps every reply
        assert max(r["reply_len"] for r in recs) == new  # a random model never stops early: it reaches the cap
    # --lr and --warmup-steps: linear warmup, lr * step / warmup
    assert [r["lr"] for r in _records(a, "rl")] == pytest.approx([2e-3 * s / 4 for s in (1, 2, 3)], rel=1e-9)
    assert [r["lr"] for r in _records(b, "rl")] == pytest.approx([1e-3 / 2, 1e-3], rel=1e-9)
    # --eval-every (0 = start and end) and --eval-n
    assert [(r["step"], r["n"]) for r in _records(a, "eval")] == [(0, 3), (2, 3), (3, 3)]
    assert [(r["step"], r["n"]) for r in _records(b, "eval")] == [(0, 2), (2, 2)]
    # --ckpt-every and --keep-ckpts (the newest kept); the last step is saved whatever --ckpt-every says
    assert (_ckpt_steps(a), _ckpt_steps(b), _ckpt_steps(c)) == ([3], [1, 2], [1])
    # --seed: the same seed draws the same problems, another seed others; --task compare: compare problems
    first = lambda calls: sorted({x["q"] for x in calls[:6]})  # noqa: E731  step 1's problems
    assert first(calls_d) == first(calls_a) and first(calls_e) != first(calls_a)
    assert all(q.startswith("What is") for q in first(calls_a) + first(calls_e))
    assert all(q.startswith("Which is larger") for q in first(calls_c))
    # --algo ppo: the PPO recipe, a value model (the policy's body and a scalar head) beside it, its value loss logged
    (start_a,), (start_f,) = _records(a, "start"), _records(f, "start")
    assert (start_a["recipe"], start_f["recipe"]) == ("grpo", "ppo") and start_f["params"] > 1.9 * start_a["params"]
    assert "value_loss" in _records(f, "rl")[0] and "value_loss" not in _records(a, "rl")[0]
    # --top-k 1: greedy, every reply to a problem the same; without it some group's replies differ
    for calls, greedy in ((calls_a, False), (calls_b, True)):
        groups: dict[str, set] = {}
        for x in calls:
            groups.setdefault(x["q"], set()).add(x["r"])
        assert all(len(g) == 1 for g in groups.values()) == greedy


# ---------------------------------------------------------------- rm and dpo: the held-out split, the schedule
def _spy_pairs(monkeypatch, recipe_cls) -> list[dict]:
    from gptforge.training.pairs import PairRecipe

    runs: list[dict] = []
    real_loaders, real_micro = PairRecipe.loaders, recipe_cls.micro_step

    def loaders(self, cfg, info):
        train, val, n = real_loaders(self, cfg, info)
        runs.append({"train": len(train.pairs), "val": [p.chosen.ids.tolist() + p.rejected.ids.tolist()
                                                        for p in self.val], "batches": []})
        return train, val, n

    def micro_step(self, run, batch):
        runs[-1]["batches"].append(batch.n)
        return real_micro(self, run, batch)

    monkeypatch.setattr(PairRecipe, "loaders", loaders)
    monkeypatch.setattr(recipe_cls, "micro_step", micro_step)
    return runs


@pytest.mark.parametrize("command", ["rm", "dpo"])
def test_pair_options_split_schedule_and_save_what_they_say(world, tmp_path, monkeypatch, capsys, command):
    """--data, --skip-bad, --val-count, --seed, --eval-every, --steps, --micro-batch, --lr, --ckpt-every of
    rm and dpo (and dpo's --task, --eval-n): held-out and training pairs counted from the file, batches, eval
    and checkpoint steps."""
    from gptforge.training.dpo import DPO
    from gptforge.training.rm import RM

    spy = _spy_pairs(monkeypatch, RM if command == "rm" else DPO)
    n_rows = len(Path(world["prefs"]).read_text().splitlines())  # the bad file: these rows and one bad line
    go = lambda name, data, *flags: main([command, "--init-from", world["chat"], "--data", world[data],  # noqa: E731
                                          "--out", str(tmp_path / name), *CPU, *flags])
    capsys.readouterr()
    assert go("x", "bad_prefs", "--val-count", "5", "--steps", "1") == 2
    assert "bad_prefs.jsonl:6: not valid JSON" in capsys.readouterr().err
    assert go("p1", "bad_prefs", "--skip-bad", "--val-count", "5", "--seed", "3", "--eval-every", "2", "--steps", "3",
              "--micro-batch", "2", "--lr", "2e-3", "--ckpt-every", "2") == 0
    assert "skipped 1 bad preference row" in capsys.readouterr().out
    task = ["--task", "compare", "--eval-n", "3"] if command == "dpo" else []  # dpo: greedy accuracy on a task
    assert go("p2", "prefs", "--val-count", "6", "--seed", "4", "--eval-every", "0", "--steps", "3",
              "--micro-batch", "3", "--lr", "4e-3", "--ckpt-every", "0", *task) == 0
    assert go("p3", "prefs", "--val-count", "5", "--seed", "4", "--steps", "1") == 0
    p1, p2, p3 = spy
    assert (p1["train"], len(p1["val"]), p2["train"], len(p2["val"])) == (n_rows - 5, 5, n_rows - 6, 6)
    assert set(p1["batches"]) == {2} and set(p2["batches"]) == {3}  # --micro-batch pairs per forward
    assert len(p3["val"]) == 5 and sorted(p3["val"]) != sorted(p1["val"])  # --seed picks the held-out pairs
    r1, r2 = (tmp_path / "p1", tmp_path / "p2")
    assert [r["step"] for r in _records(r1, command)] == [1, 2, 3] == [r["step"] for r in _records(r2, command)]
    assert [(r["step"], r["n"]) for r in _records(r1, "eval")] == [(0, 5), (2, 5), (3, 5)]
    assert [(r["step"], r["n"]) for r in _records(r2, "eval")] == [(0, 6), (3, 6)]
    assert all("task_n" not in r for r in _records(r1, "eval"))
    if task:  # --task compare --eval-n 3: the compare task's accuracy on 3 problems at every eval
        assert all(r["task_n"] == 3 and 0 <= r["compare_acc"] <= 1 for r in _records(r2, "eval"))
    lr1, lr2 = ([r["lr"] for r in _records(r, command)] for r in (r1, r2))
    assert lr2 == pytest.approx([2 * x for x in lr1], rel=1e-12) and len(set(lr1)) == 3  # the schedule of --lr
    assert _ckpt_steps(r1) == [2, 3] and _ckpt_steps(r2) == [3]


# ---------------------------------------------------------------- sft: the held-out conversations, the base loss
def test_sft_options_split_and_score_what_they_say(world, tmp_path, monkeypatch, capsys):
    """--data, --skip-bad, --val-count, --seed, --steps, --base-loss of sft: training and held-out conversations
    counted from the file; the base loss is the starting model's held-out loss (the first val of a run whose
    one step cannot move it, lr 1e-12)."""
    from gptforge.data import sft as sft_data
    from gptforge.run import checkpoint as ckpt

    loaders: list[tuple[int, bool, list]] = []
    real = sft_data.ConversationLoader.__init__

    def init(self, convs, *a, shuffle=True, **k):
        loaders.append((len(convs), shuffle, [c.ids.tolist() for c in convs]))
        real(self, convs, *a, shuffle=shuffle, **k)

    monkeypatch.setattr(sft_data.ConversationLoader, "__init__", init)
    n_rows = len(Path(world["conv"]).read_text().splitlines())
    small = ["--train.seq_len", "64", "--train.micro_batch", "2", "--train.total_batch_tokens", "128",
             "--train.ckpt_every", "0", "--train.device", "cpu", "--train.sample_every", "0"]
    go = lambda name, data, *flags: main(["sft", "--init-from", world["chat"], "--data", world[data],  # noqa: E731
                                          "--out", str(tmp_path / name), *small, *flags])
    capsys.readouterr()
    assert go("x", "bad_conv", "--steps", "1") == 2 and "bad_conv.jsonl:6" in capsys.readouterr().err
    got = {}
    for name, data, flags in (("s1", "bad_conv", ["--skip-bad", "--val-count", "4", "--seed", "3", "--steps", "2",
                                                   "--base-loss", "--optim.lr", "1e-12", "--optim.warmup_steps", "0",
                                                   "--train.val_every", "1"]),
                              ("s2", "conv", ["--val-count", "6", "--seed", "4", "--steps", "1"]),
                              ("s3", "conv", ["--val-count", "4", "--seed", "4", "--steps", "1"])):
        loaders.clear()
        assert go(name, data, *flags) == 0
        (n_train, shuffled, _), (n_val, val_shuffled, val) = loaders[-2:]  # the run's (--base-loss: a first pair)
        assert shuffled and not val_shuffled
        got[name] = (n_train, n_val, val)
        assert ("skipped 1 bad conversation" in capsys.readouterr().out) == (name == "s1")
    assert [got[k][:2] for k in ("s1", "s2")] == [(n_rows - 4, 4), (n_rows - 6, 6)]
    assert sorted(got["s3"][2]) != sorted(got["s1"][2])  # --seed picks the held-out conversations
    assert [r["step"] for r in _records(tmp_path / "s1", "train")] == [1, 2]
    assert [r["step"] for r in _records(tmp_path / "s2", "train")] == [1]
    base = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "s1"))["base_val_loss"]
    assert base == pytest.approx(_records(tmp_path / "s1", "val")[0]["val_loss"], abs=1e-5)
    assert "base_val_loss" not in ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "s2"))


# ---------------------------------------------------------------- where a recipe starts, and which split it reads
RECIPE_RUNS = {  # one step that cannot move the weights (lr 1e-12), given (init model, data path)
    "sft": lambda m, d: ["sft", "--init-from", m, "--data", d, "--val-count", "2", "--steps", "1", "--optim.lr", "1e-12",
                         "--train.seq_len", "64", "--train.micro_batch", "2", "--train.total_batch_tokens", "128",
                         "--train.ckpt_every", "0", "--train.device", "cpu", "--train.sample_every", "0"],
    "rl": lambda m, d: ["rl", "--init-from", m, "--steps", "1", "--lr", "1e-12", "--prompts", "2", "--group", "2",
                        "--max-new-tokens", "3", "--eval-n", "2", *CPU],
    "rm": lambda m, d: ["rm", "--init-from", m, "--data", d, "--val-count", "2", "--steps", "1", "--lr", "1e-12",
                        "--micro-batch", "2", *CPU],
    "dpo": lambda m, d: ["dpo", "--init-from", m, "--data", d, "--val-count", "2", "--steps", "1", "--lr", "1e-12",
                         "--micro-batch", "2", *CPU],
}


@pytest.mark.parametrize("command", sorted(RECIPE_RUNS))
def test_init_from_is_the_weights_the_run_starts_from_and_force_starts_over(world, tmp_path, capsys, command):
    """--init-from: after one step that cannot move them, the run's weights are the starting checkpoint's, to
    1e-6 (a reward model's body; its score head is new). The checkpoint is drawn at seed 7, not at the seed a
    recipe would build a fresh model with. --force: the same run directory, refused without it, holds only
    the new run afterwards (its checkpoints and metrics, from step 1)."""
    from gptforge.run import checkpoint as ckpt
    from tests.conftest import tiny_chat_checkpoint

    init = tiny_chat_checkpoint(tmp_path / "init", seed=7)
    argv = [*RECIPE_RUNS[command](str(init), world["conv"] if command == "sft" else world["prefs"]),
            "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    start = load_file(str(Path(init) / "model.safetensors"))
    end = load_file(str(ckpt.latest_checkpoint(tmp_path / "r") / "model.safetensors"))
    if command == "rm":
        end = {k[len("body."):]: v for k, v in end.items() if k.startswith("body.")}
    assert start.keys() == end.keys()
    for k in start:
        torch.testing.assert_close(end[k], start[k], rtol=0, atol=1e-6, msg=k)
    capsys.readouterr()
    i = argv.index("--steps")  # a flag given twice with two values is refused: the second run says 2 instead
    argv[i + 1] = "2"
    assert main(argv) == 2 and "--force to start over" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    kind = {"sft": "train", "rl": "rl"}.get(command, command)
    assert len(_records(tmp_path / "r", "start")) == 1 and _ckpt_steps(tmp_path / "r") == [2]
    assert [r["step"] for r in _records(tmp_path / "r", kind)] == [1, 2]


class _Marker:
    """Unpickling this creates a file: proof that the pickle was read."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("command", ["train", "sft", "rl"])
def test_trust_checkpoint_lets_a_resume_read_the_sharded_metadata(world, tmp_path, capsys, command):
    """--trust-checkpoint: a resume from a sharded checkpoint reads its dcp/.metadata (a pickle) only with it."""
    import contextlib
    import pickle

    from gptforge.run import checkpoint as ckpt
    from tests.conftest import make_shards

    out, marker = tmp_path / "r", tmp_path / "unpickled"
    if command == "train":
        argv = ["train", "--preset", "tiny", "--data.dir", str(make_shards(tmp_path / "shards", 20_000, 4_000)),
                "--model.vocab_size", "512", "--train.max_steps", "1", "--train.val_every", "0",
                "--train.sample_every", "0", "--train.device", "cpu"]
    else:
        argv = RECIPE_RUNS[command](world["chat"], world["conv"])
    assert main([*argv, "--out", str(out)]) == 0
    (ckpt.latest_checkpoint(out) / "dcp").mkdir()
    (ckpt.latest_checkpoint(out) / "dcp" / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    resume = [command, "--out", str(out), "--resume", "--" + ("train.max_steps" if command == "train" else "steps"), "2"]
    capsys.readouterr()
    assert main(resume) == 2 and "--trust-checkpoint" in capsys.readouterr().err and not marker.exists()
    with contextlib.suppress(Exception):  # the planted pickle is no DCP table: what comes after reading it fails
        main([*resume, "--trust-checkpoint"])
    assert marker.exists()


def test_train_preset_is_the_config_and_dry_run_trains_nothing(tmp_path, monkeypatch):
    """train --preset NAME: the resolved config is that preset's (presets.get_preset), for two presets that
    differ; --dry-run prints it and writes nothing."""
    from gptforge.presets import get_preset

    monkeypatch.chdir(tmp_path)
    got = {name: _dry(["train", "--preset", name, "--dry-run"]) for name in ("tiny", "llama-tiny")}
    for name, cfg in got.items():
        assert cfg == get_preset(name).to_dict(), name
    assert got["tiny"]["model"] != got["llama-tiny"]["model"]
    assert list(tmp_path.iterdir()) == []


def _recipe_without_device(command):
    return lambda m, d, o: [a for a in RECIPE_RUNS[command](m, d) if a not in CPU] + ["--out", o]


DEVICE_RUNS = {  # (model, preferences, out dir) -> a short run of the command, without --device
    **{c: _recipe_without_device(c) for c in ("rl", "rm", "dpo")},  # sft's device is --train.device
    "eval": lambda m, d, o: ["eval", "--ckpt", m, "--tasks", "arithmetic", "--limit", "2"],
    "chat": lambda m, d, o: ["chat", "--ckpt", m, "--max-new-tokens", "2"],
    "serve": lambda m, d, o: ["serve", "--ckpt", m, "--port", "0"],
    "prepare preferences": lambda m, d, o: ["prepare", "preferences", "compare", "--policy", m, "--n", "2",
                                            "--samples", "2", "--max-new-tokens", "2", "--out", o + ".jsonl"],
    "bench-generate": lambda m, d, o: ["bench-generate", "--size", "d2", "--batch", "1", "--prompt-tokens", "2",
                                       "--new-tokens", "2", "--repeats", "1"],
}


@pytest.mark.parametrize("command", sorted(DEVICE_RUNS))
def test_device_is_where_the_command_runs(world, tmp_path, capsys, monkeypatch, command):
    """--device: without CUDA, --device cuda is refused naming the device (the default, auto, would run on the
    CPU); with CUDA, --device cpu runs (a training run's start record says cpu; auto would take the GPU)."""
    import uvicorn

    class Server:  # serve: no loop
        def __init__(self, config):
            pass

        def run(self, sockets):
            sockets[0].close()

    monkeypatch.setattr(uvicorn, "Server", Server)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n/quit\n"))  # chat: one message
    argv = DEVICE_RUNS[command](world["chat"], world["prefs"], str(tmp_path / "r"))
    if torch.cuda.is_available():
        assert main([*argv, "--device", "cpu"]) == 0
        if command in RECIPE_RUNS:
            assert _records(tmp_path / "r", "start")[0]["device"] == "cpu"
        return
    capsys.readouterr()
    assert main([*argv, "--device", "cuda"]) == 2
    assert "'cuda' but CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "rm", "dpo"])
def test_split_reads_that_split_of_a_saved_dataset(world, tmp_path, monkeypatch, command):
    """--split: with a save_to_disk dataset of a train and a test split, the run's training and held-out rows
    are the test split's (counted from it), and without --split the train split's."""
    datasets = pytest.importorskip("datasets")
    from gptforge.data import sft as sft_data
    from gptforge.training.pairs import PairRecipe

    rows = [json.loads(x) for x in Path(world["conv" if command == "sft" else "prefs"]).read_text().splitlines()]
    where = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:9])}).save_to_disk(str(where))
    seen: list[int] = []
    if command == "sft":
        real = sft_data.ConversationLoader.__init__

        def init(self, convs, *a, **k):
            seen.append(len(convs))
            real(self, convs, *a, **k)

        monkeypatch.setattr(sft_data.ConversationLoader, "__init__", init)
    else:
        real = PairRecipe.loaders

        def loaders(self, cfg, info):
            out = real(self, cfg, info)
            seen.extend([len(out[0].pairs), len(self.val)])
            return out

        monkeypatch.setattr(PairRecipe, "loaders", loaders)
    run = RECIPE_RUNS[command](world["chat"], str(where))
    assert main([*run, "--out", str(tmp_path / "a"), "--split", "test"]) == 0
    assert main([*run, "--out", str(tmp_path / "b")]) == 0
    assert seen == [9 - 2, 2, len(rows) - 2, 2]


# ---------------------------------------------------------------- model sources: one model, four files
def _base_model(seed: int):
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(seed)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    with torch.no_grad():  # no tensor left at its init value (layer norms at 1 and 0): a swapped one shows
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A base (GPT-2 vocabulary) checkpoint and the same model exported by the CLI as a Hugging Face
    directory, an llm.c file and a GGUF; and a checkpoint of another model."""
    pytest.importorskip("gguf")
    from gptforge.config import Config
    from gptforge.run.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("sources")
    ck = {}
    for seed in (0, 1):
        m = _base_model(seed)
        ck[seed] = str(save_checkpoint(tmp / f"ck{seed}", 1, m, None, {"config": Config(model=m.config).to_dict()}))
    for fmt in ("hf", "llmc", "gguf"):  # the hf directory without tokenizer files: GPT-2's is the default
        assert main(["export", fmt, "--ckpt", ck[0], "--out", str(tmp / fmt), *(["--no-tokenizer"] * (fmt == "hf"))]) == 0
    return {"tmp": tmp, "--ckpt": ck[0], "other": ck[1], "--hf": str(tmp / "hf"),
            "--llmc": str(tmp / "llmc" / "model.bin"), "--gguf": str(next((tmp / "gguf").glob("*.gguf")))}


def test_every_model_source_is_the_same_model_to_eval(sources, tmp_path):
    """eval --ckpt/--hf/--llmc/--gguf of one model (exported by export hf/llmc/gguf): the same greedy replies
    and scores; another model's replies differ, so the comparison can fail."""
    def run(*src) -> list:
        out = tmp_path / "e.json"
        assert main(["eval", *src, "--tasks", "arithmetic", "--limit", "2", "--raw", "--device", "cpu",
                     "--json", str(out), "--force"]) == 0
        return json.loads(out.read_text())

    want = run("--ckpt", sources["--ckpt"])
    assert run("--ckpt", sources["other"])[0]["samples"] != want[0]["samples"]
    for flag in ("--hf", "--llmc", "--gguf"):
        assert run(flag, sources[flag]) == want, flag


def test_export_reads_every_source_and_random_sizes(sources, tmp_path):
    """export hf from --hf/--llmc/--gguf: the same tensors as from --ckpt (a round trip through each format);
    --no-tokenizer and --force: the files in the directory; --random SIZE: a model of that size's shape
    (models/gpt2.py SIZES: d2 is 2 layers, 2 heads, 64 wide)."""
    from safetensors.torch import load_file

    want = load_file(str(Path(sources["--hf"]) / "model.safetensors"))
    for flag in ("--llmc", "--gguf", "--hf"):
        out = tmp_path / flag.strip("-")
        assert main(["export", "hf", flag, sources[flag], "--out", str(out), "--no-tokenizer"]) == 0
        got = load_file(str(out / "model.safetensors"))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), flag
    # --no-tokenizer: the directory holds no tokenizer files; without it, GPT-2's are written beside the weights.
    # --force: an export over a non-empty directory is refused without it and replaces the directory with it
    tokenizer_files = {"vocab.json", "merges.txt", "tokenizer_config.json"}
    assert not tokenizer_files & {f.name for f in (tmp_path / "llmc").iterdir()}
    assert main(["export", "hf", "--llmc", sources["--llmc"], "--out", str(tmp_path / "llmc")]) == 2
    assert main(["export", "hf", "--llmc", sources["--llmc"], "--out", str(tmp_path / "llmc"), "--force"]) == 0
    assert tokenizer_files <= {f.name for f in (tmp_path / "llmc").iterdir()}
    assert main(["export", "hf", "--random", "d2", "--out", str(tmp_path / "r")]) == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"]) == (2, 2, 64)


# ---------------------------------------------------------------- eval's prompts: --raw and --system
@torch.no_grad()
def _greedy(model, ids: list[int], n: int, stop_token: int) -> list[int]:
    """Greedy, a forward over the whole sequence per step (no cache, no padding), up to ``stop_token``."""
    seq, out = list(ids), []
    for _ in range(n):
        t = int(model(torch.tensor([seq]))[0][0, -1].argmax())
        if t == stop_token:
            break
        seq.append(t)
        out.append(t)
    return out


def test_eval_raw_and_system_are_the_prompts_the_replies_answer(world, tmp_path, tokenizer):
    """eval --tasks arithmetic on a chat model: its greedy replies are the greedy continuations (decoded here)
    of the prompt each option names, built here: the chat template's user turn; with --system a system turn
    first; with --raw the plain text "Question: ...\nAnswer:" (the reply cut at a blank line)."""
    from gptforge.data.chat import ChatTemplate, ChatTokenizer
    from gptforge.eval.generative import GENERATIVE
    from gptforge.load import ModelSource, load_model

    model = load_model(ModelSource(ckpt=world["chat"])).eval()
    t = ChatTemplate.gpt2()
    chat = ChatTokenizer(tokenizer, t)
    task = GENERATIVE["arithmetic"]
    problems = task.problems(2)[:2]
    new = min(task.max_new_tokens, model.config.block_size - 1)

    def replies(*flags) -> list[str]:
        out = tmp_path / "e.json"
        assert main(["eval", "--ckpt", world["chat"], "--tasks", "arithmetic", "--limit", "2", "--device", "cpu",
                     "--json", str(out), "--force", *flags]) == 0
        (res,) = json.loads(out.read_text())
        assert [r["question"] for r in res["samples"]] == [p.question for p in problems]
        return [r["reply"] for r in res["samples"]]

    def want_chat(system=None) -> list[str]:
        msgs = [[*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": p.question}]
                for p in problems]
        return [chat.decode(_greedy(model, t.render_for_generation(m, tokenizer), new, t.end)).strip() for m in msgs]

    def want_raw() -> list[str]:
        out = []
        for p in problems:
            text = tokenizer.decode(_greedy(model, tokenizer.encode_ordinary(f"Question: {p.question}\nAnswer:"), new,
                                            tokenizer.eot_token))
            for stop in ("\n\n", "\nQuestion:"):
                text = text.split(stop)[0]
            out.append(text.strip())
        return out

    plain, system, raw = replies(), replies("--system", "You are a calculator."), replies("--raw")
    assert plain == want_chat() and system == want_chat("You are a calculator.") and raw == want_raw()
    assert plain != system and plain != raw  # each option changed the replies
    # --force: each run above replaced the last one's --json file; without it the file is kept, refused by name
    before = (tmp_path / "e.json").read_text()
    assert main(["eval", "--ckpt", world["chat"], "--tasks", "arithmetic", "--limit", "2", "--json",
                 str(tmp_path / "e.json")]) == 2
    assert (tmp_path / "e.json").read_text() == before


# ---------------------------------------------------------------- chat: the sampling knobs of one reply
def test_chat_options_shape_the_reply(world, tokenizer, capsys, monkeypatch):
    """chat's --max-new-tokens, --temperature, --system, --repetition-penalty: greedy replies against a decoder
    written out here (a forward over the whole sequence per step, the penalty by hand); --seed, --top-k,
    --top-p: sampled replies against ``generation.complete`` given the options by hand and the same seed."""
    from gptforge.data.chat import ChatTemplate, ChatTokenizer
    from gptforge.generation import SamplingParams, complete
    from gptforge.load import ModelSource, load_model

    model = load_model(ModelSource(ckpt=world["chat"])).eval()
    t = ChatTemplate.gpt2()
    enc = ChatTokenizer(tokenizer, t)
    user = {"role": "user", "content": "What is 2 + 3?"}

    def chat(*flags) -> str:
        monkeypatch.setattr("sys.stdin", io.StringIO(user["content"] + "\n/quit\n"))
        assert main(["chat", "--ckpt", world["chat"], *CPU, *flags]) == 0
        out = capsys.readouterr().out
        return out.split("assistant> ", 1)[1].rsplit("\n", 1)[0]

    @torch.no_grad()
    def greedy(n, system=None, rep=1.0) -> str:
        seq = t.render_for_generation([*([{"role": "system", "content": system}] if system else []), user], enc)
        out = []
        for _ in range(n):
            z = model(torch.tensor([seq]))[0][0, -1].double().clone()
            if rep != 1.0:  # CTRL's rule over every token seen: divided by the penalty (multiplied when negative)
                for tok in set(seq):
                    z[tok] = z[tok] * rep if z[tok] < 0 else z[tok] / rep
            nxt = int(z.argmax())
            if nxt == t.end:
                break
            seq.append(nxt)
            out.append(nxt)
        return enc.decode(out)

    def lib(n, **kw) -> str:
        ids = t.render_for_generation([user], enc)
        return complete(model, enc, [ids], SamplingParams(max_new_tokens=n, stop_token=t.end, **kw))[0]["text"]

    g = greedy(8)
    assert chat("--temperature", "0", "--max-new-tokens", "8") == g
    assert chat("--temperature", "0", "--max-new-tokens", "3") == greedy(3) != g
    sys_reply = chat("--temperature", "0", "--max-new-tokens", "8", "--system", "You are a calculator.")
    assert sys_reply == greedy(8, system="You are a calculator.") != g
    rep = chat("--temperature", "0", "--max-new-tokens", "8", "--repetition-penalty", "3")
    assert rep == greedy(8, rep=3.0) != g
    hot = chat("--temperature", "1.5", "--top-k", "0", "--seed", "7", "--max-new-tokens", "8")
    assert hot == lib(8, temperature=1.5, top_k=None, seed=7) != g
    assert chat("--temperature", "1.5", "--top-k", "0", "--seed", "8", "--max-new-tokens", "8") == \
        lib(8, temperature=1.5, top_k=None, seed=8) != hot
    assert chat("--temperature", "1.5", "--top-k", "1", "--seed", "7", "--max-new-tokens", "8") == g
    assert chat("--temperature", "1.5", "--top-k", "0", "--top-p", "1e-6", "--seed", "7", "--max-new-tokens", "8") == g


# ---------------------------------------------------------------- serve: the app it would serve, in this process
def _served(monkeypatch, argv) -> tuple:
    """Run ``gptforge serve ARGV`` with uvicorn's loop replaced: (a TestClient of the app, the bound socket's
    address). Everything before the loop (settings, key, metrics, the model, the socket) is the command's."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import uvicorn
    from fastapi.testclient import TestClient

    got = {}

    class Server:
        def __init__(self, config):
            got["app"] = config.app

        def run(self, sockets):
            got["addr"] = sockets[0].getsockname()[:2]
            sockets[0].close()

    monkeypatch.setattr(uvicorn, "Server", Server)
    assert main(["serve", *argv]) == 0
    return TestClient(got["app"]), got["addr"]


def test_serve_options_are_what_the_app_serves(sources, tmp_path, monkeypatch):
    """serve's --host, --port (the socket bound), --api-key (a request without it is 401), --max-new-tokens-cap
    and --max-batch (a request past either is refused naming its field, one at it answered), --max-queue (the
    limit the app's gate holds; the gate's 429 is test_serve.py's), --metrics (the loss curve served is that
    file's) and the model sources --ckpt/--hf/--llmc/--gguf/--random (the same greedy completion from each
    file of one model; another model's differs; --random d2 is d2's shape)."""
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 10.0 - s}) + "\n" for s in (1, 2, 3)))
    client, addr = _served(monkeypatch, ["--ckpt", sources["--ckpt"], *CPU, "--host", "0.0.0.0", "--port", "0",
                                         "--api-key", "k3y", "--max-new-tokens-cap", "5", "--max-batch", "2",
                                         "--max-queue", "3", "--metrics", str(metrics)])
    assert addr[0] == "0.0.0.0" and addr[1] != 0  # --port 0: the system's free port (1-65535: test_serve_says)
    body = {"prompt": "ROMEO:", "max_tokens": 5, "temperature": 0}
    key = {"Authorization": "Bearer k3y"}
    assert client.post("/v1/completions", json=body).status_code == 401
    r = client.post("/v1/completions", json=body, headers=key)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
    want = r.json()["choices"][0]["text"]
    r = client.post("/v1/completions", json={**body, "max_tokens": 6}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert client.post("/v1/completions", json={**body, "n": 2}, headers=key).status_code == 200
    r = client.post("/v1/completions", json={**body, "n": 3}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    info = client.get("/api/info", headers=key).json()
    assert (info["limits"]["max_queue"], info["limits"]["max_batch"], info["limits"]["max_new_tokens_cap"]) == (3, 2, 5)
    assert client.get("/api/metrics", headers=key).json()["train"] == [[1, 9.0], [2, 8.0], [3, 7.0]]
    # the model sources: the same greedy text from every file of the model, another model's differs
    texts = {}
    for flag in ("--hf", "--llmc", "--gguf", "other"):
        src = ["--ckpt", sources["other"]] if flag == "other" else [flag, sources[flag]]
        c, _ = _served(monkeypatch, [*src, *CPU, "--port", "0"])
        texts[flag] = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert texts.pop("other") != want and texts == {"--hf": want, "--llmc": want, "--gguf": want}
    c, _ = _served(monkeypatch, ["--random", "d2", *CPU, "--port", "0"])
    shape = c.get("/api/info").json()["model"]
    assert (shape["n_layer"], shape["n_head"], shape["n_embd"]) == (2, 2, 64)


# ---------------------------------------------------------------- generated data files
def test_prepare_conversations_and_preferences_write_what_their_options_say(tmp_path, capsys):
    """prepare conversations: <task>, --n, --seed, --digits, --out, --force; prepare preferences --kinds. Rows
    counted and questions parsed from the files written."""
    import re

    def conv(name, *flags) -> list[str]:
        out = tmp_path / f"{name}.jsonl"
        assert main(["prepare", "conversations", *flags, "--out", str(out)]) == 0
        return [json.loads(x)["messages"][0]["content"] for x in out.read_text().splitlines()]

    a = conv("a", "arithmetic", "--n", "7", "--seed", "3")
    assert len(a) == 7 and a == conv("a2", "arithmetic", "--n", "7", "--seed", "3")
    assert conv("b", "arithmetic", "--n", "7", "--seed", "4") != a  # --seed: other problems
    ops = [re.fullmatch(r"What is (\d+) [+-] (\d+)\?", q).groups() for q in conv("c", "arithmetic", "--n", "6",
                                                                                  "--digits", "4")]
    assert all(len(x) == 4 for pair in ops for x in pair)  # --digits 4: four-digit operands
    assert all(re.fullmatch(r"What is \d\d [+-] \d\d\?", q) for q in a)  # the default: two
    assert all(q.startswith("Which is larger") for q in conv("d", "compare", "--n", "3"))  # <task>
    capsys.readouterr()
    assert main(["prepare", "conversations", "compare", "--n", "2", "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "--force" in capsys.readouterr().err and len((tmp_path / "a.jsonl").read_text().splitlines()) == 7
    assert main(["prepare", "conversations", "compare", "--n", "2", "--out", str(tmp_path / "a.jsonl"), "--force"]) == 0
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 2  # --force: replaced
    out = tmp_path / "p.jsonl"
    for kinds in ("wrong_number", "wrong_operand,broken_format"):
        assert main(["prepare", "preferences", "arithmetic", "--n", "12", "--kinds", kinds, "--out", str(out),
                     "--force"]) == 0
        assert {json.loads(x)["kind"] for x in out.read_text().splitlines()} == set(kinds.split(","))


def test_prepare_files_shards_are_the_reference_tokenization(tmp_path, tokenizer, capsys):
    """prepare files <paths> --text-field --skip-bad --name --shard-tokens --val-tokens --out --force: the shards
    are test_prepare.py's single-process reference (every document after <|endoftext|>, the first
    --val-tokens tokens the val shard, then cut every --shard-tokens) of the good rows' field."""
    from tests.data.test_prepare import assert_matches, make_docs, reference_shards, write_jsonl

    docs = make_docs(120, seed=5)
    rows = [{"body": d, "text": "not this field"} for d in docs]
    corpus = write_jsonl(tmp_path / "c.jsonl", [*rows[:5], "{not json", *rows[5:]])
    out = tmp_path / "o"
    argv = ["prepare", "files", str(corpus), "--out", str(out), "--text-field", "body", "--name", "nm",
            "--val-tokens", "700", "--workers", "1", "--no-progress"]
    capsys.readouterr()
    assert main([*argv, "--shard-tokens", "1500"]) == 2 and "c.jsonl" in capsys.readouterr().err
    assert main([*argv, "--shard-tokens", "1500", "--skip-bad"]) == 0
    assert_matches(out, reference_shards(tokenizer, docs, 1500, val=700), name="nm")
    assert main([*argv, "--shard-tokens", "900", "--skip-bad"]) == 2 and "--force" in capsys.readouterr().err
    assert main([*argv, "--shard-tokens", "900", "--skip-bad", "--force"]) == 0
    assert_matches(out, reference_shards(tokenizer, docs, 900, val=700), name="nm")


def test_prepare_preferences_from_a_policy_samples_as_told(world, tmp_path):
    """prepare preferences --policy with --chosen solution (a random policy is never right: every pair is the
    worked solution against a distinct wrong sample): --pairs-per-problem and --samples bound the pairs per
    problem; --top-k 1 leaves one distinct sample; --max-new-tokens cuts the (greedy) replies; --temperature
    changes the draws."""
    import re
    from collections import Counter

    def pairs(*flags) -> list[dict]:
        out = tmp_path / "p.jsonl"
        assert main(["prepare", "preferences", "compare", "--policy", world["chat"], "--chosen", "solution", "--n", "3",
                     "--seed", "1", "--device", "cpu", "--out", str(out), "--force", *flags]) == 0
        return [json.loads(x) for x in out.read_text().splitlines()]

    def per_problem(rows) -> list[int]:
        return sorted(Counter(r["prompt"][0]["content"] for r in rows).values())

    base = ["--max-new-tokens", "5", "--samples", "4"]
    many = pairs(*base, "--pairs-per-problem", "3")
    assert per_problem(many) == [3, 3, 3]
    for r in many:  # --chosen solution: the worked answer to the question, the rejected reply a sample
        a, b = map(int, re.fullmatch(r"Which is larger, (\d+) or (\d+)\?", r["prompt"][0]["content"]).groups())
        assert r["chosen"][0]["content"] == f"{max(a, b)} is larger than {min(a, b)}. The answer is {max(a, b)}."
        assert r["rejected"][0]["content"] != r["chosen"][0]["content"]
    assert per_problem(pairs(*base, "--pairs-per-problem", "1")) == [1, 1, 1]
    assert per_problem(pairs("--max-new-tokens", "5", "--samples", "2", "--pairs-per-problem", "3")) == [2, 2, 2]
    greedy5 = pairs(*base, "--pairs-per-problem", "3", "--top-k", "1")
    assert per_problem(greedy5) == [1, 1, 1]  # --top-k 1: every sample the same
    greedy2 = pairs("--max-new-tokens", "2", "--samples", "4", "--pairs-per-problem", "3", "--top-k", "1")
    for short, long in zip(greedy2, greedy5, strict=True):
        s, g = short["rejected"][0]["content"], long["rejected"][0]["content"]
        assert g.startswith(s) and len(s) < len(g)  # --max-new-tokens 2: the first two of the same greedy tokens
    assert [r["rejected"] for r in pairs(*base, "--pairs-per-problem", "3", "--temperature", "0.05")] != \
        [r["rejected"] for r in many]


def test_import_force_replaces_the_imported_model(sources, tmp_path, capsys):
    """import llmc --force: a second model imported into the same --out replaces the first (its weights are
    the second's); without --force it is refused and the first stays."""
    from gptforge.run import checkpoint as ckpt

    assert main(["export", "llmc", "--ckpt", sources["other"], "--out", str(tmp_path / "other")]) == 0
    out = tmp_path / "imp"

    def weights():
        return load_file(str(ckpt.latest_checkpoint(out) / "model.safetensors"))["transformer.h.0.ln_1.bias"]

    want = {name: load_file(str(Path(sources[name]) / "model.safetensors"))["transformer.h.0.ln_1.bias"]
            for name in ("--ckpt", "other")}
    assert main(["import", "llmc", "--model", sources["--llmc"], "--out", str(out)]) == 0
    assert torch.equal(weights(), want["--ckpt"])
    capsys.readouterr()
    second = ["import", "llmc", "--model", str(tmp_path / "other" / "model.bin"), "--out", str(out)]
    assert main(second) == 2 and "--force" in capsys.readouterr().err and torch.equal(weights(), want["--ckpt"])
    assert main([*second, "--force"]) == 0 and torch.equal(weights(), want["other"])


def test_tokenizer_train_held_out_and_max_chars(tmp_path):
    """tokenizer train --held-out F: that fraction of the pieces is held out (report.json); --max-chars N: training
    stops at N characters, and the tokenizer learned from them is another."""
    from tests.data.test_tokenizer_train import make_corpus

    corpus = make_corpus(tmp_path / "corpus")

    def train(name, *flags) -> dict:
        out = tmp_path / name
        assert main(["tokenizer", "train", str(corpus), "--out", str(out), "--vocab-size", "300", "--trainer",
                     "tokenizers", "--no-progress", *flags]) == 0
        return {**json.loads((out / "report.json").read_text())["train"],
                "merges": (out / "tokenizer" / "tokenizer.json").read_text()}

    a, c = train("a", "--held-out", "0.2"), train("c", "--max-chars", "20000")  # c: the default held-out, 0.05
    assert a["held_out_pieces"] == round(0.2 * (a["held_out_pieces"] + a["train_pieces"])) > 0
    assert not a["stopped_at_max_chars"]
    assert c["train_chars"] == 20_000 < a["train_chars"] and c["stopped_at_max_chars"] and c["merges"] != a["merges"]


# ---------------------------------------------------------------- the registry and the walk
CHAIN = f"{ME}::test_recipe_flags_reach_their_config_keys"
RL = f"{ME}::test_rl_rollout_options_shape_what_is_sampled_scored_and_logged"
PAIRS = f"{ME}::test_pair_options_split_schedule_and_save_what_they_say"
SFT = f"{ME}::test_sft_options_split_and_score_what_they_say"
RQ = "tests/training/test_recipe_quantities.py::"
PQ = "tests/training/test_pair_recipe_quantities.py::test_dpo_step_against_a_hand_computation"
RESUME = "tests/training/test_ctrl_c_every_command.py::test_ctrl_c_saves_exits_130_and_resumes_bit_exactly"
RECIPE_HELP = "tests/test_config_help.py::test_recipe_help_config_needs_no_out_or_init_from"
SAMPLE = "tests/cli/test_sample_options_effect.py::"
TOK = "tests/data/test_tokenizer_train.py::"
TOOLS = "tests/cli/test_tool_option_effects.py::"

# (command, option or <positional>) -> the tests that show its effect
EFFECTS: dict[tuple[str, str], tuple[str, ...]] = {
    # train
    ("train", "--resume"): (RESUME,),
    ("train", "--preset"): (f"{ME}::test_train_preset_is_the_config_and_dry_run_trains_nothing",),
    ("train", "--dry-run"): (f"{ME}::test_train_preset_is_the_config_and_dry_run_trains_nothing",),
    ("train", "--init-from"): ("tests/interop/test_interop.py::test_fine_tune_from_llmc_file",),
    ("train", "--out"): ("tests/interop/test_interop.py::test_fine_tune_from_llmc_file",),
    **{(c, "--device"): (f"{ME}::test_device_is_where_the_command_runs",) for c in DEVICE_RUNS},
    ("train", "--force"): ("tests/run/test_run_dir_hygiene.py::test_force_through_a_symlinked_checkpoints_dir_starts_over",),
    ("train", "--help-config"): ("tests/test_config_help.py::test_help_config_lists_choices_and_descriptions",
                                 "tests/models/test_registry.py::test_help_config_shows_the_preset_values_with_overrides"),
    **{(c, "--help-config"): ("tests/cli/test_hardening_round7_tools.py::test_every_command_taking_overrides_lists_its_keys",)
       for c in ("bench", "plan", "race")},
    # sample: greedy outputs against a decoder written out in the test, sampled ones against the library
    **{("sample", flag): (SAMPLE + test,) for flag, test in {
        "--prompt": "test_prompt_max_new_tokens_and_temperature_zero",
        "--max-new-tokens": "test_prompt_max_new_tokens_and_temperature_zero",
        "--ckpt": "test_prompt_max_new_tokens_and_temperature_zero",
        "--temperature": "test_seed_num_samples_temperature", "--num-samples": "test_seed_num_samples_temperature",
        "--seed": "test_seed_num_samples_temperature", "--top-k": "test_top_p_and_top_k",
        "--top-p": "test_top_p_and_top_k", "--repetition-penalty": "test_repetition_penalty", "--stop": "test_stop",
        "--stop-at-eot": "test_stop_at_eot", "--device": "test_device_places_the_model"}.items()},
    ("sample", "--gguf"): ("tests/cli/test_own_tokenizer.py::test_a_gguf_file_is_a_model_source_everywhere",),
    ("sample", "--hf"): ("tests/cli/test_llama_cli.py::test_train_sample_export_and_load_back",),
    ("chat", "--gguf"): ("tests/cli/test_own_tokenizer.py::test_a_gguf_file_is_a_model_source_everywhere",),
    # import gguf, then sample from the checkpoint it wrote: the same greedy text as the exported model's
    **{("import", f): ("tests/cli/test_own_tokenizer.py::test_a_gguf_file_is_a_model_source_everywhere",)
       for f in ("<format>", "--model", "--out")},
    **{("eval", f): (f"{ME}::test_every_model_source_is_the_same_model_to_eval",) for f in ("--hf", "--llmc", "--gguf")},
    **{("export", f): (f"{ME}::test_every_model_source_is_the_same_model_to_eval",
                       f"{ME}::test_export_reads_every_source_and_random_sizes") for f in ("<format>", "--ckpt", "--out")},
    **{("export", f): (f"{ME}::test_export_reads_every_source_and_random_sizes",)
       for f in ("--hf", "--llmc", "--gguf", "--random", "--no-tokenizer", "--force")},
    **{("prepare conversations", f): (f"{ME}::test_prepare_conversations_and_preferences_write_what_their_options_say",)
       for f in ("<task>", "--n", "--seed", "--digits", "--out", "--force")},
    ("prepare preferences", "--kinds"): (f"{ME}::test_prepare_conversations_and_preferences_write_what_their_options_say",),
    # the rows are preference_set's for the task, n and seed given by hand; --held-out the eval problems';
    # refused over an existing file without --force, replaced with it
    **{("prepare preferences", f): ("tests/training/test_preference_recipes.py::test_prepare_preferences",)
       for f in ("<task>", "--n", "--seed", "--held-out", "--out", "--force")},
    # --judge RM: every chosen reply scored above its rejected one; --policy: the same pairs from the policy
    # read from a checkpoint, a GGUF file or a Hugging Face directory
    ("prepare preferences", "--judge"): ("tests/training/test_policy_pairs.py::test_reward_model_judge_end_to_end",),
    ("prepare preferences", "--policy"): ("tests/training/test_policy_pairs.py::test_any_model_source_is_a_policy",),
    # tokenizer train: the trained tokenizer's vocabulary size, specials, kind and pattern read back
    **{("tokenizer train", f): (TOK + "test_jsonl_and_parquet_inputs",) for f in ("--text-field", "--pattern")},
    **{("tokenizer train", f): (TOK + "test_cli_trains_prints_the_table_and_refuses_to_overwrite",)
       for f in ("--special", "--force", "--trainer", "--out", "<paths>")},
    ("tokenizer train", "--vocab-size"): (TOK + "test_jsonl_and_parquet_inputs",
                                          TOK + "test_cli_trains_prints_the_table_and_refuses_to_overwrite"),
    ("plot", "--image"): ("tests/cli/test_eval_cli.py::test_plot_writes_a_png_from_a_real_run",),
    **{("bench-generate", f): ("tests/cli/test_cli_generation.py::test_bench_generate_agrees_with_transformers",)
       for f in ("--batch", "--json")},
    # plan: the parameters counted from the preset; the peak under --gpu-mem, and nothing fitting a smaller one
    **{("plan", f): ("tests/test_plan.py::test_plan_recommends_a_micro_batch_and_writes_json",)
       for f in ("--preset", "--gpu-mem", "--json")},
    **{("eval", f): (f"{ME}::test_eval_raw_and_system_are_the_prompts_the_replies_answer",)
       for f in ("--raw", "--system", "--force")},
    **{("chat", f): (f"{ME}::test_chat_options_shape_the_reply",)
       for f in ("--ckpt", "--max-new-tokens", "--temperature", "--system", "--repetition-penalty", "--seed", "--top-k",
                 "--top-p")},
    **{("serve", f): (f"{ME}::test_serve_options_are_what_the_app_serves",)
       for f in ("--host", "--port", "--api-key", "--max-new-tokens-cap", "--max-batch", "--metrics", "--ckpt", "--hf",
                 "--llmc", "--gguf", "--random")},
    ("serve", "--max-queue"): (f"{ME}::test_serve_options_are_what_the_app_serves",
                               "tests/serve/test_serve.py::test_many_concurrent_requests_queue_or_429"),
    **{("prepare files", f): (f"{ME}::test_prepare_files_shards_are_the_reference_tokenization",)
       for f in ("<paths>", "--text-field", "--skip-bad", "--name", "--shard-tokens", "--val-tokens", "--out", "--force")},
    # the shards made with --tokenizer carry that tokenizer (its fingerprint), and a model trained on them speaks it
    ("prepare files", "--tokenizer"): ("tests/cli/test_own_tokenizer.py::test_the_model_takes_its_shards_tokenizer",),
    # export --adapters-only: only the adapter files, and peft on the base export gives the run's logits
    ("export", "--adapters-only"): ("tests/training/test_lora_peft.py::test_adapter_export_loads_in_peft_to_the_same_logits",),
    # export llmc --dtype: the file's version and size, and weights rounded to that dtype read back
    ("export", "--dtype"): ("tests/interop/test_interop.py::test_llmc_round_trip_via_cli",
                            "tests/interop/test_export_own_dtype.py::test_a_bfloat16_model_exports_as_bfloat16_and_says_so"),
    # plan --gpu h100-80 --gpus 1024: every layout multiplies to 1024 ranks, its memory fits an H100's 80 GB
    **{("plan", f): ("tests/test_plan_parallel.py::test_plan_gpt3_175b_answers_at_once_without_building_a_model",)
       for f in ("--gpu", "--world")},
    # race: the presets raced, 12 validations each, the summary and curves in --out
    **{("race", f): ("tests/bench/test_race.py::test_race_json_on_a_tiny_run",) for f in ("<presets>", "--evals", "--out")},
    **{("prepare preferences", f): (f"{ME}::test_prepare_preferences_from_a_policy_samples_as_told",)
       for f in ("--chosen", "--pairs-per-problem", "--samples", "--top-k", "--max-new-tokens", "--temperature")},
    ("import", "--force"): (f"{ME}::test_import_force_replaces_the_imported_model",),
    **{("tokenizer train", f): (f"{ME}::test_tokenizer_train_held_out_and_max_chars",) for f in ("--held-out", "--max-chars")},
    ("sample", "--llmc"): ("tests/cli/test_cli_generation.py::test_sample_from_llmc_file_equals_checkpoint",),
    # eval
    ("eval", "--tasks"): ("tests/cli/test_eval_cli.py::test_eval_command_writes_json",),
    ("eval", "--limit"): ("tests/cli/test_eval_cli.py::test_eval_command_writes_json",),
    ("eval", "--json"): ("tests/cli/test_eval_cli.py::test_eval_command_writes_json",),
    ("eval", "--bench"): ("tests/cli/test_eval_cli.py::test_eval_bench_writes_json",),
    # eval --preferences: the pair accuracy equals the checkpoint's scores of the pairs computed in the test
    ("eval", "--preferences"): ("tests/training/test_preference_recipes.py::test_rm_resumes_exactly_and_scores",),
    ("eval", "--ckpt"): ("tests/training/test_preference_recipes.py::test_rm_resumes_exactly_and_scores",),
    ("eval", "--against"): ("tests/training/test_preference_recipes.py::"
                            "test_win_rate_against_the_reference_judged_by_a_reward_model",),
    ("eval", "--offset"): ("tests/eval/test_paired_eval.py::test_eval_offset_scores_the_problems_after_the_first_n",),
    ("eval", "--paired-with"): ("tests/eval/test_paired_eval.py::"
                                "test_eval_json_keeps_every_reply_and_pairs_with_an_earlier_run",),
    # eval --dtype: bf16 autocast is on around generation with bfloat16, off with float32/auto on CPU
    ("eval", "--dtype"): ("tests/eval/test_paired_eval.py::"
                          "test_generative_eval_takes_dtype_and_refuses_scoring_only_options",),
    # sft
    **{("sft", f): (SFT,) for f in ("--data", "--skip-bad", "--val-count", "--seed", "--steps", "--base-loss", "--out")},
    ("sft", "--dry-run"): (CHAIN,),
    ("sft", "--resume"): (RESUME,),
    ("sft", "--help-config"): (RECIPE_HELP,),
    # rl: end to end here, or the short flag to its key (CHAIN) and the key's float64 hand computation
    **{("rl", f): (RL,) for f in ("--steps", "--prompts", "--group", "--max-new-tokens", "--seed", "--task", "--top-k",
                                  "--reward", "--lr", "--warmup-steps", "--eval-every", "--eval-n", "--ckpt-every",
                                  "--keep-ckpts", "--algo", "--out")},
    ("rl", "--temperature"): (CHAIN, RQ + "test_grpo_step_against_a_hand_computation"),
    ("rl", "--kl-coef"): (CHAIN, RQ + "test_grpo_step_against_a_hand_computation"),
    ("rl", "--clip-eps"): (CHAIN, RQ + "test_grpo_step_against_a_hand_computation"),
    ("rl", "--updates-per-batch"): (CHAIN, RQ + "test_grpo_step_against_a_hand_computation",
                                    RQ + "test_ppo_step_against_a_hand_computation"),
    ("rl", "--micro-batch"): (CHAIN, RQ + "test_ppo_step_against_a_hand_computation"),
    ("rl", "--kl-target"): (CHAIN, RQ + "test_grpo_adaptive_kl_moves_the_coefficient_by_the_controller",
                            RQ + "test_ppo_adaptive_kl_feeds_the_experience"),
    ("rl", "--reward-norm"): (CHAIN, RQ + "test_grpo_reward_model_ensemble_whitened_then_reduced"),
    **{("rl", f): (CHAIN, RQ + "test_ppo_step_against_a_hand_computation")
       for f in ("--gamma", "--lam", "--vf-coef", "--clip-value")},
    ("rl", "--reward-model"): ("tests/training/test_preference_recipes.py::"
                               "test_grpo_with_reward_model_logs_score_beside_accuracy",),
    ("rl", "--raw"): ("tests/training/test_grpo.py::test_rl_refuses_base_model_without_template",),
    ("rl", "--dry-run"): (CHAIN,),
    ("rl", "--resume"): (RESUME,),
    ("rl", "--help-config"): (RECIPE_HELP,),
    # rm and dpo
    **{(c, f): (PAIRS,) for c in ("rm", "dpo") for f in ("--data", "--skip-bad", "--val-count", "--seed",
                                                          "--eval-every", "--steps", "--micro-batch", "--lr",
                                                          "--ckpt-every", "--out")},
    **{(c, "--dry-run"): (CHAIN,) for c in ("rm", "dpo")},
    **{(c, "--resume"): (RESUME,) for c in ("rm", "dpo")},
    **{(c, "--help-config"): (RECIPE_HELP,) for c in ("rm", "dpo")},
    **{(c, f): (f"{ME}::test_init_from_is_the_weights_the_run_starts_from_and_force_starts_over",)
       for c in RECIPE_RUNS for f in ("--init-from", "--force")},
    **{(c, "--trust-checkpoint"): (f"{ME}::test_trust_checkpoint_lets_a_resume_read_the_sharded_metadata",)
       for c in ("train", "sft", "rl")},
    **{(c, "--split"): (f"{ME}::test_split_reads_that_split_of_a_saved_dataset",) for c in ("sft", "rm", "dpo")},
    ("dpo", "--task"): (PAIRS,),
    ("dpo", "--eval-n"): (PAIRS,),
    ("dpo", "--beta"): (PQ,),
    ("dpo", "--sft-coef"): (PQ,),
    ("dpo", "--loss-type"): (PQ,),
    # plan, bench, bench-generate, bench-prepare, plot, the prepare shard options: test_tool_option_effects.py
    **{("plan", f): (TOOLS + "test_plan_reserve_tokens_gpus_per_node_and_force",)
       for f in ("--reserve", "--tokens", "--gpus-per-node", "--force")},
    **{("plan", f): (TOOLS + "test_plan_measure_runs_steps_and_holds_adamws_state",) for f in ("--measure", "--steps")},
    **{("bench", f): (TOOLS + "test_bench_times_steps_after_warmup_and_writes_what_it_timed",)
       for f in ("--steps", "--warmup", "--out", "--trace", "--json", "--force")},
    **{("bench", f): (TOOLS + "test_bench_preset_ladder_sweep_and_switch_are_the_configs_timed",)
       for f in ("--preset", "--ladder", "--sweep-micro-batch", "--switch")},
    **{("bench-generate", f): (TOOLS + "test_bench_generate_decodes_what_its_options_say",)
       for f in ("--size", "--prompt-tokens", "--new-tokens", "--repeats", "--dtype", "--threads", "--force")},
    **{("bench-prepare", f): (TOOLS + "test_bench_prepare_corpus_runs_and_memory_check",)
       for f in ("--workers", "--copies", "--repeats", "--shard-tokens", "--memory-factor", "--json", "--force",
                 "--workdir")},
    **{("plot", f): (TOOLS + "test_plot_draws_each_run_under_its_label",) for f in ("<runs>", "--labels", "--force")},
    **{(c, f): (TOOLS + "test_prepare_workers_and_start_method_make_the_pool",)
       for c in ("prepare files", "prepare fineweb") for f in ("--workers", "--start-method")},
    **{("prepare fineweb", f): (TOOLS + "test_prepare_fineweb_edu_sample_and_val_tokens",)
       for f in ("--edu", "--sample", "--val-tokens")},
    **{("prepare fineweb", f): (TOOLS + "test_prepare_fineweb_skip_bad_force_and_tokenizer",)
       for f in ("--skip-bad", "--force", "--tokenizer")},
    # --data-files streamed through datasets: the shards of those files, cut every --shard-tokens, in --out
    **{("prepare fineweb", f): ("tests/data/test_prepare.py::test_fineweb_path_streams_with_datasets",
                                TOOLS + "test_prepare_fineweb_skip_bad_force_and_tokenizer")
       for f in ("--data-files", "--out", "--shard-tokens")},
    **{("tokenizer train", f): (TOOLS + "test_tokenizer_train_reads_the_hf_dataset_config_and_split_named",)
       for f in ("--hf-dataset", "--hf-config", "--split")},
    **{(c, "--random"): (TOOLS + "test_random_is_a_seed_0_model_of_that_size",) for c in ("sample", "eval")},
    ("chat", "--hf"): (TOOLS + "test_chat_hf_is_the_exported_chat_model",),
    **{("eval", f): (TOOLS + "test_eval_batch_tokens_packs_the_forwards_and_repeats_times_them",)
       for f in ("--batch-tokens", "--repeats")},
    **{("prepare shakespeare", f): (TOOLS + "test_prepare_shakespeare_source_tokenizer_and_out",)
       for f in ("--source", "--tokenizer", "--out")},
    **{("race", f): (TOOLS + "test_race_target_stops_every_run_there_and_no_plot_skips_the_image",)
       for f in ("--target", "--no-plot")},
    ("eval", "--reward-model"): (TOOLS + "test_eval_reward_model_is_the_judge_of_the_win_rate",),
    ("assets", "<names>"): (TOOLS + "test_assets_fetches_and_names_what_is_asked",),
    ("assets", "--online"): (TOOLS + "test_assets_evals_online_reads_the_original_sources",),
}

# options that only choose what is printed, not what is computed or written
OUTPUT_ONLY: dict[str, str] = {
    "--help": "prints the command's usage and exits (argparse)",
    "--no-progress": "hides the progress bar on stderr; the shards written are the same",
}

NOT_YET_MAX = 0  # every option has its effect test: never raise it
# options with no effect test yet, as (command, option): none; a new option comes in with its test, not here
NOT_YET: set[tuple[str, str]] = set()


def cli_options() -> list[tuple[str, str]]:
    """(command path, option) for every command and sub-command of ``build_parser()``: an option by its
    longest spelling, a positional as <dest>."""
    import argparse

    from gptforge.cli import build_parser

    out: list[tuple[str, str]] = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif path:
                out.append((" ".join(path), max(a.option_strings, key=len) if a.option_strings else f"<{a.dest}>"))

    walk(build_parser(), [])
    return out


def _defined(node_id: str, cache: dict) -> bool:
    """``path::name`` names a test function at the top level of that file (a parametrized one by its name)."""
    path, name = node_id.split("::")
    if path not in cache:
        file = ROOT / path
        tree = ast.parse(file.read_text()) if file.is_file() else ast.Module(body=[], type_ignores=[])
        cache[path] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return name.startswith("test") and name in cache[path]


def test_every_cli_option_has_an_effect_test():
    options = cli_options()
    assert len(options) > 250 and ("prepare files", "<paths>") in options  # the walk reaches sub-commands
    walked = set(options)
    untested = sorted(o for o in walked if o not in EFFECTS and o[1] not in OUTPUT_ONLY and o not in NOT_YET)
    assert not untested, ("options with no effect test (write one and add it to EFFECTS; see the module "
                          f"docstring): {untested}")
    assert not set(EFFECTS) - walked, f"EFFECTS names options the CLI does not have: {set(EFFECTS) - walked}"
    assert not NOT_YET - walked, f"NOT_YET names options the CLI does not have: {NOT_YET - walked}"
    assert not set(EFFECTS) & NOT_YET, f"tested now, take them out of NOT_YET: {set(EFFECTS) & NOT_YET}"
    assert len(NOT_YET) <= NOT_YET_MAX, "NOT_YET only shrinks: an option needs an effect test, not a NOT_YET entry"
    cache: dict = {}
    dangling = sorted({t for tests in EFFECTS.values() for t in tests if not _defined(t, cache)})
    assert not dangling and all(EFFECTS.values()), f"EFFECTS entries that name no test: {dangling}"
    covered = sum(1 for o in walked if o in EFFECTS)
    print(f"\n{len(walked)} options walked: {covered} with an effect test, "
          f"{sum(1 for o in walked if o[1] in OUTPUT_ONLY)} output-only, {len(NOT_YET)} NOT_YET")
