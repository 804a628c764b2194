"""The config sections of the preference recipes: ``rm`` (``gptforge rm``) and ``dpo`` (``gptforge dpo``).

    gptforge dpo --init-from runs/sft --data prefs.jsonl --out runs/dpo --dpo.beta 0.1 --dpo.loss_type ipo

They live beside :mod:`gptforge.config` (which imports them, so ``from gptforge.config import
RMConfig`` works) only to keep that file short; they validate like every section there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """A ValueError naming the key (``Config.from_dict`` and ``apply_overrides`` turn it into the
    ConfigError of every other section: this module imports nothing of gptforge)."""
    if not ok:
        raise ValueError(f"{key}={value!r} is not allowed; expected {allowed}")


@dataclass
class _PairData:
    data: str = ""  # FILE.jsonl of {"prompt", "chosen", "rejected"}, or a Hugging Face preference dataset
    split: str = "train"  # HF dataset split
    val_count: int = 100  # held-out pairs (accuracy, margin, val loss)
    seed: int = 0  # held-out split and per-epoch order
    skip_bad: bool = False  # count and skip bad rows instead of stopping
    grad_accum: int = 1  # micro-batches (train.micro_batch pairs each) per optimizer step
    eval_every: int = 0  # steps between held-out evals (0 = only at the start and the end)

    def _validate(self, section: str) -> None:
        _check(self.val_count >= 1, f"{section}.val_count", self.val_count, "an integer >= 1")
        _check(0 <= self.seed < 2**32, f"{section}.seed", self.seed, "an integer in [0, 2^32)")
        _check(self.grad_accum >= 1, f"{section}.grad_accum", self.grad_accum, "an integer >= 1")
        _check(self.eval_every >= 0, f"{section}.eval_every", self.eval_every, "an integer >= 0")


@dataclass
class RMConfig(_PairData):
    """``gptforge rm``: a reward model on preference pairs (Bradley–Terry, optional per-pair margin)."""

    use_margin: bool = True  # subtract a row's "margin" inside the sigmoid when the data has one (Llama 2)
    center_coef: float = 0.0  # TRL's center_rewards_coefficient: + c * mean((r_c + r_r)^2)

    def __post_init__(self) -> None:
        self._validate("rm")
        _check(self.center_coef >= 0, "rm.center_coef", self.center_coef, "a number >= 0")


DPO_LOSS_TYPES = ("sigmoid", "ipo")


@dataclass
class DPOConfig(_PairData):
    """``gptforge dpo``: DPO / IPO against a frozen reference (the starting model)."""

    beta: float = 0.1  # strength of the implicit KL to the reference (larger: stay closer to it)
    loss_type: str = "sigmoid"  # sigmoid (DPO) | ipo
    sft_coef: float = 0.0  # weight of an SFT (NLL) loss on the chosen replies added to the DPO loss (RPO; TRL's loss_type [sigmoid, sft])
    precompute_ref: bool = True  # reference log-probs computed once, cached in RUN/ref_logps.pt
    init_from: str = ""  # the starting model, which is also the reference
    task: str = ""  # a generated task (compare, arithmetic) whose held-out greedy accuracy is the eval; "" = none
    eval_n: int = 200  # held-out task problems
    max_new_tokens: int = 24  # reply cap of the task eval

    def __post_init__(self) -> None:
        self._validate("dpo")
        _check(self.beta > 0, "dpo.beta", self.beta, "a number > 0")
        _check(self.loss_type in DPO_LOSS_TYPES, "dpo.loss_type", self.loss_type, " or ".join(DPO_LOSS_TYPES))
        _check(self.eval_n >= 0, "dpo.eval_n", self.eval_n, "an integer >= 0")
        _check(0 <= self.sft_coef <= 100, "dpo.sft_coef", self.sft_coef, "a number in [0, 100] (0 = off)")
        _check(self.max_new_tokens >= 1, "dpo.max_new_tokens", self.max_new_tokens, "an integer >= 1")
