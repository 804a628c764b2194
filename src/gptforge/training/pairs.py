"""What the two preference recipes (reward model, DPO) share: their preset, the pair batch source,
the chat template in meta.json, micro-batch accumulation and the held-out eval schedule.

    gptforge rm --init-from runs/sft --data prefs.jsonl --out runs/rm
    gptforge dpo --init-from runs/sft --data prefs.jsonl --out runs/dpo

A step takes ``grad_accum`` micro-batches of ``train.micro_batch`` pairs (each rank its own share of
a seeded order; :class:`gptforge.data.preference.PairLoader`) and makes one optimizer step; the
loader's position is in every checkpoint, so a resume is bit-exact. The held-out pairs (``val_count``,
never trained on) are scored at the start, every ``eval_every`` steps and at the end.
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.config import Config, ConfigError, OptimConfig, TrainConfig
from gptforge.data.chat import ChatTemplate, plain_tokenizer
from gptforge.data.preference import PairBatch, RenderedPair, collate, pair_loaders
from gptforge.parallel.distributed import all_reduce_mean, grad_sync, local_tensor
from gptforge.training.recipe import Recipe, RunCtx


def pair_config(model: Any, out_dir: str, lr: float = 5e-6) -> Config:
    """Defaults of ``gptforge rm`` / ``dpo`` (TRL's are lr 5e-6 / 1e-6 at 8 pairs; small models learn
    faster at a larger lr): constant lr after a short warmup, no weight decay, 8 pairs per micro-batch,
    the base model's context up to 512, 200 steps, checkpoints every 100. Override any --section.key."""
    T = min(model.block_size, 512) if model is not None else 512
    cfg = Config(optim=OptimConfig(lr=lr, warmup_steps=10, weight_decay=0.0, grad_clip=1.0, schedule="wsd",
                                   cooldown_frac=0.0, min_lr_frac=1.0),
                 train=TrainConfig(micro_batch=8, seq_len=T, total_batch_tokens=8 * T, max_steps=200, val_every=0,
                                   sample_every=0, ckpt_every=100, keep_ckpts=2, seed=0, compile=False,
                                   out_dir=out_dir))
    if model is not None:
        cfg.model = model
    return cfg


class PairRecipe(Recipe):
    """The base of :class:`gptforge.training.rm.RM` and :class:`gptforge.training.dpo.DPO`. A subclass
    sets ``name``/``kind``/``section`` and supplies ``micro_step(run, batch) -> (loss, metrics)`` and
    ``score_held_out(run) -> metrics`` (with ``loss``)."""

    section = ""  # "rm" | "dpo": the config section with data, split, val_count, seed, grad_accum
    predicts_next = True  # the forward sees a side less its last token (DPO's targets), so seq_len + 1 fit

    def __init__(self, cfg: Config, template: ChatTemplate, enc: Any = None):
        self.template = template
        self.tokenizer = plain_tokenizer(enc) or getattr(template, "tok", None)  # the starting model's
        self.make = pair_loaders(getattr(cfg, self.section), template, cfg.train.micro_batch,
                                 cfg.train.seq_len + int(self.predicts_next), self.section)  # reads and checks the data before any compute
        self.val: list[RenderedPair] = []

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "chat_template": self.template.to_dict()}

    def check(self, cfg: Config, world: int) -> int:
        from gptforge.config import check_finite_floats

        check_finite_floats(cfg)
        if world > 1 and (cfg.dist.tp > 1 or cfg.dist.pp > 1):  # (on one process they only say they do nothing)
            raise ConfigError(f"dist.tp={cfg.dist.tp}, dist.pp={cfg.dist.pp}: {self.name} runs data-parallel only "
                              "(dist.tp 1, dist.pp 1; --dist.shard zero1 or fsdp shard its memory): its pair batches "
                              "and held-out scores are split by rank, where tensor- and pipeline-parallel ranks need the same ones")
        if cfg.train.seq_len > cfg.model.block_size:
            raise ConfigError(f"train.seq_len={cfg.train.seq_len} exceeds model.block_size={cfg.model.block_size}")
        return 0  # steps are pair batches, not token batches

    def loaders(self, cfg: Config, info: Any) -> tuple[Any, Any, int]:
        train, self.val, n = self.make(info)
        return train, None, n

    def begin(self, run: RunCtx, start_step: int) -> None:
        if start_step == 0:
            self.evaluate(run, 0, last=False, force=True)

    def micro_step(self, run: RunCtx, batch: PairBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def step(self, run: RunCtx, step: int) -> dict[str, float]:
        accum = getattr(run.cfg, self.section).grad_accum
        sums: dict[str, float] = {}
        for k in range(accum):
            batch = run.state.loader.next_batch().to(run.device)
            with grad_sync(run.wrapped, run.info, sync=k == accum - 1), run.autocast():
                loss, m = self.micro_step(run, batch)
                (loss / accum).backward()
            for key, v in m.items():
                sums[key] = sums.get(key, 0.0) + v / accum
        clip = run.cfg.optim.grad_clip
        params = list(run.model.parameters())
        norm = (torch.nn.utils.clip_grad_norm_(params, clip) if clip > 0 else
                torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        keys = sorted(sums)
        mean = all_reduce_mean(torch.tensor([sums[k] for k in keys], device=run.device), run.info).tolist()
        return {**dict(zip(keys, mean, strict=True)), "grad_norm": float(local_tensor(norm))}

    def held_out_batches(self, run: RunCtx) -> list[PairBatch]:
        """This rank's share of the held-out pairs, in micro-batches (every pair once over all ranks)."""
        mine = list(range(run.info.rank, len(self.val), run.info.world))
        B = run.cfg.train.micro_batch
        return [collate([self.val[i] for i in mine[j : j + B]], mine[j : j + B], self.template.bos).to(run.device)
                for j in range(0, len(mine), B)]

    def score_held_out(self, run: RunCtx) -> dict[str, float]:
        raise NotImplementedError

    def evaluate(self, run: RunCtx, step: int, last: bool, force: bool = False) -> float | None:
        every = getattr(run.cfg, self.section).eval_every
        if not (force or last or (every and step % every == 0)):
            return None
        from gptforge.parallel.distributed import gathered

        was = run.model.training
        run.model.eval()
        with torch.no_grad(), run.autocast(), gathered(run.model):  # FSDP: ranks' shares differ in size
            m = self.score_held_out(run)
        run.model.train(was)
        run.metrics.write("eval", step, n=len(self.val), **m)  # n: the summary's interval
        run.log(f"step {step:>5} | held-out ({len(self.val)} pairs) | " + " | ".join(
            f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float)))
        return m["loss"]


def weighted_mean(parts: list[tuple[int, dict[str, float]]], run: RunCtx) -> dict[str, float]:
    """Metrics of micro-batches (n pairs, metrics) -> their pair-weighted mean over all ranks."""
    keys = sorted(parts[0][1]) if parts else []
    tot = torch.zeros(len(keys) + 1, dtype=torch.float64)
    for n, m in parts:
        tot[:-1] += torch.tensor([m[k] * n for k in keys], dtype=torch.float64)
        tot[-1] += n
    from gptforge.parallel.distributed import all_reduce_sum

    tot = all_reduce_sum(tot.to(run.device), run.info).cpu()
    return {k: float(tot[i] / tot[-1]) for i, k in enumerate(keys)}

