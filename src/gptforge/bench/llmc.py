"""gptforge against llm.c on the same GPU: parse both runs and report them side by side.

    scripts/bench_vs_llmc.sh ../shared/reference/llm.c -b 64 -t 1024 -d 524288   # builds, runs, calls this
    python -m gptforge.bench.llmc shard OUT/tokens.bin --tokens 2000000            # the shard both read
    python -m gptforge.bench.llmc report --llmc-log llmc.log --gptforge-json gf.json --json compare.json

llm.c's ``train_gpt2cu`` prints a parameter table (``| micro batch size B    | 64 ...``), then
``device memory usage: X MiB / Y MiB`` once its buffers are allocated, then one line per step:
``step    9/16 | loss ... | lr ... | 1000.12 ms | 42.5% bf16 MFU | 524288 tok/s`` (its tok/s is an
EMA; here tokens/s is recomputed from the median step time after ``--skip`` warm-up steps, as
``gptforge bench`` does). Both MFUs use llm.c's formula, 6N + 6LCT FLOPs per token, and the same
peak (llm.c's ``peak TFlops`` line, else gptforge's datasheet value). Each ``--switch`` that ``gptforge bench`` timed becomes a further row. Peak memory: gptforge's
CUDA allocator peak and llm.c's allocation total; when the script samples ``nvidia-smi`` during
each run, the device-level peak above the idle baseline is reported for both, which is the only
like-for-like figure (it includes the CUDA context, cuBLAS/cuDNN workspaces and allocator slack).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from gptforge import environment
from gptforge.reading import read_json

OUTPUTS = ("--json", "shard")  # what this tool writes (environment.tool_writes_files): report --json, shard PATH

STEP_RE = re.compile(
    r"^step\s+(\d+)/(\d+) \| loss ([-\d.naif]+) .*?\| ([\d.]+) ms \| ([-\d.]+)% \S+ MFU \| ([\d.]+) tok/s"
)
TABLE_RE = re.compile(r"^\|\s*(.+?)\s*\|\s*(.+?)\s*\|\s*$")
MEM_RE = re.compile(r"^device memory usage: (\d+) MiB / (\d+) MiB")


class ReportError(ValueError):
    """A log or JSON that does not look like the run it should be; the message names the file."""


def parse_llmc_log(text: str, source: str = "llm.c log") -> dict:
    """The parameter table, allocation total and per-step lines of a ``train_gpt2cu`` run."""
    table: dict[str, str] = {}
    steps: list[dict] = []
    mem = None
    for line in text.splitlines():
        if m := STEP_RE.match(line):
            steps.append({"step": int(m[1]), "loss": float(m[3]), "ms": float(m[4]),
                          "mfu": float(m[5]) / 100, "tok_s_ema": float(m[6])})
        elif m := MEM_RE.match(line):
            mem = int(m[1])
        elif (m := TABLE_RE.match(line)) and m[1] not in ("Parameter",):
            table[m[1]] = m[2]
    if not steps:
        raise ReportError(f"{source}: no 'step N/M | ... ms | ... MFU | ... tok/s' lines; did train_gpt2cu run?")

    def num(key: str, kind=int):
        if key not in table:
            raise ReportError(f"{source}: the parameter table has no {key!r} row")
        return kind(table[key])

    peak = float(table["peak TFlops"]) * 1e12 if "peak TFlops" in table else None
    return {
        "device": table.get("device"), "precision": table.get("precision"),
        "B": num("micro batch size B"), "T": num("sequence length T"), "total_batch": num("total batch size"),
        "params": num("num_parameters"), "L": num("num_layers L"), "C": num("channels C"),
        "peak_flops": peak if peak and peak > 0 else None,
        "alloc_MiB": mem, "steps": steps,
    }


def summarize_llmc(parsed: dict, skip: int) -> dict:
    timed = [s["ms"] for s in parsed["steps"] if s["step"] > skip]
    if not timed:
        raise ReportError(f"llm.c ran {len(parsed['steps'])} steps; none left after skipping {skip} warm-up steps")
    ms = statistics.median(timed)
    return {"ms_per_step": ms, "tokens_per_s": parsed["total_batch"] / (ms / 1000), "timed_steps": len(timed),
            "mfu_printed_median": statistics.median(s["mfu"] for s in parsed["steps"] if s["step"] > skip)}


def smi_peak_mib(csv_text: str) -> float | None:
    """Peak of an ``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms N`` log,
    above its first sample (the idle baseline before the run started)."""
    vals = [float(x) for x in csv_text.split() if x.replace(".", "", 1).isdigit()]
    return max(vals) - vals[0] if len(vals) >= 2 else None


def compare(llmc: dict, gf_report: dict, skip: int, smi: dict[str, str | None] | None = None) -> dict:
    """One row per system and the ratio gptforge / llm.c, both MFUs by llm.c's formula and one peak."""
    results = gf_report.get("results") or [{}]
    gf = results[0]
    if "tokens_per_s" not in gf:
        raise ReportError(f"gptforge bench did not measure its base config: {gf.get('skipped', 'no result')}")
    if (gf["micro_batch"], gf["seq_len"], gf["tokens_per_step"]) != (llmc["B"], llmc["T"], llmc["total_batch"]):
        raise ReportError(
            f"the runs differ: gptforge B={gf['micro_batch']} T={gf['seq_len']} total={gf['tokens_per_step']}, "
            f"llm.c B={llmc['B']} T={llmc['T']} total={llmc['total_batch']}"
        )
    peak = llmc["peak_flops"] or gf.get("peak_flops")
    model = gf_report["config"]["model"]
    lc_fpt = 6 * llmc["params"] + 6 * llmc["L"] * llmc["C"] * llmc["T"]
    lc = summarize_llmc(llmc, skip)
    smi = smi or {}
    rows: dict[str, dict] = {"llm.c": {**lc, "mfu": lc_fpt * lc["tokens_per_s"] / peak if peak else None,
                                       "peak_MiB_alloc": llmc["alloc_MiB"],
                                       "peak_MiB_device": smi_peak_mib(smi.get("llmc") or "")}}
    for i, r in enumerate(gf_report["results"]):  # the config as given, then each --switch (same process)
        name = "gptforge" if i == 0 else f"gptforge {r['name']}"
        if "tokens_per_s" not in r:
            rows[name] = {"skipped": r.get("skipped", "no result")}
            continue
        fpt = 6 * r["params"] + 6 * model["n_layer"] * model["n_embd"] * r["seq_len"]
        rows[name] = {"ms_per_step": r["ms_per_step"], "tokens_per_s": r["tokens_per_s"],
                      "mfu": fpt * r["tokens_per_s"] / peak if peak else None,
                      "peak_MiB_alloc": r.get("cuda_max_allocated_MiB"),
                      # nvidia-smi sees the whole bench process: one config's peak only when it ran alone
                      "peak_MiB_device": smi_peak_mib(smi.get("gptforge") or "") if len(results) == 1 else None,
                      "switches": r.get("switches"), "vs_llmc": r["tokens_per_s"] / lc["tokens_per_s"]}
    return {
        "device": llmc["device"], "B": llmc["B"], "T": llmc["T"], "total_batch": llmc["total_batch"],
        "peak_flops": peak, "params": {"llm.c": llmc["params"], "gptforge": gf["params"]},
        "env": gf_report.get("env"), "date": gf_report.get("date"),
        "systems": rows, "ratio_tokens_per_s": gf["tokens_per_s"] / lc["tokens_per_s"],
        "gptforge_process_peak_MiB_device": smi_peak_mib(smi.get("gptforge") or ""),
    }


