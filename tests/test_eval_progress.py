"""`gptforge eval` is never silent for long: a progress bar per task on stderr (advancing with each
forward) and a line per task as it finishes, before the table; the scores are unchanged by it."""

from __future__ import annotations

from gptforge.cli import main
from gptforge.eval.run import evaluate, prepare_tasks
from gptforge.eval.scorer import score_requests


def test_eval_reports_each_task_as_it_goes(eval_data, tokenizer, capsys):
    argv = ["eval", "--tasks", "hellaswag,lambada", "--random", "d2", "--limit", "6", "--batch-tokens", "256",
            "--device", "cpu"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    done = [i for i, line in enumerate(lines) if ": done, n 6 " in line]
    table = next(i for i, line in enumerate(lines) if line.startswith("task "))
    assert [lines[i].split(":")[0] for i in done] == ["hellaswag", "lambada"] and max(done) < table
    assert "hellaswag (6 examples)" in cap.err and "lambada (6 examples)" in cap.err and "req" in cap.err


def test_progress_callback_counts_every_request_and_changes_nothing(eval_data, tokenizer):
    import torch

    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("d2")).eval()
    prepared = prepare_tasks("hellaswag", limit=3, enc=tokenizer)
    flat = [r for ex in prepared[0].requests for r in ex]
    seen: list[int] = []
    with_cb = score_requests(model, flat, batch_tokens=200, progress=seen.append)
    assert sum(seen) == len(flat) and len(seen) > 1
    assert with_cb == score_requests(model, flat, batch_tokens=200)
    quiet = evaluate(model, prepared, batch_tokens=200)
    loud = evaluate(model, prepared, batch_tokens=200, log=lambda _: None)
    assert {k: v for k, v in quiet["hellaswag"].items() if k != "seconds"} == \
        {k: v for k, v in loud["hellaswag"].items() if k != "seconds"}
