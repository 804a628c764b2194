"""On-policy preference pairs (``prepare preferences --policy``): the pairing rule, the verifier's
labels against the truth, a reward model's labels against its own scores recomputed from the written
file, determinism, and the command's refusals."""

from __future__ import annotations

import json
import random

import pytest

from gptforge.cli import main
from gptforge.eval.generative import compare_eval_problems
from gptforge.eval.tasks.preferences import preference_set, write_preferences
from gptforge.eval.tasks.verifiable import is_correct
from gptforge.training import rollouts
from gptforge.training.policy_pairs import PairSettings, pairs_from_scores, policy_pairs, problems_for
from tests.conftest import tiny_chat_checkpoint


def test_pairs_from_scores_verifier_and_ranking():
    rng = random.Random(0)
    texts = ["a", "b", "c", "d", "e", "f"]
    got = pairs_from_scores(texts, [1, 0, 1, 0, 0, 1], 2, rng, threshold=1.0)
    assert len(got) == 2 and len({i for p in got for i in p}) == 4  # no reply used twice
    assert all(texts[c] in "acf" and texts[r] in "bde" for c, r in got)
    # all right or all wrong: no pair; the same text on both sides: no pair
    assert pairs_from_scores(texts, [1] * 6, 3, rng, threshold=1.0) == []
    assert pairs_from_scores(["x", "x"], [1, 0], 1, rng, threshold=1.0) == []
    # a reward model's scores: the best against the worst, then the next best against the next worst
    assert pairs_from_scores(texts, [0.5, 2.0, -1.0, 0.1, 3.0, 0.2], 2, rng) == [(4, 2), (1, 3)]
    assert pairs_from_scores(texts[:2], [1.0, 1.0], 1, rng) == []  # a tie prefers nothing


def test_verifier_labels_equal_the_truth(monkeypatch, tokenizer):
    """With the sampler replaced by known replies, each problem gives a pair iff its replies are mixed,
    chosen is correct and rejected wrong (checked with the task's own verifier), and the stats count
    the replies."""
    problems = compare_eval_problems(6)

    def fake(model, enc, template, probs, group, params):
        texts = []
        for p in probs:
            i = problems.index(p)
            right, wrong = p.solution, f"The answer is {int(p.answer) + 1}."
            texts += [right if (i % 3 == 0 or (i % 3 == 1 and k == 0)) else wrong for k in range(group)]
        rows = [p for p in probs for _ in range(group)]
        return rollouts.Rollouts(rows, [[1]] * len(rows), [[2]] * len(rows), texts)

    monkeypatch.setattr(rollouts, "sample_replies", fake)
    rows, stats = policy_pairs(None, tokenizer, None, problems, PairSettings(samples=4, pairs_per_problem=3, batch=4))
    # problem i: i % 3 == 0 all right, == 1 one right of four (one pair), == 2 all wrong
    assert len(rows) == 2 and stats["problems_with_pairs"] == 2 and stats["replies"] == 24
    assert stats["sample_accuracy"] == pytest.approx((4 + 1 + 4 + 1) / 24)
    for r in rows:
        assert is_correct(r["chosen"][0]["content"], r["answer"]) and r["chosen_correct"]
        assert not is_correct(r["rejected"][0]["content"], r["answer"]) and not r["rejected_correct"]
        assert r["kind"] == "policy" and r["prompt"][0]["content"].startswith("Which is larger")


