"""Document sources for `gptforge prepare`: local .txt / .jsonl(.gz) / .parquet files, and Hugging Face streams.

A source yields :class:`Item` s in a fixed order, each either a document's text or a bad row (with
the reason and where it is). Items are numbered 0, 1, 2, ... in that order; the resumable writer
(`gptforge.data.prepare.pipeline`) records how many items it has consumed, and a restarted run asks
the source for ``items(start=n)``. Every item, good or bad, takes one number, so a restart skips
exactly the items already written, bad ones included.

    gptforge prepare files corpus/ more.jsonl.gz --text-field text --out data/corpus

What one document is: a ``.txt`` file (whole file), a ``.jsonl`` line (blank lines are ignored),
a parquet row. Folders are walked recursively in sorted order; files are taken in the order given.

A ``.txt`` file is one document but is never held whole: it is read ``TXT_CHUNK_BYTES`` at a time and given
as pieces (:class:`Item` s with ``more``: the document goes on in the next one, and ``cont``: it goes on from
the previous one; one item number for them all). A piece ends only where the tokens of the pieces are the
tokens of the whole text: before a line break that follows a letter (GPT-2's, cl100k's and o200k's split
patterns never join a letter to a following line break, and have no look-behind), and only where the tokenizer
given as ``cut_ok`` agrees on the text around the cut (see :func:`safe_cut`); past ``TXT_HOLD_CHARS`` held
without one (one endless line), also before a space or tab that follows a letter. The file is read once, decoded
by an incremental UTF-8 decoder (a character split by a read is completed from the next): a bad byte ends the
document as a bad row naming that byte, and the run stops there. With ``skip_bad`` (``whole_check``) a bad file
is skipped whole, so it is first checked in a read of its own, before any piece of it is given. A file with no
cut at all (a text without a letter before a space or line break, a tokenizer that disagrees everywhere) is held
until its end.

Parquet is read with pyarrow directly (``iter_batches`` over the text column only), rather than
through ``datasets``: it names the file and row of a bad value, reads one row group at a time
(memory bounded), and a restart skips whole row groups from the footer metadata without reading
them. The Hugging Face path (:class:`HFStreamSource`) is ``datasets`` streaming, as for FineWeb.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gptforge.extras import require
from gptforge.reading import UTF8_BOM, UTF16_BOMS, bounded_lines, jsonl_hint, too_long, utf8

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")


class SourceError(ValueError):
    """Unreadable input: names the file (and row) and what to do."""


@dataclass
class Item:
    text: str | None  # None: a bad row, see reason; "": an empty document (skipped and counted, not bad)
    where: str  # "file:row" for messages and the manifest
    reason: str = ""
    more: bool = False  # a piece of a document that goes on in the next item (a .txt file read in pieces)
    cont: bool = False  # a piece that goes on from the previous item: no separator before it, no new item number


def numbered(first: int, items: list[Item]) -> Iterator[tuple[int, Item]]:
    """(item number, item) of a chunk whose first entry is item ``first``: the pieces of one document share its
    number, which only the last piece (``more`` False) completes."""
    n = first
    for it in items:
        yield n, it
        if not it.more:
            n += 1


# a .txt file is read this many bytes at a time: the pieces a document is tokenized in (each one within the
# pipeline's chunk bound of about chunk_chars characters, 1 Mi by default)
TXT_CHUNK_BYTES = 1 << 20
# characters either side of a cut that the tokenizer must tokenize alike, cut or not (safe_cut): far more than
# any split pattern looks ahead (one character for GPT-2's \s+(?!\S)) or a BPE merge spans across a line break
CUT_WINDOW = 64
# text held past this many characters without a cut before a line break (one endless line): a piece may also end
# before a space or tab that follows a letter, a place every split pattern above ends a word at too
TXT_HOLD_CHARS = 8 * TXT_CHUNK_BYTES


def safe_cut(encode) -> callable:
    """The check a cut of a text in two must pass, for the tokenizer whose ``encode_ordinary`` is ``encode``: the
    CUT_WINDOW characters either side, tokenized apart, give the tokens of them tokenized together. A tokenizer
    that marks each text's start (sentencepiece's prepended ▁) fails it at every cut, and its documents are read
    whole."""
    def ok(text: str, c: int) -> bool:
        a, b = max(0, c - CUT_WINDOW), c + CUT_WINDOW
        return list(encode(text[a:b])) == list(encode(text[a:c])) + list(encode(text[c:b]))
    return ok


def _cut(text: str, cut_ok, floor: int, ceiling: int, spaces: bool = False) -> int:
    """The last place in ``text`` in (``floor``, ``ceiling``] to end a piece at: before a line break that follows a
    letter (``spaces``: or a space or tab that follows a letter), the tokenizer agreeing (``cut_ok``); 0 for none.
    ``ceiling`` leaves CUT_WINDOW characters after it, so the check sees the text that follows; places at or below
    ``floor`` were judged before."""
    marks = "\n\r \t" if spaces else "\n\r"
    c = ceiling + 1
    while True:
        c = max(text.rfind(m, floor + 1, c) for m in marks)
        if c <= 0:
            return 0
        if text[c - 1].isalpha() and cut_ok(text, c):
            return c


def source_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suf in SUFFIXES:
        if name.endswith(suf):
            return suf
    return None


def _walk(folder: Path) -> tuple[list[Path], list[Path]]:
    """(files to read, files left out) under ``folder``, sorted. Hidden files and anything under a hidden
    folder are not read (``.git/``, macOS's ``._name.txt`` resource forks, gptforge's own ``.NAME.tmp-*``
    temporaries of an interrupted write: a partial file that would pass for data); those with a readable
    suffix, and files of other types (a ``.jsonl.zst``, a ``.csv``), are returned as left out, so the
    caller can say so rather than leave the corpus smaller in silence."""
    found: list[Path] = []
    left_out: list[tuple[bool, Path]] = []
    for f in sorted(folder.rglob("*")):
        if not f.is_file():
            continue
        hidden = any(part.startswith(".") for part in f.relative_to(folder).parts)
        if source_kind(f) and not hidden:
            found.append(f)
        elif source_kind(f) or not hidden:  # a hidden file of no readable type (.DS_Store, .git/*) goes unsaid
            left_out.append((hidden, f))
    return found, [f for _, f in sorted(left_out)]  # files of other types named first: the likelier mistake


def _some_names(files: list[Path], folder: Path) -> str:
    names = [str(f.relative_to(folder)) for f in files[:3]]
    return ", ".join(names) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


def expand_paths(paths: list[str | os.PathLike], repeats: bool = False, note=_stderr) -> list[Path]:
    """Files to read, in order: given files as given, folders walked recursively (sorted). A file met
    twice (given twice, given and inside a folder also given, or reached again through a symlink or hard
    link) is refused, naming both ways it was met: read twice it would silently weigh its text double
    (and put the same documents in both the val and the train split). ``repeats``: allowed on purpose (a
    benchmark's corpus made of copies). A folder's hidden files and files of other types are not read;
    ``note`` (stderr by default) gets one line naming them (see :func:`_walk`)."""
    from gptforge.reading import not_a_file

    out: list[Path] = []
    seen: dict[tuple[int, int], Path] = {}  # (device, inode) -> how the file was first met

    def add(f: Path) -> None:
        st = f.stat()
        first = seen.setdefault((st.st_dev, st.st_ino), f)
        if first is not f and not repeats:
            how = "met twice (given twice, or inside a folder also given)" if str(first) == str(f) else \
                f"the same file as {first} (a symbolic or hard link to it)"
            raise SourceError(f"{f}: {how}; each file must be read once (twice would weigh its text double): "
                              "remove one of them")
        out.append(f)

    for p in map(Path, paths):
        if p.is_dir():
            found, left_out = _walk(p)
            if not found:
                raise FileNotFoundError(f"{p}: folder holds no {', '.join(SUFFIXES)} files"
                                        + (f" (left out: {_some_names(left_out, p)})" if left_out else ""))
            if left_out and note is not None:
                note(f"note: {p}: left out {len(left_out)} file{'s' * (len(left_out) > 1)} "
                     f"({_some_names(left_out, p)}): only {', '.join(SUFFIXES)} files are read, and no hidden ones")
            for f in found:
                add(f)
        elif p.is_file():
            if not source_kind(p):
                raise SourceError(f"{p}: unsupported file type; use one of {', '.join(SUFFIXES)}")
            add(p)
        elif p.exists():  # a device or pipe: there, but no document source
            raise SourceError(f"{p}: {not_a_file(p)}; give text files or folders")
        else:  # nothing there, a dangling symlink or a symlink loop; a glob the shell left unexpanded
            hint = " (a pattern that matched nothing?)" if any(c in str(p) for c in "*?[") else ""
            raise FileNotFoundError(f"{p}: {not_a_file(p)}{hint}")
    return out


class FilesSource:
    """Local files, read lazily one file (and one parquet row group / jsonl line) at a time."""

    def __init__(self, paths: list[str | os.PathLike], text_field: str = "text", batch_rows: int = 1024,
                 repeats: bool = False):
        self.files = expand_paths(paths, repeats)
        self.text_field = text_field
        self.batch_rows = batch_rows
        if any(source_kind(f) == ".parquet" for f in self.files):
            _pyarrow()  # a missing pyarrow is reported now, before any work

    def describe(self) -> dict:
        """Identity of the input, checked when a run resumes or is run again (a changed input would shift
        documents, or leave shards of the old text): each file's path, size and modification time (an edit
        that keeps the size still moves the time; a copy without its times is refused too: --force)."""
        out = []
        for f in self.files:
            st = f.stat()
            out.append({"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
        return {"kind": "files", "text_field": self.text_field, "files": out}

    def total_items(self) -> int | None:
        """Item count when cheap to know (txt and parquet footers); None when a jsonl is present."""
        total = 0
        for f in self.files:
            kind = source_kind(f)
            if kind == ".txt":
                total += 1
            elif kind == ".parquet":
                try:
                    total += _parquet_file(f).metadata.num_rows
                except SourceError:
                    return None
            else:
                return None
        return total

    def items(self, start: int = 0, cut_ok=None, whole_check: bool = False) -> Iterator[Item]:
        """The items from number ``start`` on. ``cut_ok``: the tokenizer's check of a cut (:func:`safe_cut`), which
        lets a .txt file be read in pieces; None: each read whole. ``whole_check``: a .txt file is checked to be
        UTF-8 before its first piece is given (``skip_bad``: a bad file is then one bad row, skipped whole)."""
        n = 0  # items yielded or skipped so far
        for f in self.files:
            kind = source_kind(f)
            if kind == ".parquet":
                it = self._parquet(f, skip=max(0, start - n))
            elif kind == ".txt":
                if n < start:  # one item, already written: not read at all
                    n += 1
                    continue
                it = self._txt(f, cut_ok, whole_check)
            else:
                it = self._jsonl(f)
            for count, item in it:
                # count > 1 only for parquet row groups skipped wholesale
                if item is None:
                    n += count
                    continue
                if n >= start:
                    yield item
                n += 0 if item.more else 1

    # --- readers: yield (count, Item) with count=1, or (k, None) for k rows skipped unread ---------

    def _txt(self, f: Path, cut_ok=None, whole_check: bool = False) -> Iterator[tuple[int, Item | None]]:
        """The file as one document, in pieces where ``cut_ok`` allows (the module's docstring), decoded as it is
        read, holding at most the text since the last cut and one read. A bad byte ends it as a bad row naming
        that byte, after the pieces before it (a run without ``skip_bad`` stops there). ``whole_check`` (``skip_bad``:
        a bad file is skipped whole, so no piece of it may be given first): checked throughout in a first read."""
        if whole_check:
            try:
                for _ in _txt_texts(f):
                    pass
            except UnicodeDecodeError as e:
                yield 1, Item(None, f"{f}", _not_utf8(e))
                return
        held, cont, floor = "", False, 0  # floor: places up to it were judged no cut already
        try:
            for text in _txt_texts(f):
                held += text
                if cut_ok is None:
                    continue
                ceiling = len(held) - CUT_WINDOW
                c = _cut(held, cut_ok, floor, ceiling, spaces=len(held) > TXT_HOLD_CHARS) if ceiling > floor else 0
                if c:
                    yield 1, Item(held[:c], f"{f}", more=True, cont=cont)
                    cont, held, floor = True, held[c:], ceiling - c
                else:
                    floor = max(floor, ceiling)
        except UnicodeDecodeError as e:
            yield 1, Item(None, f"{f}", _not_utf8(e), cont=cont)
            return
        yield 1, Item(held, f"{f}", cont=cont)  # "" alone: an empty document (counted, not an error)

    def _jsonl(self, f: Path) -> Iterator[tuple[int, Item | None]]:
        opener = gzip.open if f.name.lower().endswith(".gz") else open
        line_no = 0
        try:
            with opener(f, "rb") as fh:
                for line in bounded_lines(fh):
                    line_no += 1
                    if line is None:  # never held whole: a bad row like any other (--skip-bad counts it)
                        yield 1, Item(None, f"{f}:{line_no}", too_long())
                        continue
                    if not line.strip():
                        continue
                    yield 1, self._json_row(line, f"{f}:{line_no}", at_start=line_no == 1)
        except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt .gz
            yield 1, Item(None, f"{f}:{line_no + 1}", f"file is truncated or corrupt ({type(e).__name__}: {e}); "
                                                     "the rest of the file is unreadable")

    def _json_row(self, line: bytes, where: str, at_start: bool = False) -> Item:
        try:
            s = utf8(line, at_start)
        except UnicodeDecodeError as e:
            return Item(None, where, f"not valid UTF-8 at byte {e.start} ({e.reason})")
        hint = jsonl_hint(s) if at_start else ""
        try:
            row = json.loads(s)
        except json.JSONDecodeError as e:
            return Item(None, where, f"not valid JSON ({e.msg} at column {e.colno}){hint}")
        except RecursionError:  # [[[[... thousands deep: the parser's stack, a bad row like any other
            return Item(None, where, "JSON nested too deeply")
        if not isinstance(row, dict):
            return Item(None, where, f"a JSON {type(row).__name__}, not an object with a {self.text_field!r} field{hint}")
        if self.text_field not in row:
            return Item(None, where, f"no field {self.text_field!r} (has {sorted(row)[:8]}); set --text-field")
        text = row[self.text_field]
        if not isinstance(text, str):
            return Item(None, where, f"field {self.text_field!r} is {type(text).__name__}, not a string")
        return Item(text, where)

    def _parquet(self, f: Path, skip: int) -> Iterator[tuple[int, Item | None]]:
        pa = _pyarrow()

        try:
            pf = _parquet_file(f)
        except SourceError as e:
            yield 1, Item(None, f"{f}", str(e))
            return
        names = pf.schema_arrow.names
        if self.text_field not in names:
            # a schema without the field is a wrong --text-field, not a bad row: always an error
            raise SourceError(f"{f}: parquet has no column {self.text_field!r} (columns: {names}); set --text-field")
        row = 0
        try:
            for g in range(pf.metadata.num_row_groups):
                rows = pf.metadata.row_group(g).num_rows
                if skip >= rows:  # resume: skip the whole row group without reading it
                    skip -= rows
                    row += rows
                    yield rows, None
                    continue
                for batch in pf.iter_batches(batch_size=self.batch_rows, row_groups=[g], columns=[self.text_field]):
                    col = batch.column(0)
                    # as binary so that invalid UTF-8 is caught per row, not per batch
                    values = col.cast(pa.large_binary()).to_pylist() if pa.types.is_string(col.type) or \
                        pa.types.is_large_string(col.type) or pa.types.is_binary(col.type) or \
                        pa.types.is_large_binary(col.type) else None
                    if values is None:
                        raise SourceError(f"{f}: column {self.text_field!r} has type {col.type}, not text")
                    for v in values:
                        where = f"{f}:{row}"
                        row += 1
                        if skip > 0:
                            skip -= 1
                            yield 1, None
                            continue
                        yield 1, _bytes_item(v, where)
        except (OSError, pa.ArrowException) as e:
            yield 1, Item(None, f"{f}:{row}", f"file is truncated or corrupt ({type(e).__name__}: {e}); "
                                             "the rest of the file is unreadable")


def _not_utf8(e: UnicodeDecodeError) -> str:
    return f"not valid UTF-8 at byte {e.start} ({e.reason})"


def _txt_texts(f: Path) -> Iterator[str]:
    """``f``'s text, TXT_CHUNK_BYTES read at a time and decoded as :func:`gptforge.reading.utf8` decodes a whole
    file (its byte order mark dropped, UTF-16 named), by one incremental decoder: a character split by a read is
    completed from the next. UnicodeDecodeError's ``start`` counts bytes from the file's start, as the whole
    file's decode would."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(f, "rb") as fh:
        raw = fh.read(max(TXT_CHUNK_BYTES, 4))  # a byte order mark (3 bytes; UTF-16's 2) is judged whole
        if raw[:2] in UTF16_BOMS:
            utf8(raw[:2], at_start=True)  # raises, naming UTF-16
        read = len(UTF8_BOM) if raw.startswith(UTF8_BOM) else 0  # bytes of the file given to the decoder so far
        raw = raw[read:]
        while True:
            pending = len(decoder.getstate()[0])  # bytes of a character the last read cut, held by the decoder
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:  # e.start counts from the held bytes, then this read's
                at = read - pending
                raise UnicodeDecodeError("utf-8", e.object, e.start + at, e.end + at, e.reason) from None
            if not raw:
                return
            read += len(raw)
            if text:
                yield text
            raw = fh.read(TXT_CHUNK_BYTES)


def _pyarrow():
    return require("pyarrow", extra="data", for_what="reading parquet (gptforge prepare files|fineweb)")


def _parquet_file(f: Path):
    pa = _pyarrow()
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"{f}: not a readable parquet file ({type(e).__name__}: {e})") from e


