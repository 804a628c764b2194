"""What a recipe supplies to the one loop, and what the loop hands it.

    class MyRecipe(Recipe):
        kind = "train"                                  # metrics.jsonl record kind of a step
        def loaders(self, cfg, info): ...               # (train source, val source, val batches)
        def step(self, run, step): ...                  # forward/backward/optimizer; {"loss": ..., ...}
        def evaluate(self, run, step, last): ...        # its own eval; returns a val loss or None

A recipe owns only its batch source, its loss/step and its eval. Everything else (optimizer and
schedule, precision and compile, DDP/FSDP, checkpoints with RNG and bit-exact resume, signals and
exit codes, metrics and sinks, progress) comes from :func:`gptforge.training.loop.train`, so a new
recipe cannot forget one of them. Recipes: :mod:`.pretrain` (and SFT, :mod:`.sft`), :mod:`.grpo`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gptforge.config import Config
from gptforge.parallel.distributed import DistInfo
from gptforge.run.checkpointer import TrainState
from gptforge.run.metrics import MetricsLog


@dataclass
class RunCtx:
    """Everything a recipe's step and eval may use, built once by the loop."""

    cfg: Config
    info: DistInfo
    model: torch.nn.Module  # the raw module: checkpoints, generation, task evals
    wrapped: torch.nn.Module  # compiled and/or DDP/FSDP: forward/backward in training steps
    state: TrainState  # model, optimizer, train source, step
    autocast: Callable[[], Any]
    metrics: MetricsLog | None  # set once the run directory is open
    log: Callable[[str], None]
    grad_accum: int
    extras: dict[str, Any] = field(default_factory=dict)  # what a recipe keeps between calls

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer

    @property
    def device(self) -> torch.device:
        return self.info.device


class Recipe:
    """The base recipe: the hooks with their defaults. See the module docstring."""

    name = "pretrain"  # stored in every checkpoint's meta.json as "recipe"
    kind = "train"  # the metrics.jsonl kind of one step's record
    step_logits = False  # a step computes (micro_batch x seq_len, vocabulary) logits: its memory is checked first
    tokenizer: Any = None  # the run's Tokenizer (gptforge.data.tokenizer): GPT-2's unless the command sets one
    words_unknown = False  # shards that name no tokenizer, on a model smaller than GPT-2's: none is recorded

    def words(self) -> Any:
        """The run's tokenizer; every checkpoint carries it (meta.json's "tokenizer" and its files)."""
        from gptforge.data.tokenizer import Tokenizer, gpt2_tokenizer

        if self.tokenizer is None:
            self.tokenizer = gpt2_tokenizer()
        if not isinstance(self.tokenizer, Tokenizer):  # a raw tiktoken Encoding would be written as its repr
            raise TypeError(f"{type(self).__name__}.tokenizer is a {type(self.tokenizer).__name__}, not a "
                            "gptforge.data.tokenizer.Tokenizer")
        return self.tokenizer

    def meta(self) -> dict[str, Any]:
        """Extra keys for every checkpoint's meta.json (the tokenizer, the chat template, ...)."""
        if self.words_unknown:
            return {"recipe": self.name}
        return {"recipe": self.name, "tokenizer": self.words()}

    def check(self, cfg: Config, world: int) -> int:
        """Settings checked before any process group or compute; returns gradient-accumulation steps
        (0: the recipe's steps are not token batches). The mesh (dist.tp, dist.pp) and the batch."""
        from gptforge.parallel.mesh import check_layout

        return check_layout(cfg, world)

    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        """The module the run trains and checkpoints: the family model, or one wrapping it with a head
        (a reward model's score, PPO's value model). Fine-tuning weights go in through ``init_weights``."""
        from gptforge.models.registry import build_model

        return build_model(model_cfg)

    def loaders(self, cfg: Config, info: DistInfo) -> tuple[Any, Any, int]:
        """(train source with state_dict()/load_state_dict(), val source, val batches available)."""
        raise NotImplementedError

    def prepare_model(self, run: RunCtx) -> None:
        """After the model is built and restored, before the first step (a frozen reference model)."""

    def begin(self, run: RunCtx, start_step: int) -> None:
        """After the run directory is open, before the first step (a baseline eval)."""

    def step(self, run: RunCtx, step: int) -> dict[str, float]:
        """One optimizer step (0-based ``step``); returns at least ``loss``; ``grad_norm`` and
        ``tokens`` (trained this step) when it has them. Non-finite values stop the run (exit 3)."""
        raise NotImplementedError

    def log_line(self, stats: dict[str, float]) -> str:
        """The part of a step's log line after ``step N/M``."""
        return f"loss {stats['loss']:.4f}"

    def evaluate(self, run: RunCtx, step: int, last: bool) -> float | None:
        """The recipe's eval after step ``step``; returns a val loss when it computed one."""
        return None
