"""The one reader of the files users hand gptforge: their text decoded once (``utf8``: a byte order
mark dropped, UTF-16 named), JSON files bounded before a byte is read (``read_json``: one line per
damage), and the words for what a path is when it is not a file (``not_a_file``) or cannot be a path at all
(``path_fault``: a name too long, a symlink loop).

    from gptforge.reading import read_json, utf8
    cfg = read_json(folder / "config.json", ValueError, "config.json")   # size, UTF-8, depth, top level checked
    text = utf8(raw, at_start=True)                                      # a corpus file's bytes as text

No torch import here: prepare's workers load this module.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def utf8(raw: bytes, at_start: bool = False) -> str:
    """``raw`` as UTF-8 text: the one decoder of the text gptforge reads from users' files (a corpus's .txt,
    a JSONL line of any kind, a JSON file, a tokenizer file). At the start of a file (``at_start``: its
    first bytes, or its first line) a UTF-8 byte order mark is dropped: Windows editors and PowerShell
    write one, and it is no part of the text (kept, it was three stray tokens at the head of a corpus, or
    "not valid JSON" on line 1 of a JSONL file). A UTF-16 file is named as such. Anything else that is not
    UTF-8 raises UnicodeDecodeError with ``start`` counted in ``raw``, as a plain decode would."""
    if at_start and raw[:2] in UTF16_BOMS:
        raise UnicodeDecodeError("utf-8", raw, 0, 2, "the file is UTF-16 (it starts with UTF-16's byte order mark): save it as UTF-8")
    skip = len(UTF8_BOM) if at_start and raw.startswith(UTF8_BOM) else 0
    try:
        return str(memoryview(raw)[skip:], "utf-8") if skip else raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnicodeDecodeError("utf-8", raw, e.start + skip, e.end + skip, e.reason) from None


def jsonl_hint(line: str) -> str:
    """What to add when line 1 of a JSON Lines file (one object a line) is not such an object but begins a
    whole-file JSON document (an array of rows, or one object over several lines, as many datasets are
    published): said, and how to convert it, instead of "line 1: not valid JSON (Expecting value)"."""
    s = line.strip()
    if s.startswith("["):
        return ("; the file looks like one JSON array, not JSON Lines (one object a line): convert it, e.g. "
                "jq -c '.[]' FILE > FILE.jsonl")
    if s == "{" or (s.startswith("{") and not s.endswith("}")):
        return ("; the file looks like one JSON document over several lines, not JSON Lines (one object a line): "
                "convert it, e.g. jq -c . FILE > FILE.jsonl")
    return ""


MAX_JSON_BYTES = 16 << 20  # config.json, meta.json, a manifest or an index: kilobytes; 16 MiB is damage, not size


MAX_LINE_BYTES = 64 << 20  # a JSONL row (a conversation, a pair, a document) is kilobytes; past 64 MiB is damage


def bounded_lines(f: Any, limit: int = MAX_LINE_BYTES) -> Any:
    """The lines of binary file ``f`` (a JSONL file, gzipped or not), each read at most ``limit`` bytes at a time;
    None for a line longer than that, whose rest is then read past in pieces of that size. ``for raw in f`` held
    a whole line in memory: a .jsonl.gz of 13 MB that expands to 3 GB of one line cost 3 GB and a MemoryError
    traceback (or the OOM killer) before its first row was judged. The one line reader of the JSONL readers
    (data/rows.py: sft, rm, dpo --data; data/prepare/sources.py: prepare files)."""
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw
            continue
        yield None  # judged first: a reader that stops here reads nothing more
        while True:
            rest = f.readline(limit)
            if not rest or rest.endswith(b"\n"):
                break


def too_long(limit: int = MAX_LINE_BYTES) -> str:
    """What a reader says of a line :func:`bounded_lines` gave as None."""
    return (f"a line of more than {limit:,} bytes, more than a row holds (a file of one huge line, or a compressed "
            "file that expands without end)")


def not_a_file(path: str | Path) -> str:
    """What ``path``, which cannot be read as a regular file, is instead, in words for an error: a folder, a
    device or other special file (/dev/null, a pipe), a symlink to nothing, or nothing at all. A device
    is not called "no such file": it is there, and the user needs to hear what it is."""
    path = Path(path)
    if path.is_dir():
        return "a folder, not a file"
    if path.exists():
        return "a device or other special file (not a regular file)"
    if not path.is_symlink():
        return "no such file or folder"
    return LOOP if _errno(path) == errno.ELOOP else "a symlink to a missing file"


LOOP = "a symlink loop (its links lead back to themselves)"


def _errno(path: str | Path) -> int | None:
    try:
        os.stat(path)
    except OSError as e:
        return e.errno
    except ValueError:  # a NUL byte: no path at all
        return None
    return None


def path_fault(e: BaseException) -> str | None:
    """The words for an error that is about a path's name rather than its contents, met anywhere a command
    opens, stats, creates or resolves a path the user gave: a name past the filesystem's limit (ENAMETOOLONG),
    a symlink loop (ELOOP from the kernel; pathlib's own RuntimeError "Symlink loop from ..." in
    ``Path.resolve``), or a create over a symlink loop, which the kernel reports as "file exists". None for
    any other error. The command line's one door (gptforge.cli) prints it as one line, exit 2."""
    if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):  # pathlib (3.11, 3.12)
        return f"{str(e)[len('Symlink loop from '):].strip(chr(39))}: {LOOP}; fix or remove the link"
    if not isinstance(e, OSError):
        return None
    name = e.filename if e.filename is not None else "a path given"
    if e.errno == errno.ENAMETOOLONG:
        return (f"{name}: file name too long (most filesystems allow a name of at most 255 bytes and a path of "
                "4,096); choose a shorter path")
    if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and e.filename is not None
                                  and _errno(e.filename) == errno.ELOOP):
        return f"{name}: {LOOP}; fix or remove the link"
    return None


