"""What an RL run (GRPO or PPO) carries from step to step besides its weights, and the two rules that
move it (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"):

* **the adaptive KL coefficient** (``rl.kl_target``): after each step,
  ``kl_coef * (1 + clip(KL / target - 1, -0.2, 0.2) * replies / rl.kl_horizon)`` (TRL's old
  ``AdaptiveKLController``), so the KL is held near the target instead of drifting;
* **the reward model's whitening** (``rl.reward_norm``): each member's mean and std over the run's first
  batch of replies (the starting policy's, every rank's), by which its scores are shifted and scaled
  from then on, so ``kl_coef`` weighs the KL against a reward of unit spread whatever its scale.

Both are saved as the loader state in every checkpoint's meta.json (:class:`RLState`) and checked when
read back, like any input.
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.parallel.distributed import DistInfo, all_reduce_sum


class RLError(ValueError):
    """Bad RL settings or inputs; the message names the flag."""


class RLState:
    """What an RL run carries between steps besides the weights (its batches are a function of the step):
    the adaptive KL coefficient (``rl.kl_target``) and the reward model's whitening (``rl.reward_norm``).
    Saved as the loader state in every checkpoint's meta.json and checked on the way back in: a
    checkpoint is data, and a bad number there must not steer a run."""

    def __init__(self, kl_start: float | None = None, adaptive: bool | None = None) -> None:
        """``kl_start``, ``adaptive``: this run's ``rl.kl_coef`` and whether ``rl.kl_target`` moves it (None: not
        known, the saved coefficient is taken as it is)."""
        self.kl_coef: float | None = None  # None: rl.kl_coef (a fixed coefficient, or the adaptive one's start)
        self.reward_norm: dict[str, list[float]] | None = None  # {"shift": [...], "scale": [...]}, one per member
        self.kl_start, self.adaptive = kl_start, adaptive

    def state_dict(self) -> dict:
        start = self.kl_start if self.kl_coef is not None else None  # where the saved coefficient started
        return {k: v for k, v in (("kl_coef", self.kl_coef), ("kl_start", start), ("reward_norm", self.reward_norm))
                if v is not None}

    def load_state_dict(self, state: dict) -> None:
        import math

        from gptforge.errors import LoaderStateError

        def number(x: Any, positive: bool) -> bool:
            return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                    and (x > 0 if positive else True))

        if not isinstance(state, dict):
            raise LoaderStateError(f"loader = {state!r}: not an object")
        kl, start, norm = state.get("kl_coef"), state.get("kl_start"), state.get("reward_norm")
        if kl is not None and not number(kl, positive=True):
            raise LoaderStateError(f"loader.kl_coef = {kl!r}: not a finite number > 0")
        if start is not None and not number(start, positive=True):
            raise LoaderStateError(f"loader.kl_start = {start!r}: not a finite number > 0")
        if norm is not None:
            ok = (isinstance(norm, dict) and set(norm) == {"shift", "scale"}
                  and all(isinstance(norm[k], list) and norm[k] for k in ("shift", "scale"))
                  and len(norm["shift"]) == len(norm["scale"])
                  and all(number(x, False) for x in norm["shift"]) and all(number(x, True) for x in norm["scale"]))
            if not ok:
                raise LoaderStateError(f"loader.reward_norm = {norm!r}: not {{'shift': [finite numbers], 'scale': "
                                       "[numbers > 0]}} of one length (one per reward model)")
        self.kl_coef = None if kl is None else float(kl)
        if self.kl_coef is not None and (self.adaptive is False or (start is not None and self.kl_start is not None
                                                                    and float(start) != self.kl_start)):
            # the command line's rl.kl_coef, as every override on a resume applies: a fixed coefficient (rl.kl_target
            # turned off), or a new start for the controller (--kl-coef changed); the controller's coefficient was
            # kept over both in silence while config.json and the next checkpoint recorded them
            self.kl_coef = None
        self.reward_norm = None if norm is None else {k: [float(x) for x in norm[k]] for k in ("shift", "scale")}


    def whiten(self, scores: torch.Tensor, info: DistInfo, log: Any = print) -> torch.Tensor:
        """(members, N) reward-model scores, whitened member by member: on the run's first call the
        numbers are set from these scores (every rank's, :func:`whitening`) and reported through ``log``;
        every call after reuses them. Non-finite scores are returned as they are (the step stops the run)."""
        if self.reward_norm is None:
            self.reward_norm = n = whitening(scores, info)
            if n is None:
                return scores
            log("rl.reward_norm: the reward model's score on the starting policy's replies, "
                + ", ".join(f"mean {m:.3f} std {d:.3f}" for m, d in zip(n["shift"], n["scale"], strict=True))
                + " (member by member): whitened to mean 0, std 1 from now on")
        n = self.reward_norm
        return (scores - torch.tensor(n["shift"])[:, None]) / torch.tensor(n["scale"])[:, None]


def adapt_kl_coef(coef: float, kl: float, target: float, n: int, horizon: int) -> float:
    """Ziegler et al. (2019)'s adaptive KL controller, in TRL's form: after a step of ``n`` replies whose
    KL was ``kl``, ``coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon)``."""
    err = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + err * n / horizon)


def whitening(scores: torch.Tensor, info: DistInfo) -> dict[str, list[float]] | None:
    """(members, n) scores of this rank's replies -> each member's mean and std over every rank's replies,
    as {"shift": [...], "scale": [...]} (population std, float64); None when a score is not finite (the
    step then stops the run). Every rank must call it (it all-reduces)."""
    s = scores.double()
    sums = torch.stack([s.sum(1), (s * s).sum(1), torch.full((s.size(0),), float(s.size(1)), dtype=torch.float64)])
    sums = all_reduce_sum(sums.to(info.device), info).cpu()
    mean = sums[0] / sums[2]
    std = (sums[1] / sums[2] - mean * mean).clamp(min=0).sqrt()
    if not bool(torch.isfinite(mean).all() and torch.isfinite(std).all()):
        return None
    if bool((std < 1e-6).any()):
        k = int((std < 1e-6).nonzero()[0])
        raise RLError(f"rl.reward_norm: reward model {k + 1} gave all {int(sums[2][0])} replies of step 1 the same "
                      f"score ({mean[k].item():.4g}): there is no spread to scale by (use it without rl.reward_norm)")
    return {"shift": mean.tolist(), "scale": std.tolist()}
