"""The effect of the tool commands' options (plan, bench, bench-generate, bench-prepare, prepare fineweb's and
files' shard options, plot), for the walk of tests/cli/test_every_cli_option_has_an_effect.py (issue 36).

Each option is checked against what it promises, counted or computed here: days to a token budget from
the step time (``ceil(tokens / batch tokens) x step``), a measured peak against the bytes AdamW must hold
(weights, gradients and two moments, 16 bytes a parameter), the steps a benchmark times from a
recording ``train_step``, the prompts and replies a decode benchmark runs from a recording
``generate``, the shards a prepare writes against test_prepare.py's single-process reference, the
legend and the lines of a plot against the metrics files drawn. Benchmarks run tiny models for a step or
two; the numbers they time are not checked, only what was timed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gptforge.cli import main

GIB = 2**30


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------- plan
def test_plan_reserve_tokens_gpus_per_node_and_force(tmp_path, capsys):
    """--reserve R: the recommendation's peak fits --gpu-mem less R (a bigger reserve, a smaller one);
    --tokens N: days = ceil(N / tokens per step) x step seconds / 86400; --gpus-per-node: groups that span
    nodes go over the slower NIC, so one GPU a node is slower than eight; --force replaces the --json file."""
    out = tmp_path / "p.json"
    rec = {}
    for reserve in (2, 20):
        assert main(["plan", "--preset", "gpt2-350m", "--gpu-mem", "40", "--world", "8", "--reserve", str(reserve),
                     "--json", str(out), "--force"]) == 0
        rec[reserve] = _json(out)["recommended"]
        assert rec[reserve]["peak"] <= (40 - reserve) * GIB
    assert rec[2]["peak"] > 20 * GIB  # so the reserve of 20 had to choose another
    # nothing fits once the reserve takes the whole GPU
    assert main(["plan", "--preset", "gpt2-350m", "--gpu-mem", "40", "--world", "8", "--reserve", "39.9"]) == 1
    base = ["plan", "--preset", "gpt3-13b", "--gpus", "64", "--gpu", "a100-80", "--json", str(out), "--force"]
    got = {}
    for flags in (["--tokens", "3e9", "--gpus-per-node", "8"], ["--tokens", "7.5e10", "--gpus-per-node", "1"]):
        assert main([*base, *flags]) == 0
        got[flags[-1]] = plan = _json(out)
        assert plan["cluster"]["gpus_per_node"] == int(flags[-1])
        tokens, batch_tokens = float(flags[1]), plan["global_batch"] * plan["seq_len"]
        for b in plan["best"]:
            assert b["days"] == pytest.approx(math.ceil(tokens / batch_tokens) * b["step_s"] / 86400, rel=1e-12)
    assert got["1"]["best"][0]["step_s"] > got["8"]["best"][0]["step_s"]
    capsys.readouterr()
    before = out.read_text()
    assert main(base[:-1]) == 2 and "--force" in capsys.readouterr().err and out.read_text() == before


def test_plan_measure_runs_steps_and_holds_adamws_state(tmp_path, monkeypatch):
    """--measure: the config's own steps, run here; the measured peak holds at least AdamW's 16 bytes a
    parameter (fp32 weights, gradients, two moments) and the ratio is the estimate over it; --steps N: N
    training steps (counted from a recording train_step)."""
    from gptforge.training import step

    calls = []
    real = step.train_step

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(step, "train_step", counting)
    out = tmp_path / "m.json"
    tiny = ["plan", "--preset", "tiny", "--train.device", "cpu", "--model.vocab_size", "256", "--world", "1",
            "--train.micro_batch", "1", "--train.seq_len", "16", "--train.total_batch_tokens", "16"]
    assert main([*tiny, "--json", str(out)]) == 0
    assert "measured_peak" not in _json(out) and not calls  # without --measure nothing runs
    for steps in (1, 3):
        calls.clear()
        assert main([*tiny, "--measure", "--steps", str(steps), "--json", str(out), "--force"]) == 0
        rep = _json(out)
        assert len(calls) == steps
        assert rep["measured_peak"] >= 16 * rep["params"]
        assert rep["ratio"] == pytest.approx(rep["estimate"]["peak"] / rep["measured_peak"])


# ---------------------------------------------------------------- bench
TINY_BENCH = ["bench", "--preset", "tiny", "--model.vocab_size", "256", "--train.device", "cpu"]


def test_bench_times_steps_after_warmup_and_writes_what_it_timed(tmp_path, monkeypatch, capsys):
    """--steps S --warmup W: W untimed then S timed train steps (a recording train_step); --out names the
    result; --trace: a profiler trace of the timed steps (real aten ops); --json and --force: the report
    is written, refused over an existing file without --force and replaced with it."""
    from gptforge.bench import train as bench_train

    calls = []
    real = bench_train.train_step

    def counting(*a, timer=None, **k):
        calls.append(timer is not None)
        return real(*a, timer=timer, **k)

    monkeypatch.setattr(bench_train, "train_step", counting)
    out, trace = tmp_path / "b.json", tmp_path / "t.json"
    assert main([*TINY_BENCH, "--steps", "2", "--warmup", "1", "--out", "runs/mine", "--trace", str(trace),
                 "--json", str(out)]) == 0
    assert calls == [False, True, True]
    rep = _json(out)
    assert [r["name"] for r in rep["results"]] == ["mine"]
    assert any("aten::" in e.get("name", "") for e in _json(trace)["traceEvents"])
    calls.clear()
    capsys.readouterr()
    assert main([*TINY_BENCH, "--steps", "1", "--warmup", "0", "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and _json(out) == rep and not calls
    assert main([*TINY_BENCH, "--steps", "1", "--warmup", "0", "--json", str(out), "--force"]) == 0
    assert calls == [True] and _json(out)["results"][0]["name"] != "mine"


def test_bench_preset_ladder_sweep_and_switch_are_the_configs_timed(tmp_path, monkeypatch):
    """What each timed config is (bench_one replaced by a recorder): --preset's model; --sweep-micro-batch's
    micro-batches; --switch KEY=VALUE the base then the base with that key; --ladder the speed ladder,
    fp32 -> tf32 -> bf16 -> compile -> flash -> pad vocab -> fused AdamW, each rung adding its change."""
    from gptforge.bench import train as bench_train

    seen = []

    def record(cfg, steps, warmup, device, trace=None):
        seen.append(cfg)
        return {"tokens_per_s": 1.0, "ms_per_step": 1.0, "phase_ms": dict.fromkeys(
            ("data", "forward", "backward", "optimizer"), 0.0), "mfu_llmc": None, "process_max_rss_MiB": 0,
            "cpu_user_s_per_step": 0, "cpu_sys_s_per_step": 0, "minor_faults_per_step": 0}

    monkeypatch.setattr(bench_train, "bench_one", record)

    def run(*flags):
        seen.clear()
        assert main(["bench", "--model.vocab_size", "256", "--train.device", "cpu", *flags]) == 0
        return list(seen)

    (tiny,) = run("--preset", "tiny")
    (cpu,) = run("--preset", "shakespeare-cpu")  # presets.py: d2 (2 layers, 64 wide, T 32), d4 (4, 128, T 128)
    assert (tiny.model.n_layer, tiny.model.n_embd, tiny.train.seq_len) == (2, 64, 32)
    assert (cpu.model.n_layer, cpu.model.n_embd, cpu.train.seq_len) == (4, 128, 128)
    assert [c.train.micro_batch for c in run("--preset", "tiny", "--sweep-micro-batch", "2,4")] == [2, 4]
    base, sw = run("--preset", "tiny", "--switch", "optim.lr=0.005")
    assert (base.optim.lr, sw.optim.lr) == (1e-3, 0.005)
    # the ladder on CPU: +tf32 is skipped (a CUDA mode), the other six rungs are timed, each adding its change
    rungs = run("--preset", "tiny", "--ladder")
    assert [c.train.dtype for c in rungs] == ["float32"] + ["bfloat16"] * 5
    assert [c.train.compile for c in rungs] == [False, False, True, True, True, True]
    assert [c.model.flash for c in rungs] == [False] * 3 + [True] * 3
    assert [c.model.pad_vocab for c in rungs] == [False] * 4 + [True] * 2
    assert [c.optim.fused for c in rungs] == [False] * 5 + [True]


# ---------------------------------------------------------------- bench-generate
def test_bench_generate_decodes_what_its_options_say(tmp_path, monkeypatch, capsys):
    """What gptforge's side decodes (``generate`` replaced by a recorder around the real one): --size's model
    (d2: 2 layers, 64 wide), --prompt-tokens and --new-tokens the shape of the prompts and the tokens
    returned, one warm-up plus --repeats timed calls per batch, --dtype the weights' dtype, --threads the
    torch threads it decodes on; --json/--force the report file, refused over an existing one without."""
    pytest.importorskip("transformers")
    from gptforge import generation

    seen = []
    real = generation.generate

    def record(model, idx, n, **kw):
        out = real(model, idx, n, **kw)
        seen.append({"layers": model.config.n_layer, "width": model.config.n_embd, "prompt": tuple(idx.shape),
                     "out": tuple(out.shape), "dtype": next(model.parameters()).dtype,
                     "threads": torch.get_num_threads()})
        return out

    monkeypatch.setattr(generation, "generate", record)
    out = tmp_path / "g.json"
    threads = torch.get_num_threads()
    try:
        assert main(["bench-generate", "--size", "d2", "--batch", "2", "--prompt-tokens", "3", "--new-tokens", "4",
                     "--repeats", "2", "--device", "cpu", "--json", str(out)]) == 0
        a = list(seen)
        seen.clear()
        assert main(["bench-generate", "--size", "d4", "--batch", "1", "--prompt-tokens", "5", "--new-tokens", "2",
                     "--repeats", "1", "--device", "cpu", "--dtype", "bfloat16", "--threads", "1", "--json", str(out),
                     "--force"]) == 0
        b = list(seen)
    finally:
        torch.set_num_threads(threads)
    assert [(s["layers"], s["width"], s["prompt"], s["out"], s["dtype"]) for s in a] == \
        [(2, 64, (2, 3), (2, 7), torch.float32)] * 3
    assert [(s["layers"], s["width"], s["prompt"], s["out"], s["dtype"], s["threads"]) for s in b] == \
        [(4, 128, (1, 5), (1, 7), torch.bfloat16, 1)] * 2
    rep = _json(out)
    assert rep["size"] == "d4" and [r["batch"] for r in rep["results"]] == [1]
    capsys.readouterr()
    assert main(["bench-generate", "--size", "d2", "--batch", "1", "--new-tokens", "1", "--prompt-tokens", "1",
                 "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and _json(out) == rep


# ---------------------------------------------------------------- bench-prepare
def test_bench_prepare_corpus_runs_and_memory_check(tmp_path, monkeypatch, capsys):
    """bench-prepare on a small corpus (the plays' documents cut to 12): --copies C: the pipeline tokenizes
    C copies of the single-core pass's tokens; --memory-factor F: the memory check's larger corpus F times
    the first; --repeats R: R pipeline runs per worker count; --workers: one row per count, run with it;
    --shard-tokens: the shards each run writes hold that many tokens; --workdir: the runs' files live
    there (and are gone after); --json/--force: the report file, refused over an existing one without."""
    pytest.importorskip("pyarrow")
    from gptforge.bench import prepare as bench

    docs = bench.shakespeare_documents()[:12]
    monkeypatch.setattr(bench, "shakespeare_documents", lambda: docs)
    runs = []
    real = bench.run_pipeline

    def record(corpus, out, workers, shard_tokens):
        s = real(corpus, out, workers, shard_tokens)
        m = json.loads((Path(out) / "manifest.json").read_text())
        runs.append({"corpus": Path(corpus), "workers": workers, "tokens": s["tokens"],
                     "train_shards": [x["tokens"] for x in m["shards"] if x["split"] == "train"]})
        return s

    monkeypatch.setattr(bench, "run_pipeline", record)
    work, out = tmp_path / "work", tmp_path / "bp.json"
    work.mkdir()
    assert main(["bench-prepare", "--workers", "1", "--copies", "2", "--repeats", "2", "--memory-factor", "3",
                 "--shard-tokens", "5000", "--workdir", str(work), "--json", str(out)]) == 0
    rep = _json(out)
    one_copy = rep["single_core"]["tokens"] + len(docs)  # each document also gets its <|endoftext|>
    assert [r["workers"] for r in rep["pipeline"]] == [1] and len(rep["pipeline"][0]["all_tokens_per_s"]) == 2
    assert [(r["workers"], r["tokens"]) for r in runs] == [(1, 2 * one_copy)] * 3 + [(1, 6 * one_copy)]
    assert [m["tokens"] for m in rep["memory"]] == [2 * one_copy, 6 * one_copy]
    for r in runs:
        assert r["corpus"].parent.parent == work
        assert r["train_shards"][:-1] and set(r["train_shards"][:-1]) == {5000} and r["train_shards"][-1] <= 5000
    assert list(work.iterdir()) == []
    capsys.readouterr()
    assert main(["bench-prepare", "--workers", "1", "--copies", "1", "--repeats", "1", "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and _json(out) == rep
