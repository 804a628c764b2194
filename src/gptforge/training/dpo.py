"""DPO (Direct Preference Optimization, Rafailov et al. 2023) and IPO (Azar et al. 2023): a policy
learns from preference pairs against a frozen reference, with no reward model and no sampling.

    >>> table = reference_logps(ref, pairs)           # once: the frozen reference's log-probs
    >>> loss, metrics = dpo_batch_loss(policy, loader.next_batch(), beta=0.1, ref_table=table)

The math, for a pair (x, y_c, y_r), a policy π and a reference π_ref:

    log π(y | x)  = Σ_t∈reply log π(y_t | x, y_<t)           sequence log-prob over the reply's tokens
    h_c = log π(y_c|x) − log π_ref(y_c|x),   h_r likewise   the implicit rewards' log-ratios
    sigmoid (DPO):  loss = −mean log σ(β (h_c − h_r))
    ipo:            loss =  mean (h_c / n_c − h_r / n_r − 1/(2β))²
                    n_c, n_r: reply lengths in tokens (TRL's IPO is length-normalised; so is this)
    + sft_coef · NLL  with NLL = −Σ log π(y_c|x) / Σ n_c, the chosen replies' mean token loss
                    (RPO, Pang et al. 2024; TRL's loss_type ["sigmoid", "sft"], loss_weights [1, sft_coef]):
                    DPO alone lowers the chosen replies' likelihood along with the rejected ones'

Metrics under TRL's names: ``rewards/chosen`` = mean β h_c, ``rewards/rejected`` = mean β h_r,
``rewards/margins`` = mean β (h_c − h_r), ``rewards/accuracies`` = share of pairs with h_c > h_r,
``logps/chosen`` and ``logps/rejected`` = mean sequence log-probs under the policy. The reference's
log-probs can be computed once (:func:`reference_logps`) and looked up by a batch's ``index``.
:class:`DPO` is the recipe of ``gptforge dpo --init-from runs/sft --data prefs.jsonl --out runs/dpo``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gptforge.data.preference import PairBatch, RenderedPair, collate
from gptforge.training.pairs import PairRecipe, weighted_mean

LOSS_TYPES = ("sigmoid", "ipo")

# --- the math ---------------------------------------------------------------------------------------


def sequence_logps(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask (N, L): tokens and their reply mask -> (sum of log p(ids[t] | ids[:t]) over the reply
    tokens t (N,) float32, reply lengths (N,)). The output head runs from the first reply position
    on only (``logits_to_keep``): the prompt's rows are never a target."""
    target_mask = mask[:, 1:]  # target t is token t + 1
    if not bool(target_mask.any()):
        raise ValueError("no reply tokens to score")
    start = int(target_mask.any(dim=0).nonzero()[0])  # the batch's first reply target
    logits, _ = model(ids[:, :-1], logits_to_keep=ids.size(1) - 1 - start)
    logp = torch.gather(F.log_softmax(logits.float() / temperature, dim=-1), 2, ids[:, 1 + start :, None]).squeeze(2)
    m = target_mask[:, start:].to(logp.dtype)
    return (logp * m).sum(dim=1), m.sum(dim=1)


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, beta: float, loss_type: str = "sigmoid",
             chosen_len: torch.Tensor | None = None, rejected_len: torch.Tensor | None = None,
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence log-probs (N,) of the chosen and rejected replies under the policy and the reference
    -> (loss, metrics with TRL's names); see the module docstring. IPO needs the reply lengths."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"dpo loss_type {loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")
    if beta <= 0:
        raise ValueError(f"dpo beta {beta}: must be > 0")
    h_c = chosen_logps - ref_chosen_logps
    h_r = rejected_logps - ref_rejected_logps
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (h_c - h_r))
    else:
        if chosen_len is None or rejected_len is None:
            raise ValueError("the ipo loss is length-normalised: pass chosen_len and rejected_len")
        losses = (h_c / chosen_len.clamp(min=1) - h_r / rejected_len.clamp(min=1) - 1 / (2 * beta)) ** 2
    loss = losses.mean()
    with torch.no_grad():
        r_c, r_r = beta * h_c.detach(), beta * h_r.detach()
        metrics = {"loss": loss.item(), "rewards/chosen": r_c.mean().item(), "rewards/rejected": r_r.mean().item(),
                   "rewards/margins": (r_c - r_r).mean().item(),
                   "rewards/accuracies": (r_c > r_r).float().mean().item(),
                   "logps/chosen": chosen_logps.detach().mean().item(),
                   "logps/rejected": rejected_logps.detach().mean().item()}
    return loss, metrics


# --- on pair batches -----------------------------------------------------------------------------------


