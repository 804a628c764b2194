"""A tiktoken ranks file is read from the file, every time. tiktoken's loader reads a local path through
its download cache ($TMPDIR/data-gym-cache, keyed by the path string): a ranks file rewritten in place
(a tokenizer trained again into the same folder) kept loading its first contents, silently."""

from __future__ import annotations

import base64
import os

import pytest

from gptforge import assets
from gptforge.data.tokenizer.base import TokenizerError, TokenizerUnavailable
from gptforge.data.tokenizer.tiktoken_kind import load_ranks, tiktoken_from_ranks


def _write(path, tokens: list[bytes]) -> None:
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))


BYTES = [bytes([i]) for i in range(256)]


def test_a_ranks_file_rewritten_in_place_loads_its_new_contents(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))  # where tiktoken would cache
    path = tmp_path / "tok" / "ranks.tiktoken"
    path.parent.mkdir()
    _write(path, BYTES + [b"ab"])
    first = tiktoken_from_ranks(path)
    assert first.encode_ordinary("ab") == [256] and load_ranks(path, None)[b"ab"] == 256
    _write(path, BYTES + [b"xy", b"ab"])  # trained again into the same folder: "ab" is now 257
    assert load_ranks(path, None) == {**{b: i for i, b in enumerate(BYTES)}, b"xy": 256, b"ab": 257}
    again = tiktoken_from_ranks(path)
    assert again.encode_ordinary("xyab") == [256, 257]
    assert again.fingerprint != first.fingerprint
    assert not (tmp_path / "tiktoken-cache").exists() or not os.listdir(tmp_path / "tiktoken-cache")  # no copy


def test_gpt2_ranks_read_as_tiktoken_reads_them(monkeypatch):
    """The same dict as tiktoken's own parser (its cache off), on GPT-2's 50,256 ranks."""
    from tiktoken.load import load_tiktoken_bpe

    path = assets.fetch_gpt2_ranks()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken: "" disables its cache
    assert load_ranks(path) == load_tiktoken_bpe(str(path), expected_hash=assets.GPT2_RANKS_SHA256)


def test_damage_is_named_with_the_file(tmp_path):
    gpt2 = assets.fetch_gpt2_ranks().read_bytes()
    cut = tmp_path / "gpt2.tiktoken"
    cut.write_bytes(gpt2[:300_000])  # good lines, but not GPT-2's ranks
    with pytest.raises(TokenizerUnavailable, match=f"{cut}.*SHA-256 is not GPT-2's.*gptforge assets tokenizer"):
        load_ranks(cut)
    for bad in (b"!!notbase64 0\n", b"Q!Q== 0\n", b"QQ== zero\n", b"QQ==\n"):
        other = tmp_path / "other.tiktoken"
        other.write_bytes(bad)
        with pytest.raises(TokenizerError, match=f"{other}: not a tiktoken ranks file"):
            load_ranks(other, None)
