"""``gptforge plan`` shows the combination the config asks for (issue 55: ``plan --model.recompute block`` on
one GPU printed one "recomp none" row): the requested (shard, recompute) is a row of the table, marked
"as configured", once; the candidates are unchanged around it."""

from __future__ import annotations

import pytest

from gptforge.cli import main


def _rows(out: str) -> list[list[str]]:
    return [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0] in ("none", "zero1", "fsdp")]


def test_a_requested_recompute_is_a_row_on_one_gpu(capsys):
    assert main(["plan", "--preset", "gpt2-124m", "--world", "1", "--model.recompute", "block"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r[0], r[1]) for r in rows] == [("none", "none"), ("none", "block")], rows
    none, block = rows
    assert " ".join(block).endswith("<- fits, as configured"), block
    assert "configured" not in " ".join(none)
    # recomputing whole blocks keeps only each block's input: fewer activation bytes at the same micro-batch
    if none[2] == block[2]:
        assert float(block[6]) < float(none[6]), rows
    else:  # or a larger micro-batch fits
        assert int(block[2]) > int(none[2]), rows


def test_a_requested_candidate_is_marked_not_repeated(capsys):
    assert main(["plan", "--preset", "gpt2-124m", "--world", "8", "--dist.shard", "zero1",
                 "--model.recompute", "mlp"]) == 0
    rows = _rows(capsys.readouterr().out)
    pairs = [(r[0], r[1]) for r in rows]
    assert len(pairs) == len(set(pairs)) == 7  # the seven candidates, none added
    assert [p for p, r in zip(pairs, rows, strict=True) if "configured" in " ".join(r)] == [("zero1", "mlp")]


@pytest.mark.parametrize("shard", ["none", "zero1", "fsdp"])
def test_on_one_gpu_the_requested_recompute_is_a_row_whatever_the_shard(shard, capsys):
    """On one GPU sharding does nothing, so a config's dist.shard (llama3-1b's preset says zero1) must not hide
    its recompute: ``plan --preset llama3-1b --world 1 --model.recompute block`` printed the one "recomp none"
    row and "nothing fits", where block recomputation fits."""
    assert main(["plan", "--preset", "gpt2-124m", "--world", "1", "--dist.shard", shard,
                 "--model.recompute", "block"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r[0], r[1]) for r in rows] == [("none", "none"), ("none", "block")], rows
    assert " ".join(rows[1]).endswith("as configured"), rows


def test_the_guides_full_fine_tune_fits_with_recompute_and_nothing_fits_says_so(capsys):
    """docs/own-model.md's 24 GB question: full fine-tuning of llama3-1b does not fit as the preset is, the
    refusal names recomputation, and with --model.recompute block it fits (peak below 24 - 2 GiB reserved)."""
    assert main(["plan", "--preset", "llama3-1b", "--world", "1", "--gpu-mem", "24"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits" in out and "--model.recompute mlp or block" in out
    assert main(["plan", "--preset", "llama3-1b", "--world", "1", "--gpu-mem", "24", "--model.recompute", "block"]) == 0
    block = [r for r in _rows(capsys.readouterr().out) if r[1] == "block"]
    assert len(block) == 1 and float(block[0][7]) <= 22.0 and "fits," in " ".join(block[0]), block