def test_the_task_judge_checks_the_working_not_only_the_final_number(monkeypatch, tokenizer):
    """Issue 34: "60 is larger than 59. The answer is 63." ends on the right number by luck; the judge
    (is_verified) checks the task's form and its consistency with the question, so it is rejected."""
    from gptforge.eval.tasks.verifiable import Problem, is_verified

    p = Problem("Which is larger, 63 or 12?", "63", "63 is larger than 12. The answer is 63.")
    assert is_verified(p.solution, p)
    for lucky in ("60 is larger than 59. The answer is 63.", "12 is larger than 63. The answer is 63.",
                  "The answer is 63.", "63 is larger than 12. The answer is 12."):
        assert not is_verified(lucky, p), lucky
    a = Problem("What is 37 + 48?", "85", "37 + 48 = 85. The answer is 85.")
    assert is_verified(a.solution, a) and is_verified("48 + 37 = 85. The answer is 85.", a)
    assert not is_verified("37 + 40 = 85. The answer is 85.", a) and not is_verified("37 - 48 = 85. The answer is 85.", a)
    assert is_verified("Half of 170 is 85. The answer is 85.", Problem("gsm8k-like", "85", "170 / 2 = 85 The answer is 85."))

    problems = [p]

    def fake(model, enc, template, probs, group, params):
        texts = ["60 is larger than 59. The answer is 63.", "63 is larger than 12. The answer is 12.",
                 p.solution, "63 is larger than 12. The answer is 12."][:group]
        return rollouts.Rollouts(list(probs) * group, [[1]] * group, [[2]] * group, texts)

    monkeypatch.setattr(rollouts, "sample_replies", fake)
    rows, _ = policy_pairs(None, tokenizer, None, problems, PairSettings(samples=4, pairs_per_problem=2, batch=1))
    assert rows and all(r["chosen"][0]["content"] == p.solution for r in rows)
    assert "60 is larger than 59. The answer is 63." in {r["rejected"][0]["content"] for r in rows}


@pytest.fixture(scope="module")
def chat_world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("onpolicy")
    sft = tiny_chat_checkpoint(tmp / "sft", block_size=96)
    plain = tiny_chat_checkpoint(tmp / "plain", chat=False, block_size=96)
    prefs = write_preferences(preference_set("compare", 24, seed=1), tmp / "prefs.jsonl")
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", str(tmp / "rm"), "--steps", "2",
                 "--val-count", "4", "--micro-batch", "4", "--lr", "1e-3", "--device", "cpu", "--ckpt-every", "0"]) == 0
    return tmp, sft, plain


