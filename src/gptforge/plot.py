"""Plot runs: train/val loss and task accuracy against step and tokens, with reference lines.

    gptforge plot runs/gpt2-124m runs/gpt2-124m-lr1e-3 --image curves.png

Reads each run's ``metrics.jsonl`` (records ``train``, ``val``, ``eval`` and RL's ``rl``). Rows: loss,
then the reward (RL runs: mean reward and sampled accuracy per step), then one per evaluated task
(RL's held-out accuracy included); columns: against optimizer steps and against tokens seen. Reference lines, drawn
only where they apply: GPT-2 124M validation loss on FineWeb (3.2847, llm.c) when a run's
``config.json`` names FineWeb data, and HellaSwag acc_norm of GPT-2 124M (0.2955, build-nanogpt's
completion-style scoring, which ours reproduces) and GPT-3 125M (0.337, the GPT-3 paper).
Needs matplotlib (extra ``plot``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gptforge.run.metrics import StepSeries, finite_number, iter_metrics, other_runs_records, whole_step

GPT2_124M_FINEWEB_VAL_LOSS = 3.2847  # llm.c's baseline: OpenAI's GPT-2 124M on the FineWeb val shard
# task -> (metric plotted, [(label, value), ...]) — only numbers measured with our scoring
TASK_REFERENCES = {
    "hellaswag": ("acc_norm", [("GPT-2 124M", 0.2955), ("GPT-3 125M", 0.337)]),
    "winogrande": ("acc", []),  # partial scoring: acc and acc_norm agree
}
REF_STYLES = {"GPT-2 124M": "tab:red", "GPT-3 125M": "tab:green"}
MAX_POINTS = 4096  # per curve: more than the figure's width in pixels (13 in at 110 dpi)


def _run_series(run: str | Path) -> dict:
    path = Path(run)
    mfile = path / "metrics.jsonl" if path.is_dir() else path
    if not mfile.exists():
        raise FileNotFoundError(f"{mfile}: no metrics.jsonl; give a run directory written by `gptforge train`")
    # a line torn by a kill (or otherwise garbled) is skipped with a warning naming its line number;
    # records a resume superseded ("replayed") are left out
    # streamed, each curve held to MAX_POINTS (StepSeries): a million-line file is not a million records in memory
    records = iter_metrics(mfile, warn=lambda msg: print(f"gptforge plot: warning: {msg}", file=sys.stderr))
    kinds = {"train": StepSeries(MAX_POINTS), "val": StepSeries(MAX_POINTS), "rl": StepSeries(MAX_POINTS)}
    tasks: dict[str, StepSeries] = {}
    starts: list[str] = []  # the run ids of its start records: a file of one run holds one (resumes keep it)
    for r in records:  # files from before replayed records were marked repeat steps: the last one wins
        if r.get("kind") == "start" and isinstance(r.get("run"), str):
            starts.append(r["run"])
        if whole_step(r.get("step")) is None:
            continue  # a record without a step (hand-edited, another tool's) has no place on a step axis
        if r.get("kind") in ("train", "val", "rl"):
            kinds[r["kind"]].add(r["step"], r)
        elif r.get("kind") == "eval" and isinstance(r.get("task"), str):
            tasks.setdefault(r["task"], StepSeries(MAX_POINTS)).add(r["step"], r)
    if len(set(starts)) > 1:  # a run started again into the folder (a dead first attempt's records), files joined
        meta = _newest_meta(mfile.parent)
        other = other_runs_records(mfile, meta.get("run_id") if isinstance(meta.get("run_id"), str) else starts[-1])
        if other:
            print(f"gptforge plot: warning: {mfile}: {other}; they are drawn into this run's curves as if one run: "
                  "move them out of this file (into a metrics.jsonl of their own, to plot beside it)", file=sys.stderr)
    by_kind = {k: v.items() for k, v in kinds.items()}
    evals = {t: v.items() for t, v in tasks.items()}
    if not by_kind["train"] and not by_kind["val"] and not by_kind["rl"] and not evals:
        raise FileNotFoundError(f"{mfile} holds no train, val, rl or eval records to plot")
    data_dir, config = "", None
    cfg_file = mfile.parent / "config.json"
    if cfg_file.exists():
        from gptforge.reading import read_json

        try:  # it only says whether to draw FineWeb's reference lines: a damaged one is a warning, as a torn line is
            config = read_json(cfg_file, ValueError, "run's config.json")
            data = config.get("data")
        except ValueError as e:
            print(f"gptforge plot: warning: {e}; no reference lines for this run", file=sys.stderr)
            data = None
        data_dir = data.get("dir") if isinstance(data, dict) and isinstance(data.get("dir"), str) else ""
    # an RL step's loss is a policy-gradient surrogate (about 0), not a token loss: RL runs get their own
    # reward row and stay off the loss axes
    return {"train": by_kind["train"], "val": by_kind["val"], "rl": by_kind["rl"], "eval": evals,
            "fineweb": "fineweb" in data_dir.lower(), "words": _run_words(mfile.parent, config)}


def _newest_meta(run: Path) -> dict:
    """The meta.json of a run's newest checkpoint, or {} (none, or damaged: it only loses a note)."""
    from gptforge.run import checkpoint as ckpt

    try:
        where = ckpt.latest_checkpoint(run)
        return ckpt.read_meta(where) if where is not None else {}
    except Exception:
        return {}


