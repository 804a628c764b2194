"""Every JSON file gptforge reads from a path goes through one bounded reader (reading.read_json): a
damaged or hostile file (gigabytes, nested past Python's recursion limit, not UTF-8, the wrong
top-level type, a folder) is one line naming the file, never a traceback, a hang or gigabytes read.

The class is closed by construction: the source test below fails when any module outside reading.py
parses a whole file's JSON itself, so a command added later inherits the reader or does not pass."""

from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.reading import MAX_JSON_BYTES, read_json

SRC = Path(__file__).resolve().parents[1] / "src" / "gptforge"


class Bad(ValueError):
    pass


def _sparse(path: Path, size: int, head: bytes = b'{"model_type": "gpt2", "x": "') -> Path:
    """A file that stat() calls ``size`` bytes but that holds no data past ``head`` (reading it would
    take seconds per GiB and the memory to match)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _whole_file_json_reads(tree: ast.AST) -> list[int]:
    """Lines that parse a file's JSON outside the reader: json.load(f), or json.loads of a
    .read_text() / .read_bytes() / open(...).read()."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
            continue
        if node.func.attr == "load":
            lines.append(node.lineno)
        elif node.func.attr == "loads" and node.args:
            for sub in ast.walk(node.args[0]):
                if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                        and sub.func.attr in ("read_text", "read_bytes")):
                    lines.append(node.lineno)
                elif (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "read"
                      and isinstance(sub.func.value, ast.Call) and getattr(sub.func.value.func, "id", "") == "open"):
                    lines.append(node.lineno)
    return lines


def test_no_module_parses_a_json_file_itself():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "reading.py":
            continue
        found += [f"{path.relative_to(SRC)}:{n}" for n in _whole_file_json_reads(ast.parse(path.read_text()))]
    assert not found, ("these read a JSON file without reading.read_json (no size bound, a traceback on a damaged "
                       f"file): {found}")


def test_the_source_check_sees_each_way_of_reading():
    """The check above is only as good as its pattern: each spelling of a whole-file read is found."""
    for code in ("json.load(open(p))", "json.loads(p.read_text())", "json.loads(Path(p).read_bytes().decode())",
                 "json.loads(open(p).read())", "x = json.loads(f.read_text(encoding='utf-8')).get('a')"):
        assert _whole_file_json_reads(ast.parse(code)) == [1], code
    for code in ("json.loads(line)", "json.loads(raw or b'null')", "json.dumps(x)"):
        assert _whole_file_json_reads(ast.parse(code)) == [], code


