"""`gptforge eval --json` keeps every generative reply, and `--paired-with EARLIER.json` pairs two models on
the same problems (issue 32's RL goal is stated as paired counts and an exact McNemar p). References: the
binomial tail written out in float64 by hand, and counts made in the test from the JSON rows themselves."""

from __future__ import annotations

import json
import re
from math import comb

import pytest

from gptforge.cli import main
from gptforge.eval.generative import GENERATIVE, GenerativeResult
from gptforge.eval.stats import mcnemar_exact
from tests.conftest import tiny_chat_checkpoint


def _binomial_two_sided(b: int, c: int) -> float:
    """P(X <= min) + P(X >= max) for X ~ Binomial(b + c, 1/2), summed term by term (symmetric: 2 x one tail)."""
    n = b + c
    pmf = [comb(n, i) * 0.5**n for i in range(n + 1)]
    return min(1.0, sum(pmf[: min(b, c) + 1]) + sum(pmf[max(b, c):])) if b != c else 1.0


@pytest.mark.parametrize(("b", "c"), [(26, 9), (9, 26), (0, 5), (5, 0), (3, 3), (0, 0), (1, 0), (40, 22), (7, 8)])
def test_mcnemar_exact_is_the_binomial_tail(b, c):
    assert mcnemar_exact(b, c) == pytest.approx(_binomial_two_sided(b, c), rel=1e-12)
    assert round(mcnemar_exact(26, 9), 3) == 0.006  # issue 34: SFT -> RL, 26 vs 9 discordant, "p = 0.006"


def _result(task: str, flags: list[bool]) -> GenerativeResult:
    problems = GENERATIVE[task].problems(len(flags))
    rows = [{"question": p.question, "answer": p.answer, "reply": "", "correct": f} for p, f in zip(problems, flags, strict=True)]
    return GenerativeResult(task, len(flags), sum(flags) / len(flags), 0.0, 0, [], rows)


def test_paired_lines_count_each_direction():
    from gptforge.cli.evaluate import paired_lines

    now = _result("arithmetic3", [True, True, True, False, False, True, False])
    then = {r["question"]: f for r, f in zip(now.replies, [False, True, False, False, True, True, False], strict=True)}
    then["What is 1 + 1?"] = True  # a problem not scored now: left out of the pairing
    (line,) = paired_lines("A.json", {"arithmetic3": then}, [now])
    # now right 4, then right 3 of the 7 shared; only now: rows 0, 2; only then: row 4
    assert "on 7 problems: this model 4 right, that one 3 (+14.3 points)" in line
    assert "only this one right on 2, only that one on 1" in line
    assert f"McNemar p {_binomial_two_sided(2, 1):.3g}" in line


