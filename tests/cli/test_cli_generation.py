"""`gptforge sample` on the streaming generator, `serve`/`bench-generate` argument checks, and the
benchmark's own correctness check (greedy tokens identical to transformers' on the same weights)."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.generation import SamplingParams, complete
from gptforge.interop.llmc import write_llmc_model
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run.checkpoint import save_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)).eval()
    where = save_checkpoint(tmp_path / "run", 3, model, None, {"config": Config(model=model.config).to_dict()})
    return model, where


def test_sample_streams_one_and_batches_several(ckpt, tokenizer, capsys):
    model, where = ckpt
    assert main(["sample", "--ckpt", str(where), "--prompt", "ROMEO:", "--num-samples", "1", "--max-new-tokens", "10",
                 "--temperature", "0"]) == 0
    ref = complete(model, tokenizer, ["ROMEO:"], SamplingParams(max_new_tokens=10, temperature=0.0))[0]["text"]
    assert capsys.readouterr().out == f"--- sample 0\nROMEO:{ref}\n"
    argv = ["sample", "--ckpt", str(where), "--prompt", "A", "--prompt", "Hello there", "--num-samples", "2",
            "--max-new-tokens", "6", "--top-p", "0.9", "--repetition-penalty", "1.2", "--seed", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("--- sample") == 4 and out.count("\nHello there") == 2
    assert main(argv) == 0 and capsys.readouterr().out == out  # seeded


@pytest.mark.parametrize("command", ["sample", "chat", "eval"])
def test_inference_commands_take_trainings_cpu_threads(tmp_path, command, monkeypatch):
    """`--device` commands on a CPU run at one torch thread per process unless OMP_NUM_THREADS says otherwise, as
    `train` does (runtime.auto_threads): torch's default of one per core made `eval` 2x slower on a loaded
    2-core machine. The test process starts them at 3 threads, which only a reset brings back down."""
    import io

    from tests.conftest import tiny_chat_checkpoint

    where = tiny_chat_checkpoint(tmp_path / "chat")
    argv = {"sample": ["sample", "--ckpt", str(where), "--max-new-tokens", "2", "--num-samples", "1"],
            "chat": ["chat", "--ckpt", str(where), "--max-new-tokens", "2"],
            "eval": ["eval", "--ckpt", str(where), "--tasks", "compare", "--limit", "1"]}[command]
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    before = torch.get_num_threads()
    try:
        for omp, want in ((None, 1), ("2", 2)):
            if omp is None:
                monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
            else:
                monkeypatch.setenv("OMP_NUM_THREADS", omp)
            torch.set_num_threads(3)
            assert main([*argv, "--device", "cpu"]) == 0
            assert torch.get_num_threads() == want, (command, omp)
    finally:
        torch.set_num_threads(before)


def test_greedy_sample_prints_one_sample_per_prompt(ckpt, tokenizer, capsys):
    """Issue 34: --temperature 0 printed the default 5 samples, all the same; now one, and an explicit
    --num-samples N is answered with one sample and a line saying why."""
    model, where = ckpt
    greedy = ["sample", "--ckpt", str(where), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--temperature", "0"]
    assert main(greedy) == 0
    out, err = capsys.readouterr()
    assert out.count("--- sample") == 1 and not err
    assert main([*greedy, "--num-samples", "3"]) == 0
    out2, err = capsys.readouterr()
    assert out2 == out and "identical" in err and "--temperature 0" in err
    assert main([*greedy[:-2], "--seed", "1"]) == 0 and capsys.readouterr().out.count("--- sample") == 5  # sampling: 5


def test_sample_from_llmc_file_equals_checkpoint(ckpt, tmp_path, capsys):
    model, where = ckpt
    write_llmc_model(model, tmp_path / "m.bin")
    argv = ["--prompt", "Hi", "--num-samples", "3", "--max-new-tokens", "8", "--seed", "1"]
    assert main(["sample", "--ckpt", str(where), *argv]) == 0
    a = capsys.readouterr().out
    assert main(["sample", "--llmc", str(tmp_path / "m.bin"), *argv]) == 0
    assert capsys.readouterr().out == a


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top-p"),
        (["--top-k", "-1"], "top-k"),
        (["--repetition-penalty", "0"], "repetition-penalty"),
        (["--max-new-tokens", "0"], "max-new-tokens"),
        (["--max-new-tokens", "70"], "context of 64"),
        (["--stop", ""], "--stop: '' is empty"),  # refused by the parser, as every empty value is
    ],
)
def test_sample_bad_knobs_exit_2(ckpt, extra, words, capsys):
    _, where = ckpt
    try:
        code = main(["sample", "--ckpt", str(where), *extra])
    except SystemExit as e:  # the parser's own refusal
        code = e.code
    assert code == 2
    assert words in capsys.readouterr().err


def test_serve_and_export_bad_input_exit_2(ckpt, tmp_path, capsys):
    _, where = ckpt
    assert main(["serve"]) == 2
    assert "exactly one of --ckpt" in capsys.readouterr().err
    assert main(["serve", "--ckpt", str(where), "--max-new-tokens-cap", "0"]) == 2
    assert "max-new-tokens-cap" in capsys.readouterr().err
    assert main(["serve", "--ckpt", str(tmp_path / "nope")]) == 2
    assert main(["export", "hf", "--ckpt", str(where), "--hf", "gpt2", "--out", str(tmp_path / "x")]) == 2
    assert main(["import", "llmc", "--model", str(tmp_path / "missing.bin"), "--out", str(tmp_path / "r")]) == 2
    assert "missing.bin" in capsys.readouterr().err
    assert main(["bench-generate", "--batch", "0"]) == 2


def test_bench_generate_agrees_with_transformers(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "bg.json"
    assert main(["bench-generate", "--size", "d2", "--batch", "1", "3", "--new-tokens", "6", "--prompt-tokens", "5",
                 "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["batch"] for r in res["results"]] == [1, 3]
    assert all(r["same_tokens"] and r["gptforge_tokens_per_s"] > 0 for r in res["results"])


def test_bench_generate_counts_every_call_on_a_bar(monkeypatch, capsys):
    """No silent minutes: at gpt2's size on a CPU the first result row came after a minute and the run took
    minutes with nothing on the screen; a bar on stderr now counts every generate call (each batch, each
    implementation, the warm-up and every repeat) from its first draw."""
    pytest.importorskip("transformers")
    import tqdm as tqdm_module

    bars = []

    class Recorded(tqdm_module.tqdm):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.shown = not self.disable  # close() disables it
            bars.append(self)

    monkeypatch.setattr(tqdm_module, "tqdm", Recorded)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert main(["bench-generate", "--size", "d2", "--batch", "1", "2", "--new-tokens", "2", "--prompt-tokens", "2",
                     "--repeats", "2", "--device", "cpu"]) == 0
        assert torch.get_num_threads() == 1  # --threads 0 is train.threads 0: one on CPU (torch's 2-3 was 10x slower)
    finally:
        torch.set_num_threads(before)
    assert len(bars) == 1 and bars[0].total == bars[0].n == 2 * 2 * (1 + 2) and bars[0].shown
    assert bars[0].desc.startswith("bench-generate d2") and bars[0].unit == "call"
    assert "bench-generate d2" in capsys.readouterr().err  # drawn at once, before the first call ends


def test_serve_command_serves_checkpoint_and_its_metrics(ckpt, tmp_path):
    """The real `gptforge serve` process: binds 127.0.0.1, finds the run's metrics.jsonl, answers."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("uvicorn")
    _, where = ckpt
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 9.5}) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gptforge", "serve", "--ckpt", str(tmp_path / "run"), "--port",
                             str(port), "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                info = json.loads(urllib.request.urlopen(url + "/api/info", timeout=2).read())
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() else "timeout"
                time.sleep(0.2)
        assert info["model"]["n_embd"] == 32
        assert json.loads(urllib.request.urlopen(url + "/api/metrics").read())["train"] == [[1, 9.5]]
        req = urllib.request.Request(url + "/api/generate", data=json.dumps({"prompt": "Hi", "max_new_tokens": 4}).encode(),
                                     headers={"content-type": "application/json"})
        assert json.loads(urllib.request.urlopen(req).read())["completions"][0]["finish_reason"] in ("length", "eot")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
