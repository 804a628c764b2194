"""The one file-hashing reader (``gptforge.storage.digest``): the sha256 of the whole bytes whatever the block
size, each block told to the callback, and every checksum of a file taken through it."""

from __future__ import annotations

import hashlib
import os

import pytest

from gptforge.storage import digest

BLOCK = 7  # small, so a few bytes cross block edges


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5])
def test_sha256_file_is_hashlib_of_the_whole_bytes_and_tells_each_block(tmp_path, size):
    f = tmp_path / "blob"
    data = os.urandom(size)
    f.write_bytes(data)
    told: list[int] = []
    assert digest.sha256_file(f, told.append, block=BLOCK) == hashlib.sha256(data).hexdigest()
    assert sum(told) == size and len(told) == -(-size // BLOCK) and all(0 < n <= BLOCK for n in told), told
    assert digest.sha256_file(str(f)) == hashlib.sha256(data).hexdigest()  # the default block, no callback


def test_every_file_checksum_is_taken_by_the_one_reader(tmp_path, monkeypatch):
    """A checkpoint's files, the assets' and shards' (assets.sha256_file), a model's identity (resume.files_digest
    reads through it, its bar fed by the callback): one reader, not three that could drift."""
    from gptforge import assets
    from gptforge.run import checkpoint, resume

    assert checkpoint.sha256_file is digest.sha256_file and assets.sha256_file is digest.sha256_file
    read, real = [], digest.sha256_file
    monkeypatch.setattr(digest, "sha256_file", lambda p, on_block=None: read.append((p, on_block)) or real(p, on_block))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"weights")
    assert resume.files_digest([f], str(f)) == hashlib.sha256(b"weights").hexdigest()
    assert [p for p, _ in read] == [f] and callable(read[0][1])