def test_eval_json_keeps_every_reply_and_pairs_with_an_earlier_run(tmp_path, capsys, monkeypatch):
    ckpt = tiny_chat_checkpoint(tmp_path / "m")
    a = tmp_path / "a.json"
    assert main(["eval", "--ckpt", str(ckpt), "--tasks", "arithmetic3", "--limit", "4", "--json", str(a),
                 "--device", "cpu"]) == 0
    (res,) = json.loads(a.read_text())
    problems = GENERATIVE["arithmetic3"].problems(4)
    assert [r["question"] for r in res["replies"]] == [p.question for p in problems]
    for r, p in zip(res["replies"], problems, strict=True):  # right = the reply's last "The answer is N" is the answer
        m = re.findall(r"The answer is (-?\d+)", r["reply"])
        assert r["correct"] == (bool(m) and m[-1] == p.answer) and r["answer"] == p.answer
    assert res["accuracy"] == sum(r["correct"] for r in res["replies"]) / 4
    capsys.readouterr()
    # the earlier "model" right on problems 1 and 4 where this one is not (the random model is right on none)
    right = [r["correct"] for r in res["replies"]]
    assert not any(right)
    for i in (1, 3):
        res["replies"][i]["correct"] = True
    a.write_text(json.dumps([res]))
    assert main(["eval", "--ckpt", str(ckpt), "--tasks", "arithmetic3", "--limit", "4", "--paired-with", str(a),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert (f"arithmetic3: paired with {a} on 4 problems: this model 0 right, that one 2 (-50.0 points); only this "
            f"one right on 0, only that one on 2; exact McNemar p 0.5") in out


def _refused(argv, capsys, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--paired-with" in err and all(w in err for w in words), err
    return err


def test_paired_with_refusals_name_the_file_and_come_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import gptforge.cli.evaluate as ev

    monkeypatch.setattr(ev, "load", lambda *a, **k: pytest.fail("the model loaded before --paired-with was checked"))
    ckpt = tiny_chat_checkpoint(tmp_path / "m")
    base = ["eval", "--ckpt", str(ckpt), "--tasks", "arithmetic3", "--limit", "2", "--device", "cpu", "--paired-with"]
    good = {"task": "arithmetic3", "replies": [{"question": "What is 100 + 100?", "correct": True}]}
    cases = {
        "missing.json": (None, "cannot read"),
        "text.json": ("not json at all", "not valid JSON"),
        "latin1.json": (b"\xff\xfe\x00", "not UTF-8"),
        "mc.json": (json.dumps({"results": {"hellaswag": {"acc": 0.3}}}), "not the JSON"),
        "notask.json": (json.dumps([{"replies": []}]), "not the JSON"),
        "old.json": (json.dumps([{"task": "arithmetic3", "samples": []}]), "no 'replies'"),
        "badrow.json": (json.dumps([{"task": "arithmetic3", "replies": [{"question": 1, "correct": "yes"}]}]),
                        "no 'replies'"),
        "other.json": (json.dumps([{**good, "task": "compare"}]), "holds no arithmetic3"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        _refused([*base, str(path)], capsys, str(path), words)
    _refused([*base, str(tmp_path)], capsys, "cannot read")  # a folder
    monkeypatch.setattr(ev, "PAIRED_MAX_BYTES", 10)
    (tmp_path / "big.json").write_text(json.dumps([good]))
    _refused([*base, str(tmp_path / "big.json")], capsys, "bytes")
    monkeypatch.setattr(ev, "PAIRED_MAX_BYTES", 256 << 20)
    (tmp_path / "good.json").write_text(json.dumps([good]))
    _refused(["eval", "--ckpt", str(ckpt), "--tasks", "hellaswag", "--paired-with", str(tmp_path / "good.json")],
             capsys, "has none")
    _refused(["eval", "--ckpt", str(ckpt), "--preferences", "p.jsonl", "--paired-with", str(tmp_path / "good.json")],
             capsys, "does not apply")
    monkeypatch.undo()
    # loads, then finds no shared problem: the first 2 arithmetic3 eval problems are not "What is 100 + 100?"
    _refused([*base, str(tmp_path / "good.json")], capsys, "none of its arithmetic3 problems")


def test_every_reply_is_kept_with_its_own_verdict(monkeypatch):
    """Rows built from the replies the model gave (here: the worked solution on even problems, a wrong number
    or a broken format on odd ones), in problem order, each judged on its own."""
    import gptforge.eval.generative as gen

    problems = GENERATIVE["arithmetic3"].problems(6)
    given = [p.solution if i % 2 == 0 else ("The answer is 7." if i % 4 == 1 else f"It is {p.answer}.")
             for i, p in enumerate(problems)]
    monkeypatch.setattr(gen, "generate_replies", lambda model, enc, prompts, *a, **k: given[: len(prompts)])
    monkeypatch.setattr(gen, "prompt_ids", lambda p, enc, template, system=None: [1, 2, 3])

    class M:
        class config:
            block_size = 64

    (r,) = gen.evaluate_generative(M(), None, ["arithmetic3"], None, limit=6)
    assert [x["reply"] for x in r.replies] == given and [x["question"] for x in r.replies] == [p.question for p in problems]
    assert [x["correct"] for x in r.replies] == [True, False, True, False, True, False]
    assert r.accuracy == 0.5 and r.format_rate == 0.5 and len(r.samples) == 3


def test_generative_eval_takes_dtype_and_refuses_scoring_only_options(tmp_path, capsys, monkeypatch):
    """``--dtype`` reaches generation (bf16 autocast around it, as for the scored tasks); ``--batch-tokens`` and
    ``--bench``, which only the scorer has, are refused for generative-only ``--tasks`` instead of ignored."""
    import torch

    import gptforge.eval.generative as gen

    seen = []

    def record(*a, **k):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return []

    monkeypatch.setattr(gen, "evaluate_generative", record)
    ckpt = str(tiny_chat_checkpoint(tmp_path / "m"))
    for dtype in ("bfloat16", "float32", "auto"):
        assert main(["eval", "--ckpt", ckpt, "--tasks", "arithmetic", "--limit", "1", "--device", "cpu",
                     "--dtype", dtype]) == 0
    assert [s[0] for s in seen] == [True, False, False] and seen[0][1] == torch.bfloat16
    capsys.readouterr()
    for extra, flag in ((["--batch-tokens", "512"], "--batch-tokens"), (["--bench"], "--bench")):
        assert main(["eval", "--ckpt", ckpt, "--tasks", "arithmetic,compare", "--device", "cpu", *extra]) == 2
        err = capsys.readouterr().err
        assert flag in err and "arithmetic, compare generate" in err, err
    assert len(seen) == 3  # refused before anything ran


def test_eval_offset_scores_the_problems_after_the_first_n(tmp_path, capsys):
    """``--offset 3 --limit 2`` scores eval problems 3 and 4 (counted here from the task's whole held-out set),
    the same replies as those rows of an evaluation of the first 5; an offset outside the held-out set, a negative
    one, and one given to the scored tasks or the reward-model and preference paths are refused, exit 2, before
    the model loads."""
    ckpt = str(tiny_chat_checkpoint(tmp_path / "m"))
    whole = GENERATIVE["arithmetic3"].problems(0)
    assert len(whole) == 500
    first5, skipped = tmp_path / "first5.json", tmp_path / "skipped.json"
    assert main(["eval", "--ckpt", ckpt, "--tasks", "arithmetic3", "--limit", "5", "--json", str(first5),
                 "--device", "cpu"]) == 0
    assert main(["eval", "--ckpt", ckpt, "--tasks", "arithmetic3", "--offset", "3", "--limit", "2", "--json",
                 str(skipped), "--device", "cpu"]) == 0
    (a,), (b,) = json.loads(first5.read_text()), json.loads(skipped.read_text())
    assert [r["question"] for r in b["replies"]] == [p.question for p in whole[3:5]]
    assert b["replies"] == a["replies"][3:5] and b["n"] == 2
    last = tmp_path / "last.json"  # --limit 0 with an offset: the rest of the held-out set
    assert main(["eval", "--ckpt", ckpt, "--tasks", "compare", "--offset", "498", "--json", str(last),
                 "--device", "cpu"]) == 0
    (c,) = json.loads(last.read_text())
    assert [r["question"] for r in c["replies"]] == [p.question for p in GENERATIVE["compare"].problems(0)[498:]]
    capsys.readouterr()
    for argv, words in (
            (["--tasks", "arithmetic3", "--offset", "499", "--limit", "2"], ("--offset 499", "500 problems")),
            (["--tasks", "arithmetic3", "--offset", "500"], ("--offset 500", "500 problems")),
            (["--tasks", "arithmetic3", "--offset", "-1"], ("--offset -1", ">= 0")),
            (["--tasks", "arithmetic3,hellaswag", "--offset", "2"], ("--offset", "hellaswag")),
            (["--preferences", str(first5), "--offset", "2"], ("--offset", "--preferences")),
            (["--tasks", "arithmetic3", "--reward-model", ckpt, "--against", ckpt, "--offset", "2"],
             ("--offset", "--reward-model"))):
        assert main(["eval", "--ckpt", ckpt, "--device", "cpu", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and all(w in err for w in words), (argv, err)
    # the edge allowed: the last problem alone
    assert main(["eval", "--ckpt", ckpt, "--tasks", "arithmetic3", "--offset", "499", "--limit", "1", "--device",
                 "cpu"]) == 0