def pair_logps(model: torch.nn.Module, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over a :class:`PairBatch` -> (chosen logps, rejected logps, chosen lengths,
    rejected lengths), each (n,)."""
    logps, lens = sequence_logps(model, batch.ids, batch.mask)
    n = batch.n
    return logps[:n], logps[n:], lens[:n], lens[n:]


@torch.no_grad()
def reference_logps(ref: torch.nn.Module, pairs: Sequence[RenderedPair], batch_size: int = 16,
                    pad: int = 50256, desc: str | None = None) -> torch.Tensor:
    """The reference's sequence log-probs of every pair, computed once: (len(pairs), 2) float32 with
    columns (chosen, rejected), on the CPU; a batch's rows are ``table[batch.index]``. ``desc``: a
    progress bar by that name over the pairs, on stderr (a few minutes for a 135M model on a CPU)."""
    from gptforge.progress import progress_bar

    device = next(ref.parameters()).device
    was_training = ref.training
    ref.eval()
    out = torch.empty(len(pairs), 2)
    with progress_bar(len(pairs), desc or "", "pair", show=desc is not None) as bar:
        for i in range(0, len(pairs), batch_size):
            idx = list(range(i, min(i + batch_size, len(pairs))))
            b = collate([pairs[k] for k in idx], idx, pad).to(device)
            c, r, _, _ = pair_logps(ref, b)
            out[i : i + len(idx), 0], out[i : i + len(idx), 1] = c.cpu(), r.cpu()
            bar.update(len(idx))
    ref.train(was_training)
    return out


def dpo_batch_loss(policy: torch.nn.Module, batch: PairBatch, beta: float, loss_type: str = "sigmoid",
                   ref: torch.nn.Module | None = None, ref_table: torch.Tensor | None = None, sft_coef: float = 0.0,
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPO step function: a pair batch -> (loss, metrics), the reference's log-probs from a frozen
    ``ref`` model or from a :func:`reference_logps` table (one of the two); ``sft_coef`` > 0 adds that
    weight times the chosen replies' mean token NLL (metric ``nll_loss``)."""
    if (ref is None) == (ref_table is None):
        raise ValueError("give the reference as a model (ref) or as precomputed log-probs (ref_table), not both")
    c, r, n_c, n_r = pair_logps(policy, batch)
    if ref_table is not None:
        ref_c, ref_r = ref_table[batch.index.cpu()].to(c.device).unbind(1)
    else:
        with torch.no_grad():
            ref_c, ref_r, _, _ = pair_logps(ref, batch)
    loss, metrics = dpo_loss(c, r, ref_c, ref_r, beta, loss_type, n_c, n_r)
    if sft_coef > 0:
        nll = -c.sum() / n_c.sum()
        loss = loss + sft_coef * nll
        metrics = {**metrics, "loss": loss.item(), "nll_loss": nll.item()}
    return loss, metrics


# --- the recipe: `gptforge dpo` on the one loop -------------------------------------------------------------

class DPO(PairRecipe):
    """DPO / IPO on the one loop. The reference is the starting model: its log-probs computed once and
    cached in ``RUN/ref_logps.pt`` keyed by the pairs' fingerprint, the reference model's and the dtype
    (``dpo.precompute_ref``, the default; recomputed when any no longer matches), or a frozen copy run beside the policy. Eval: the
    held-out pairs' DPO metrics and, with ``dpo.task``, held-out greedy accuracy on that task."""

    name, kind, section = "dpo", "dpo", "dpo"

    def __init__(self, cfg, template, enc=None):
        super().__init__(cfg, template, enc)
        from gptforge.data.chat import ChatTokenizer
        from gptforge.eval.generative import GENERATED

        self.enc = ChatTokenizer(self.words(), template)
        self.problems = []
        if cfg.dpo.task:
            if cfg.dpo.task not in GENERATED:
                from gptforge.config import ConfigError

                raise ConfigError(f"dpo.task {cfg.dpo.task!r}: generated tasks are {', '.join(GENERATED)}")
            self.problems = GENERATED[cfg.dpo.task][1](cfg.dpo.eval_n)[: cfg.dpo.eval_n]
        self.ref, self.tables = None, None

    def _reference(self, run):
        """The starting model: the run's own weights before the first step, else ``dpo.init_from``'s."""
        if run.state.step == 0:
            from gptforge.models.registry import build_model
            from gptforge.parallel.distributed import frozen_copy

            return frozen_copy(run.model, lambda: build_model(run.cfg.model))
        from gptforge.load import ModelSource, load_model

        return load_model(ModelSource.from_path(run.cfg.dpo.init_from)).to(run.device).eval().requires_grad_(False)

    def prepare_model(self, run):
        if not run.cfg.dpo.precompute_ref:
            self.ref = self._reference(run)

    def begin(self, run, start_step):
        if run.cfg.dpo.precompute_ref:
            self.tables = self._cached_tables(run)
        super().begin(run, start_step)

    def _cached_tables(self, run):
        """{"train": (n, 2), "val": (m, 2)} reference log-probs, from RUN/ref_logps.pt when its
        fingerprints match these pairs, else computed now (and written by rank 0)."""
        from pathlib import Path

        from gptforge.data.preference import fingerprint

        loader = run.state.loader
        from gptforge.parallel.distributed import from_main

        # the reference's sha256 read by rank 0 (remembered from the run's models record), not once a rank
        ref_id = from_main(reference_identity(run.cfg) if run.info.is_main else None, run.info)
        keys = {"train": loader.fingerprint, "val": fingerprint(self.val), **ref_id}
        path = Path(run.cfg.train.out_dir) / "ref_logps.pt"
        if path.is_file():
            try:
                saved = torch.load(path, weights_only=True)
                if saved.get("fingerprints") != keys:
                    run.log(f"{path} was computed for other pairs, another reference model or dtype; recomputing")
                elif all(_table_fits(saved.get(k), n) for k, n in (("train", len(loader.pairs)), ("val", len(self.val)))):
                    run.log(f"reference log-probs from {path}")
                    return {"train": saved["train"], "val": saved["val"]}
                else:  # the fingerprints are right and the numbers are not: still only a cache
                    run.log(f"{path} holds tables of the wrong shape, type or non-finite values; recomputing")
            except Exception as e:  # a damaged cache is only a cache
                run.log(f"{path} is unreadable ({e}); recomputing")
        ref = self._reference(run)
        pad = self.template.bos
        mb, main = run.cfg.train.micro_batch, run.info.is_main
        with run.autocast():
            tables = {k: reference_logps(ref, pairs, mb, pad, desc=f"reference log-probs ({k})" if main else None)
                      for k, pairs in (("train", loader.pairs), ("val", self.val))}
        del ref
        if run.info.is_main:
            tmp = path.with_suffix(".tmp")
            torch.save({"fingerprints": keys, **tables}, tmp)
            tmp.replace(path)
        run.log(f"reference log-probs of {len(loader.pairs)} + {len(self.val)} pairs -> {path}")
        return tables

    def micro_step(self, run, batch):
        d = run.cfg.dpo
        return dpo_batch_loss(run.wrapped, batch, d.beta, d.loss_type, ref=self.ref,
                              ref_table=None if self.tables is None else self.tables["train"], sft_coef=d.sft_coef)

    def score_held_out(self, run):
        d, parts = run.cfg.dpo, []
        for b in self.held_out_batches(run):
            parts.append((b.n, dpo_batch_loss(run.model, b, d.beta, d.loss_type, ref=self.ref, sft_coef=d.sft_coef,
                                              ref_table=None if self.tables is None else self.tables["val"])[1]))
        out = weighted_mean(parts, run)
        if self.problems:
            from gptforge.parallel.distributed import all_reduce_sum
            from gptforge.training.rollouts import held_out_correct

            mine = self.problems[run.info.rank :: run.info.world]
            hits = held_out_correct(run.model, self.enc, self.template, mine, d.max_new_tokens,
                                    desc=f"held-out {d.task} ({len(mine)} problems)" if run.info.is_main else None)
            tot = all_reduce_sum(torch.tensor([float(hits), float(len(mine))], device=run.device), run.info).tolist()
            out[f"{d.task}_acc"], out["task_n"] = tot[0] / tot[1], int(tot[1])  # n: the summary's interval
        return out

    def log_line(self, s):
        return (f"acc {s['rewards/accuracies']:.3f} | margin {s['rewards/margins']:.3f} | "
                f"chosen {s['rewards/chosen']:.3f} | rejected {s['rewards/rejected']:.3f} | loss {s['loss']:.4f}")


def reference_identity(cfg) -> dict[str, str]:
    """What the cached reference log-probs depend on besides the pairs: the reference model (``dpo.init_from``:
    the sha256 of its weights, :func:`gptforge.run.resume.model_identity`, whatever its kind) and the dtype they
    were computed in. Without it a run started over in the same directory (``--force``, or a first run that
    died before its first checkpoint) from another model reused the old model's numbers as its reference."""
    from gptforge.run.resume import model_identity

    src = cfg.dpo.init_from
    return {"reference": f"{src}|{model_identity(src)}", "dtype": str(cfg.train.dtype)}


def _table_fits(t: object, n: int) -> bool:
    """A cached reference table for ``n`` pairs: a finite float tensor (n, 2) (chosen, rejected)."""
    return (isinstance(t, torch.Tensor) and t.dtype.is_floating_point and tuple(t.shape) == (n, 2)
            and bool(torch.isfinite(t).all()) and bool((t <= 0).all()))  # log-probabilities