def format_comparison(c: dict) -> str:
    def f(v, spec):
        return format(v, spec) if v is not None else "n/a"

    w = max(len(n) for n in c["systems"])
    lines = [f"{c['device']} | B {c['B']} T {c['T']} | {c['total_batch']:,} tokens/step",
             f"{'system':<{w}} {'ms/step':>9} {'tokens/s':>11} {'MFU':>7} {'peak MiB (alloc)':>17} {'peak MiB (device)':>18}"]
    for name, r in c["systems"].items():
        if "skipped" in r:
            lines.append(f"{name:<{w}} skipped: {r['skipped']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(f"{name:<{w}} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>11,.0f} {mfu:>7} "
                     f"{f(r['peak_MiB_alloc'], ',.0f'):>17} {f(r['peak_MiB_device'], ',.0f'):>18}")
    lines.append(f"gptforge / llm.c tokens/s: {c['ratio_tokens_per_s']:.3f}x")
    return "\n".join(lines)


def _read(path: str | None) -> str | None:
    return Path(path).read_text() if path and Path(path).exists() else None


def main(argv: list[str] | None = None) -> int:
    from gptforge.argparsing import check_tool_output, tool_parser

    p = tool_parser(prog="python -m gptforge.bench.llmc", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shard", help="write a uniform-random GPT-2 token shard (llm.c format) for both runs")
    s.add_argument("path")
    s.add_argument("--tokens", type=int, required=True)
    r = sub.add_parser("report", help="parse an llm.c log and a gptforge bench JSON; print and write the comparison")
    r.add_argument("--llmc-log", required=True)
    r.add_argument("--gptforge-json", required=True)
    r.add_argument("--skip", type=int, default=3, help="llm.c warm-up steps left out of the median (default 3)")
    r.add_argument("--llmc-smi", help="nvidia-smi memory.used samples taken during the llm.c run")
    r.add_argument("--gptforge-smi", help="the same during the gptforge run")
    r.add_argument("--json", help="write the comparison here")
    args = p.parse_args(argv)
    if args.cmd == "shard":
        from gptforge.data.shards import MAX_TOKENS

        if not 1 <= args.tokens <= MAX_TOKENS:  # the llm.c header's int32 count; numpy was asked for 1e12 before
            p.error(f"--tokens {args.tokens}: a shard holds 1 to {MAX_TOKENS:,} tokens")
        check_tool_output(p, args.path, "PATH")
    else:
        if args.skip < 0:
            p.error(f"--skip {args.skip}: the warm-up steps to leave out, >= 0")
        check_tool_output(p, args.json)
    try:
        if args.cmd == "shard":
            import numpy as np

            from gptforge.data.shards import write_shard

            rng = np.random.default_rng(0)
            write_shard(Path(args.path), rng.integers(0, 50257, args.tokens, dtype=np.int64))
            return 0
        for path in (args.llmc_log, args.gptforge_json):
            if not Path(path).exists():
                raise ReportError(f"{path}: no such file (did that run fail? see its log)")
        llmc = parse_llmc_log(Path(args.llmc_log).read_text(), args.llmc_log)
        gf = read_json(args.gptforge_json, ReportError, "gptforge bench --json report", top=None)
        c = compare(llmc, gf, args.skip, {"llmc": _read(args.llmc_smi), "gptforge": _read(args.gptforge_smi)})
    except ReportError as e:
        print(f"bench_llmc: error: {e}", file=sys.stderr)
        return 2
    print(format_comparison(c))
    if args.json:
        from gptforge import storage

        storage.write_json(args.json, c)  # temporary name, fsync, rename
        print(f"[bench_llmc] wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(environment.tool(main, "python -m gptforge.bench.llmc"))
