"""Tokens-to-target benchmark: train presets on the same data until a target validation loss.

    gptforge race shakespeare-cpu speedrun-d4 --data.dir data/shakespeare_plays --out runs/race

A preset may carry its own overrides, ``PRESET,section.key=value,...`` (e.g.
``speedrun-d4,optim.name=adamw`` races the recipe with one switch turned off). Each preset trains in turn (``train()`` with validation every ``max_steps / evals`` steps, on the
same data and the same validation tokens) and stops at the first validation at or below the
target. The target defaults to the first preset's final validation loss, so the first preset runs
its whole schedule and the others race to where it ended. Reported per preset, read back from its
``metrics.jsonl``: steps, tokens, training seconds (the sum of step times) and wall seconds (with
validation) to the target, and the first preset's tokens to target divided by each one's (the
speed-up). Writes ``race.json`` and ``race.png`` (val loss against tokens; needs matplotlib, extra
``plot``) under ``--out``. A preset that never reaches the target is reported with ``reached:
false``. Stopping at a validation point means the tokens are exact to within ``val_every`` steps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.run.metrics import read_metrics


def race_configs(presets: list[str], overrides: list[str], out_dir: Path, evals: int) -> list[Config]:
    """Each preset's config with the shared overrides, frequent validation and the same val tokens."""
    from gptforge.presets import get_preset

    if len(presets) < 2:
        raise ConfigError("race needs at least two presets (the first sets the target)")
    if len(set(presets)) != len(presets):
        raise ConfigError(f"race: preset named twice in {presets}; each runs into its own directory")
    if evals < 1:
        raise ConfigError(f"race --evals {evals}: expected validations per run >= 1")
    cfgs = []
    for spec in presets:
        name, *own = spec.split(",")
        pairs = []
        for kv in own:
            if "=" not in kv:
                raise ConfigError(f"race: {spec!r}: per-preset overrides look like PRESET,section.key=value,...")
            k, v = kv.split("=", 1)
            pairs += [f"--{k}", v]
        cfg = apply_overrides(get_preset(name), [*overrides, *pairs])
        cfg.train.out_dir = str(out_dir / run_folder(spec, {Path(c.train.out_dir).name for c in cfgs}))
        cfg.train.val_every = max(1, cfg.train.max_steps // evals)
        cfg.train.ckpt_every = 0  # only the final (or stopping) checkpoint
        cfgs.append(cfg)
    dirs = {c.data.dir for c in cfgs}
    if len(dirs) > 1:
        raise ConfigError(f"race: the presets read different data ({sorted(dirs)}); set --data.dir for all of them")
    first = cfgs[0].train
    for c in cfgs[1:]:  # the same validation tokens: the val split from its start, as many tokens as the first's
        c.train.val_tokens = first.val_tokens
        if c.train.seq_len != first.seq_len:
            raise ConfigError(
                f"race: train.seq_len differs ({first.seq_len} vs {c.train.seq_len}); val loss is only comparable "
                "at one context length: set --train.seq_len for all presets"
            )
    return cfgs


def check_race_inputs(cfgs: list[Config]) -> None:
    """What ``train()`` would refuse, for every preset before the first trains (a later preset's bad
    config or data must not surface after an hour of the first): the config's cross-checks, the eval
    tasks, the run directory, and every shard of both splits against the model's vocabulary."""
    from gptforge.data.shards import check_token_ids, list_shards, read_shard
    from gptforge.run.preflight import check_run_dir
    from gptforge.runtime import launched_world
    from gptforge.training.evaluate import check_tasks

    largest: dict[Path, int] = {}  # each shard is read once, however many presets share it
    for cfg in cfgs:
        cfg.validate(launched_world())
        check_tasks(cfg)
        check_run_dir(cfg.train.out_dir)
        for split, other in ((cfg.data.train_split, cfg.data.val_split), (cfg.data.val_split, cfg.data.train_split)):
            for f in list_shards(cfg.data.dir, split, other):
                if f not in largest:
                    toks = read_shard(f)
                    largest[f] = int(toks.max()) if toks.size else -1
                if largest[f] >= cfg.model.vocab_size:
                    check_token_ids(f, cfg.model.vocab_size)  # raises, naming the id, its offset and the fix


def run_folder(spec: str, taken: set[str]) -> str:
    """A folder name for a race entry (``speedrun-d4,optim.name=adamw`` -> ``speedrun-d4_optim.name-adamw``):
    letters, digits, ``.``, ``_`` and ``-`` only (no commas, ``=``, spaces or slashes to quote in a
    shell; no leading dot or dash), unique among ``taken``."""
    import re

    name = re.sub(r"=", "-", spec.replace(",", "_"))
    name = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]+", "_", name)).strip("._-") or "run"
    base, i = name, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def summarize(run_dir: Path, target: float) -> dict[str, Any]:
    """Steps, tokens and seconds to the first val loss <= target, from a run's metrics.jsonl."""
    records = read_metrics(run_dir / "metrics.jsonl")
    start = next(r for r in records if r["kind"] == "start")
    train = {r["step"]: r for r in records if r["kind"] == "train"}
    # a non-finite val loss is written as null (MetricsLog): no point on the curve, and never "reached"
    every = sorted((r for r in records if r["kind"] == "val"), key=lambda r: r["step"])
    val = [r for r in every if _finite(r.get("val_loss"))]
    hit = next((r for r in val if r["val_loss"] <= target), None)
    out: dict[str, Any] = {  # the final val loss as written: None (printed "none") when the run ended diverged
        "run_dir": str(run_dir), "reached": hit is not None,
        "final_val_loss": every[-1].get("val_loss") if every and _finite(every[-1].get("val_loss")) else None,
        "val_curve": [[r["tokens"], r["val_loss"]] for r in val],
    }
    if hit is not None:
        step = hit["step"]
        out.update(steps=step, tokens=hit["tokens"],
                   train_seconds=round(sum(train[s]["dt_ms"] for s in train if s <= step) / 1000, 3),
                   wall_seconds=round(hit["time"] - start["time"], 3), val_loss=hit["val_loss"])
    return out


