"""prepare files / fineweb: shards equal a plain single-process tokenization, for any worker count,
after any interruption, and bad input is reported or counted as specified."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from gptforge.cli import main
from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import PrepareSettings
from gptforge.data.prepare.sources import FilesSource, HFStreamSource, SourceError
from gptforge.data.shards import ShardError, read_header, read_shard

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SHARD = 2000  # tokens per shard in these tests: ~8 shards, many documents straddle a boundary
WORDS = ["the", "model", "café", "naïve", "言語", "tokens", "shard", "\n", "  ", "1234", "données", "🙂", "it's", "GPT", "<|endoftext|>"]


def make_docs(n: int = 160, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 150))) for _ in range(n)]


def fineweb_table(docs: list[str]) -> pa.Table:
    """FineWeb's parquet schema (text, id, dump, url, date, file_path, language, language_score, token_count)."""
    n = len(docs)
    return pa.table({
        "text": docs, "id": [f"<urn:uuid:{i:08d}>" for i in range(n)], "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{i}" for i in range(n)], "date": ["2024-02-20T00:00:00Z"] * n,
        "file_path": ["s3://commoncrawl/x.warc.gz"] * n, "language": ["en"] * n,
        "language_score": [0.9] * n, "token_count": [0] * n,
    })


def write_parquet(path: Path, docs: list[str], row_group: int = 25) -> Path:
    pq.write_table(fineweb_table(docs), path, row_group_size=row_group)
    return path


def write_jsonl(path: Path, rows: list, gz: bool = False) -> Path:
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def reference_shards(enc, docs: list[str], size: int = SHARD, val: int | None = None) -> list[np.ndarray]:
    """The straightforward way: tokenize everything in one process, the first `val` tokens (default
    `size`) are the val shard, then cut every `size` tokens. Empty documents give no tokens."""
    stream = np.array([t for d in docs if d for t in [enc.eot_token, *enc.encode_ordinary(d)]], dtype=np.int64)
    val = size if val is None else val
    return [stream[:val]] + [stream[i : i + size] for i in range(val, len(stream), size)]


def shard_files(out: Path) -> list[Path]:
    return sorted(out.glob("*.bin"), key=lambda p: p.name.split("_")[-1])