def test_reward_model_judge_end_to_end(chat_world, tmp_path, capsys):
    """``--judge RM``: every row's chosen reply scored above its rejected one; the scores written are
    the reward model's on the same tokens; the same command writes the same file; the file trains DPO."""
    tmp, sft, _ = chat_world
    out, again = tmp_path / "p.jsonl", tmp_path / "q.jsonl"
    args = ["prepare", "preferences", "compare", "--policy", str(sft), "--judge", str(tmp / "rm"), "--n", "6",
            "--samples", "4", "--max-new-tokens", "6", "--temperature", "1.5", "--seed", "4", "--device", "cpu"]
    assert main([*args, "--out", str(out)]) == 0
    assert "on-policy compare preference pairs" in capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert 1 <= len(rows) <= 6 and all(r["chosen_score"] > r["rejected_score"] for r in rows)
    assert {r["prompt"][0]["content"] for r in rows} <= {p.question for p in problems_for("compare", 6, 4)}
    assert main([*args, "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()
    assert main(["dpo", "--init-from", str(sft), "--data", str(out), "--out", str(tmp_path / "dpo"), "--steps", "1",
                 "--val-count", "1", "--micro-batch", "2", "--device", "cpu", "--ckpt-every", "0"]) == 0


def test_policy_flags_without_a_policy_are_refused(tmp_path, capsys):
    """--judge/--samples/... only mean something with --policy: refused, not silently ignored; and the
    defaults the refusal compares with are the parser's own."""
    from gptforge.cli import build_parser

    out = tmp_path / "x.jsonl"
    assert main(["prepare", "preferences", "compare", "--n", "2", "--samples", "4", "--out", str(out)]) == 2
    assert "--samples" in capsys.readouterr().err and not out.exists()
    defaults = build_parser().parse_args(["prepare", "preferences", "compare", "--out", "x"])
    assert main(["prepare", "preferences", "compare", "--n", "2", "--out", str(out)]) == 0
    from gptforge.cli.data import POLICY_DEFAULTS

    assert {k: getattr(defaults, k) for k in POLICY_DEFAULTS} == POLICY_DEFAULTS


@pytest.mark.parametrize("extra, says", [
    (["--kinds", "wrong_number"], "--kinds"),
    (["--samples", "1"], "--samples"),
    (["--samples", "1e6"], "--samples"),
    (["--n", "1e9"], "--n"),
    (["--temperature", "0"], "--temperature"),
    (["--pairs-per-problem", "0"], "--pairs-per-problem"),
    (["--judge", "SFT"], "not a reward model"),
    (["--judge", "MISSING"], "MISSING"),
    (["--policy", "PLAIN"], "no chat template"),
    (["--policy", "MISSING"], "MISSING"),
    (["--device", "nonsense"], "nonsense"),
])
def test_refusals_name_the_flag(chat_world, tmp_path, capsys, extra, says):
    tmp, sft, plain = chat_world
    subst = {"SFT": str(sft), "PLAIN": str(plain), "MISSING": str(tmp_path / "missing")}
    extra = [subst.get(x, x) for x in extra]
    says = subst.get(says, says)
    args = ["prepare", "preferences", "compare", "--policy", str(sft), "--n", "2", "--out", str(tmp_path / "x.jsonl")]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_solution_as_chosen_pairs_it_with_wrong_samples(monkeypatch, tokenizer):
    """``chosen="solution"`` (SPIN): chosen is the worked solution; rejected are distinct wrong samples,
    never a correct one and never the solution itself."""
    problems = compare_eval_problems(3)

    def fake(model, enc, template, probs, group, params):
        texts = []
        for p in probs:
            texts += [p.solution, p.solution, "The answer is 1.", "The answer is 1."]
        rows = [p for p in probs for _ in range(group)]
        return rollouts.Rollouts(rows, [[1]] * len(rows), [[2]] * len(rows), texts)

    monkeypatch.setattr(rollouts, "sample_replies", fake)
    rows, _ = policy_pairs(None, tokenizer, None, problems, PairSettings(samples=4, pairs_per_problem=3, chosen="solution"))
    assert len(rows) == 3  # one distinct wrong reply per problem
    for r, p in zip(rows, problems, strict=True):
        assert r["chosen"][0]["content"] == p.solution and r["rejected"][0]["content"] == "The answer is 1."
    with pytest.raises(ValueError, match="--chosen"):
        PairSettings(chosen="gold").check()


@pytest.mark.parametrize("kind", ["gguf", "hf"])
def test_any_model_source_is_a_policy(chat_world, tmp_path, capsys, kind):
    """``--policy`` takes every model source the other commands take (issue 32): the SFT model exported
    to a GGUF file (f32) or a Hugging Face directory, judged by a reward model trained the same way from
    that export (so its template is the export's), writes the same pairs, byte for byte, as the checkpoint
    judged by the same reward model trained from the checkpoint."""
    tmp, sft, _ = chat_world
    export = tmp_path / "export"
    extra = ["--dtype", "f32"] if kind == "gguf" else []
    assert main(["export", kind, "--ckpt", str(sft), "--out", str(export), *extra]) == 0
    policy = next(export.glob("*.gguf")) if kind == "gguf" else export
    prefs = write_preferences(preference_set("compare", 24, seed=1), tmp_path / "prefs.jsonl")
    outs = []
    for name, model in (("ckpt", sft), ("export", policy)):
        rm = tmp_path / f"rm_{name}"
        assert main(["rm", "--init-from", str(model), "--data", str(prefs), "--out", str(rm), "--steps", "2",
                     "--val-count", "4", "--micro-batch", "4", "--lr", "1e-3", "--device", "cpu",
                     "--ckpt-every", "0"]) == 0
        out = tmp_path / f"{name}.jsonl"
        rc = main(["prepare", "preferences", "compare", "--policy", str(model), "--judge", str(rm), "--n", "4",
                   "--samples", "4", "--max-new-tokens", "6", "--temperature", "1.5", "--seed", "4",
                   "--device", "cpu", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        outs.append(out.read_text())
    assert outs[0] and outs[1] == outs[0]