def _run_words(run: Path, config: dict | None) -> tuple[str, str] | None:
    """(identity, description) of the tokenizer a run's losses are counted in: its newest checkpoint's
    recorded tokenizer (name, size, fingerprint), else its config.json's model.vocab_size; None if neither."""
    tok = _newest_meta(run).get("tokenizer")
    if isinstance(tok, dict) and tok.get("fingerprint"):
        n = tok.get("n_vocab")
        return str(tok["fingerprint"]), f"tokenizer {tok.get('name')!r}" + (f" ({n:,} ids)" if isinstance(n, int) else "")
    model = config.get("model") if isinstance(config, dict) else None
    v = model.get("vocab_size") if isinstance(model, dict) else None
    if isinstance(v, int) and not isinstance(v, bool):
        return f"vocab {v}", f"a {v:,}-token vocabulary"
    return None


def tokenizer_note(names: list[str], series: list[dict]) -> str | None:
    """Where runs count their losses in different tokenizers, a sentence saying so (a nats-per-token loss
    of a 4,096-token vocabulary is not comparable with GPT-2's: a token is a different amount of text, and
    the metrics record no bytes per token to convert both to bits per byte); else None."""
    known = [(n, s["words"]) for n, s in zip(names, series, strict=True) if s.get("words")]
    if len({w[0] for _, w in known}) < 2:
        return None
    return ("different tokenizers, losses not comparable per token: "
            + "; ".join(f"{n}: {w[1]}" for n, w in known))


_number = finite_number  # the one rule for a point's value (run/metrics.py)


