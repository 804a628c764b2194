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
from dataclasses import dataclass
from typing import Any

from gptforge.config import Config, ConfigError, DataConfig, OptimConfig, TrainConfig
from gptforge.data.chat import ChatTemplate
from gptforge.models.gpt2 import GPTConfig


@dataclass
class SFTData:
    """Where the conversations come from and how they are split (stored in meta.json as "sft")."""

    data: str
    val_count: int = 200  # held-out conversations for the val loss
    split: str = "train"  # HF dataset split (online path)
    seed: int = 0  # held-out split and per-epoch order
    skip_bad: bool = False


def sft_config(model: GPTConfig, out_dir: str) -> Config:
    """SFT defaults (a preset for fine-tuning): a small constant-then-decay LR, no weight decay,
    the base model's context, frequent validation. Any key can be overridden as --section.key."""
    T = min(model.block_size, 512)
    return Config(
        model=model,
        data=DataConfig(dir="(conversations)"),
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


def conversation_loaders(cfg: Config, sft: SFTData, template: ChatTemplate) -> Callable[[Any], tuple]:
    """The ``loaders`` factory for :func:`gptforge.training.loop.train`: (train, val, val batches)."""
    from gptforge.data.sft import ConversationLoader, read_conversations, render_all, split_conversations

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

    return make


def base_val_loss(cfg: Config, init_weights: Callable, loaders: Callable[[Any], tuple], max_batches: int = 16) -> float:
    """The starting model's loss on the held-out assistant tokens (on CPU, one process): the number
    SFT is measured against."""
    import torch

    from gptforge.models.registry import build_model
    from gptforge.training.distributed import DistInfo

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


def run_sft(cfg: Config, sft: SFTData, template: ChatTemplate, resume: str | None = None, force: bool = False,
            init_weights: Callable | None = None, stop_at_step: int | None = None, base_loss: bool = False):
    """Train ``cfg`` on the conversations of ``sft``; returns the loop's RunResult. ``base_loss``:
    first score the starting model on the held-out conversations (printed, and kept in meta.json)."""
    from gptforge.training.loop import train

    if cfg.train.seq_len > cfg.model.block_size:
        raise ConfigError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
    prepare_chat_model(cfg, template)
    loaders = conversation_loaders(cfg, sft, template)  # reads and checks the data before any compute
    meta = {"chat_template": template.to_dict(), "sft": dataclasses.asdict(sft)}
    if base_loss and init_weights is not None and resume is None:
        meta["base_val_loss"] = base_val_loss(cfg, init_weights, loaders)
        print(f"[gptforge sft] base model's held-out assistant loss {meta['base_val_loss']:.4f}", flush=True)
    return train(cfg, resume=resume, force=force, init_weights=init_weights, loaders=loaders, extra_meta=meta,
                 stop_at_step=stop_at_step)
