"""The tool commands (plot, bench, plan, race, tokenizer train, --help-config) under careless and hostile
input: a value of the wrong kind in a metrics file, sizes at the edges, a flag every override-taking command
should have. Each refusal is one line naming the flag or key, exit 2, nothing written; each accepted input
gives correct output."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from gptforge.cli import COMMANDS, main


def _main(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own exits (--help-config of the recipe commands exits from the parser)
        return int(e.code or 0)


# --- plot: a record whose value is not a finite number --------------------------------------------------------

GOOD = [{"kind": "train", "step": 1, "loss": 3.0, "tokens": 10}, {"kind": "train", "step": 3, "loss": 2.0, "tokens": 30}]
# what json.loads gives for a hand-edited or foreign line: NaN/Infinity literals, strings, containers, bools, and
# an integer past float's range (OverflowError in matplotlib before)
BAD_VALUES = ["NaN", "Infinity", "-Infinity", '"abc"', "[1, 2]", '{"a": 1}', "true", str(10**400)]


def _drawn(monkeypatch) -> list:
    """Every line the next plot draws, as (axis title, xdata, ydata)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure

    seen: list = []
    real = matplotlib.figure.Figure.savefig

    def catch(self, *a, **k):
        seen.extend((ax.get_title(), list(ln.get_xdata()), list(ln.get_ydata())) for ax in self.axes for ln in ax.lines
                    if ln.get_label().endswith(" train"))
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", catch)
    return seen


@pytest.mark.parametrize("field", ["loss", "tokens", "step"])
@pytest.mark.parametrize("bad", BAD_VALUES)
def test_plot_leaves_a_value_that_is_not_a_finite_number_off_the_curve(tmp_path, monkeypatch, capsys, field, bad):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    rec = {"kind": "train", "step": 2, "loss": 2.5, "tokens": 20}
    line = json.dumps(rec).replace(f'"{field}": {json.dumps(rec[field])}', f'"{field}": {bad}')
    assert line != json.dumps(rec)
    (run / "metrics.jsonl").write_text(json.dumps(GOOD[0]) + "\n" + line + "\n" + json.dumps(GOOD[1]) + "\n")
    seen = _drawn(monkeypatch)
    image = tmp_path / "p.png"
    assert main(["plot", str(run), "--image", str(image)]) == 0, capsys.readouterr().err
    assert image.stat().st_size > 0
    by_axis = {title.split("\n")[0]: (xs, ys) for title, xs, ys in seen}
    # the bad record is on the step axis only where just its tokens are bad; never on the tokens axis
    assert by_axis["loss vs step"] == (([1, 2, 3], [3.0, 2.5, 2.0]) if field == "tokens" else ([1, 3], [3.0, 2.0]))
    assert by_axis["loss vs tokens"] == ([10, 30], [3.0, 2.0])
    assert all(math.isfinite(v) for _, xs, ys in seen for v in (*xs, *ys))


@pytest.mark.parametrize("task", ['["hellaswag"]', '{"t": 1}', "7", "null"])
def test_plot_skips_an_eval_record_whose_task_is_not_a_name(tmp_path, capsys, task):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(GOOD[0]), f'{{"kind": "eval", "step": 1, "task": {task}, "acc": 0.5}}',
             json.dumps({"kind": "eval", "step": 1, "task": "hellaswag", "acc_norm": 0.3})]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["plot", str(run), "--image", str(tmp_path / "p.png")]) == 0, capsys.readouterr().err
    assert (tmp_path / "p.png").stat().st_size > 0


# --- bench: micro-batch sizes at the edges -------------------------------------------------------------------

TINY_BENCH = ["bench", "--preset", "tiny", "--model.vocab_size", "256", "--train.device", "cpu", "--steps", "1",
              "--warmup", "0"]


@pytest.fixture
def timed(monkeypatch):
    """The sizes bench_one was asked to time, in order."""
    from gptforge.bench import train as bench_train

    calls: list = []
    real = bench_train.bench_one
    monkeypatch.setattr(bench_train, "bench_one", lambda c, *a, **k: (calls.append(c.train.micro_batch), real(c, *a, **k))[1])
    return calls


