"""A graded reward for the distributed GRPO tests (``--reward tests.training.graded_reward:graded``).

A random model's replies to arithmetic never score under the built-in rewards (all 0), so the
advantages, and with them ``rl.scale_rewards``' statistics across ranks, would never be checked. This
one grades any text: the share of distinct characters in the reply, plus a term of the problem (so a
group's mean differs from the batch's). Importable by every torchrun worker (the test puts the
repository root on ``PYTHONPATH``).
"""

from __future__ import annotations


def graded(problem, reply: str) -> float:
    return len(set(reply)) / 8 + (len(problem.question) % 3) / 4


def flat_for_odd_answers(problem, reply: str) -> float:
    """Flat (one reward for every reply) for the problems whose answer is odd: the groups ``rl.resample_flat``
    replaces; graded for the rest."""
    return 0.25 if int(problem.answer) % 2 else graded(problem, reply)
