"""A run's summary times the whole command, not only its training loop (issue 55: DPO's summary said 1m47s
of a 5m26s run): the time the user waited, as the test's own clock measures around the command, with the
loop's share beside it."""

from __future__ import annotations

import re
import time

from gptforge.cli import main
from tests.training.commands import RUNS, make_world

PAUSE = 1.2  # seconds added outside the loop (in the reference pass): the summary's whole time must hold them


def test_dpo_summary_counts_the_reference_pass_and_loading(tmp_path, monkeypatch, capsys):
    from gptforge.training import dpo

    world = make_world(tmp_path / "w")
    real = dpo.reference_logps

    def slow(*a, **k):
        time.sleep(PAUSE / 2)  # twice: train and val pairs
        return real(*a, **k)

    monkeypatch.setattr(dpo, "reference_logps", slow)
    # the test's clock starts where the command's does (cli.main's first call), so what lies between the two
    # clocks is no import or set-up a loaded machine can stretch, only the summary's print and main's return
    from gptforge.cli import common

    starts, real_mark = [], common.mark_command_start

    def mark():
        starts.append(time.perf_counter())
        real_mark()

    monkeypatch.setattr(common, "mark_command_start", mark)
    assert main([*RUNS[("dpo", None)](world), "--out", str(tmp_path / "dpo")]) == 0
    wall = time.perf_counter() - starts[0]
    out = capsys.readouterr().out
    m = re.search(r"^time        0m(\d\d)s \(the whole command; 0m(\d\d)s in the training loop\)$", out, re.M)
    assert m, out
    whole, loop = int(m.group(1)), int(m.group(2))  # whole seconds, rounded down
    # the command's time from its start: not more than the test's clock; less by the rounding down (1 s) and the
    # moments between the summary's clock reading and main's return (0.5 s: far more than a print takes)
    assert wall - 1.5 < whole <= wall, (whole, wall)
    assert whole >= loop + 1, (whole, loop)  # floor(loop + 1.2 + loading) >= floor(loop) + 1


def test_a_library_summary_has_only_the_loops_time(tmp_path):
    from gptforge.cli.common import summary
    from gptforge.training.loop import RunResult

    text = summary(RunResult(run_dir=tmp_path, steps_done=4, seconds=75.0), "train")
    assert "time        1m15s\n" in text + "\n"
