"""Supervised fine-tuning on conversations: the pretraining loop with a conversation loader.

    gptforge sft --init-from runs/base --data conv.jsonl --out runs/sft
    gptforge sft --init-from runs/base --data HuggingFaceTB/smoltalk --out runs/sft   # online
    gptforge sft --init-from runs/base --data ./chat_ds --out runs/sft   # save_to_disk dir, parquet
    gptforge sft --data conv.jsonl --out runs/sft --resume

The base model's shape is kept; ``model.vocab_size`` grows to cover the chat tokens (the padded
embedding rows already exist, so the weights fit unchanged). Held-out conversations give the val
loss, which is the mean loss over assistant tokens only. Checkpoints carry the chat template in
meta.json and resume like pretraining (same loop, same TrainState), under torchrun too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gptforge.config import Config, ConfigError, DataConfig, OptimConfig, SFTConfig, TrainConfig
from gptforge.data.chat import ChatTemplate
from gptforge.models.gpt2 import GPTConfig
from gptforge.training.pretrain import Pretrain
from gptforge.training.recipe import Recipe


def sft_config(model: GPTConfig, out_dir: str, data: str = "") -> Config:
    """SFT defaults (a preset for fine-tuning): a small constant-then-decay LR, no weight decay,
    the base model's context, frequent validation. Any key can be overridden as --section.key."""
    T = min(model.block_size, 512)
    return Config(
        model=model,
        data=DataConfig(dir="(conversations: see sft.data)"),
        sft=SFTConfig(data=data),
        optim=OptimConfig(lr=1e-4, warmup_steps=10, min_lr_frac=0.0, weight_decay=0.0, grad_clip=1.0),
        train=TrainConfig(micro_batch=8, seq_len=T, total_batch_tokens=8 * T, max_steps=500, val_every=50,
                          val_tokens=1 << 30, sample_every=0, sample_tokens=32, ckpt_every=100, keep_ckpts=2,
                          out_dir=out_dir),
    )


def prepare_chat_model(cfg: Config, template: ChatTemplate) -> None:
    """Check the base model has embedding rows for the chat tokens; widen its logits to cover them."""
    template.check_model(cfg.model)
    if cfg.model.vocab_size < template.vocab_size:
        cfg.model = dataclasses.replace(cfg.model, vocab_size=template.vocab_size)


class SFT(Pretrain):
    """Pretraining's step and eval on conversations: the batch source renders ``cfg.sft.data`` with the
    chat template and trains on assistant tokens only; held-out conversations give the val loss."""

    name = "sft"

    def __init__(self, cfg: Config, template: ChatTemplate, base_val_loss: float | None = None, tok: Any = None):
        self.template = template
        self.tokenizer = tok if tok is not None else getattr(template, "tok", None)  # a Jinja template's own
        self.extra = {} if base_val_loss is None else {"base_val_loss": base_val_loss}
        self.make = conversation_loaders(cfg, template)  # reads and checks the data before any compute

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "chat_template": self.template.to_dict(), **self.extra}

    def check(self, cfg: Config, world: int) -> int:
        """Conversations, not shards: the tokenizer is the starting model's (set by the command)."""
        return Recipe.check(self, cfg, world)

    def loaders(self, cfg: Config, info: Any) -> tuple[Any, Any, int]:
        return self.make(info)

    def print_samples(self, run: Any, step: int) -> None:
        """Chat turns: the first held-out conversations' opening turns, then the model's reply."""
        from gptforge.training.evaluate import print_chat_samples

        print_chat_samples(run.model, run.cfg, run.info, step, run.metrics, run.log, self.template,
                           self.make.prompts, enc=self.words())


def conversation_loaders(cfg: Config, template: ChatTemplate) -> Callable[[Any], tuple]:
    """Read, render and split ``cfg.sft``'s conversations once; returns info -> (train, val, val batches)."""
    from gptforge.data.sft import ConversationLoader, read_conversations, render_all, split_conversations

    sft = cfg.sft
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    stats: dict[str, int] = {}
    convs = read_conversations(sft.data, sft.split, sft.skip_bad, stats)
    rendered = render_all(convs, template, T + 1, skip_bad=sft.skip_bad, stats=stats)
    if stats.get("skipped"):
        print(f"[gptforge sft] skipped {stats['skipped']} bad conversation(s) (--skip-bad)", flush=True)
    train_convs, val_convs = split_conversations(rendered, sft.val_count, sft.seed)

    def make(info: Any) -> tuple:
        # the data dimension's rank and size: tensor/pipeline-parallel ranks of one replica read the same rows
        train = ConversationLoader(train_convs, B, T, info.dp_rank, info.dp_world, shuffle=True, seed=sft.seed,
                                   pad=template.bos)
        val = ConversationLoader(val_convs, B, T, info.dp_rank, info.dp_world, shuffle=False, pad=template.bos)
        return train, val, max(1, val.num_batches())

    make.prompts = [generation_prompt(r.ids.tolist(), template, r.mask.tolist()) for r in val_convs[:2]]  # type: ignore[attr-defined]
    return make


def generation_prompt(ids: list[int], template: ChatTemplate, mask: list[int] | None = None) -> list[int]:
    """A rendered conversation cut just after its first ``<|assistant|>`` (a Jinja template: just
    before the first token trained on, i.e. after the assistant's header): what the model replies to."""
    if hasattr(template, "roles"):
        return ids[: ids.index(template.roles["assistant"]) + 1]
    return ids[: next((i for i, m in enumerate(mask or []) if m), len(ids))]


def base_val_loss(cfg: Config, init_weights: Callable, loaders: Callable[[Any], tuple], max_batches: int = 16) -> float:
    """The starting model's loss on the held-out assistant tokens (on CPU, one process): the number
    SFT is measured against."""
    import torch

    from gptforge.models.registry import build_model
    from gptforge.parallel.distributed import DistInfo

    model = build_model(cfg.model)
    init_weights(model)
    model.eval()
    _, val, n = loaders(DistInfo())
    total = 0.0
    with torch.no_grad():
        for _ in range(min(n, max_batches)):
            x, y = val.next_batch()
            total += model(x, y)[1].item()
    return total / min(n, max_batches)


def run_sft(cfg: Config, template: ChatTemplate, resume: str | None = None, force: bool = False,
            init_weights: Callable | None = None, stop_at_step: int | None = None, base_loss: bool = False,
            tok: Any = None):
    """Train ``cfg`` on the conversations of ``cfg.sft``; returns the loop's RunResult. ``base_loss``:
    first score the starting model on the held-out conversations (printed, and kept in meta.json)."""
    from gptforge.training.loop import train

    if not cfg.sft.data:
        raise ConfigError("sft.data is empty: give --data FILE.jsonl or a Hugging Face chat dataset")
    if cfg.train.seq_len > cfg.model.block_size:
        raise ConfigError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
    prepare_chat_model(cfg, template)
    recipe = SFT(cfg, template, tok=tok)
    if base_loss and init_weights is not None and resume is None:
        recipe.extra["base_val_loss"] = base_val_loss(cfg, init_weights, recipe.make)
        print(f"[gptforge sft] base model's held-out assistant loss {recipe.extra['base_val_loss']:.4f}", flush=True)
    return train(cfg, recipe, resume=resume, force=force, init_weights=init_weights, stop_at_step=stop_at_step)