def assert_matches(out: Path, ref: list[np.ndarray], name: str = "data") -> None:
    files = shard_files(out)
    assert [f.name for f in files] == [f"{name}_{'val' if i == 0 else 'train'}_{i:06d}.bin" for i in range(len(ref))]
    for f, r in zip(files, ref, strict=True):
        np.testing.assert_array_equal(np.asarray(read_shard(f), dtype=np.int64), r)
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["tokens"] == sum(map(len, ref))
    for f, s in zip(files, m["shards"], strict=True):
        assert s["file"] == f.name and s["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()


def file_bytes(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in shard_files(out)}


def settings(**kw) -> PrepareSettings:
    """Val shard = one shard's worth, uncapped: shards cut every `shard_tokens` from the start, as
    reference_shards does (the val sizing of small corpora is tested in test_prepare_val.py)."""
    kw = {"shard_tokens": SHARD, "workers": 1, "chunk_docs": 7, **kw}
    kw.setdefault("val_tokens", kw["shard_tokens"])
    kw.setdefault("val_max_fraction", 1.0)
    return PrepareSettings(**kw)


def test_parquet_shards_equal_reference(tmp_path, tokenizer):
    docs = make_docs()
    src = FilesSource([write_parquet(tmp_path / "fw.parquet", docs)])
    summary = prepare(src, tmp_path / "out", settings(), progress=False)
    ref = reference_shards(tokenizer, docs)
    assert len(ref) >= 5 and summary["documents"] == len(docs) and summary["val_tokens"] == SHARD
    assert_matches(tmp_path / "out", ref)
    assert read_header(shard_files(tmp_path / "out")[0])[0] == 20240520  # GPT-2 vocab: uint16 format


def test_workers_and_formats_give_identical_bytes(tmp_path, tokenizer):
    """1 worker in-process vs 2 spawned workers; parquet vs jsonl vs jsonl.gz of the same documents."""
    docs = make_docs(seed=1)
    pq_src = FilesSource([write_parquet(tmp_path / "a.parquet", docs)])
    half = len(docs) // 2
    d = tmp_path / "js"
    d.mkdir()  # a folder: files are taken in sorted order
    write_jsonl(d / "0.jsonl", [{"text": t, "id": i} for i, t in enumerate(docs[:half])])
    write_jsonl(d / "1.jsonl.gz", [{"text": t} for t in docs[half:]] + [""], gz=True)  # blank line: ignored
    one = prepare(pq_src, tmp_path / "w1", settings(), progress=False)
    two = prepare(pq_src, tmp_path / "w2", settings(workers=2, start_method="spawn"), progress=False)
    js = prepare(FilesSource([d]), tmp_path / "js_out", settings(workers=2), progress=False)
    assert file_bytes(tmp_path / "w1") == file_bytes(tmp_path / "w2") == file_bytes(tmp_path / "js_out")
    assert one["documents"] == two["documents"] == js["documents"] == len(docs)
    assert two["peak_rss_mb"]["largest_worker"] > 0


def test_txt_files_are_one_document_each(tmp_path, tokenizer):
    docs = make_docs(12, seed=2)
    for i, t in enumerate(docs):
        (tmp_path / f"{i:02d}.txt").write_text(t, encoding="utf-8")
    prepare(FilesSource([tmp_path]), tmp_path / "out", settings(shard_tokens=300), progress=False)
    assert_matches(tmp_path / "out", reference_shards(tokenizer, docs, 300))


class Crash(Exception):
    pass


class CrashingSource(FilesSource):
    """Raises after yielding `after` items: a crash in the middle of a shard."""

    def __init__(self, paths, after: int):
        super().__init__(paths)
        self.after = after

    def items(self, start=0):
        for k, item in enumerate(super().items(start)):
            if k == self.after:
                raise Crash(f"simulated crash after {k} items")
            yield item


def test_interrupted_runs_resume_to_identical_bytes(tmp_path, tokenizer):
    docs = make_docs(seed=3)
    path = write_parquet(tmp_path / "fw.parquet", docs, row_group=10)
    out = tmp_path / "out"
    stamps: dict[str, tuple] = {}
    crashes = 0
    for after in [23, 5, 41, 17, 30, 11, 64, 9, 50, 40, 40, 40]:
        try:
            prepare(CrashingSource([path], after), out, settings(workers=2 if after % 2 else 1), progress=False)
            break
        except Crash:
            crashes += 1
        m = json.loads((out / "manifest.json").read_text())
        for s in m["shards"]:  # a finished shard is never rewritten
            st = (out / s["file"]).stat()
            stamps.setdefault(s["file"], (st.st_ino, st.st_mtime_ns))
            assert stamps[s["file"]] == (st.st_ino, st.st_mtime_ns)
    else:
        prepare(FilesSource([path]), out, settings(), progress=False)
    assert crashes >= 5 and len(stamps) >= 3
    assert_matches(out, reference_shards(tokenizer, docs))
    # a finished run is not redone
    before = {f.name: f.stat().st_mtime_ns for f in shard_files(out)}
    again = prepare(FilesSource([path]), out, settings(), progress=False)
    assert again["new_tokens"] == 0 and {f.name: f.stat().st_mtime_ns for f in shard_files(out)} == before


def _processes_with_env(entry: str) -> list[int]:
    """PIDs of live processes whose environment holds ``entry`` (Linux /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if entry.encode() in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_sigkill_mid_shard_then_resume(tmp_path, tokenizer):
    """A real SIGKILL (no cleanup runs) with 2 spawned workers, then leftovers of a kill inside
    write_shard; the resumed run trusts none of them and ends byte-identical to the reference."""
    docs = make_docs(seed=4)
    path = write_parquet(tmp_path / "fw.parquet", docs)
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        from gptforge.data.prepare.pipeline import prepare
        from gptforge.data.prepare.settings import PrepareSettings
        from gptforge.data.prepare.sources import FilesSource
        class Killed(FilesSource):
            def items(self, start=0):
                for k, item in enumerate(super().items(start)):
                    if k == 70:
                        os.kill(os.getpid(), signal.SIGKILL)
                    yield item
        prepare(Killed([{str(path)!r}]), {str(out)!r},
                PrepareSettings(shard_tokens={SHARD}, val_tokens=200, workers=2, chunk_docs=7), progress=False)
    """)
    marker = f"GPTFORGE_TEST_MARK={tmp_path.name}"
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "GPTFORGE_TEST_MARK": tmp_path.name},
                       timeout=120)
    assert r.returncode == -9
    # the killed run's workers notice they were orphaned and exit (they would otherwise wait forever): at once by
    # the parent-death signal, or within their 1 s poll; 30 s leaves a loaded machine room for a spawned worker
    # still importing when its parent died (the loop ends as soon as they are gone)
    deadline = time.time() + 30
    while _processes_with_env(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert not _processes_with_env(marker)
    m = json.loads((out / "manifest.json").read_text())
    n_done = len(m["shards"])
    # a val shard of 200 tokens (decided once the corpus passed 2000 tokens: 10%), then SHARD-token train shards
    ref = reference_shards(tokenizer, docs, val=200)
    assert 1 <= n_done < len(ref) and not m["complete"]
    # what a kill inside write_shard / between rename and manifest leaves behind
    (out / f"data_train_{n_done:06d}.bin.tmp").write_bytes(b"\0" * 100)
    (out / f"data_train_{n_done:06d}.bin").write_bytes(b"garbage")
    assert main(["prepare", "files", str(path), "--out", str(out), "--shard-tokens", str(SHARD),
                 "--val-tokens", "200", "--workers", "1", "--no-progress"]) == 0
    assert not list(out.glob("*.tmp"))
    assert_matches(out, ref)


# file fsyncs: manifest, tokenizer/info.json, manifest (val size decided), shard 0, manifest, shard 1 (6),
# manifest (7); each is followed by the folder's fsync (its rename), not counted
@pytest.mark.parametrize("fail_at", [6, 7])
def test_full_disk_leaves_no_trusted_partial_shard(tmp_path, tokenizer, monkeypatch, fail_at):
    import gptforge.data.shards as shards

    docs = make_docs(seed=5)
    path = write_parquet(tmp_path / "fw.parquet", docs)
    out = tmp_path / "out"
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):  # the folder's fsync after a rename: not a file write
            return real_fsync(fd)
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(28, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(shards.os, "fsync", failing_fsync)  # the os module: shard and manifest writes
    with pytest.raises(OSError, match="(?i)no space left"):  # DiskFullError (a shard) or the raw OSError
        prepare(FilesSource([path]), out, settings(), progress=False)
    monkeypatch.undo()
    assert not list(out.glob("*.tmp"))
    m = json.loads((out / "manifest.json").read_text())
    listed = [s["file"] for s in m["shards"]]
    assert len(listed) == 1 and not m["complete"]
    assert [f.name for f in shard_files(out)] == listed + ([] if fail_at == 6 else ["data_train_000001.bin"])
    prepare(FilesSource([path]), out, settings(), progress=False)
    assert_matches(out, reference_shards(tokenizer, docs))


def bad_jsonl(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    good = make_docs(30, seed=6)
    rows = [{"text": t} for t in good[:10]]
    rows.append('{"text": "broken json')  # line 11
    rows += [{"text": t} for t in good[10:20]]
    rows.append({"content": "no text field"})  # line 22
    rows.append({"text": ""})  # line 23: empty document: not bad, skipped and counted apart
    rows += [{"text": t} for t in good[20:]]
    p = write_jsonl(tmp_path / "bad.jsonl", rows)
    raw = p.read_bytes().replace(b"\n", b'\n{"text": "caf\xe9 latin-1"}\n', 1)  # line 2: not UTF-8
    p.write_bytes(raw)
    return p, good, [f"{p}:2", f"{p}:12", f"{p}:23"]


def test_bad_rows_named_or_skipped_and_counted(tmp_path, tokenizer, capsys):
    p, good, where = bad_jsonl(tmp_path)
    with pytest.raises(SourceError, match=f"{p}:2: not valid UTF-8"):
        prepare(FilesSource([p]), tmp_path / "strict", settings(), progress=False)
    # the CLI: exit status 2, file and row named
    assert main(["prepare", "files", str(p), "--out", str(tmp_path / "cli"), "--no-progress"]) == 2
    assert f"{p}:2" in capsys.readouterr().err
    summary = prepare(FilesSource([p]), tmp_path / "skip", settings(skip_bad=True), progress=False)
    m = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert summary["skipped"] == m["state"]["skipped"] == 3 and summary["documents"] == len(good)
    assert summary["empty_documents"] == m["state"]["empty_documents"] == 1
    assert [e["where"] for e in m["state"]["skipped_examples"]] == where
    reasons = " ".join(e["reason"] for e in m["state"]["skipped_examples"])
    for words in ("UTF-8", "JSON", "no field 'text'"):
        assert words in reasons
    assert_matches(tmp_path / "skip", reference_shards(tokenizer, good))


def test_corrupt_and_truncated_files(tmp_path, tokenizer):
    docs = make_docs(40, seed=7)
    gz = write_jsonl(tmp_path / "a.jsonl.gz", [{"text": t} for t in docs], gz=True)
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])  # truncated download
    with pytest.raises(SourceError, match="a.jsonl.gz:.*truncated or corrupt"):
        prepare(FilesSource([gz]), tmp_path / "o1", settings(), progress=False)
    s = prepare(FilesSource([gz]), tmp_path / "o2", settings(skip_bad=True), progress=False)
    assert s["skipped"] == 1 and 0 < s["documents"] < len(docs)
    # the documents read before the cut are intact
    assert_matches(tmp_path / "o2", reference_shards(tokenizer, docs[: s["documents"]]))

    broken = tmp_path / "b.parquet"
    write_parquet(broken, docs)
    broken.write_bytes(broken.read_bytes()[:-100])  # footer gone
    with pytest.raises(SourceError, match="b.parquet.*not a readable parquet"):
        prepare(FilesSource([broken]), tmp_path / "o3", settings(), progress=False)
    # skipped, it leaves no text at all: refused, never a "complete" folder without a shard
    with pytest.raises(SourceError, match=r"b.parquet: no text to tokenize \(0 empty documents, 1 bad rows skipped"):
        prepare(FilesSource([broken]), tmp_path / "o4", settings(skip_bad=True), progress=False)
    s = prepare(FilesSource([broken, gz]), tmp_path / "o4b", settings(skip_bad=True), progress=False)
    assert s["skipped"] == 2 and s["documents"] > 0 and s["complete"]

    binary = tmp_path / "c.parquet"  # a binary text column with one invalid UTF-8 value and one null
    values = [d.encode() for d in docs[:5]] + [b"\xff\xfe bad", None]
    pq.write_table(pa.table({"text": pa.array(values, type=pa.binary())}), binary)
    with pytest.raises(SourceError, match=r"c.parquet:5: not valid UTF-8"):
        prepare(FilesSource([binary]), tmp_path / "o5", settings(), progress=False)
    s = prepare(FilesSource([binary]), tmp_path / "o6", settings(skip_bad=True), progress=False)
    assert (s["documents"], s["skipped"]) == (5, 2)

    with pytest.raises(SourceError, match="no column 'body'.*--text-field"):
        prepare(FilesSource([write_parquet(tmp_path / "d.parquet", docs)], text_field="body"), tmp_path / "o7",
                settings(), progress=False)


