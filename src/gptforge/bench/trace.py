"""Where a profiled step goes: a torch.profiler Chrome trace summed by kernel family, per step.

    gptforge bench --preset gpt2-124m --trace step.json.gz      # prints this table after the timed steps
    python -m gptforge.bench.trace step.json.gz --steps 8       # the same table from a trace fetched back

On a GPU the time is the device's kernel time (``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events);
on CPU, where there are no kernels, it is each ``cpu_op``'s self time (its duration less that of the
ops it called directly, per thread), so nothing is counted twice. Each name goes to the first family
whose pattern it matches (:data:`FAMILIES`): Inductor names a fused kernel after the ops it holds
(``triton_poi_fused__to_copy_add_native_layer_norm_3``), so the order decides: a kernel that does a
LayerNorm and a cast is LayerNorm, and "copies" is left with the kernels that only move or convert
data. Each family's heaviest names are listed, so the copies a profile shows can be named one by one
(issue 58; the H100 profile in ``../shared/GPU-PROFILE.md`` had "copies, casts, transposes, sums" at
81 ms of 1,147 without saying which).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from gptforge import environment

OUTPUTS = ("--json",)  # what this tool writes (environment.tool_writes_files): a closed stdout does not cost it

# (family, pattern), first match wins: fused kernels are named for every op they hold
FAMILIES: tuple[tuple[str, str], ...] = (
    ("cross-entropy", r"log_softmax|nll_loss|cross_entropy|_ce_loss"),
    ("attention", r"attention|sdpa|flash|fmha|cudnn"),
    ("layernorm", r"layer_norm|_add_ln|rms_norm|layernorm"),
    ("gelu", r"gelu|silu|swiglu"),
    ("optimizer", r"adam|multi_tensor_apply|foreach|_fused_sgd|lerp"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|\bmm\b|aten::(mm|addmm|bmm|matmul|linear|baddbmm)$|mkldnn_matmul"),
    ("embedding", r"embedding"),
    ("sums", r"\bsum\b|_sum_|fused_sum|reduce|triton_red_|triton_per_"),
    ("fills", r"memset|fill|zero"),
    ("copies", r"copy|clone|\bcat\b|_cat_|contiguous|convert|to_copy|transpose|permute|memcpy|cast|index"),
)
_COMPILED = tuple((f, re.compile(p, re.IGNORECASE)) for f, p in FAMILIES)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class TraceError(ValueError):
    """A file that is not a torch.profiler Chrome trace (the message names it)."""


def family(name: str) -> str:
    for fam, pat in _COMPILED:
        if pat.search(name):
            return fam
    return "other"


TRACE_LIMIT = 4 << 30  # bytes (decompressed): a GPU trace of a few 124M steps is ~0.1-0.5 GB; more is not a step's trace


def load_events(path: str | Path, limit: int = TRACE_LIMIT) -> list[dict]:
    """The trace's complete (``"ph": "X"``) events; ``.gz`` is read compressed. Read through
    ``reading.read_json``'s guards (size before a byte is read, UTF-8, nesting); a ``.gz`` is
    decompressed at most ``limit`` bytes. Raises TraceError naming the file."""
    from gptforge.reading import not_a_file, read_json

    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace {p}: {not_a_file(p)}; give the file `gptforge bench --trace F` wrote")
    if p.suffix == ".gz":
        try:
            with gzip.open(p, "rb") as f:
                raw = f.read(limit + 1)
            if len(raw) > limit:
                raise TraceError(f"trace {p}: more than {limit:,} bytes uncompressed: not one profiled run's trace")
            data = json.loads(raw.decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError) as e:
            if isinstance(e, TraceError):
                raise
            raise TraceError(f"trace {p} is not a gzip-compressed Chrome trace: {type(e).__name__}: {e}") from None
    else:
        try:
            data = read_json(p, TraceError, what="Chrome trace", limit=limit, top=None)
        except FileNotFoundError as e:
            raise TraceError(f"trace {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"trace {p} has no traceEvents list: not a torch.profiler Chrome trace")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("dur"), (int, float)) and isinstance(e.get("ts"), (int, float))]


def _self_times(ops: list[dict]) -> dict[str, list[float]]:
    """Each op name's (self microseconds, calls): an op's duration less its direct children's, per thread."""
    by_thread: dict = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, self]
        for e in evs:
            while stack and stack[-1][0] <= e["ts"]:
                _end, name, own = stack.pop()
                out[name][0] += max(own, 0.0)
                out[name][1] += 1
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], str(e.get("name", "?")), float(e["dur"])])
        for _end, name, own in stack:
            out[name][0] += max(own, 0.0)
            out[name][1] += 1
    return out


