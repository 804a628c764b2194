"""Issue 21 class 5: a cached eval file (gsm8k.jsonl, hellaswag.jsonl, ...) is read by the one JSONL
reader, which names the file and line of whatever is wrong with it; eval and rl exit 2 with one line
for each way the cache can be damaged. eval's error and --help list every task, generative ones too."""

from __future__ import annotations

import json

import pytest

from gptforge import assets
from gptforge.cli import main
from gptforge.eval.tasks.base import EvalDataError, load_rows
from tests.conftest import tiny_chat_checkpoint

GOOD = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
NESTED = "[" * 100_000 + "]" * 100_000

# name -> (what to put at gsm8k.jsonl, words the one error line must hold)
DAMAGE = {
    "truncated": (lambda p: p.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD)[:20]), ["line 2", "not JSON"]),
    "empty": (lambda p: p.write_text(""), ["holds no rows"]),
    "blank lines": (lambda p: p.write_text("\n \n"), ["holds no rows"]),
    "not utf-8": (lambda p: p.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe{}\n"), ["line 2", "not UTF-8"]),
    "html": (lambda p: p.write_text("<!DOCTYPE html>\n<html><body>rate limited</body></html>\n"),
             ["line 1", "HTML page"]),
    "key missing": (lambda p: p.write_text(json.dumps({"question": "q"}) + "\n"), ["line 1", "'answer'"]),
    "not a string": (lambda p: p.write_text(json.dumps({"question": "q", "answer": 5}) + "\n"), ["line 1", "'answer'"]),
    "a list": (lambda p: p.write_text("[1, 2]\n"), ["line 1", "expected a JSON object"]),
    "deeply nested": (lambda p: p.write_text(NESTED + "\n"), ["line 1", "not JSON"]),
    "no #### answer": (lambda p: p.write_text(json.dumps({"question": "q", "answer": "two"}) + "\n"),
                       ["example 0", "#### N"]),
    "a directory": (lambda p: p.mkdir(), ["not a file"]),
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "evals"
    d.mkdir()
    monkeypatch.setattr(assets, "eval_data_dir", lambda: d)
    return d


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    return tiny_chat_checkpoint(tmp_path_factory.mktemp("c") / "sft")


def _one_line(capsys, argv, path, words):
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("case", list(DAMAGE))
def test_eval_gsm8k_names_the_file_and_line(cache, capsys, case):
    make, words = DAMAGE[case]
    make(cache / "gsm8k.jsonl")
    _one_line(capsys, ["eval", "--random", "d2", "--tasks", "gsm8k", "--limit", "1", "--device", "cpu"],
              cache / "gsm8k.jsonl", words)


@pytest.mark.parametrize("case", ["truncated", "not utf-8", "html", "a list", "deeply nested", "a directory", "empty"])
def test_eval_multiple_choice_cache_goes_through_the_same_reader(cache, capsys, case):
    make, words = DAMAGE[case]
    make(cache / "hellaswag.jsonl")
    _one_line(capsys, ["eval", "--random", "d2", "--tasks", "hellaswag", "--limit", "1", "--device", "cpu"],
              cache / "hellaswag.jsonl", words)


@pytest.mark.parametrize("case", ["truncated", "not utf-8", "html", "key missing", "a directory", "empty"])
def test_rl_gsm8k_names_the_file_and_line(cache, capsys, chat_ckpt, tmp_path, case):
    make, words = DAMAGE[case]
    make(cache / "gsm8k.jsonl")
    _one_line(capsys, ["rl", "--init-from", str(chat_ckpt), "--task", "gsm8k", "--steps", "1", "--prompts", "1",
                       "--group", "2", "--eval-n", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "rl"),
                       "--device", "cpu"], cache / "gsm8k.jsonl", words)


def test_a_good_file_still_reads(cache):
    (cache / "gsm8k.jsonl").write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n")
    from gptforge.eval.tasks.verifiable import gsm8k_problems

    assert [(p.question, p.answer) for p in gsm8k_problems()] == [(GOOD["question"], "2")] * 2
    with pytest.raises(EvalDataError, match="line 1 .*'x'"):
        load_rows("gsm8k", cache / "gsm8k.jsonl", required=("x",))


def test_eval_lists_the_generative_tasks_in_its_error_and_help(capsys):
    assert main(["eval", "--random", "d2", "--tasks", "nope"]) == 2
    err = capsys.readouterr().err
    for name in ("hellaswag", "lambada", "arithmetic", "compare", "gsm8k"):
        assert name in err, err
    assert main(["eval", "--random", "d2", "--tasks", ","]) == 2
    assert "gsm8k" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "arithmetic, arithmetic3, compare, gsm8k" in out and "hellaswag, piqa" in out