@pytest.mark.parametrize("content,words", [
    (b"{\"a\": ", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8 text (byte 0: the file is UTF-16"),
    (b"[" * 200_000, "nested too deeply"),
    (b"[1, 2]", "expected an object at the top of the thing.json, found a list"),
    (b"\"text\"", "found a string"),
    (b"null", "found null"),
])
def test_damaged_files_are_one_error_naming_the_file(tmp_path, content, words):
    p = tmp_path / "f.json"
    p.write_bytes(content)
    with pytest.raises(Bad) as e:
        read_json(p, Bad, "thing.json", then="make it again")
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and words in msg and msg.endswith("; make it again") and "\n" not in msg, msg


def test_size_is_checked_before_anything_is_read(tmp_path):
    big = _sparse(tmp_path / "big.json", 64 << 30)  # 64 GiB by stat(), nothing on disk
    t0 = time.thread_time()  # CPU of this thread (a read's page zeroing included): not a loaded machine's wait
    with pytest.raises(Bad, match=r"big\.json: 68,719,476,736 bytes, more than a config holds \(limit 16,777,216\)"):
        read_json(big, Bad, "config")
    assert time.thread_time() - t0 < 1.0  # reading 64 GiB of holes costs ~10 s of CPU at ~6 GB/s; a stat, microseconds
    exact = tmp_path / "exact.json"
    exact.write_text(json.dumps({"k": "v" * 20}))
    size = exact.stat().st_size
    assert read_json(exact, Bad, limit=size) == {"k": "v" * 20}  # the limit itself is allowed
    with pytest.raises(Bad, match="bytes, more than"):
        read_json(exact, Bad, limit=size - 1)
    assert MAX_JSON_BYTES == 16 << 20


def test_top_none_takes_any_value_and_a_folder_or_missing_file_is_named(tmp_path):
    p = tmp_path / "l.json"
    p.write_text("[1, {\"a\": null}]")
    assert read_json(p, Bad, top=None) == [1, {"a": None}]
    assert read_json(p, Bad, top=list) == [1, {"a": None}]
    with pytest.raises(Bad, match=r"d\.json: not a file \(a folder or device\), so cannot read it"):
        (tmp_path / "d.json").mkdir()
        read_json(tmp_path / "d.json", Bad)
    with pytest.raises(FileNotFoundError, match=r"gone\.json: no such file; do this"):
        read_json(tmp_path / "gone.json", Bad, then="do this")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")
    with pytest.raises(FileNotFoundError, match=r"dangling\.json: no such file"):
        read_json(tmp_path / "dangling.json", Bad)


# --- through the doors: each command that reads one of these files ----------------------------------

def _refused(argv, capsys, *words):
    t0 = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and all(w in err for w in words), err
    assert time.perf_counter() - t0 < 30
    return err


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_hugging_face_config_of_gigabytes_is_refused_before_it_is_read(tmp_path, capsys, family):
    """import hf read a 300 MB config.json several times over (minutes) before this reader."""
    d = tmp_path / "hf"
    d.mkdir()
    _sparse(d / "config.json", 3 << 30, b'{"model_type": "%s", "x": "' % family.encode())
    (d / "model.safetensors").write_bytes(b"")
    _refused(["import", "hf", "--model", str(d), "--out", str(tmp_path / "run")], capsys,
             "config.json", "3,221,225,472 bytes")
    (d / "config.json").write_text("[" * 100_000)
    _refused(["import", "hf", "--model", str(d), "--out", str(tmp_path / "run")], capsys,
             "config.json", "nested too deeply")
    assert not (tmp_path / "run").exists()


def test_a_checkpoints_meta_json_damaged_in_each_way_is_refused(tmp_path, capsys):
    from tests.conftest import tiny_chat_checkpoint

    ck = tiny_chat_checkpoint(tmp_path / "m")
    meta = ck / "meta.json"
    for content, words in ((b"[" * 100_000, "nested too deeply"), (b"\x80{}", "not UTF-8"),
                           (b"[]", "found a list")):
        meta.write_bytes(content)
        _refused(["sample", "--ckpt", str(ck), "--max-new-tokens", "1", "--device", "cpu"], capsys,
                 "meta.json", words, "the checkpoint is damaged")
    _sparse(meta, 2 << 30)
    _refused(["sample", "--ckpt", str(ck), "--max-new-tokens", "1", "--device", "cpu"], capsys,
             "meta.json", "2,147,483,648 bytes")


def test_a_hugging_face_tokenizer_config_nested_past_the_recursion_limit(tmp_path):
    from gptforge.data.tokenizer import TokenizerError
    from gptforge.data.tokenizer.hf_kind import hf_tokenizer_from_dir

    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{\"a\": " + "[" * 100_000)
    with pytest.raises(TokenizerError, match="tokenizer_config.json: not valid JSON"):
        hf_tokenizer_from_dir(tmp_path)


def test_a_shard_manifest_that_lists_files_outside_its_folder_is_refused(tmp_path, capsys):
    """prepare continues from its manifest: a listed shard is hashed and a kill's leftovers deleted, so a
    damaged list (a path out of the folder, a list of numbers, no list) is refused before any of that."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i}: " + "words and more words " * 20 for i in range(10)))
    out = tmp_path / "out"
    argv = ["prepare", "files", str(corpus), "--out", str(out), "--shard-tokens", "1000", "--workers", "1",
            "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    path = out / "manifest.json"
    good = json.loads(path.read_text())
    outside = tmp_path / "precious.bin"
    outside.write_bytes(b"keep")
    for shards in ([{**good["shards"][0], "file": "../precious.bin"}], [1, 2], None, "x"):
        path.write_text(json.dumps({**good, "shards": shards, "complete": False}))
        _refused(argv, capsys, "manifest.json", "shards", "--force")
        assert outside.read_bytes() == b"keep"
    path.write_text("[" * 100_000)
    _refused(argv, capsys, "manifest.json", "nested too deeply")


def test_an_error_class_that_is_an_os_error_is_not_taken_for_a_read_failure(tmp_path):
    class BadOS(OSError):
        pass

    big = _sparse(tmp_path / "big.json", 1 << 30)
    with pytest.raises(BadOS, match=r"1,073,741,824 bytes, more than"):
        read_json(big, BadOS)
    (tmp_path / "d").mkdir()
    with pytest.raises(BadOS, match="not a file"):
        read_json(tmp_path / "d", BadOS)