def _bytes_item(v: bytes | None, where: str) -> Item:
    if v is None:
        return Item(None, where, "text is null")
    try:
        text = v.decode("utf-8")
    except UnicodeDecodeError as e:
        return Item(None, where, f"not valid UTF-8 at byte {e.start}")
    return Item(text, where)


class HFStreamSource:
    """A Hugging Face dataset streamed with ``datasets`` (no full download, nothing held in RAM).

    ``path``/``name`` are passed to ``datasets.load_dataset(..., streaming=True)``; with
    ``data_files`` the same code streams local files through the ``parquet`` / ``json`` builders,
    which is how this path is tested offline. A restart re-streams and discards the items already
    written (``IterableDataset.skip``): no tokenization is repeated, only the download.
    """

    def __init__(self, path: str, name: str | None = None, split: str = "train", text_field: str = "text",
                 data_files: list[str] | None = None):
        self.path, self.name, self.split, self.text_field = path, name, split, text_field
        self.data_files = [str(Path(f).resolve()) for f in data_files] if data_files else None

    def describe(self) -> dict:
        return {"kind": "huggingface", "path": self.path, "name": self.name, "split": self.split,
                "text_field": self.text_field, "data_files": self.data_files}

    def total_items(self) -> int | None:
        return None

    def items(self, start: int = 0) -> Iterator[Item]:
        datasets = require("datasets", extra="data", for_what="streaming from Hugging Face (gptforge prepare fineweb)")
        kwargs = {"data_files": self.data_files} if self.data_files else {}
        try:
            ds = datasets.load_dataset(self.path, name=self.name, split=self.split, streaming=True, **kwargs)
            ds = ds.select_columns([self.text_field])
        except (ValueError, FileNotFoundError, ConnectionError) as e:
            # a config, split or column the dataset lacks, no such dataset, or the hub out of reach: datasets
            # says which and what there is over several lines (and a usage example); one line of it, naming
            # the dataset
            what = " ".join(x.strip() for x in str(e).splitlines()[:2] if x.strip())
            raise SourceError(f"dataset {self.path} (config {self.name}, split {self.split}, text field "
                              f"{self.text_field!r}): {what}") from None
        if start:
            ds = ds.skip(start)
        where0 = self.path if self.name is None else f"{self.path}/{self.name}"
        for i, row in enumerate(ds, start=start):
            text = row.get(self.text_field)
            where = f"{where0}:{i}"
            if text is None:
                yield Item(None, where, f"no value for {self.text_field!r}")
            elif isinstance(text, bytes):
                yield _bytes_item(text, where)
            elif not isinstance(text, str):
                yield Item(None, where, f"{type(text).__name__}, not text")
            else:
                yield Item(text, where)
