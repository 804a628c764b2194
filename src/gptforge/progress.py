"""One progress bar for the long passes that have no log line of their own (DPO's reference log-probs,
generative eval, RL's held-out eval, bench-generate's calls): a tqdm bar on stderr, shown from its first line, gone when done.

    with progress_bar(len(pairs), "reference log-probs (train)", "pair") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))
"""

from __future__ import annotations


def progress_bar(total: int, desc: str, unit: str, show: bool = True):
    """A tqdm bar over ``total`` ``unit``s (``show`` False: a silent one, e.g. off rank 0). It draws at
    once (``desc: 0/total``), redraws at most once a second, and leaves no line behind: the pass's
    own summary line follows it."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not show, dynamic_ncols=True, leave=False,
                mininterval=1.0)