def _xy(records: dict[int, dict], key: str, x: str) -> tuple[list, list]:
    pts = [(_number(r.get(x, step if x == "step" else None)), _number(r.get(key))) for step, r in sorted(records.items())]
    pts = [(a, b) for a, b in pts if a is not None and b is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def image_format(out: str | Path) -> str:
    """The format ``out``'s suffix names (``png``, ``svg``, ``pdf`` ...), or ValueError naming ``--image`` and the
    formats there are: checked before any run is read, where matplotlib's own refusal came after the drawing,
    as a traceback (a name without a suffix, ``curves.foo``)."""
    from gptforge.extras import require

    require("matplotlib", extra="plot", for_what="gptforge plot")
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(out).suffix.lstrip(".").lower()
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        said = f"ends in .{fmt}, which matplotlib cannot write" if fmt else "has no suffix to say the image format"
        raise ValueError(f"--image {out}: the name {said}; end it in one of {', '.join('.' + k for k in sorted(known))}")
    return fmt


def plot_runs(runs: list[str], out: str | Path, labels: str | None = None) -> Path:
    """Draw every run into one figure and save it to ``out`` (PNG, or any format matplotlib knows)."""
    from gptforge.extras import require

    fmt = image_format(out)
    matplotlib = require("matplotlib", extra="plot", for_what="gptforge plot")
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator
    names = [n.strip() for n in labels.split(",")] if labels else [Path(r).resolve().name for r in runs]
    if len(names) != len(runs):
        raise ValueError(f"labels: {len(names)} names for {len(runs)} runs")
    series = [_run_series(r) for r in runs]
    note = tokenizer_note(names, series)
    if note is not None:
        print(f"gptforge plot: warning: {note}", file=sys.stderr)
    tasks = sorted({t for s in series for t in s["eval"]})
    rl = any(s["rl"] for s in series)
    lossy = any(s["train"] or s["val"] for s in series)  # a loss row only where some run has token losses
    rows = lossy + rl + len(tasks)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, x in enumerate(("step", "tokens")):
        ax = axes[0][col]
        for i, (name, s) in enumerate(zip(names, series, strict=True)):
            if not lossy:
                break
            c = colors[i % len(colors)]
            xs, ys = _xy(s["train"], "loss", x)
            if xs:  # a run without token losses (RL) draws nothing here, not an empty legend entry
                ax.plot(xs, ys, color=c, alpha=0.35, linewidth=0.8, label=f"{name} train")
            xs, ys = _xy(s["val"], "val_loss", x)
            if xs:
                ax.plot(xs, ys, color=c, linewidth=2, marker="o" if len(xs) < 30 else None, markersize=3,
                        label=f"{name} val")
        if lossy and any(s["fineweb"] for s in series):
            ax.axhline(GPT2_124M_FINEWEB_VAL_LOSS, color="tab:red", linestyle="--", linewidth=1,
                       label=f"GPT-2 124M val ({GPT2_124M_FINEWEB_VAL_LOSS})")
        if lossy:
            ax.set_ylabel("loss (nats/token)" + (", tokens differ" if note else ""))
            title = f"loss vs {'tokens' if x == 'tokens' else 'step'}"
            if note is None:
                ax.set_title(title)
            else:  # on the axis itself: a figure shared without the terminal still says it
                ax.set_title(f"{title}\n({note})", fontsize=8, color="tab:red")
        if rl:
            ax = axes[int(lossy)][col]
            for i, (name, s) in enumerate(zip(names, series, strict=True)):
                for key, style in (("reward", "-"), ("accuracy", ":")):
                    xs, ys = _xy(s["rl"], key, x)
                    if xs:
                        ax.plot(xs, ys, color=colors[i % len(colors)], linestyle=style, linewidth=1.5,
                                marker="o" if len(xs) < 30 else None, markersize=3, label=f"{name} {key}")
            ax.set_ylabel("reward")
            ax.set_title(f"RL reward (sampled replies) vs {'tokens' if x == 'tokens' else 'step'}")
        for r, task in enumerate(tasks, start=int(lossy) + rl):
            ax = axes[r][col]
            metric, refs = TASK_REFERENCES.get(task, ("acc_norm", []))
            for i, (name, s) in enumerate(zip(names, series, strict=True)):
                recs = s["eval"].get(task, {})
                key = metric if any(metric in v for v in recs.values()) else "acc"
                xs, ys = _xy(recs, key, x)
                if xs:
                    ax.plot(xs, ys, color=colors[i % len(colors)], linewidth=2, marker="o" if len(xs) < 30 else None,
                            markersize=3, label=f"{name} {key}")
            for ref_name, value in refs:
                ax.axhline(value, color=REF_STYLES.get(ref_name, "gray"), linestyle="--", linewidth=1,
                           label=f"{ref_name} ({value})")
            ax.set_ylabel("accuracy")
            ax.set_title(f"{task} vs {'tokens' if x == 'tokens' else 'step'}")
    for row in axes:
        for col, ax in enumerate(row):
            ax.set_xlabel("tokens" if col == 1 else "step")
            if not any(len(ln.get_xdata()) for ln in ax.lines):  # e.g. RL records count steps, not tokens: say so instead of an empty 0-1 axis
                ax.text(0.5, 0.5, f"no {'token counts' if col == 1 else 'values'} in these runs' records",
                        ha="center", va="center", transform=ax.transAxes, color="gray")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            if col == 1:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 2k, 1.5M tokens
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    from gptforge.storage import atomic_path

    out = Path(out)
    with atomic_path(out, what="the plot") as tmp:  # format from the final name: the temporary has none
        fig.savefig(tmp, dpi=110, format=fmt)
    plt.close(fig)
    return out
