"""AI2's multiple-choice rows (ARC, OpenBookQA) read by one function: the answer's index among the labels,
and a malformed row named instead of scored wrong."""

from __future__ import annotations

import re

import pytest

from gptforge.eval.tasks.base import labelled_choices


def row(texts, labels, key):
    return {"choices": {"text": texts, "label": labels}, "answerKey": key}


def test_the_answer_key_picks_its_label_not_a_position():
    assert labelled_choices(row(["a", "b", "c"], ["1", "2", "3"], "3")) == (["a", "b", "c"], 2)


@pytest.mark.parametrize("bad, says", [
    (row(["a", "b"], ["A"], "A"), "choices need matching text and label lists"),
    (row(["a"], ["A"], "A"), "2+ entries"),
    (row(["a", "b"], ["A", "B"], "E"), "answerKey 'E' is not among the choice labels"),
])
def test_a_malformed_row_is_named(bad, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        labelled_choices(bad)
