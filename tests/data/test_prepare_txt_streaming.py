"""prepare reads a .txt file in pieces, never whole: the shard bytes of a file read a few bytes at a time (reads
that end inside a multi-byte UTF-8 character and inside a word) equal those of a file read in one piece, which
equal [EOT] + tiktoken's own encoding of the whole text; a resumed run that stops inside a document read in pieces
writes the same bytes; and the memory a prepare run takes does not grow with the file."""
from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from gptforge.data.prepare import sources
from gptforge.data.prepare.pipeline import prepare
from gptforge.data.prepare.settings import PrepareSettings
from gptforge.data.prepare.sources import FilesSource, safe_cut
from gptforge.data.shards import read_shard

# multi-byte characters of every length (2: é, 3: 語, 4: 🙂), words cut by reads, lines that end in a letter (where
# a piece may end), in spaces, in punctuation, CRLF, blank lines, a digit run; "<|endoftext|>" is plain text
WORDS = ["the", "model", "café", "naïve", "言語", "tokens", "shard", "1234", "données", "🙂", "it's", "GPT", "x.",
         "<|endoftext|>", "word  ", "\t"]
ENDS = ["\n", "\n\n", "\r\n", "  \n", ".\n", "\n \n"]


def corpus(lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(ENDS)
                   for _ in range(lines))


def settings(**kw) -> PrepareSettings:
    return PrepareSettings(shard_tokens=kw.pop("shard_tokens", 700), val_tokens=kw.pop("val_tokens", 300),
                           workers=1, **kw)


def shards(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.bin"))}


def tokens(out: Path) -> list[int]:
    return [int(t) for f in sorted(out.glob("*.bin"), key=lambda f: f.name.split("_")[-1]) for t in read_shard(f)]


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"\xef\xbb\xbf" + corpus(120, 1).encode())  # a byte order mark: dropped, read whole or in pieces
    b.write_text(corpus(80, 2), encoding="utf-8")
    return [a, b]


def test_a_txt_read_in_tiny_pieces_gives_the_whole_files_shard_bytes(files, tmp_path, monkeypatch, tokenizer):
    whole = prepare(FilesSource(files), tmp_path / "whole", settings(), progress=False)
    want = shards(tmp_path / "whole")
    # the reference outside the pipeline: [EOT] + the GPT-2 BPE of each whole text, in file order (the val shard is
    # the stream's head, the train shards the rest, so the shards in index order are the stream)
    enc = tokenizer
    texts = [f.read_bytes().decode("utf-8").removeprefix("\ufeff") for f in files]
    assert tokens(tmp_path / "whole") == [t for x in texts for t in [enc.eot_token, *enc.encode_ordinary(x)]]
    assert whole["documents"] == 2 and whole["shards"] > 4
    for size in (1, 2, 3, 5, 7, 64, 997):  # reads that end inside 2-, 3- and 4-byte characters and inside words
        monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", size)
        pieces = list(FilesSource(files).items(cut_ok=safe_cut(enc.encode_ordinary)))
        assert len(pieces) > 10 and sum(not p.more for p in pieces) == 2  # cut in pieces; two documents
        out = tmp_path / f"c{size}"
        got = prepare(FilesSource(files), out, settings(), progress=False)
        assert shards(out) == want, size
        assert (got["documents"], got["tokens"]) == (2, whole["tokens"])


def test_pieces_end_only_before_a_line_break_after_a_letter(files, monkeypatch, tokenizer):
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 5)
    enc = tokenizer
    pieces = list(FilesSource(files[1:]).items(cut_ok=safe_cut(enc.encode_ordinary)))
    assert "".join(p.text for p in pieces) == files[1].read_bytes().decode("utf-8")
    for p, q in zip(pieces, pieces[1:], strict=False):
        assert p.text[-1].isalpha() and q.text[0] in "\r\n" and p.more and q.cont
    assert not pieces[0].cont and not pieces[-1].more


def test_a_tokenizer_that_disagrees_at_every_cut_reads_the_document_whole(files, monkeypatch):
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 5)
    # a tokenizer marking each text's start (sentencepiece's prepended ▁): no cut passes the check
    pieces = list(FilesSource(files[1:]).items(cut_ok=safe_cut(lambda s: [0] + [ord(c) for c in s])))
    assert len(pieces) == 1 and pieces[0].text == files[1].read_bytes().decode("utf-8")