def run_race(presets: list[str], overrides: list[str], out_dir: str | Path = "runs/race", target: float | None = None,
             evals: int = 20, plot: bool = True) -> dict[str, Any]:
    """Train every preset to the target; write and return the race summary (see the module docstring)."""
    from gptforge.training.loop import train

    out_dir = Path(out_dir)
    cfgs = race_configs(presets, overrides, out_dir, evals)
    check_race_inputs(cfgs)  # every preset, before the first one trains
    if plot:  # before any training: a missing matplotlib is one line and exit 2, not a lost race
        from gptforge.extras import require

        require("matplotlib", extra="plot", for_what="gptforge race's race.png (--no-plot skips it)")
    target_from = "--target" if target is not None else presets[0]
    results: dict[str, dict[str, Any]] = {}
    for i, (name, cfg) in enumerate(zip(presets, cfgs, strict=True)):
        res = train(cfg, force=True, stop_at_val_loss=target)
        if res.stop_reason == "signal" and not (target is not None and min(res.val_losses.values(), default=2e9) <= target):
            raise KeyboardInterrupt(f"race stopped during {name} (signal); its run is in {cfg.train.out_dir}")
        if i == 0 and target is None:
            if not res.val_losses:
                raise ConfigError(f"race: {name} produced no validation loss to use as the target")
            target = res.val_losses[max(res.val_losses)]
            if not math.isfinite(target):
                raise ConfigError(f"race: {name}'s final val loss is {target} (it diverged), no target to race to; "
                                  "lower its --optim.lr or give --target")
        results[name] = {"preset": name, "max_steps": cfg.train.max_steps,
                         "tokens_per_step": cfg.train.total_batch_tokens, **summarize(Path(cfg.train.out_dir), target)}
    base = results[presets[0]]
    for r in results.values():
        r["token_ratio"] = round(base["tokens"] / r["tokens"], 4) if r["reached"] and base["reached"] else None
        r["time_ratio"] = round(base["train_seconds"] / r["train_seconds"], 4) \
            if r["reached"] and base["reached"] and r["train_seconds"] > 0 else None
    summary = {"target_val_loss": target, "target_from": target_from,
               "data_dir": cfgs[0].data.dir, "val_tokens": cfgs[0].train.val_tokens, "overrides": list(overrides),
               "runs": [results[n] for n in presets]}
    out_dir.mkdir(parents=True, exist_ok=True)
    from gptforge.storage import write_json

    write_json(out_dir / "race.json", _standard(summary), allow_nan=False)
    if plot:
        summary["plot"] = str(plot_race(summary, out_dir / "race.png"))
    return summary


def _standard(obj: Any) -> Any:
    """Standard JSON: a non-finite float (a diverged run's loss) becomes null, at any depth."""
    if isinstance(obj, dict):
        return {k: _standard(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_standard(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def plot_race(summary: dict[str, Any], out: Path) -> Path:
    from gptforge.extras import require

    matplotlib = require("matplotlib", extra="plot", for_what="gptforge race's race.png (--no-plot skips it)")
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in summary["runs"]:
        xs, ys = zip(*r["val_curve"], strict=True) if r["val_curve"] else ((), ())
        label = r["preset"] + (f" ({r['tokens']:,} tokens to target)" if r["reached"] else " (not reached)")
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=2, label=label)
    ax.axhline(summary["target_val_loss"], color="gray", linestyle="--", linewidth=1,
               label=f"target {summary['target_val_loss']:.4f}")
    ax.set_xlabel("tokens")
    ax.set_ylabel("val loss")
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("race: val loss vs tokens")
    fig.tight_layout()
    from gptforge.storage import atomic_path

    with atomic_path(out, what="the race plot") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


def format_race(summary: dict[str, Any]) -> str:
    """The race's table; the preset column is as wide as the longest name, so long names keep the columns."""
    w = max([24, *(len(str(r["preset"])) for r in summary["runs"])])
    lines = [f"target val loss {summary['target_val_loss']:.4f} ({summary['target_from']})",
             f"{'preset':<{w}} {'reached':>7} {'steps':>7} {'tokens':>12} {'train s':>9} {'x tokens':>9}"]
    for r in summary["runs"]:
        if r["reached"]:  # no ratio when the first preset missed an explicit --target
            ratio = f"{r['token_ratio']:>9.2f}" if r["token_ratio"] is not None else f"{'-':>9}"
            lines.append(f"{r['preset']:<{w}} {'yes':>7} {r['steps']:>7} {r['tokens']:>12,} {r['train_seconds']:>9.1f} "
                         f"{ratio}")
        else:
            final = r.get("final_val_loss")
            final = f"{final:.4f}" if isinstance(final, (int, float)) else "none"
            lines.append(f"{r['preset']:<{w}} {'no':>7} {'-':>7} {'-':>12} {'-':>9} {'-':>9}  (final val loss {final})")
    return "\n".join(lines)
