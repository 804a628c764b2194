"""Preference pairs: TRL's row forms read the same pair, JSONL and offline HF datasets read alike, bad
rows are named or counted, each side's mask covers exactly the reply, long pairs are refused as SFT
refuses them, and PairLoader batches are seeded, rank-sharded and resume bit-exactly; the generated
sets with a known truth are what they claim."""

from __future__ import annotations

import json
import random

import pytest
import torch

from gptforge.data.chat import ChatTemplate
from gptforge.data.preference import (
    PairLoader,
    PreferenceDataError,
    PreferencePair,
    read_preferences,
    render_pair,
    render_pairs,
    split_pairs,
)
from gptforge.eval.tasks.preferences import KINDS, preference_rows, rejected_reply, write_preferences
from gptforge.eval.tasks.verifiable import (
    arithmetic_problems,
    compare_problems,
    extract_answer,
    follows_arithmetic_format,
    follows_compare_format,
    is_correct,
)

T = ChatTemplate.gpt2()
Q = [{"role": "user", "content": "What is 2 + 3?"}]
GOOD = [{"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}]
BAD = [{"role": "assistant", "content": "2 + 3 = 6. The answer is 6."}]


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def test_trl_row_forms_read_as_one_pair(tmp_path):
    rows = [
        {"prompt": Q, "chosen": GOOD, "rejected": BAD},  # explicit prompt, conversational
        {"chosen": Q + GOOD, "rejected": Q + BAD},  # implicit prompt (TRL's maybe_extract_prompt)
        {"prompt": Q[0]["content"], "chosen": GOOD[0]["content"], "rejected": BAD[0]["content"]},  # standard (strings)
    ]
    got = read_preferences(str(_write(tmp_path / "p.jsonl", rows)))
    assert [w for w, _ in got] == [f"{tmp_path / 'p.jsonl'}:{i}" for i in (1, 2, 3)]
    assert all(p == PreferencePair(Q, GOOD, BAD) for _, p in got)
    got = read_preferences(str(_write(tmp_path / "m.jsonl", [{**rows[0], "margin": 2}])))
    assert got[0][1].margin == 2.0


def test_the_mask_covers_the_reply_only(tokenizer):
    history = [*Q, *GOOD, {"role": "user", "content": "And 4 + 4?"}]  # an earlier assistant turn: prompt, not reply
    r = render_pair(PreferencePair(history, [{"role": "assistant", "content": "8"}], BAD), T, tokenizer)
    for side, text in ((r.chosen, "8"), (r.rejected, BAD[0]["content"])):
        assert T.decode(side.ids[side.mask].tolist(), tokenizer) == text + "<|end|>"
        full = T.render([*history, {"role": "assistant", "content": text}], tokenizer)[0]
        assert side.ids.tolist() == full  # the same ids SFT renders


@pytest.mark.parametrize("line,msg", [
    ('{"prompt": "q", "chosen": "a"}', 'expected an object with "chosen" and "rejected"'),
    ("not json", "not valid JSON"),
    ('{"prompt": "q", "chosen": 3, "rejected": "b"}', "'chosen' is int"),
    ('{"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}', "'chosen' has no assistant"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}', "'margin' is 'big'"),
    ('{"prompt": "q", "chosen": "a", "rejected": "a"}', "'chosen' and 'rejected' are the same reply"),
])
def test_bad_rows_are_named_or_counted(tmp_path, line, msg):
    path = _write(tmp_path / "p.jsonl", [{"prompt": Q, "chosen": GOOD, "rejected": BAD}, line])
    with pytest.raises(PreferenceDataError, match=f"p.jsonl:2: {msg}"):
        read_preferences(str(path))
    stats: dict[str, int] = {}
    assert len(read_preferences(str(path), skip_bad=True, stats=stats)) == 1 and stats == {"skipped": 1}


def test_unknown_roles_and_long_pairs_are_refused_at_render(tmp_path, tokenizer):
    rows = [{"prompt": Q, "chosen": GOOD, "rejected": BAD},
            {"prompt": [{"role": "bot", "content": "x"}], "chosen": GOOD, "rejected": BAD},
            {"prompt": Q, "chosen": GOOD, "rejected": "word " * 80}]
    pairs = read_preferences(str(_write(tmp_path / "p.jsonl", rows)))
    with pytest.raises(PreferenceDataError, match=r"p.jsonl:2: message 0: unknown role 'bot'"):
        render_pairs(pairs, T, 65, tokenizer)
    with pytest.raises(PreferenceDataError, match=r"p.jsonl:3: \d+ tokens is longer than the context \(64 \+ 1\)"):
        render_pairs(pairs[2:], T, 65, tokenizer)
    stats: dict[str, int] = {}
    assert len(render_pairs(pairs, T, 65, tokenizer, skip_bad=True, stats=stats)) == 1 and stats == {"skipped": 2}


@pytest.mark.parametrize("kind", ["save_to_disk_dict", "parquet", "json_dir"])
def test_offline_hf_datasets_read_like_the_jsonl(tmp_path, kind):
    datasets = pytest.importorskip("datasets")
    rows = preference_rows(arithmetic_problems(12, seed=3), seed=1)
    jsonl = write_preferences(rows, tmp_path / "p.jsonl")
    ds = datasets.Dataset.from_list(rows)
    where = tmp_path / "ds"
    if kind == "save_to_disk_dict":
        datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(where))
    elif kind == "parquet":
        where = tmp_path / "p.parquet"
        ds.to_parquet(str(where))
    else:
        (where / "data").mkdir(parents=True)
        ds.to_json(str(where / "data" / "train.jsonl"))
    got = read_preferences(str(where))
    assert [p for _, p in got] == [p for _, p in read_preferences(str(jsonl))]
    assert got[4][0] == f"{where}[train] row 4"
    if kind == "save_to_disk_dict":
        assert len(read_preferences(str(where), split="test")) == 2


def test_bad_hf_rows_are_named(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = preference_rows(arithmetic_problems(5, seed=3), seed=1)
    rows[2]["chosen"] = [{"role": "user", "content": "no reply"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(PreferenceDataError, match=r"ds\[train\] row 2: 'chosen' has no assistant message"):
        read_preferences(str(tmp_path / "ds"))
    datasets.Dataset.from_list([{"text": "x"}]).save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(PreferenceDataError, match=r"plain\[train\]: the dataset has no 'chosen' or 'rejected' column"):
        read_preferences(str(tmp_path / "plain"))


def _pairs(tokenizer, n=23):
    rows = preference_rows(compare_problems(n, seed=4), seed=2)
    return render_pairs([("x", PreferencePair(r["prompt"], r["chosen"], r["rejected"], float(i % 3)))
                         for i, r in enumerate(rows)], T, 65, tokenizer)


def test_pair_batches_layout_and_sharding(tokenizer):
    pairs = _pairs(tokenizer)
    b = PairLoader(pairs, B=4, seed=1).next_batch()
    assert b.ids.shape[0] == 8 and b.mask.shape == b.ids.shape and b.n == 4
    for k, i in enumerate(b.index.tolist()):  # chosen rows first, right-padded with <|endoftext|>
        for row, side in ((k, pairs[i].chosen), (k + 4, pairs[i].rejected)):
            L = len(side.ids)
            assert b.ids[row, :L].tolist() == side.ids.tolist() and (b.ids[row, L:] == 50256).all()
            assert b.mask[row, :L].tolist() == side.mask.tolist() and not b.mask[row, L:].any()
    assert b.margin.tolist() == [pairs[i].margin for i in b.index.tolist()]
    one = PairLoader(pairs, B=6, seed=1)
    ranks = [PairLoader(pairs, B=3, rank=r, world=2, seed=1) for r in range(2)]
    for _ in range(5):  # across an epoch boundary: 2 ranks together walk the 1-rank order
        assert one.next_batch().index.tolist() == sum((x.next_batch().index.tolist() for x in ranks), [])


def test_pair_loader_resumes_bit_exactly_and_refuses_other_data(tokenizer):
    pairs = _pairs(tokenizer)
    a = PairLoader(pairs, B=5, seed=3)
    for _ in range(4):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # as a checkpoint stores it
    want = [a.next_batch() for _ in range(6)]
    b = PairLoader(pairs, B=5, seed=3)
    b.load_state_dict(state)
    for w in want:
        g = b.next_batch()
        assert torch.equal(g.ids, w.ids) and torch.equal(g.mask, w.mask) and torch.equal(g.index, w.index)
    other = PairLoader(_pairs(tokenizer, n=22), B=5)
    with pytest.raises(PreferenceDataError, match="other preference pairs"):
        other.load_state_dict(state)
    train, val = split_pairs(pairs, 5, seed=0)
    assert len(train) == 18 and len(val) == 5


@pytest.mark.parametrize("task,make,fmt", [("arithmetic", arithmetic_problems, follows_arithmetic_format),
                                           ("compare", compare_problems, follows_compare_format)])
def test_generated_pairs_have_a_known_truth(task, make, fmt):
    problems = make(300, seed=7)
    rows = preference_rows(problems, seed=5)
    assert rows == preference_rows(problems, seed=5) and rows != preference_rows(problems, seed=6)
    assert {r["kind"] for r in rows} == set(KINDS)
    for p, r in zip(problems, rows, strict=True):
        chosen, rejected = r["chosen"][0]["content"], r["rejected"][0]["content"]
        assert r["prompt"] == [{"role": "user", "content": p.question}] and r["answer"] == p.answer
        assert is_correct(chosen, p.answer) and fmt(chosen)
        if r["kind"] == "broken_format":  # the right number, unreadable
            assert extract_answer(rejected) is None and not fmt(rejected) and p.answer in rejected
        else:  # in format, wrong number
            assert fmt(rejected) and extract_answer(rejected) != p.answer, (p, rejected)
        if r["kind"] == "wrong_operand" and task == "arithmetic":  # a correct sum of the wrong numbers
            lhs, rhs = rejected.split(" = ")
            assert eval(lhs) == int(rhs.split(".")[0]) and lhs != p.question[8:-1]
        if r["kind"] == "wrong_operand" and task == "compare":
            assert extract_answer(rejected) in p.question
    only = preference_rows(problems[:20], seed=0, kinds=["wrong_number"])
    assert {r["kind"] for r in only} == {"wrong_number"}


def test_tasks_without_operands_still_get_wrong_replies():
    from gptforge.eval.tasks.verifiable import Problem

    p = Problem("Tom has 3 apples and buys 4. How many?", "7", "3 + 4 = 7. The answer is 7.")
    rng = random.Random(0)
    assert extract_answer(rejected_reply(p, "broken_format", rng)) is None
    for kind in ("wrong_number", "wrong_operand"):
        got = extract_answer(rejected_reply(p, kind, rng))
        assert got is not None and got != "7"
    with pytest.raises(ValueError, match="rejected kind"):
        rejected_reply(p, "nonsense", rng)


def test_preference_sets_keep_the_eval_problems_held_out():
    from gptforge.eval.generative import compare_eval_problems
    from gptforge.eval.tasks.preferences import preference_set

    evals = {p.question for p in compare_eval_problems(500)}
    train = preference_set("compare", 600, seed=2)
    assert len(train) == 600 and not {r["prompt"][0]["content"] for r in train} & evals
    held = preference_set("compare", 50, held_out=True)
    assert [r["prompt"][0]["content"] for r in held] == [p.question for p in compare_eval_problems(50)]
    with pytest.raises(ValueError, match="generated tasks are arithmetic, arithmetic3, compare"):
        preference_set("gsm8k", 3)