def test_a_bad_byte_is_named_at_the_same_byte_however_the_file_is_read(tmp_path, monkeypatch):
    """Read once (the default): the pieces before the bad byte, then a bad row naming the byte a whole-file decode
    names; checked whole first (``whole_check``, what --skip-bad asks): one bad row, no piece. Either way at every
    read size, a read ending inside the bad character or just after it."""
    f = tmp_path / "bad.txt"
    head = corpus(40).encode()
    f.write_bytes(head + b"\xe2\x82" + b"x" + corpus(5).encode())  # a 3-byte character cut short
    with pytest.raises(UnicodeDecodeError) as e:
        f.read_bytes().decode("utf-8")
    want = f"not valid UTF-8 at byte {e.value.start} ({e.value.reason})"
    assert e.value.start == len(head)
    for size in (1 << 20, 1, 2, 3, 7):
        monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", size)
        items = list(FilesSource([f]).items(cut_ok=lambda t, c: True))
        assert items[-1].text is None and items[-1].reason == want, size
        assert all(it.text for it in items[:-1]) and (len(items) > 1) == (size < 1 << 20), size
        assert "".join(it.text for it in items[:-1]) == head.decode()[:len("".join(it.text for it in items[:-1]))]
        whole = list(FilesSource([f]).items(cut_ok=lambda t, c: True, whole_check=True))
        assert [(it.text, it.reason) for it in whole] == [(None, want)], size


@pytest.mark.parametrize("end", [b"\xe2\x82", b"\xff"], ids=["cut-short-at-the-end", "a-bad-lead-byte"])
def test_the_last_bytes_are_judged_too(end, tmp_path, monkeypatch):
    f = tmp_path / "bad.txt"
    f.write_bytes(corpus(10).encode() + end)
    with pytest.raises(UnicodeDecodeError) as e:
        f.read_bytes().decode("utf-8")
    for size in (1 << 20, 1, 3):
        monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", size)
        items = list(FilesSource([f]).items(cut_ok=lambda t, c: True))
        assert items[-1].reason == f"not valid UTF-8 at byte {e.value.start} ({e.value.reason})", size


def test_a_txt_is_read_once_unless_bad_files_are_skipped(files, tmp_path, monkeypatch):
    """prepare read every .txt twice (a UTF-8 check, then the pieces); now once, and twice only with --skip-bad,
    where a bad file is skipped whole and so must be judged before its first piece is written. A bad file stops
    the run with the refusal it had; skipped, none of its tokens is in the shards."""
    reads = []
    real = sources._txt_texts
    monkeypatch.setattr(sources, "_txt_texts", lambda f: (reads.append(f), real(f))[1])
    prepare(FilesSource(files), tmp_path / "once", settings(), progress=False)
    assert reads == files
    reads.clear()
    prepare(FilesSource(files), tmp_path / "twice", settings(skip_bad=True), progress=False)
    assert reads == [files[0], files[0], files[1], files[1]]
    bad = tmp_path / "bad.txt"
    head = corpus(400, 5).encode()
    bad.write_bytes(head + b"\xff" + b"tail\n")
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 64)
    from gptforge.data.prepare.sources import SourceError

    with pytest.raises(SourceError) as e:
        prepare(FilesSource([*files, bad]), tmp_path / "stops", settings(), progress=False)
    assert str(e.value).startswith(f"{bad}: not valid UTF-8 at byte {len(head)} (invalid start byte). Fix or remove")
    got = prepare(FilesSource([*files, bad]), tmp_path / "skips", settings(skip_bad=True), progress=False)
    assert got["skipped"] == 1 and shards(tmp_path / "skips") == shards(tmp_path / "once")
    # the stopped run wrote shards holding the bad file's head: resumed with --skip-bad it cannot be skipped whole
    with pytest.raises(SourceError):  # no val split: shards are written from the start, the bad file's head too
        prepare(FilesSource([*files, bad]), tmp_path / "head", settings(val_tokens=0), progress=False)
    state = json.loads((tmp_path / "head" / "manifest.json").read_text())["state"]
    assert (state["next_item"], state["doc_offset"] > 0) == (2, True)  # the bad file, some of its tokens written
    with pytest.raises(SourceError, match=r"its first [0-9,]+ tokens are already in the shards"):
        prepare(FilesSource([*files, bad]), tmp_path / "head", settings(val_tokens=0, skip_bad=True), progress=False)


