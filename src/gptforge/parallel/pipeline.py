"""Pipeline parallelism through ``torch.distributed.pipelining``: stages by layers, a schedule per
``dist.pp_schedule``, the gradient-accumulation micro-batches as the pipeline's micro-batches.

    torchrun --nproc_per_node 2 -m gptforge train --preset tiny --dist.pp 2 --dist.pp_schedule gpipe

The model is built whole on every rank (same seed, same weights), then each rank keeps only its
stages' layers, in place, under their original names (``transformer.h.2`` stays ``h.2``), so
checkpoints, the optimizer and DCP see the same keys under any mesh. The first stage keeps the
embeddings, the last the final norm and the head. A stage's layers take their arguments by their index
in the whole model (the family's ``layer_args``: a sliding layer its window and local rope base). A
tied head (GPT-2, a tied Llama) is held by both end stages, as Megatron-LM does: the first stage's embedding and the last stage's head are one
parameter per stage, and their gradients are summed over a two-rank group before the optimizer
step, so both copies take the same update. Schedules: ``gpipe`` (all forwards, then all
backwards), ``1f1b`` (one forward one backward, at most pp micro-batches in flight) and
``interleaved1f1b`` (``dist.pp_virtual`` stages per rank, a smaller bubble). Stage s holds layers
[s L/S, (s+1) L/S); rank r holds stages r, r + pp, ... (the looped placement the interleaved
schedule expects).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gptforge.models.head import logits_and_loss

# family -> (container, layers, first-stage modules, last-stage modules, embedding a tied head shares)
FAMILIES = {
    "gpt2": ("transformer", "h", ("wte", "wpe"), ("ln_f",), "wte"),
    "llama": ("model", "layers", ("embed_tokens",), ("norm",), "embed_tokens"),
}


class Stage(nn.Module):
    """One pipeline stage: the family's forward from token ids (first stage) or hidden states, through
    layers ``[lo, hi)``, to logits (last stage) or hidden states. Holds references to the model's own
    modules, so no parameter is copied."""

    def __init__(self, model: nn.Module, lo: int, hi: int, first: bool, last: bool, tp: int):
        super().__init__()
        self.cfg = model.config
        self.first, self.last, self.tp, self.lo = first, last, tp, lo
        container, layers, first_mods, last_mods, _ = FAMILIES[self.cfg.arch]
        parts = getattr(model, container)
        # only the modules this stage runs: a schedule scales and reduces each stage's parameters() once
        self.layers = nn.ModuleList([getattr(parts, layers)[str(i)] for i in range(lo, hi)])
        self.embed = nn.ModuleDict({n: parts[n] for n in first_mods}) if first else None
        self.norm = parts[last_mods[0]] if last else None
        self.lm_head = model.lm_head if last else None
        # the family's own embedding and per-block arguments (bound methods: its modules, not copies);
        # its dropout registered here too, so the stage's train()/eval() reach it
        self._embed, self._layer_args = model.embed, model.layer_args
        self.drop = getattr(model, "drop", None) or getattr(parts, "drop", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        T = x.size(1) if self.first else x.size(1) * self.tp  # hidden states are sequence-sharded under TP
        pos = torch.arange(T, dtype=torch.long, device=x.device)
        if self.first:
            x = self._embed(x, pos)
        per_layer = self._layer_args(pos)  # indexed by the layer's place in the whole model (sliding patterns)
        for i, block in enumerate(self.layers, start=self.lo):
            extra, mask = per_layer[i]
            if cfg.recompute == "block" and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, *extra, None, i, mask, use_reentrant=False)
            else:
                x = block(x, *extra, None, i, mask)
        if not self.last:
            return x
        logits, _ = logits_and_loss(self.norm(x), self.lm_head, None, cfg, self.training)
        return logits


def _loss_fn(vocab_size: int):
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # per micro-batch mean; the schedule divides the summed gradients by the micro-batch count
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    return loss


def _prune(model: nn.Module, keep: set[int], first: bool, last: bool) -> nn.Parameter | None:
    """Keep this rank's layers (as a ModuleDict under their original indices) and end modules; returns
    the tied embedding/head parameter when this rank holds an end of a tied model."""
    container, layers, first_mods, last_mods, tied_name = FAMILIES[model.config.arch]
    parts = getattr(model, container)
    tied = model.lm_head.weight is getattr(parts, tied_name).weight
    old = getattr(parts, layers)
    setattr(parts, layers, nn.ModuleDict({str(i): old[i] for i in sorted(keep)}))
    for name in first_mods:
        if not first and not (last and tied and name == tied_name):
            del parts[name]
    for name in last_mods:
        if not last:
            del parts[name]
    if not last:
        del model.lm_head
    if tied and (first or last):
        return getattr(parts, tied_name).weight
    return None


class Pipeline(nn.Module):
    """What ``wrap_model`` returns under ``dist.pp`` > 1: this rank's stages and their schedules.
    ``train_step`` hands it each step's micro-batches (:func:`pipeline_step`); calling it runs an
    evaluation forward. A schedule is built per micro-batch count on first use, each over its own
    ``PipelineStage`` objects (a stage fixes its buffers' shapes the first time it runs)."""

    pipeline = True

    def __init__(self, modules: list[Stage], indices: list[int], n_stages: int, kind: str, info, vocab_size: int,
                 tied: nn.Parameter | None, tied_group):
        super().__init__()
        self.parts = nn.ModuleList(modules)
        self.indices, self.n_stages, self.kind, self.info = indices, n_stages, kind, info
        self.pp_group = info.mesh["pp"].get_group()
        self.is_first, self.is_last = 0 in indices, n_stages - 1 in indices
        self.tied, self.tied_group = tied, tied_group
        self.loss = _loss_fn(vocab_size)
        self._schedules: dict = {}

    def retie(self, model: nn.Module) -> None:
        """After FSDP2 swapped the parameters for DTensor ones: the last stage's embedding (kept only to
        hold the tied weight) points at the head's new parameter again, and ``tied`` at the new one."""
        if self.tied is None:
            return
        container, _, _, _, tied_name = FAMILIES[model.config.arch]
        embedding = getattr(getattr(model, container), tied_name)
        if self.is_last:
            embedding.weight = model.lm_head.weight
        self.tied = embedding.weight

    def schedule(self, n_micro: int, train: bool = True):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        key = (n_micro, train)
        if key not in self._schedules:
            stages = [PipelineStage(m, s, self.n_stages, self.info.device, group=self.pp_group)
                      for m, s in zip(self.parts, self.indices, strict=True)]
            if self.kind == "interleaved1f1b":
                sched = ScheduleInterleaved1F1B(stages, n_micro, loss_fn=self.loss)
            elif self.kind == "gpipe" or not train:  # evaluation: forwards only, any count
                sched = ScheduleGPipe(stages[0], n_micro, loss_fn=self.loss)
            else:
                sched = Schedule1F1B(stages[0], n_micro, loss_fn=self.loss)
            self._schedules[key] = sched
        return self._schedules[key]

    def run(self, x: torch.Tensor, y: torch.Tensor, n_micro: int, train: bool) -> torch.Tensor:
        """Run the schedule over ``x``/``y`` split into ``n_micro`` micro-batches; the mean of their
        losses on every stage."""
        sched = self.schedule(n_micro, train)
        losses: list = []
        args = [x] if self.is_first else []
        target, out = (y, losses) if self.is_last else (None, None)
        if train:
            sched.step(*args, target=target, losses=out, return_outputs=False)
        else:
            sched.eval(*args, target=target, losses=out, return_outputs=False)
        return _carry_loss(losses, self.is_last, self.pp_group, x.device)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        """Evaluation: (None, mean loss) on every stage."""
        return None, self.run(idx, targets, 1, train=False)


def _carry_loss(losses: list, last: bool, pp_group, device) -> torch.Tensor:
    """The mean of the last stage's micro-batch losses, on every stage of the pipeline."""
    total = torch.zeros((), device=device)
    if last:
        total = torch.stack([_local(x.detach()).float() for x in losses]).mean()
    dist.all_reduce(total, group=pp_group)
    return total


def _local(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def build_pipeline(model: nn.Module, info, dist_cfg) -> Pipeline:
    """Split ``model`` in place into this rank's stages; the schedules come with the first step."""
    mesh = info.mesh
    pp, rank = mesh["pp"].size(), mesh["pp"].get_local_rank()
    virtual = dist_cfg.pp_virtual if dist_cfg.pp_schedule == "interleaved1f1b" else 1
    n_stages = pp * virtual
    per = model.config.n_layer // n_stages
    mine = [rank + k * pp for k in range(virtual)]
    first, last = 0 in mine, n_stages - 1 in mine
    keep = {i for s in mine for i in range(s * per, (s + 1) * per)}
    tied_model = _is_tied(model)
    tied = _prune(model, keep, first, last)
    tp = mesh["tp"].size()
    modules = [Stage(model, s * per, (s + 1) * per, s == 0, s == n_stages - 1, tp) for s in mine]
    tied_group = _tied_group(mesh) if tied_model else None
    return Pipeline(modules, mine, n_stages, dist_cfg.pp_schedule, info, model.config.vocab_size, tied, tied_group)


def _is_tied(model: nn.Module) -> bool:
    container, _, _, _, tied_name = FAMILIES[model.config.arch]
    return model.lm_head.weight is getattr(getattr(model, container), tied_name).weight


def _tied_group(mesh):
    """The two-rank group (first and last pipeline stage at this data/tensor coordinate) that sums a
    tied embedding's gradient. Every rank creates every such group, in the same order."""
    ranks = mesh.mesh  # (pp, dp_replicate, dp_shard, tp) tensor of global ranks
    mine = None
    flat = ranks.reshape(ranks.size(0), -1)
    for j in range(flat.size(1)):
        pair = [int(flat[0, j]), int(flat[-1, j])]
        g = dist.new_group(pair)
        if dist.get_rank() in pair:
            mine = g
    return mine


def pipeline_step(runner: Pipeline, model, optimizer, loader, grad_accum: int, autocast, info, grad_clip: float,
                  timer=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step: the schedule runs the ``grad_accum`` micro-batches through the stages
    (forward and backward), the tied embedding's gradient is summed over its two stages, then the
    global norm, clipping and the optimizer. Returns (mean loss, pre-clip grad norm) on every rank."""
    from gptforge.parallel.grads import grad_norm_and_clip, loss_context

    xs, ys = zip(*(loader.next_batch() for _ in range(grad_accum)), strict=True)
    x, y = torch.cat(xs).to(info.device), torch.cat(ys).to(info.device)
    if timer:
        timer.mark("data")
    with autocast(), loss_context(info):
        loss = runner.run(x, y, grad_accum, train=True)
    if timer:
        timer.mark("backward")
    dist.all_reduce(loss)  # equal within a pipeline: the mean over all ranks is the mean over replicas
    loss /= info.world
    if runner.tied is not None and runner.tied.grad is not None:
        _sum_tied_grad(runner.tied, runner.tied_group)
    # the tied parameter is counted once, on the first stage
    skip = {id(runner.tied)} if runner.tied is not None and not runner.is_first else set()
    norm = grad_norm_and_clip(list(model.parameters()), grad_clip, info, skip=skip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if timer:
        timer.mark("optimizer")
    return loss, norm


def _sum_tied_grad(p: nn.Parameter, group) -> None:
    """First stage's embedding gradient + last stage's head gradient, on both (Megatron's embedding
    group). Under tensor parallelism the embedding's gradient may come back replicated while the head's
    is vocabulary-sharded: both are put in the parameter's own placement first, so the two ranks
    reduce tensors of one shape."""
    g = p.grad
    if hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(placements=p.placements)
        p.grad = g
    dist.all_reduce(g.to_local() if hasattr(g, "to_local") else g, group=group)