def name_times(events: list[dict]) -> tuple[str, dict[str, list[float]]]:
    """(``"gpu kernels"`` or ``"cpu self"``, {name: [microseconds, calls]})."""
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if device:
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for e in device:
            out[str(e.get("name", "?"))][0] += float(e["dur"])
            out[str(e.get("name", "?"))][1] += 1
        return "gpu kernels", out
    return "cpu self", _self_times([e for e in events if e.get("cat") == "cpu_op"])


def summarize(path: str | Path, steps: int = 1, top: int = 3) -> dict:
    """Milliseconds per step by family (heaviest first), each with its ``top`` heaviest names."""
    if steps < 1:
        raise TraceError(f"steps must be >= 1 (the timed steps the trace holds), got {steps}")
    source, times = name_times(load_events(path))
    if not times:
        raise TraceError(f"trace {path} holds no kernel or cpu_op events: profile with torch.profiler "
                         "(`gptforge bench --trace F`)")
    fams: dict[str, dict] = {}
    for name, (us, calls) in times.items():
        f = fams.setdefault(family(name), {"ms": 0.0, "names": []})
        f["ms"] += us / 1000 / steps
        f["names"].append((name, us / 1000 / steps, calls / steps))
    total = sum(f["ms"] for f in fams.values())
    rows = []
    for fam, f in sorted(fams.items(), key=lambda kv: -kv[1]["ms"]):
        names = sorted(f["names"], key=lambda n: -n[1])[:top]
        rows.append({"family": fam, "ms": f["ms"], "share": f["ms"] / total if total else 0.0,
                     "top": [{"name": n, "ms": ms, "calls": c} for n, ms, c in names]})
    return {"source": source, "steps": steps, "total_ms": total, "families": rows}


def format_summary(s: dict, width: int = 70) -> str:
    lines = [f"where a step goes ({s['source']} time, per step over {s['steps']} step(s)): {s['total_ms']:.1f} ms",
             f"{'family':<14} {'ms':>9} {'share':>6}  heaviest"]
    for r in s["families"]:
        first = r["top"][0] if r["top"] else None
        lines.append(f"{r['family']:<14} {r['ms']:>9.2f} {100 * r['share']:>5.1f}%  "
                     + (f"{first['name'][:width]} ({first['ms']:.2f} ms, {first['calls']:g} calls)" if first else ""))
        for n in r["top"][1:]:
            lines.append(f"{'':<33}{n['name'][:width]} ({n['ms']:.2f} ms, {n['calls']:g} calls)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from gptforge.argparsing import check_tool_output, tool_parser

    ap = tool_parser(prog="python -m gptforge.bench.trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a Chrome trace from `gptforge bench --trace F` (or any torch.profiler export)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps the trace holds (to print per step)")
    ap.add_argument("--top", type=int, default=3, help="names listed per family (default 3)")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args(argv)
    check_tool_output(ap, args.json)
    try:
        s = summarize(args.trace, args.steps, max(args.top, 1))
    except TraceError as e:
        print(f"gptforge trace: {e}", file=sys.stderr)
        return 2
    print(format_summary(s))
    if args.json:
        from gptforge.storage import write_json

        write_json(args.json, s)
    return 0


if __name__ == "__main__":
    sys.exit(environment.tool(main, "python -m gptforge.bench.trace"))
