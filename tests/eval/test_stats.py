"""The context printed next to an accuracy: Wilson intervals and chance levels."""

from __future__ import annotations

import math

import pytest

from gptforge.eval.run import format_table
from gptforge.eval.stats import Z95, chance_level, wilson
from gptforge.eval.tasks import Example


@pytest.mark.parametrize("k, n, lo, hi", [
    (81, 263, 0.2553, 0.3662),  # Newcombe (1998), Stat. Med. 17:857, table I, method 3 (Wilson)
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombes_published_intervals(k, n, lo, hi):
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=6e-5)


def test_wilson_bounds_are_where_the_score_statistic_equals_z():
    # the defining property, checked in float64: |p_hat - p| = z * sqrt(p (1 - p) / n) at both ends
    k, n = 25, 40
    for p in wilson(k, n):
        assert abs(k / n - p) == pytest.approx(Z95 * math.sqrt(p * (1 - p) / n), rel=1e-9)


def _ex(n_choices: int) -> Example:
    return Example(contexts=("c",) * n_choices, continuations=tuple(f" {i}" for i in range(n_choices)), label=0)


def test_chance_level_is_the_mean_of_one_over_the_candidates():
    assert chance_level([_ex(4)] * 3) == 0.25
    assert chance_level([_ex(2), _ex(4)]) == pytest.approx(0.375)
    assert chance_level([_ex(1)] * 3) is None  # one continuation (LAMBADA): open-ended, no chance level


def test_the_table_says_when_an_accuracy_is_noise():
    r = {"n": 40, "acc": 0.625, "acc_ci95": list(wilson(25, 40)), "chance": 0.5, "seconds": 1.0}
    table = format_table({"piqa": r})
    assert "0.625" in table and "0.470-0.758" in table and "not distinguishable from guessing" in table
    r = {"n": 1000, "acc": 0.7, "acc_ci95": list(wilson(700, 1000)), "chance": 0.5, "seconds": 1.0}
    assert "not distinguishable" not in format_table({"piqa": r})


@pytest.mark.parametrize("ppl", [1.0, 99999.99, 1415902.0, 1e300, float("inf")])
def test_the_tables_columns_stay_in_line_whatever_the_perplexity(ppl):
    """An untrained model's LAMBADA perplexity (1,415,902) was 10 characters in a 9-wide column: every
    column after it moved. Each row is as long as the header, whatever the value."""
    lam = {"n": 100, "acc": 0.0, "ppl": ppl, "seconds": 1234.5}
    piqa = {"n": 100, "acc": 0.5, "acc_ci95": list(wilson(50, 100)), "acc_norm": 0.5,
            "acc_norm_ci95": list(wilson(50, 100)), "chance": 0.5, "seconds": 2.0}
    rows = format_table({"lambada": lam, "piqa": piqa}).splitlines()[:3]
    assert len({len(row) for row in rows}) == 1, rows
    assert float(rows[1].split()[-2]) == pytest.approx(ppl, rel=5e-3)  # the value is still there, to 3 digits
