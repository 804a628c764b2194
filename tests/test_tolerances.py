"""The derived tolerances of tests/tolerances.py against hand-made differences: what they must let through
(rounding, a few cancelled gradients under Adam) and what they must not (a micro-batch's worth of change)."""

from __future__ import annotations

import pytest
import torch

from tests.tolerances import CANCELLED_SHARE, assert_adam_trained_alike

LR, STEPS = 3e-3, 2
ATOL = STEPS * LR * 1e-3  # the rounding bound assert_adam_trained_alike states for grad_rel 1e-3


def _pair(n: int = 100_000) -> tuple[dict, dict]:
    torch.manual_seed(0)
    w = {"h.0.mlp.c_fc.weight": torch.randn(n) * 0.02, "wte.weight": torch.randn(n) * 0.02}
    return w, {k: v.clone() for k, v in w.items()}


def test_rounding_and_a_few_cancelled_gradients_pass():
    w1, w2 = _pair()
    w2["wte.weight"] += ATOL / 2  # rounding: every element, inside the bound
    w2["h.0.mlp.c_fc.weight"][:int(CANCELLED_SHARE * 100_000)] += 1.9 * LR  # Adam's sign flips, up to 2 lr a step
    assert_adam_trained_alike(w1, w2, lr=LR, steps=STEPS)


@pytest.mark.parametrize(("share", "by"), [
    (1.0, LR),  # a micro-batch dropped or doubled: every element moves by ~lr
    (0.01, LR),  # one element in a hundred (a misaligned micro-batch's rows)
    (0.0, 2.1 * LR * STEPS),  # one element past Adam's largest move: no rounding does that
])
def test_what_a_wrong_rank_contribution_does_fails(share, by):
    w1, w2 = _pair()
    n = max(1, int(share * 100_000))
    w2["wte.weight"][:n] += by
    with pytest.raises(AssertionError, match="wte.weight"):
        assert_adam_trained_alike(w1, w2, lr=LR, steps=STEPS)
