"""Pretraining as a recipe: llm.c token shards in, next-token loss out.

    gptforge train --preset shakespeare-cpu

The batch source is ``data.dir``'s train shards (resumable position, optional shuffling and BOS
alignment); a step is ``train.total_batch_tokens`` over gradient-accumulation micro-batches
(:func:`gptforge.training.step.train_step`); the eval is the val loss every ``train.val_every``
steps, task accuracy every ``eval.every`` steps, and samples every ``train.sample_every`` steps.
SFT (:mod:`gptforge.training.sft`) is this recipe with conversations as the batch source.
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.config import Config
from gptforge.data.aligned import make_loader
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import list_shards, read_header
from gptforge.data.tokenizer import shard_tokenizer, shard_tokenizer_recorded
from gptforge.parallel.comm import count_comm
from gptforge.parallel.distributed import DistInfo, gathered
from gptforge.training.evaluate import evaluate_during_training, prepare_for_training, print_samples
from gptforge.training.recipe import Recipe, RunCtx
from gptforge.training.step import evaluate_loss, train_step


class Pretrain(Recipe):
    name, kind = "pretrain", "train"
    step_logits = True  # and SFT's, which is a Pretrain

    def check(self, cfg: Config, world: int) -> int:
        """The run speaks the tokenizer its shards were made with (``data.dir``'s tokenizer/)."""
        tok = shard_tokenizer(cfg.data.dir)
        if not shard_tokenizer_recorded(cfg.data.dir) and tok.n_vocab > cfg.model.vocab_size:
            self.words_unknown = True  # shards of unknown origin on a model smaller than GPT-2: ids are checked
        else:  # as the loader reads them; no tokenizer is claimed for the checkpoints
            self.tokenizer = tok
            fit_vocab(cfg, tok)
        return super().check(cfg, world)

    def loaders(self, cfg: Config, info: DistInfo) -> tuple[Any, Any, int]:
        B, T = cfg.train.micro_batch, cfg.train.seq_len
        train = make_loader(list_shards(cfg.data.dir, cfg.data.train_split, cfg.data.val_split), B, T, info.dp_rank, info.dp_world,
                            align=cfg.data.align, shuffle=cfg.data.shuffle, seed=cfg.data.shuffle_seed,
                            eot=cfg.data.eot_token, step_tokens=_shard_step_tokens(cfg, info),
                            vocab_size=cfg.model.vocab_size)
        val_files = list_shards(cfg.data.dir, cfg.data.val_split, cfg.data.train_split)
        val = ShardLoader(val_files, B, T, info.dp_rank, info.dp_world, vocab_size=cfg.model.vocab_size)
        return train, val, sum(read_header(f)[2] for f in val.files) // (B * T * info.dp_world)  # (short ones left out)

    def prepare_model(self, run: RunCtx) -> None:
        self.tasks = prepare_for_training(run.cfg, run.model, run.log)  # loaded once; None when eval.every 0

    def step(self, run: RunCtx, step: int) -> dict[str, float]:
        cfg, info = run.cfg, run.info
        accum = cfg.train.accum_at(step, info.dp_world)
        every = cfg.dist.count_comm
        with count_comm(bool(every) and (step + 1) % every == 0, info, run.wrapped) as comm:
            loss, norm = train_step(run.wrapped, run.model, run.optimizer, run.state.loader, accum, run.autocast,
                                    info, cfg.optim.grad_clip)
        return {"loss": loss.item(), "grad_norm": float(norm),
                "tokens": accum * (cfg.train.total_batch_tokens // run.grad_accum), **comm}

    def log_line(self, stats: dict[str, float]) -> str:
        return f"loss {stats['loss']:.4f} | lr {stats['lr']:.2e} | norm {stats['grad_norm']:.3f}"

    def evaluate(self, run: RunCtx, step: int, last: bool) -> float | None:
        cfg, info = run.cfg, run.info
        vl = None
        if last or (cfg.train.val_every and step % cfg.train.val_every == 0):
            vl = evaluate_loss(_eval_module(run), run.extras["val"], run.extras["val_steps"], run.autocast, info)
            run.metrics.write("val", step, val_loss=vl, tokens=run.extras["tokens_seen"])
            run.log(f"step {step:>6} | val loss {vl:.4f} ({run.extras['val_steps']} batches)")
        tasks = self.tasks and (last or step % cfg.eval.every == 0)
        samples = last or (cfg.train.sample_every and step % cfg.train.sample_every == 0)
        if samples and (cfg.dist.tp > 1 or cfg.dist.pp > 1):  # a tensor- or pipeline-parallel forward needs every rank
            if info.is_main:
                run.log(f"(no in-loop samples under {info.layout}: generation on one rank would wait for the "
                        "others; use `gptforge sample --ckpt` on the checkpoint)")
            samples = False
        if tasks or samples:
            with gathered(run.model):  # FSDP: a task's rank shares differ in size, and rank 0 samples alone
                if tasks:  # on the raw module, not `wrapped`
                    evaluate_during_training(run.model, self.tasks, cfg, info, run.autocast, step,
                                             run.extras["tokens_seen"], run.metrics, run.log)
                if samples and info.is_main:
                    self.print_samples(run, step)
        return vl

    def print_samples(self, run: RunCtx, step: int) -> None:
        enc = None if self.words_unknown else self.words()
        print_samples(run.model, run.cfg, run.info, step, run.metrics, run.log, enc=enc)


def fit_vocab(cfg: Config, tok: Any, log=print) -> None:
    """A model left at GPT-2's vocabulary (the presets') over shards of another tokenizer takes that
    tokenizer's size, and its document separator; a size the user chose must cover the tokenizer."""
    import dataclasses

    from gptforge.tokens import EOT, GPT2_VOCAB

    if not tok.is_gpt2 and cfg.model.vocab_size == GPT2_VOCAB:
        cfg.model = dataclasses.replace(cfg.model, vocab_size=tok.n_vocab)
        log(f"model.vocab_size {GPT2_VOCAB} -> {tok.n_vocab}: the {tok.describe()} of {cfg.data.dir}")
    if cfg.data.eot_token == EOT and tok.eot_token != EOT:
        cfg.data.eot_token = tok.eot_token
    # that the tokenizer fits the model is checked by the loop (check_run_tokenizer), after a resumed
    # run's own tokenizer is compared: "another tokenizer" says more than "does not fit"


def _shard_step_tokens(cfg: Config, info: DistInfo) -> int:
    """The unit the loader keeps within one shard: a whole optimizer step, so a step's data does not
    depend on how it is split over ranks and micro-steps. Under a batch-size schedule steps change
    size, so the unit is one micro-batch of all ranks (a step may then span two shards)."""
    if cfg.train.batch_warmup_steps:
        return cfg.train.micro_batch * cfg.train.seq_len * info.dp_world
    return cfg.train.total_batch_tokens


def _eval_module(run: RunCtx) -> torch.nn.Module:
    """Evaluate through the compiled module but not through DDP (no gradient sync needed); under
    FSDP through the sharded module itself (its forward all-gathers the parameters on every rank)."""
    if run.info.fsdp:
        return run.wrapped
    return run.wrapped.module if run.info.enabled else run.wrapped
