"""``gptforge plan`` shows the combination the config asks for (issue 55: ``plan --model.recompute block`` on
one GPU printed one "recomp none" row): the requested (shard, recompute) is a row of the table, marked
"as configured", once; the candidates are unchanged around it."""

from __future__ import annotations

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
