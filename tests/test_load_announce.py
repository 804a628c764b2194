"""Loading a model says what it reads (kind, path, size) once it lasts past ``load.ANNOUNCE_AFTER_S``,
from the one door every command loads through (issue 55: no silent minute)."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from gptforge import load
from gptforge.cli import main
from gptforge.load import ModelSource, describe_source
from tests.conftest import tiny_chat_checkpoint

UNITS = {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def _size_said(line: str) -> float:
    """The byte count a line states, e.g. ``(1.2 MB)`` -> 1.2e6."""
    m = re.search(r"\((\d+(?:\.\d+)?) (bytes|kB|MB|GB)", line)
    assert m, line
    return float(m.group(1)) * UNITS[m.group(2)]


@pytest.mark.parametrize("kind,said,n", [("gguf", "GGUF file", 1_234_567), ("llmc", "llm.c model file", 2_345),
                                         ("gguf", "GGUF file", 999)])
def test_a_file_is_named_with_its_kind_and_size(tmp_path, kind, said, n):
    f = tmp_path / "m.bin"
    f.write_bytes(b"\0" * n)
    line = describe_source(ModelSource(**{kind: str(f)}))
    assert line.startswith(f"{said} {f} (")
    # one decimal of the unit: the stated size is within half a unit's tenth of the true one
    assert abs(_size_said(line) - n) <= 0.05 * max(u for u in UNITS.values() if u <= n), line


def test_directories_count_their_weight_files_only(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    (hf / "tokenizer.json").write_bytes(b"\0" * 900_000)  # not weights
    line = describe_source(ModelSource(hf=str(hf)))
    assert line.startswith(f"Hugging Face directory {hf} (") and _size_said(line) == 3.0e6, line
    where = tiny_chat_checkpoint(tmp_path / "run")
    line = describe_source(ModelSource(ckpt=str(tmp_path / "run")))  # a run: its newest checkpoint is named
    n = (where / "model.safetensors").stat().st_size  # optimizer.pt and meta.json are not the model
    assert line.startswith(f"gptforge checkpoint {where} (") and abs(_size_said(line) - n) <= 0.05e6, (line, n)  # 6.5 MB: a tenth of a MB


def test_a_missing_source_is_named_as_given_and_left_to_its_loader(tmp_path):
    assert describe_source(ModelSource(ckpt=str(tmp_path / "nope"))) == f"ckpt {tmp_path / 'nope'}"


class _Stamped(io.StringIO):
    """stderr that remembers when each write came."""

    def __init__(self) -> None:
        super().__init__()
        self.when: list[tuple[float, str]] = []

    def write(self, s: str) -> int:
        self.when.append((time.perf_counter(), s))
        return super().write(s)


def test_a_slow_load_says_what_it_reads_while_it_reads(tmp_path, monkeypatch):
    where = tiny_chat_checkpoint(tmp_path / "run")
    real = load._load_model
    err = _Stamped()
    spent = []

    def slow(source):
        # the load goes on until the word is out (30 s at most: a load that ends first proves the word late),
        # then 1 s more: "while it reads" holds by construction, with no race of the 0.1 s timer on a loaded machine
        t_in = time.perf_counter()
        while not any(s.startswith("loading") for _, s in list(err.when)):
            assert time.perf_counter() - t_in < 30, "no word while the load ran (30 s)"
            time.sleep(0.01)
        time.sleep(1.0)
        spent.append(time.perf_counter() - t_in)
        return real(source)

    monkeypatch.setattr(load, "_load_model", slow)
    monkeypatch.setattr(load, "ANNOUNCE_AFTER_S", 0.1)
    monkeypatch.setattr("sys.stderr", err)
    t0 = time.perf_counter()
    load.load_model(ModelSource(ckpt=str(where)))
    t1 = time.perf_counter()
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(f"loading gptforge checkpoint {where} (") and lines[0].endswith(" ..."), lines
    took = float(re.fullmatch(r"loaded in (\d+\.\d) s", lines[1]).group(1))
    # one decimal; at least the stand-in load's own time, at most the test's clock around load_model
    assert spent[0] <= took + 0.05 and took <= t1 - t0 + 0.05, (took, spent, t1 - t0)


def test_a_fast_load_prints_nothing(monkeypatch, capsys):
    """Under the default threshold a load that returns at once (a stand-in loader: a real one's time depends
    on the machine's load) prints nothing, then or later."""
    monkeypatch.setattr(load, "ANNOUNCE_AFTER_S", 1.0)  # the default (the suite's own is 600 s: tests/conftest.py)
    monkeypatch.setattr(load, "_load_model", lambda source: "model")
    assert load.load_model(ModelSource(random="d2")) == "model"
    time.sleep(load.ANNOUNCE_AFTER_S + 0.2)  # past the threshold: a timer left running would have printed by now
    assert capsys.readouterr().err == ""


def test_a_failed_slow_load_leaves_its_error_last(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(load, "ANNOUNCE_AFTER_S", 0.0)
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a gguf")
    assert main(["sample", "--gguf", str(bad)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"loading GGUF file {bad} (10 bytes) ...", lines
    assert not any(ln.startswith("loaded in") for ln in lines) and str(bad) in lines[-1], lines


def test_every_command_inherits_it(tmp_path, monkeypatch, capsys):
    """``sample`` is a command like the others: the line comes from the loader, before its output."""
    monkeypatch.setattr(load, "ANNOUNCE_AFTER_S", 0.0)
    where = tiny_chat_checkpoint(tmp_path / "run")
    assert main(["sample", "--ckpt", str(where), "--max-new-tokens", "2", "--num-samples", "1",
                 "--temperature", "0"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"loading gptforge checkpoint {Path(where)} (") and err[1].startswith("loaded in"), err


def test_at_once_means_before_the_block_runs(monkeypatch, capsys):
    """``announce_after=0`` (serve) prints in the calling thread before the load starts: no timer thread that a
    busy machine could schedule after the load began (a timer that never fires stands in for one)."""
    import threading

    class NeverFires(threading.Timer):
        def start(self):
            pass

    monkeypatch.setattr(load.threading, "Timer", NeverFires)
    with load.Announce("GGUF file m.gguf (1.0 MB)", after=0):
        assert capsys.readouterr().err == "loading GGUF file m.gguf (1.0 MB) ...\n"


def test_the_threshold_comes_from_the_environment_when_set():
    """GPTFORGE_ANNOUNCE_AFTER sets the threshold (the suite sets it to 600 s); unset, it is 1 s."""
    import os
    import subprocess
    import sys

    code = "from gptforge import load; print(load.Announce('x').after)"  # read when a load starts, not at import
    for env, want in (({"GPTFORGE_ANNOUNCE_AFTER": "2.5"}, "2.5"), ({}, "1.0")):
        base = {k: v for k, v in os.environ.items() if k != "GPTFORGE_ANNOUNCE_AFTER"}
        out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                             timeout=120)
        assert out.stdout.strip() == want, out.stderr