def read_json(path: str | Path, error: type[Exception] = ValueError, what: str = "JSON file",
              limit: int = MAX_JSON_BYTES, top: type | None = dict, then: str = "") -> Any:
    """The one reader of a JSON file that gptforge did not just write itself (a model's config.json, a
    checkpoint's meta.json, a manifest, an index): the size is checked before a byte is read (a damaged
    or hostile file of gigabytes costs nothing), the text must be UTF-8 JSON (depth bounded: Python's
    parser raises RecursionError on ``[[[[...``), and the top level of type ``top`` (None: any). Every
    failure is one ``error`` naming the file and what was found, with ``then`` (what to do) after it;
    a missing file stays FileNotFoundError, which each caller words for its own flag."""
    path = Path(path)
    tail = f"; {then}" if then else ""
    if not path.is_file() and path.exists():
        raise error(f"{path}: not a file (a folder or device), so cannot read it{tail}")
    try:
        size = path.stat().st_size
        raw = b""
        if size <= limit:
            with open(path, "rb") as f:
                raw = f.read(limit + 1)  # a file that grew since stat() is still read only this far
    except FileNotFoundError:  # a dangling link too: each caller words a missing file for its own flag
        raise FileNotFoundError(f"{path}: no such file{tail}") from None
    except OSError as e:  # (the errors raised for the caller are outside this try: one may be an OSError)
        raise error(f"{path}: cannot read it ({e.strerror or e}){tail}") from None
    if size > limit:
        raise error(f"{path}: {size:,} bytes, more than a {what} holds (limit {limit:,}): damaged, or not a "
                    f"{what}{tail}")
    if len(raw) > limit:
        raise error(f"{path}: more than {limit:,} bytes, more than a {what} holds: damaged, or not a {what}{tail}")
    try:
        doc = json.loads(utf8(raw, at_start=True))
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}), so not a {what}{tail}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; RecursionError: nesting
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise error(f"{path}: not valid JSON ({why}){tail}") from None
    if top is not None and not isinstance(doc, top):
        want = {dict: "an object", list: "a list"}.get(top, top.__name__)
        raise error(f"{path}: expected {want} at the top of the {what}, found {_json_kind(doc)}{tail}")
    return doc


def _json_kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(v), "a number")
