"""The tool commands (plot, bench, plan, race, tokenizer train, --help-config) under careless and hostile
input: a value of the wrong kind in a metrics file, sizes at the edges, a flag every override-taking command
should have. Each refusal is one line naming the flag or key, exit 2, nothing written; each accepted input
gives correct output."""

from __future__ import annotations

import json
import math

import pytest

from gptforge.cli import main


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