def test_one_endless_line_is_cut_before_a_space_once_it_holds_too_much(tmp_path, monkeypatch, tokenizer):
    """A text with no line break after a letter grew in memory until its end. Past TXT_HOLD_CHARS held, a piece may
    also end before a space or tab after a letter (checked by the tokenizer as the line-break cut is): what is held
    stays bounded, and the tokens are those of the whole text."""
    text = corpus(300, 4).replace("\n", " ").replace("\r", " ")
    f = tmp_path / "line.txt"
    f.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 50)
    monkeypatch.setattr(sources, "TXT_HOLD_CHARS", 400)
    pieces = list(FilesSource([f]).items(cut_ok=safe_cut(tokenizer.encode_ordinary)))
    assert "".join(p.text for p in pieces) == text
    # a cut is sought once more than 400 characters are held, which is at most 400 + one 50-byte read
    assert len(pieces) > 10 and max(len(p.text) for p in pieces) <= 400 + 50
    for p, q in zip(pieces, pieces[1:], strict=False):
        assert p.text[-1].isalpha() and q.text[0] in " \t"
    enc = tokenizer
    assert [t for p in pieces for t in enc.encode_ordinary(p.text)] == enc.encode_ordinary(text)
    monkeypatch.setattr(sources, "TXT_HOLD_CHARS", 1 << 30)  # the bound off: held whole, as before
    assert len(list(FilesSource([f]).items(cut_ok=safe_cut(enc.encode_ordinary)))) == 1


def test_a_run_stopped_inside_a_document_read_in_pieces_resumes_to_the_same_bytes(files, tmp_path, monkeypatch):
    from gptforge.data.prepare import pipeline

    prepare(FilesSource(files), tmp_path / "whole", settings(), progress=False)
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 13)
    real, written = pipeline._Writer.flush, []

    def stop_after_three(self, next_item, doc_offset):
        real(self, next_item, doc_offset)
        written.append(doc_offset)
        if len(written) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline._Writer, "flush", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare(FilesSource(files), tmp_path / "r", settings(), progress=False)
    assert written[-1] > 0  # it stopped inside a document: the restart drops tokens across the pieces read again
    monkeypatch.setattr(pipeline._Writer, "flush", real)
    prepare(FilesSource(files), tmp_path / "r", settings(), progress=False)
    assert shards(tmp_path / "r") == shards(tmp_path / "whole")


def test_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """The peak of Python's and numpy's allocations (tracemalloc) while preparing a 0.17 MB and a 1.24 MB text file,
    read 16 KiB at a time. Read whole, the larger file raises the peak by at least twice the 1.07 MB between them
    (its bytes, and its text at one byte a character); read in pieces, what is held (a read, the text since the
    last cut, a chunk's tokens, the 20,000-token shard buffer) is the same for both, and only the bookkeeping of
    the shards grows (an entry each in the manifest, which is rewritten after each). The bound, half the
    difference, is 4x below what a whole read adds, so it tells the two apart whatever the bookkeeping costs."""
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 16 << 10)
    s = PrepareSettings(shard_tokens=20_000, val_tokens=2_000, workers=1, chunk_chars=16 << 10)
    peaks, sizes = [], []
    for name, copies in (("warm", 1), ("small", 10), ("big", 75)):  # warm: the tokenizer loaded, caches filled
        f = tmp_path / f"{name}.txt"
        f.write_text(corpus(400) * copies, encoding="utf-8")
        tracemalloc.start()
        try:
            got = prepare(FilesSource([f]), tmp_path / name, s, progress=False)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        sizes.append(f.stat().st_size)
        assert got["documents"] == 1
    grown, more = peaks[2] - peaks[1], sizes[2] - sizes[1]
    assert more > 1_000_000
    assert grown < more / 2, f"peak {peaks[1]:,} -> {peaks[2]:,} bytes for {sizes[1]:,} -> {sizes[2]:,}-byte files"


