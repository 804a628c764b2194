"""Evaluation: the batched scorer against hand-computed losses and against the one-at-a-time
reference, each task's renderer on real rows, bad data, and compiled vs uncompiled evaluation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptforge.eval import reference
from gptforge.eval.run import evaluate, prepare_tasks
from gptforge.eval.scorer import CandidateScore, decide, evaluate_requests, score_requests, unwrap
from gptforge.eval.tasks import TASKS, EvalDataMissing, MalformedExample, get_tasks, load_rows
from gptforge.eval.tasks.base import EvalDataError
from gptforge.models.gpt2 import GPT, GPTConfig

# --- the scorer against a hand computation ------------------------------------------------------------


class BigramModel(torch.nn.Module):
    """Logits depend only on the current token: row t of a table of log-probabilities, so every
    continuation loss can be worked out by hand."""

    def __init__(self, probs: list[list[float]], block_size: int = 16):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(probs).log())
        self.config = GPTConfig(n_layer=1, n_head=1, n_embd=4, block_size=block_size, vocab_size=len(probs))

    def forward(self, idx, targets=None):
        return self.table[idx], None


PROBS = [  # P(next | current), rows sum to 1
    [0.10, 0.35, 0.20, 0.35],  # after 0
    [0.25, 0.25, 0.25, 0.25],  # after 1
    [0.05, 0.05, 0.00001, 0.89999],  # after 2
    [0.05, 0.05, 0.00001, 0.89999],  # after 3
]


def test_scorer_matches_hand_computed_losses():
    model = BigramModel(PROBS)
    # context [1, 0]; candidate A = [1], candidate B = [2, 3, 3]
    requests = [([1, 0], [1]), ([1, 0], [2, 3, 3])]
    loss_a = -math.log(0.35)  # 1.0498
    loss_b = -math.log(0.20) - 2 * math.log(0.89999)  # 1.6094 + 0.2107 = 1.8201; mean 0.6067
    for batch_tokens in (1, 3, 100):  # one request per batch, and both in one padded batch
        a, b = score_requests(model, requests, batch_tokens=batch_tokens)
        assert a.n_tokens == 1 and b.n_tokens == 3
        assert a.sum_loss == pytest.approx(loss_a, abs=1e-5)
        assert b.sum_loss == pytest.approx(loss_b, abs=1e-5)
        assert b.mean_loss == pytest.approx(loss_b / 3, abs=1e-5)
        # greedy: after 0 the argmax is token 1 (first of the 0.35 tie), after 2 and 3 it is token 3
        assert a.greedy is True
        assert b.greedy is False  # token 2 is not the argmax after 0
        # acc picks A (1.05 < 1.82), acc_norm picks B (0.61 < 1.05): the two rules differ here
        assert decide([a, b]) == (0, 1)
    (c,) = score_requests(model, [([0, 3], [3, 3])])
    assert c.greedy is True and c.sum_loss == pytest.approx(-2 * math.log(0.89999), abs=1e-5)


def test_scorer_truncates_long_requests_from_the_left():
    model = BigramModel(PROBS, block_size=4)
    # 6 context tokens + 2 continuation: only the last block+1 = 5 tokens are kept, the loss is unchanged
    (s,) = score_requests(model, [([1, 1, 1, 1, 1, 0], [2, 3])])
    assert s.n_tokens == 2
    assert s.sum_loss == pytest.approx(-math.log(0.2) - math.log(0.89999), abs=1e-5)


def test_decide_breaks_ties_toward_the_first_candidate():
    scores = [CandidateScore(2.0, 2, False), CandidateScore(2.0, 2, False)]
    assert decide(scores) == (0, 0)


# --- renderers on real rows ----------------------------------------------------------------------------

SIZES = {"hellaswag": 10042, "piqa": 1838, "arc_easy": 570, "arc_challenge": 299, "winogrande": 1267,
         "openbookqa": 500, "sciq": 1000, "lambada": 5153}


def test_every_task_renders_all_its_real_rows(eval_data):
    for name, task in TASKS.items():
        rows = load_rows(name)
        assert len(rows) == SIZES[name], name
        examples = [task.render(r, i) for i, r in enumerate(rows)]
        for ex in examples:
            assert all(c.startswith(" ") for c in ex.continuations), name
        if task.mode == "choice":
            labels = [ex.label for ex in examples]
            assert len(set(labels)) >= 2 or name == "sciq", name  # real label distributions, not a constant


def test_renderers_on_known_rows(eval_data):
    hs = TASKS["hellaswag"].render(load_rows("hellaswag")[0], 0)
    assert hs.contexts == ("A man is sitting on a roof. he",) * 4
    assert hs.continuations[3] == " starts pulling up roofing on a roof." and hs.label == 3

    wg_row = load_rows("winogrande")[0]
    wg = TASKS["winogrande"].render(wg_row, 0)
    assert wg_row["sentence"] == "Sarah was a much better surgeon than Maria so _ always got the easier cases."
    assert wg.contexts == ("Sarah was a much better surgeon than Maria so Sarah",
                           "Sarah was a much better surgeon than Maria so Maria")
    assert wg.continuations == (" always got the easier cases.",) * 2 and wg.label == 1

    lb_row = load_rows("lambada")[0]
    lb = TASKS["lambada"].render(lb_row, 0)
    assert lb.continuations == (" signs",) and lb.contexts[0] + lb.continuations[0] == lb_row["text"]

    pq_row = load_rows("piqa")[0]
    pq = TASKS["piqa"].render(pq_row, 0)
    assert pq.contexts[0] == f"Question: {pq_row['goal']}\nAnswer:"
    assert pq.continuations == (" " + pq_row["sol1"], " " + pq_row["sol2"]) and pq.label == int(pq_row["label"])

    arc = TASKS["arc_easy"].render(load_rows("arc_easy")[0], 0)
    assert arc.contexts[0] == "Question: Which technology was developed most recently?\nAnswer:"
    assert arc.continuations[arc.label] == " cellular telephone"  # answerKey A

    ob_row = load_rows("openbookqa")[0]
    ob = TASKS["openbookqa"].render(ob_row, 0)
    assert ob.contexts[0] == ob_row["question_stem"]
    assert ob.continuations[ob.label] == " " + ob_row["choices"]["text"][ob_row["choices"]["label"].index(ob_row["answerKey"])]

    sq_row = load_rows("sciq")[0]
    sq = TASKS["sciq"].render(sq_row, 0)
    assert sq.contexts[0].endswith(f"Question: {sq_row['question']}\nAnswer:")
    assert sq.label == 3 and sq.continuations[3] == " " + sq_row["correct_answer"]


# --- bad data ---------------------------------------------------------------------------------------------


def test_malformed_row_is_reported_by_index(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    (tmp_path / "evals").mkdir()
    good = {"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": "1"}
    bad = {"ctx": "A man", "endings": ["a", "b"], "label": "1"}
    (tmp_path / "evals" / "hellaswag.jsonl").write_text("\n".join(json.dumps(r) for r in (good, good, bad)) + "\n")
    with pytest.raises(MalformedExample, match=r"hellaswag: example 2 is malformed"):
        prepare_tasks("hellaswag", enc=_FakeEnc())
    (tmp_path / "evals" / "winogrande.jsonl").write_text(json.dumps({"sentence": "no blank", "option1": "a",
                                                                      "option2": "b", "answer": "1"}) + "\n")
    with pytest.raises(MalformedExample, match=r"winogrande: example 0"):
        prepare_tasks("winogrande", enc=_FakeEnc())
    (tmp_path / "evals" / "piqa.jsonl").write_text('{"goal": "x"}\nnot json\n')
    with pytest.raises(MalformedExample, match=r"piqa: example 1 \(line 2"):
        load_rows("piqa")


def test_missing_dataset_names_both_ways_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    with pytest.raises(EvalDataMissing) as e:
        load_rows("sciq")
    msg = str(e.value)
    assert "gptforge assets evals`" in msg and "gptforge assets evals --online" in msg and "sciq" in msg
    assert isinstance(e.value, FileNotFoundError)  # the CLI turns it into exit status 2


def test_unknown_task_and_limit_clamp(eval_data):
    with pytest.raises(EvalDataError, match="unknown task"):
        get_tasks("hellaswag,nope")
    said = []
    (p,) = prepare_tasks("arc_challenge", limit=1000, log=said.append, enc=_FakeEnc())
    assert len(p.examples) == 299 and p.available == 299
    assert said and "limit 1000 exceeds the 299 examples" in said[0]
    (p,) = prepare_tasks("arc_challenge", limit=10, log=said.append, enc=_FakeEnc())
    assert len(p.examples) == 10 and len(said) == 1


class _FakeEnc:
    """Byte-level stand-in for tests that only exercise loading and rendering."""

    def encode_ordinary(self, s: str) -> list[int]:
        return list(s.encode("utf-8"))


# --- batched scorer vs the one-at-a-time reference on real data ---------------------------------------------


@pytest.fixture(scope="module")
def tiny_gpt2():
    torch.manual_seed(1234)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=1024)).eval()


def _compare_with_reference(model, tokenizer, name: str, n: int, batch_tokens: int):
    (p,) = prepare_tasks(name, limit=n, enc=tokenizer)
    flat = [r for rq in p.requests for r in rq]
    scores = score_requests(model, flat, batch_tokens=batch_tokens)
    pos, refs = 0, []
    for ex, rq in zip(p.examples, p.requests, strict=True):
        ref = reference.score_example(model, tokenizer, ex)
        refs.append(ref)
        mine = scores[pos : pos + len(rq)]
        pos += len(rq)
        assert decide(mine) == (ref["pred"], ref["pred_norm"])
        assert [s.n_tokens for s in mine] == ref["n_tokens"]
        assert [s.greedy for s in mine] == ref["greedy"]
        assert [s.sum_loss for s in mine] == pytest.approx(ref["sum_loss"], abs=1e-3)
    return p, refs


def test_batched_hellaswag_matches_one_at_a_time_reference(tiny_gpt2, tokenizer, eval_data):
    p, refs = _compare_with_reference(tiny_gpt2, tokenizer, "hellaswag", 32, batch_tokens=1500)
    # and the aggregate numbers equal the reference's accuracy on the same examples
    res = evaluate_requests(tiny_gpt2, p.task, p.examples, p.requests, batch_tokens=1500)
    assert res["n"] == 32
    assert res["acc"] == sum(r["pred"] == ex.label for r, ex in zip(refs, p.examples, strict=True)) / 32
    assert res["acc_norm"] == sum(r["pred_norm"] == ex.label for r, ex in zip(refs, p.examples, strict=True)) / 32


@pytest.mark.parametrize("name", ["winogrande", "lambada", "arc_easy"])
def test_batched_other_tasks_match_reference(tiny_gpt2, tokenizer, eval_data, name):
    _compare_with_reference(tiny_gpt2, tokenizer, name, 16, batch_tokens=700)


def test_lambada_perplexity_is_exp_of_mean_word_loss(tiny_gpt2, tokenizer, eval_data):
    (p,) = prepare_tasks("lambada", limit=12, enc=tokenizer)
    res = evaluate_requests(tiny_gpt2, p.task, p.examples, p.requests)
    refs = [reference.score_example(tiny_gpt2, tokenizer, ex) for ex in p.examples]
    assert res["acc"] == sum(r["greedy"][0] for r in refs) / 12
    assert res["ppl"] == pytest.approx(math.exp(sum(r["sum_loss"][0] for r in refs) / 12), rel=1e-4)


def test_evaluation_restores_train_mode(tiny_gpt2, tokenizer, eval_data):
    (p,) = prepare_tasks("winogrande", limit=4, enc=tokenizer)
    tiny_gpt2.train()
    evaluate(tiny_gpt2, [p])
    assert tiny_gpt2.training
    tiny_gpt2.eval()


def test_model_with_a_small_vocabulary_is_refused(tokenizer, eval_data):
    (p,) = prepare_tasks("winogrande", limit=2, enc=tokenizer)
    small = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, vocab_size=512))
    with pytest.raises(EvalDataError, match="vocab_size is 512"):
        evaluate(small, [p])


# --- compiled vs uncompiled ------------------------------------------------------------------------------


@pytest.mark.slow
def test_compiled_model_evaluates_like_the_uncompiled_one(tokenizer, eval_data):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=256)).eval()
    prepared = prepare_tasks("hellaswag,lambada", limit=8, enc=tokenizer)
    plain = evaluate(model, prepared)
    compiled = torch.compile(model)
    x = torch.randint(0, 50257, (2, 32))
    with torch.no_grad():
        before = compiled(x)[0]  # compile for a training-like shape first, as the loop does
    assert unwrap(compiled) is model
    got = evaluate(compiled, prepared)
    for name in plain:
        plain[name].pop("seconds")
        got[name].pop("seconds")
    assert got == plain
    with torch.no_grad():  # the compiled module still runs after evaluation
        torch.testing.assert_close(compiled(x)[0], before)


# --- every rank scores a share, the counts are all-reduced ---------------------------------------------------


def _rank_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(7)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=256)).eval()
        prepared = prepare_tasks("winogrande,lambada", limit=7)
        res = evaluate(model, prepared, rank=rank, world=world)
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_all_reduce_to_the_single_process_numbers(tmp_path, tokenizer, eval_data):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(7)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=256)).eval()
    single = evaluate(model, prepare_tasks("winogrande,lambada", limit=7, enc=tokenizer))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in single:
            assert got[name]["n"] == 7  # 4 + 3 examples, summed over ranks
            assert got[name]["acc"] == pytest.approx(single[name]["acc"])
            for key in ("acc_norm", "ppl"):
                if key in single[name]:
                    assert got[name][key] == pytest.approx(single[name][key], rel=1e-5)
