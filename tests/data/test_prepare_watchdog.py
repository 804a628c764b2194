"""prepare's per-document deadline: a document whose tokenization runs long (a split pattern slow only on it,
past what the load-time probe saw) stops the run in one line naming it, with the workers killed, instead of a
hang; the shards written before it are kept and a rerun resumes to the bytes of a run never stopped.

The slow tokenizer is the real GPT-2 one wrapped so that it sleeps inside its encode call on a marked
document: the stand-in for a C-level regex call that never returns (a sleeping worker cannot be interrupted
from inside either). Workers inherit the wrapper through ``fork``, as in test_prepare's dead-worker test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from gptforge.data.prepare import pipeline, workers
from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import PrepareSettings
from gptforge.data.prepare.sources import FilesSource, SourceError
from gptforge.data.prepare.workers import DOC_BUDGET_S_PER_CHAR, DOC_DEADLINE_FLOOR_S, deadline_floor, doc_deadline

MARK = "SLOWDOC"
N_DOCS, SLOW_AT = 60, 45  # the slow document comes after several shards' worth of documents


def docs() -> list[str]:
    return [f"document {i} " + "tokens in a row " * (5 + i % 7) + (MARK if i == SLOW_AT else "") for i in range(N_DOCS)]


class SlowOn:
    """The real tokenizer, except that encoding a text holding MARK sleeps ``sleep_s`` first."""

    def __init__(self, enc, sleep_s: float):
        self._enc, self._sleep = enc, sleep_s

    def __getattr__(self, name):
        return getattr(self._enc, name)

    def encode_batch_numpy(self, texts, *a, **kw):
        if any(MARK in t for t in texts):
            time.sleep(self._sleep)
        return self._enc.encode_batch_numpy(texts, *a, **kw)


def slow_tokenizer(monkeypatch, enc, sleep_s: float) -> None:
    monkeypatch.setattr(workers, "load_tokenizer", lambda spec: SlowOn(enc, sleep_s))  # fork: workers inherit it
    monkeypatch.setattr(pipeline, "load_tokenizer", lambda spec: SlowOn(enc, sleep_s))


def run(tmp_path: Path, src: Path, out: str, n_workers: int, **kw) -> dict:
    tok_dir = tmp_path / "tok"  # a tokenizer "from a file": watched even with workers 1
    tok_dir.mkdir(exist_ok=True)
    s = PrepareSettings(shard_tokens=40, val_tokens=0, workers=n_workers, chunk_docs=3, start_method="fork",
                        tokenizer=str(tok_dir))
    return prepare(FilesSource([src]), tmp_path / out, s, progress=False, **kw)


def write(tmp_path: Path, texts: list[str], name: str = "c.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return p


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.bin"))}


def test_deadline_formula():
    # the floor, until the per-character budget is more: 30 s up to 300,000 characters, then 100 us a character
    assert DOC_DEADLINE_FLOOR_S == 30.0 and DOC_BUDGET_S_PER_CHAR == 100e-6
    assert doc_deadline(0) == 30.0
    assert doc_deadline(300_000) == pytest.approx(30.0)
    assert doc_deadline(1_000_000) == pytest.approx(100.0)  # a 1M-character document: 100 s
    assert doc_deadline(10_000_000) == pytest.approx(1000.0)
    assert doc_deadline(1000, floor=0.5) == pytest.approx(0.5)
    assert doc_deadline(100_000, floor=0.5) == pytest.approx(10.0)


def test_deadline_floor_from_the_environment(monkeypatch):
    monkeypatch.delenv("GPTFORGE_DOC_DEADLINE_S", raising=False)
    assert deadline_floor() == 30.0
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "120")
    assert deadline_floor() == 120.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", bad)
        with pytest.raises(SourceError, match="GPTFORGE_DOC_DEADLINE_S.*positive number of seconds"):
            deadline_floor()


@pytest.mark.parametrize("n_workers", [1, 2])
def test_a_slow_document_is_named_and_the_shards_before_it_are_kept(tmp_path, tokenizer, monkeypatch, capsys,
                                                                       n_workers):
    slow_tokenizer(monkeypatch, tokenizer, sleep_s=20.0)  # without the watchdog: 20 s, then no error at all
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "0.5")
    src = write(tmp_path, docs())
    t0 = time.monotonic()
    with pytest.raises(SourceError) as err:
        run(tmp_path, src, "out", n_workers)
    took = time.monotonic() - t0
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{src}:{SLOW_AT + 1}: ")  # jsonl rows count from 1
    assert f"({len(docs()[SLOW_AT]):,} characters) has been tokenizing for " in msg
    ran = float(re.search(r"tokenizing for ([0-9.]+) s, past its deadline of 0.5 s ", msg).group(1))
    assert 0.5 <= ran < 5  # shown to 0.1 s
    assert "remove or split this document" in msg and "split pattern" in msg and "GPTFORGE_DOC_DEADLINE_S" in msg
    assert took < 15, took  # the deadline (0.5 s) plus worker start and kill, far below the 20 s sleep
    # the shards the manifest lists are on disk, whole, and hold documents before the slow one only
    out = tmp_path / "out"
    m = json.loads((out / "manifest.json").read_text())
    assert not m["complete"] and len(m["shards"]) >= 2
    assert m["state"]["next_item"] <= SLOW_AT
    for s in m["shards"]:
        assert hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() == s["sha256"]
    assert sorted(f.name for f in out.glob("*.bin")) == sorted(s["file"] for s in m["shards"])
    # no worker is left behind (each was killed, and the pool shut down)
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_a_long_document_gets_a_word_before_its_deadline(tmp_path, tokenizer, monkeypatch, capsys):
    # over the 2 s of the first word, under the deadline. The word comes at the first poll (0.25 s apart) past 2 s,
    # which a loaded machine may make late: the document runs 3.8 s, so a poll up to 1.8 s late still sees it;
    # a word past 4 s (the doubling's next) is allowed, for the worker may be held past 3.8 s too
    sleep_s = 3.8
    slow_tokenizer(monkeypatch, tokenizer, sleep_s=sleep_s)
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "30")
    src = write(tmp_path, docs())
    run(tmp_path, src, "out", 2)
    err = capsys.readouterr().err
    said = re.findall(r"^prepare: (.*) \(([0-9,]+) characters\) still tokenizing after ([0-9.]+) s \(stopped at 30 s\)$",
                      err, re.M)
    assert said and {(w, c) for w, c, _ in said} == {(f"{src}:{SLOW_AT + 1}", f"{len(docs()[SLOW_AT]):,}")}, err
    assert 2.0 <= float(said[0][2]) < sleep_s  # the first word after the 2 s, while the document still ran
    assert all(float(t) >= 2.0 * 2**k for k, (_, _, t) in enumerate(said)), said  # then at 4 s, 8 s: not each poll


def test_a_rerun_with_more_time_resumes_to_the_bytes_of_an_unstopped_run(tmp_path, tokenizer, monkeypatch):
    src = write(tmp_path, docs())
    # the reference: the plain tokenizer, never stopped, workers 1 in the main process
    ref_settings = PrepareSettings(shard_tokens=40, val_tokens=0, workers=1, chunk_docs=3, tokenizer="gpt2")
    prepare(FilesSource([src]), tmp_path / "ref", ref_settings, progress=False)
    ref = shard_bytes(tmp_path / "ref")
    assert len(ref) > 5

    slow_tokenizer(monkeypatch, tokenizer, sleep_s=1.5)
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "0.3")
    with pytest.raises(SourceError, match="past its deadline"):
        run(tmp_path, src, "out", 2)
    kept = shard_bytes(tmp_path / "out")
    assert kept and all(ref[k] == v for k, v in kept.items())  # what was kept is what a clean run writes
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "30")  # "if it is only slow": more time, the same command
    summary = run(tmp_path, src, "out", 2)
    assert summary["complete"] and summary["new_tokens"] < summary["tokens"]  # resumed, not started over
    assert shard_bytes(tmp_path / "out") == ref


def test_removing_the_slow_document_then_force_gives_a_clean_runs_bytes(tmp_path, tokenizer, monkeypatch):
    slow_tokenizer(monkeypatch, tokenizer, sleep_s=20.0)
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "0.3")
    texts = docs()
    src = write(tmp_path, texts)
    with pytest.raises(SourceError, match="past its deadline"):
        run(tmp_path, src, "out", 1)
    cleaned = texts[:SLOW_AT] + texts[SLOW_AT + 1:]
    os.utime(write(tmp_path, cleaned), ns=(1, 1))  # the file edited: the manifest no longer matches it
    with pytest.raises(Exception, match="changed since the shards"):
        run(tmp_path, src, "out", 1)
    run(tmp_path, src, "out", 1, force=True)  # as the refusal says
    ref_settings = PrepareSettings(shard_tokens=40, val_tokens=0, workers=1, chunk_docs=3, tokenizer="gpt2")
    prepare(FilesSource([write(tmp_path, cleaned, "clean.jsonl")]), tmp_path / "ref", ref_settings, progress=False)
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "ref")


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, tokenizer, monkeypatch, capsys):
    from gptforge.cli import main

    slow_tokenizer(monkeypatch, tokenizer, sleep_s=20.0)
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "0.3")
    src = write(tmp_path, docs())
    (tmp_path / "tok").mkdir()
    argv = ["prepare", "files", str(src), "--out", str(tmp_path / "o"), "--tokenizer", str(tmp_path / "tok"),
            "--workers", "2", "--start-method", "fork", "--shard-tokens", "40", "--val-tokens", "0", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gptforge prepare: error: {src}:{SLOW_AT + 1}: ")
    monkeypatch.setenv("GPTFORGE_DOC_DEADLINE_S", "soon")  # a bad setting: refused before any work
    assert main([*argv[:4], str(tmp_path / "o2"), *argv[5:]]) == 2
    assert "GPTFORGE_DOC_DEADLINE_S='soon'" in capsys.readouterr().err and not (tmp_path / "o2").exists()


@pytest.mark.lane
def test_a_real_split_pattern_slow_on_one_document_is_stopped(tmp_path):
    """End to end, nothing injected: a tokenizer.json made by the tokenizers library whose split pattern is
    quadratic only on runs of 'xy' (no run the load-time probe tries), the CLI with its default spawn workers.
    A 400,000-character document of 'xy' takes ~60 s of CPU to split here (1.7 s at 65,536 characters, x4 for
    each 2x); its deadline is 40 s (100 us a character). ~45 s a worker count."""
    import subprocess
    import sys

    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    pre = tokenizers.pre_tokenizers
    tok.pre_tokenizer = pre.Sequence([pre.Split(tokenizers.Regex(r"(?:xy)+z|[a-w]+|\s+|."), "isolated"),
                                      pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=pre.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world the model tokens"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = [f"document {i} hello world the model tokens " * 20 for i in range(300)]
    texts[200] = "xy" * 200_000
    src = write(tmp_path, texts)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    env.pop("GPTFORGE_DOC_DEADLINE_S", None)
    for n_workers in ("1", "2"):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "gptforge", "prepare", "files", str(src), "--out",
                            str(tmp_path / f"o{n_workers}"), "--tokenizer", str(tmp_path / "tokenizer.json"),
                            "--workers", n_workers, "--shard-tokens", "2000", "--val-tokens", "0",
                            "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2, r.stderr[-2000:]
        assert last.startswith(f"gptforge prepare: error: {src}:201: this document (400,000 characters)"), last
        assert "past its deadline of 40 s" in last
        assert f"{src}:201 (400,000 characters) still tokenizing after 2." in r.stderr  # the first word, at ~2 s
        assert 40 <= took < 120, took