def test_changed_settings_refused_unless_forced(tmp_path, tokenizer):
    path = write_parquet(tmp_path / "fw.parquet", make_docs(50, seed=8))
    out = tmp_path / "out"
    prepare(FilesSource([path]), out, settings(), progress=False)
    with pytest.raises(ShardError, match="other settings.*--force"):
        prepare(FilesSource([path]), out, settings(shard_tokens=999), progress=False)
    prepare(FilesSource([path]), out, settings(shard_tokens=999), progress=False, force=True)
    assert all(s["tokens"] <= 999 for s in json.loads((out / "manifest.json").read_text())["shards"])
    shard = shard_files(out)[1]
    shard.write_bytes(shard.read_bytes()[:-2] + b"\x01\x00")  # a bit flip in a listed shard
    m = json.loads((out / "manifest.json").read_text())
    m["complete"] = False
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match=f"{shard.name}: does not match its sha256"):
        prepare(FilesSource([path]), out, settings(shard_tokens=999), progress=False)


def test_an_input_edited_in_place_is_refused_naming_it_and_force_prepares_it_again(tmp_path, tokenizer):
    """A text file rewritten with the same size (an edit that keeps the byte count) after its shards were made:
    running the same command again is refused in one line naming the file (before, path and size matched,
    and the run said it was complete with the old text's shards); --force prepares it again, to exactly the
    shards of the new text. A manifest written before files carried their modification time still resumes."""
    import os

    docs = make_docs(12, seed=3)
    src = tmp_path / "txt"
    src.mkdir()
    for i, t in enumerate(docs):
        (src / f"{i:02d}.txt").write_text(t, encoding="utf-8")
    out = tmp_path / "out"
    prepare(FilesSource([src]), out, settings(shard_tokens=300), progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    f = src / "03.txt"
    docs[3] = docs[3].swapcase()
    assert len(docs[3].encode()) == f.stat().st_size and docs[3] != f.read_text(encoding="utf-8")
    f.write_text(docs[3], encoding="utf-8")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(ShardError, match=f"^{f}: changed since the shards in {out} were made") as e:
        prepare(FilesSource([src]), out, settings(shard_tokens=300), progress=False)
    assert "--force" in str(e.value) and "\n" not in str(e.value)
    prepare(FilesSource([src]), out, settings(shard_tokens=300), progress=False, force=True)
    assert_matches(out, reference_shards(tokenizer, docs, 300))
    # an older manifest (paths and sizes only) of the same files is still the same input
    legacy = json.loads((out / "manifest.json").read_text())
    for rec in legacy["source"]["files"]:
        rec.pop("mtime_ns")
    (out / "manifest.json").write_text(json.dumps(legacy))
    assert prepare(FilesSource([src]), out, settings(shard_tokens=300), progress=False)["tokens"] == legacy["tokens"]
    assert all("mtime_ns" in rec for rec in manifest["source"]["files"])


def test_wide_vocabulary_writes_uint32_shards(tmp_path, tokenizer):
    """A tokenizer saved as a bundle (GPT-2's ranks with <|endoftext|> moved past 65,535: 100,001 ids)
    is what --tokenizer names; spawned workers load the same bundle."""
    from gptforge import assets
    from gptforge.data.tokenizer import R50K_PAT, save_tokenizer, tiktoken_from_ranks

    wide = tiktoken_from_ranks(assets.gpt2_ranks_path(), R50K_PAT, {"<|endoftext|>": 100_000}, name="gpt2-wide")
    save_tokenizer(wide, tmp_path / "wide")
    docs = make_docs(60, seed=9)
    src = FilesSource([write_parquet(tmp_path / "fw.parquet", docs)])
    prepare(src, tmp_path / "w1", settings(tokenizer=str(tmp_path / "wide")), progress=False)
    prepare(src, tmp_path / "w2", settings(tokenizer=str(tmp_path / "wide"), workers=2, start_method="spawn"),
            progress=False)
    ref = reference_shards(wide, docs)
    assert_matches(tmp_path / "w1", ref)
    assert file_bytes(tmp_path / "w1") == file_bytes(tmp_path / "w2")
    for f in shard_files(tmp_path / "w1"):  # every shard, even one whose ids all fit 16 bits
        assert read_header(f)[:2] == (20240801, 7)
    from gptforge.data.tokenizer import shard_tokenizer

    assert shard_tokenizer(tmp_path / "w1").fingerprint == wide.fingerprint  # the shards name their tokenizer


def test_fineweb_path_streams_with_datasets(tmp_path, tokenizer, monkeypatch):
    """prepare fineweb's datasets-streaming source, on local FineWeb-shaped parquet, gives the same
    shards as the pyarrow reader, also when resumed mid-stream."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    docs = make_docs(seed=10)
    parts = [write_parquet(tmp_path / f"00{i}.parquet", docs[i * 80 : (i + 1) * 80]) for i in range(2)]
    # fineweb's default: the val shard is one shard's worth (llm.c), capped at 10% of the corpus
    fineweb = settings(name="fineweb", val_max_fraction=0.1)
    prepare(FilesSource(parts), tmp_path / "files", fineweb, progress=False)

    class Crashing(HFStreamSource):
        def items(self, start=0):
            for k, item in enumerate(super().items(start)):
                if k == 50 and start == 0:
                    raise Crash()
                yield item

    out = tmp_path / "hf_out"
    with pytest.raises(Crash):
        prepare(Crashing("parquet", data_files=parts), out, fineweb, progress=False)
    assert main(["prepare", "fineweb", "--data-files", *map(str, parts), "--out", str(out),
                 "--shard-tokens", str(SHARD), "--workers", "1", "--no-progress"]) == 0
    assert file_bytes(out) == file_bytes(tmp_path / "files")
    total = sum(len(tokenizer.encode_ordinary(d)) + 1 for d in docs)
    assert_matches(out, reference_shards(tokenizer, docs, val=min(SHARD, total // 10)), name="fineweb")


def test_cli_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["prepare", "files", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "nope: no such file" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("a,b")
    assert main(["prepare", "files", str(tmp_path / "x.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "unsupported file type" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["prepare", "fineweb", "--sample", "5BT"])
    assert e.value.code == 2


def test_dead_worker_is_an_error_not_a_hang(tmp_path, tokenizer, monkeypatch):
    main_pid = os.getpid()

    def dies_in_workers(spec):  # what the OOM killer does to a worker
        if os.getpid() != main_pid:
            os._exit(9)
        return tokenizer

    from gptforge.data.prepare import pipeline, workers

    monkeypatch.setattr(workers, "load_tokenizer", dies_in_workers)  # fork: the workers inherit it
    monkeypatch.setattr(pipeline, "load_tokenizer", dies_in_workers)
    src = FilesSource([write_parquet(tmp_path / "fw.parquet", make_docs(40, seed=11))])
    with pytest.raises(SourceError, match="worker process died.*re-run the same command"):
        prepare(src, tmp_path / "out", settings(tokenizer="dies", workers=2, start_method="fork"), progress=False)


def test_the_progress_bar_counts_documents_and_shards_as_they_happen(tmp_path, tokenizer, monkeypatch):
    from gptforge.data.prepare import pipeline

    seen = []

    class Bar:
        total = None

        def update(self, n):
            pass

        def set_postfix(self, refresh=True, **kw):
            seen.append(kw)

        def close(self):
            pass

    monkeypatch.setattr(pipeline, "_progress_bar", lambda *a: Bar())
    docs = make_docs(40, seed=3)
    prepare(FilesSource([write_parquet(tmp_path / "a.parquet", docs)]), tmp_path / "out", settings(), progress=True)
    docs_seen = [p["docs"] for p in seen]
    shards = [p["shards"] for p in seen]
    assert docs_seen == sorted(docs_seen) and docs_seen[0] == 7 and docs_seen[-1] == 40  # chunk_docs 7
    assert shards == sorted(shards) and 0 < shards[len(shards) // 2] < shards[-1]  # written along the way

    seen.clear()  # a corpus whose val size is only known at the end: the held tokens move instead
    prepare(FilesSource([write_parquet(tmp_path / "b.parquet", docs)]), tmp_path / "out2",
            settings(val_tokens=10**9), progress=True)
    held = [int(p["held_for_val_split"].split()[0].replace(",", "")) for p in seen]
    assert held == sorted(held) and held[0] > 0 and all(p["shards"] == 0 for p in seen)