@pytest.mark.parametrize("argv, names", [
    (["--sweep-micro-batch", "0"], "--sweep-micro-batch"),  # ZeroDivisionError before
    (["--sweep-micro-batch", "2,0"], "--sweep-micro-batch"),
    (["--sweep-micro-batch", "-3"], "--sweep-micro-batch"),
    (["--sweep-micro-batch", "2,1e12"], "train.micro_batch=1,000,000,000,000"),  # numpy asked for 30 TB: a traceback
    (["--train.micro_batch", "1e12", "--train.total_batch_tokens", "3.2e13"], "train.micro_batch=1,000,000,000,000"),
])
def test_bench_refuses_a_micro_batch_it_cannot_time_before_timing_any(tmp_path, capsys, timed, argv, names):
    report = tmp_path / "b.json"
    assert main([*TINY_BENCH, *argv, "--json", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert timed == [] and not report.exists()  # no size timed (2 comes before the bad one), nothing written


def test_bench_reports_a_size_the_cpu_cannot_allocate_as_out_of_memory(tmp_path, monkeypatch, capsys, timed):
    """The CPU allocator's refusal is a RuntimeError, not torch.OutOfMemoryError: a size that does not fit is a
    skipped row, as on CUDA, and the other sizes are still timed; any other RuntimeError is not swallowed."""
    from gptforge.bench import train as bench_train

    real = bench_train.bench_one

    def alloc(c, *a, **k):
        if c.train.micro_batch == 4:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 7372800000 bytes")
        return real(c, *a, **k)

    monkeypatch.setattr(bench_train, "bench_one", alloc)
    report = tmp_path / "b.json"
    assert main([*TINY_BENCH, "--sweep-micro-batch", "4,2", "--json", str(report)]) == 0
    rows = {r["name"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["B=4"]["skipped"].startswith("out of memory: ") and rows["B=2"]["tokens_per_s"] > 0
    monkeypatch.setattr(bench_train, "bench_one", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a real bug")))
    with pytest.raises(RuntimeError, match="a real bug"):
        main([*TINY_BENCH, "--json", str(tmp_path / "c.json")])


# --- --help-config: every command that takes --section.key overrides -------------------------------------------

OVERRIDE_COMMANDS = sorted(name for name, (_, takes, _) in COMMANDS.items() if takes)


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
def test_every_command_taking_overrides_lists_its_keys(command, capsys):
    """bench, plan and race took overrides but had no --help-config: it parsed as the key `help-config` with
    no value. Every such command lists the keys (race: with its first preset's values, its own overrides on)."""
    argv = [command, *(["tiny,optim.lr=0.0123", "speedrun-d4"] if command == "race" else []), "--help-config"]
    assert _main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "--optim.lr" in out and "--train.micro_batch" in out
    if command == "race":
        assert "values of preset 'tiny'" in out and "0.0123" in out


def test_race_help_config_without_a_preset_is_one_line(capsys):
    assert _main(["race", "--help-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--help-config" in err and "PRESET" in err and len(err.splitlines()) == 1


# --- plan: a reserve that leaves no memory -----------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--reserve", "80"], "the default --gpu-mem"),  # "nothing fits: use more GPUs" before, which no count changes
    (["--reserve", "90", "--gpu-mem", "40"], "--gpu-mem"),
    (["--gpu", "h100-80", "--reserve", "79.6"], "--gpu h100-80's"),
    (["--gpu", "h200", "--gpu-mem", "0.001"], "--gpu-mem"),  # "nothing fits in -1.999 GiB per GPU" before
])
def test_plan_refuses_a_reserve_that_leaves_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "plan.json"
    assert main(["plan", "--preset", "tiny", *argv, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--reserve" in err and says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_plan_takes_a_reserve_just_below_the_memory(capsys):
    assert main(["plan", "--preset", "tiny", "--gpu-mem", "4", "--reserve", "3.9"]) == 0
    assert "recommended:" in capsys.readouterr().out


# --- tokenizer train: special tokens refused before training, naming --special ------------------------------------

TRAINERS = ["tokenizers", *(["rustbpe"] if importlib.util.find_spec("rustbpe") else [])]


@pytest.fixture
def corpus(tmp_path):
    pytest.importorskip("tiktoken")
    f = tmp_path / "c.txt"
    f.write_text("hello world, hello there; hello again\n" * 200)
    return f


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("special", ["x" * 5000, "é" * 2100])  # past 4,096 bytes (the second in bytes, not characters)
def test_tokenizer_train_refuses_an_overlong_special_before_training(corpus, tmp_path, capsys, monkeypatch, trainer,
                                                                     special):
    from gptforge.data import tokenizer_train as tt

    monkeypatch.setattr(tt, "build_tokenizer", lambda *a, **k: pytest.fail("trained before refusing"))
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", str(corpus), "--trainer", trainer, "--vocab-size", "300", "--special",
                 "<|endoftext|>", "--special", special, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--special" in err and "4,096" in err and len(err) < 300 and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.skipif("rustbpe" not in TRAINERS, reason="rustbpe not installed")
def test_tokenizer_train_names_a_special_that_training_made_ordinary(corpus, tmp_path, capsys):
    """rustbpe merges `hello` (a word of the corpus) into an ordinary token: refused naming --special, not a
    temporary ranks.tiktoken file the user never saw."""
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", str(corpus), "--trainer", "rustbpe", "--vocab-size", "300", "--special",
                 "<|endoftext|>", "--special", "hello", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--special hello" in err and "tiktoken" not in err and len(err.splitlines()) == 1, err
    assert not out.exists()


# --- an empty output path, and an image name matplotlib cannot write ---------------------------------------------

def _declared_outputs():
    from gptforge.cli.outputs import CHECKED, OUTPUTS

    return [(cmd, key) for cmd, outs in OUTPUTS.items() for key, kind in outs.items() if kind in CHECKED]


@pytest.mark.parametrize("command, key", _declared_outputs())
@pytest.mark.parametrize("empty", ["", "  "])
def test_every_declared_output_refuses_an_empty_path(command, key, empty):
    """`plan --json ""`, `bench --json ""`, `eval --json ""` ran and wrote nothing (an empty path read as no
    output); `export --out ""` was called the folder the command runs in. Every declared file or folder output
    refuses it by its flag, before the command runs."""
    import argparse

    from gptforge.cli.common import CliError
    from gptforge.cli.outputs import check_outputs

    sub, _, flag = key.rpartition(" ")
    args = argparse.Namespace(force=False, source_name=sub or None, action=sub or None, format=sub or None,
                              **{flag.lstrip("-").replace("-", "_"): empty})
    with pytest.raises(CliError, match=f"^{flag} is empty; name the "):
        check_outputs(command, args)


@pytest.mark.parametrize("argv", [["plan", "--preset", "tiny", "--json", ""],
                                  ["bench", "--preset", "tiny", "--steps", "1", "--json", ""],
                                  ["plot", "RUN", "--image", ""]])
def test_an_empty_output_path_is_refused_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as e:  # by the parser, as every empty value (tests/cli/test_empty_values.py)
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "is empty" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("name", ["curves", "curves.foo", "curves.png.bak", "dir.v2/curves"])
def test_plot_refuses_an_image_name_without_a_format_before_reading_runs(tmp_path, capsys, monkeypatch, name):
    """matplotlib refused these after the figure was drawn, in a traceback; now one line naming --image and the
    formats, before any run is read."""
    pytest.importorskip("matplotlib")
    from gptforge import plot

    monkeypatch.setattr(plot, "_run_series", lambda r: pytest.fail("read a run before refusing the name"))
    image = tmp_path / name
    image.parent.mkdir(exist_ok=True)
    assert main(["plot", str(tmp_path), "--image", str(image)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gptforge plot: error: --image {image}: ") and ".png" in err and len(err.splitlines()) == 1
    assert not image.exists()


# --- bench-generate and train.threads: sizes at the edges ---------------------------------------------------------

@pytest.mark.parametrize("argv, names", [
    (["--prompt-tokens", "-1"], "--prompt-tokens"),  # "negative dimension" traceback before
    (["--threads", "1e6"], "--threads"),  # torch spawned threads until the allocator failed, in a traceback
    (["--threads", "1025"], "--threads"),
    (["--batch", "1e9"], "--batch 1,000,000,000"),  # the CPU allocator asked for 128 GB, in a traceback
    (["--batch", "1", "1e6"], "--batch 1,000,000"),  # the largest batch is checked before the first is timed
])
def test_bench_generate_refuses_a_size_at_the_edge_before_building(argv, names, capsys, monkeypatch):
    pytest.importorskip("transformers")
    from gptforge.models import registry

    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("built a model before refusing"))
    assert main(["bench-generate", "--size", "d4", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("value, ok", [("0", True), ("1024", True), ("1025", False), ("1e6", False), ("-1", False)])
def test_train_threads_is_bounded_by_the_config(value, ok):
    from gptforge.config import Config, ConfigError, apply_overrides

    if ok:
        assert apply_overrides(Config(), ["--train.threads", value]).train.threads == int(value)
    else:
        with pytest.raises(ConfigError, match=r"train\.threads.*\[0, 1024\]"):
            apply_overrides(Config(), ["--train.threads", value])


# --- bench-prepare and prepare: sizes that no disk or machine holds -----------------------------------------------

@pytest.mark.parametrize("argv, names", [
    (["--workers", "1e6"], "--workers 1000000"),  # prepare's pool would have spawned processes without end
    (["--workers", "1,100000"], "--workers 100000"),
    (["--shard-tokens", "1e18"], "--shard-tokens"),  # prepare's SourceError as a traceback from the subprocess
    (["--copies", "1e9"], "--copies 1,000,000,000"),  # parquet written until the disk was full
    (["--memory-factor", "1e9"], "--memory-factor 1,000,000,000"),
])
def test_bench_prepare_refuses_before_writing_its_corpus(argv, names, tmp_path, capsys, monkeypatch):
    pytest.importorskip("pyarrow")
    from gptforge.bench import prepare as bench_prepare

    monkeypatch.setattr(bench_prepare, "write_corpus", lambda *a, **k: pytest.fail("wrote a corpus before refusing"))
    monkeypatch.setattr(bench_prepare, "shakespeare_documents", lambda: ["To be, or not to be: that is the question."] * 300)
    assert main(["bench-prepare", "--workdir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_prepare_bounds_its_workers_by_the_cores(tmp_path, capsys):
    from gptforge.data.prepare.settings import MAX_WORKERS_PER_CORE
    from gptforge.data.prepare.workers import available_cores

    (tmp_path / "c.txt").write_text("hello world\n")
    too_many = MAX_WORKERS_PER_CORE * available_cores() + 1
    assert main(["prepare", "files", str(tmp_path / "c.txt"), "--out", str(tmp_path / "out"), "--workers",
                 str(too_many), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--workers {too_many}: must be in 1..{too_many - 1:,}" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


# --- the python -m gptforge.bench.* tools: the CLI's number parser and output checks --------------------------------

def _tool(module: str, argv: list[str], capsys) -> tuple[int, str]:
    import importlib

    try:
        code = importlib.import_module(f"gptforge.bench.{module}").main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip()


@pytest.fixture
def chrome_trace(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": [{"name": "aten::mm", "ph": "X", "dur": 5, "cat": "cpu_op", "ts": 1}]}))
    return f


@pytest.mark.parametrize("raw, ok", [("2", True), ("2e0", True), ("2_000", True), ("2_0", False), ("nan", False),
                                     ("1e30", False), ("2.5", False)])
def test_the_tools_parse_numbers_as_every_command_does(chrome_trace, capsys, raw, ok):
    """trace --steps (and every number flag of the -m tools) goes through gptforge.numbers: 2e0 was 'invalid
    int value' before, and a refusal is one line naming the flag."""
    code, err = _tool("trace", [str(chrome_trace), "--steps", raw], capsys)
    if ok:
        assert code == 0, err
    else:
        assert code == 2 and "argument --steps" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("module, argv", [
    ("trace", ["TRACE", "--json", "FOLDER"]),
    ("trace", ["TRACE", "--json", ""]),
    ("tokenizer_train", ["--json", "FOLDER"]),  # an IsADirectoryError traceback after the whole benchmark before
    ("llmc", ["report", "--llmc-log", "a", "--gptforge-json", "b", "--json", "FOLDER"]),
    ("llmc", ["shard", "FOLDER", "--tokens", "10"]),
])
def test_the_tools_refuse_an_output_that_is_a_folder_before_any_work(module, argv, chrome_trace, tmp_path, capsys,
                                                                     monkeypatch):
    from gptforge.bench import tokenizer_train as tt

    monkeypatch.setattr(tt, "corpus_files", lambda: pytest.fail("read the corpus before refusing"))
    folder = tmp_path / "out"
    folder.mkdir()
    argv = [str(folder) if a == "FOLDER" else str(chrome_trace) if a == "TRACE" else a for a in argv]
    code, err = _tool(module, argv, capsys)
    assert code == 2 and ("is a folder" in err or "is empty" in err) and len(err.splitlines()) == 1, err
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("argv, says", [
    (["--vocab-size", "0"], "--vocab-size 0: must be in [259"),  # OverflowError in the trainer before
    (["--vocab-size", "300", "--repeats", "0"], "--repeats"),  # min() of an empty sequence before
    (["--vocab-size", "300", "--copies", "0"], "--copies"),  # timed an empty corpus and wrote the report
    (["--vocab-size", "300", "--copies", "-2"], "--copies"),
])
def test_bench_tokenizer_train_refuses_edges_before_training(argv, says, capsys, monkeypatch):
    from gptforge.bench import tokenizer_train as tt

    monkeypatch.setattr(tt, "corpus_files", lambda: pytest.fail("read the corpus before refusing"))
    code, err = _tool("tokenizer_train", argv, capsys)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("tokens", ["0", "-5", "1e12"])
def test_bench_llmc_shard_refuses_a_token_count_no_shard_holds(tokens, tmp_path, capsys):
    code, err = _tool("llmc", ["shard", str(tmp_path / "s.bin"), "--tokens", tokens], capsys)
    assert code == 2 and "--tokens" in err and "2,147,483,647" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "s.bin").exists()


@pytest.mark.parametrize("writer", ["write_json", "write_text", "write_bytes"])
def test_every_writer_refuses_a_folder_as_its_file(writer, tmp_path):
    """The one writer's last guard, for callers that never went through check_output: os.replace over a folder
    was an IsADirectoryError traceback (python -m gptforge.bench.tokenizer_train --json DIR)."""
    from gptforge import storage
    from gptforge.storage.faults import OutputError

    folder = tmp_path / "out"
    (folder / "keep").mkdir(parents=True)
    value = {"json": {"a": 1}, "text": "a", "bytes": b"a"}[writer.split("_")[1]]
    with pytest.raises(OutputError, match="is a folder; name the file to write"):
        getattr(storage, writer)(folder, value)
    assert [p.name for p in folder.iterdir()] == ["keep"] and not [p for p in tmp_path.iterdir() if p != folder]


# --- race: a val loss written as null (not finite) ----------------------------------------------------------------

@pytest.mark.parametrize("last", [2.0, None])
def test_race_summary_skips_a_val_loss_that_is_not_finite(tmp_path, last):
    """MetricsLog writes a NaN val loss as null; race's summary compared it with the target (None <= float, a
    TypeError). It is no point on the curve and never 'reached'; a run that ended on one has no final loss."""
    from gptforge.bench.race import format_race, summarize

    rows = [{"kind": "start", "step": 0, "time": 1.0}, {"kind": "train", "step": 1, "loss": 3.0, "dt_ms": 10, "tokens": 10},
            {"kind": "val", "step": 1, "val_loss": None, "val_loss_str": "nan", "tokens": 10, "time": 2.0},
            {"kind": "train", "step": 2, "loss": 2.9, "dt_ms": 10, "tokens": 20},
            {"kind": "val", "step": 2, "val_loss": 3.5, "tokens": 20, "time": 3.0},
            {"kind": "val", "step": 3, "val_loss": last, "tokens": 30, "time": 4.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(tmp_path, 2.5)
    assert s["reached"] is (last is not None) and s["final_val_loss"] == last
    assert s["val_curve"] == [[20, 3.5]] + ([[30, 2.0]] if last is not None else [])
    missed = summarize(tmp_path, 1.0)
    assert not missed["reached"]
    text = format_race({"target_val_loss": 1.0, "target_from": "--target", "runs": [{"preset": "a", **missed}]})
    assert ("final val loss none" in text) is (last is None)