def test_a_piece_that_ends_exactly_at_a_shards_end_leaves_its_document_open(tmp_path, monkeypatch, tokenizer):
    """The shard is full where a piece ends but its document goes on: the manifest's resume point is inside the
    document (item 0, the shard's tokens), it is not counted as a document, and a resumed run gives the bytes of
    an uninterrupted one."""
    import json

    from gptforge.data.prepare import pipeline

    f = tmp_path / "a.txt"
    f.write_text(corpus(60, 3), encoding="utf-8")
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 200)
    first = next(FilesSource([f]).items(cut_ok=safe_cut(tokenizer.encode_ordinary)))
    assert first.more
    full = 1 + len(tokenizer.encode_ordinary(first.text))  # the separator and the first piece: one shard exactly
    s = PrepareSettings(shard_tokens=full, val_tokens=0, workers=1)
    whole = prepare(FilesSource([f]), tmp_path / "whole", s, progress=False)
    assert whole["documents"] == 1 and whole["shards"] > 2
    real = pipeline._Writer.flush

    def stop_after_one(self, next_item, doc_offset):
        real(self, next_item, doc_offset)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline._Writer, "flush", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        prepare(FilesSource([f]), tmp_path / "r", s, progress=False)
    state = json.loads((tmp_path / "r" / "manifest.json").read_text())["state"]
    assert (state["next_item"], state["doc_offset"], state["documents"]) == (0, full, 0)
    monkeypatch.setattr(pipeline._Writer, "flush", real)
    again = prepare(FilesSource([f]), tmp_path / "r", s, progress=False)
    assert shards(tmp_path / "r") == shards(tmp_path / "whole") and again["documents"] == 1


def test_pieces_through_the_worker_pool_give_the_same_bytes(files, tmp_path, monkeypatch):
    """Two tokenizer processes, the pieces of one document in different chunks (the separator only before the
    first): the bytes of the single-process whole read."""
    prepare(FilesSource(files), tmp_path / "whole", settings(), progress=False)
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 7)
    s = PrepareSettings(shard_tokens=700, val_tokens=300, workers=2, chunk_docs=3)
    got = prepare(FilesSource(files), tmp_path / "two", s, progress=False)
    assert shards(tmp_path / "two") == shards(tmp_path / "whole") and got["documents"] == 2


def _metaspace(tmp_path: Path) -> Path:
    """A SentencePiece-style BPE (Metaspace: '▁' prepended to each text it encodes) as a tokenizer.json folder."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    t.train_from_iterator([corpus(50, k) for k in range(6)], trainers.BpeTrainer(
        vocab_size=400, show_progress=False, special_tokens=["<|endoftext|>"]))
    d = tmp_path / "spm"
    d.mkdir()
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": "<|endoftext|>"}))
    return d


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_a_tokenizer_json_gives_the_whole_reads_bytes_in_pieces(kind, files, tmp_path, monkeypatch):
    """A Hugging Face tokenizer.json: byte-level BPE on GPT-4's split (cut in pieces, as GPT-2's), and a
    SentencePiece-style one, whose '▁' before each text no cut survives (safe_cut refuses them all: read whole)."""
    from gptforge.data.prepare.workers import load_tokenizer
    from tests.data.test_tokenizer_seam import train_small

    tok = str(train_small(tmp_path) if kind == "bytelevel" else _metaspace(tmp_path))
    s = settings(tokenizer=tok)
    prepare(FilesSource(files), tmp_path / "whole", s, progress=False)
    monkeypatch.setattr(sources, "TXT_CHUNK_BYTES", 7)
    pieces = list(FilesSource(files).items(cut_ok=safe_cut(load_tokenizer(tok).encode_ordinary)))
    assert (len(pieces) > 10) == (kind == "bytelevel"), len(pieces)
    prepare(FilesSource(files), tmp_path / "cut", s, progress=False)
    assert shards(tmp_path / "cut") == shards(tmp_path / "whole")
