"""Reward models: a language model's final hidden states read by a scalar head at the reply's last
token, trained on preference pairs with the Bradley–Terry loss (TRL's RewardTrainer, InstructGPT).

    >>> rm = RewardModel(model)                       # a GPT or Llama from the registry
    >>> loss, metrics = rm_loss(rm, batch.ids, batch.mask, batch.margin)   # batch: a PairLoader batch

The math, for a pair with chosen reply y_c and rejected reply y_r to prompt x:

    r(x, y)  = w · h_last(x, y)                        h_last: the final hidden state at y's last token
    P(y_c ≻ y_r) = σ(r(x, y_c) − r(x, y_r))            (Bradley–Terry)
    loss     = −mean log σ(r_c − r_r − m)              m: an optional per-pair margin (Llama 2), else 0
             (+ c · mean((r_c + r_r)²) with ``center_coef`` c: keeps rewards near 0, TRL's
               ``center_rewards_coefficient``)

Metrics: pair accuracy (the share of pairs with r_c > r_r) and the mean margin r_c − r_r, under TRL's
names ``accuracy`` and ``margin``. The head is ``score`` (transformers' ``*ForSequenceClassification``
name, without a bias), so ``export hf`` can write it as such. :class:`RM` is the recipe of
``gptforge rm --init-from runs/sft --data prefs.jsonl --out runs/rm`` on the one training loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.training.pairs import PairRecipe, weighted_mean

# --- the math ---------------------------------------------------------------------------------------


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coef: float = 0.0) -> torch.Tensor:
    """chosen, rejected (N,) rewards; margin (N,) or None -> −mean log σ(r_c − r_r − m) (see the module)."""
    d = chosen - rejected
    if margin is not None:
        d = d - margin
    loss = -F.logsigmoid(d).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """Pair accuracy (ties count as wrong, as TRL's ``>``) and mean reward margin, plus the rewards' means."""
    chosen, rejected = chosen.detach().float(), rejected.detach().float()
    return {"accuracy": (chosen > rejected).float().mean().item(),
            "margin": (chosen - rejected).mean().item(),
            "reward_chosen": chosen.mean().item(), "reward_rejected": rejected.mean().item()}


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """mask (N, L) bool, True on the reply's tokens -> (N,) the position of each row's last reply token."""
    if not bool(mask.any(dim=1).all()):
        raise ValueError("a row has no reply token to read a reward at")
    L = mask.size(1)
    return (L - 1) - mask.flip(1).to(torch.int8).argmax(dim=1)


# --- the model ----------------------------------------------------------------------------------------


class _Scorer(nn.Module):
    """What reads pairs through any ``forward(ids, at) -> (N,)`` scorer (a reward model or an ensemble)."""

    reduce = "mean"  # how member scores combine (an ensemble's setting; one model is its own mean)

    def member_scores(self, ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """(members, N): each member's own score (one row for a single reward model)."""
        return self(ids, at)[None]

    def pair_rewards(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A :class:`gptforge.data.preference.PairBatch`'s ids and mask (2n, L), chosen rows first ->
        (chosen rewards (n,), rejected rewards (n,)), each read at its reply's last token."""
        r = self(ids, last_index(mask))
        n = ids.size(0) // 2
        return r[:n], r[n:]


class RewardModel(_Scorer):
    """A family model (anything with ``hidden_states(idx) -> (N, T, C)`` and ``config.n_embd``) plus a
    linear ``score`` head. ``forward(ids, at)`` -> (N,) rewards read at positions ``at`` (N,). The head
    starts at N(0, 1/(C+1)) (OpenAI's lm-human-preferences reward head) unless ``init_std`` is given."""

    def __init__(self, body: nn.Module, init_std: float | None = None):
        super().__init__()
        self.body = body
        self.config = body.config
        C = body.config.n_embd
        self.score = nn.Linear(C, 1, bias=False)
        nn.init.normal_(self.score.weight, std=init_std if init_std is not None else 1.0 / (C + 1) ** 0.5)

    @property
    def blocks(self) -> nn.ModuleList:  # FSDP shards and recomputes per block
        return self.body.blocks

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return self.body.num_parameters(exclude_embeddings) + self.score.weight.numel()

    def forward(self, ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        h = self.body.hidden_states(ids)  # (N, T, C)
        h_last = h[torch.arange(ids.size(0), device=ids.device), at]  # (N, C)
        return self.score(h_last).squeeze(-1).float()  # (N,)



def rm_loss(model: RewardModel, ids: torch.Tensor, mask: torch.Tensor, margin: torch.Tensor | None = None,
            center_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """One pair batch -> (Bradley–Terry loss, metrics): the reward model's step function."""
    chosen, rejected = model.pair_rewards(ids, mask)
    loss = bradley_terry_loss(chosen, rejected, margin, center_coef)
    return loss, {"loss": loss.item(), **pair_metrics(chosen, rejected)}


@torch.no_grad()
def score_sequences(rm: RewardModel, seqs: Sequence[Sequence[int]], pad: int, batch_size: int = 32,
                    members: bool = False) -> torch.Tensor:
    """Rewards (N,) float32 on the CPU for token sequences (prompt + reply each, e.g. RL rollouts),
    each read at its own last token; right-padded batches, so the padding is never seen (causal).
    ``members``: each member's own score instead, (members, N) (one row for a single reward model)."""
    if any(len(s) == 0 for s in seqs):
        raise ValueError("an empty sequence has no token to read a reward at")
    device = next(rm.parameters()).device
    was_training = rm.training
    rm.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        ids = torch.full((len(chunk), max(len(s) for s in chunk)), pad, dtype=torch.long)
        for k, s in enumerate(chunk):
            ids[k, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        at = torch.tensor([len(s) - 1 for s in chunk])
        ids, at = ids.to(device), at.to(device)
        out.append((rm.member_scores(ids, at) if members else rm(ids, at)).cpu())
    rm.train(was_training)
    return torch.cat(out, dim=-1) if out else torch.empty(0)


# --- the recipe: `gptforge rm` on the one loop ------------------------------------------------------------


class RM(PairRecipe):
    """A reward model on the one loop: a family model plus the ``score`` head (checkpoints hold both,
    ``body.*`` and ``score.weight``, with ``recipe: "rm"`` in meta.json), the Bradley–Terry loss per
    micro-batch, held-out pair accuracy and margin as eval."""

    name, kind, section = "rm", "rm", "rm"
    predicts_next = False  # the whole side goes through the model: at most train.seq_len tokens

    def build_model(self, model_cfg) -> RewardModel:
        from gptforge.models.registry import build_model

        return RewardModel(freeze_unused_head(build_model(model_cfg)))

    def _margin(self, run, batch):
        return batch.margin if run.cfg.rm.use_margin else None

    def micro_step(self, run, batch):
        r = run.wrapped(batch.ids, last_index(batch.mask))  # the differentiable forward (DDP)
        chosen, rejected = r[: batch.n], r[batch.n :]
        loss = bradley_terry_loss(chosen, rejected, self._margin(run, batch), run.cfg.rm.center_coef)
        return loss, {"loss": loss.item(), **pair_metrics(chosen, rejected)}

    def score_held_out(self, run):
        parts = []
        for b in self.held_out_batches(run):
            chosen, rejected = run.model.pair_rewards(b.ids, b.mask)
            loss = bradley_terry_loss(chosen, rejected, self._margin(run, b), run.cfg.rm.center_coef)
            parts.append((b.n, {"loss": loss.item(), **pair_metrics(chosen, rejected)}))
        return weighted_mean(parts, run)

    def log_line(self, s):
        return f"acc {s['accuracy']:.3f} | margin {s['margin']:.3f} | loss {s['loss']:.4f}"


def freeze_unused_head(body: nn.Module) -> nn.Module:
    """A body read through ``hidden_states`` never runs its LM head: an untied head (Llama's default) is
    frozen, so the optimizer skips it and DDP does not wait for its gradient. A tied head is the input
    embedding, which trains."""
    head = getattr(getattr(body, "lm_head", None), "weight", None)
    if head is not None and all(p.data_ptr() != head.data_ptr() for n, p in body.named_parameters()
                                if n != "lm_head.weight"):  # (a tied head is listed once, as the embedding)
        head.requires_grad_(False)
    return body


def body_init(init_weights):
    """A fine-tuning ``init_weights`` for the family model, applied to a reward (or value) model's body."""
    if init_weights is None:
        return None

    def init(m):
        init_weights(m.body)

    init.source = getattr(init_weights, "source", "")  # type: ignore[attr-defined]  # a LoRA run's lora.base
    return init


class RewardEnsemble(_Scorer):
    """Several reward models read as one: ``forward(ids, at)`` -> the members' mean score (``reduce``
    "mean"), or their minimum ("min": worst-case optimisation). Coste et al. (2023, "Reward Model
    Ensembles Help Mitigate Overoptimization"): members trained alike from different seeds agree on what
    their labels taught them and disagree on the rest, so a policy optimised against the ensemble finds
    fewer of any one member's blind spots. ``body``, ``score`` and ``config`` are the first member's
    (PPO's value model starts from it)."""

    REDUCE = ("mean", "min")

    def __init__(self, members: Sequence[RewardModel], reduce: str = "mean"):
        super().__init__()
        if len(members) < 2:
            raise ValueError("a reward-model ensemble needs at least two members")
        self.members = nn.ModuleList(members)
        self.config = members[0].config
        self.reduce = reduce

    @property
    def reduce(self) -> str:
        return self._reduce

    @reduce.setter
    def reduce(self, how: str) -> None:
        if how not in self.REDUCE:
            raise ValueError(f"reward-model ensemble reduce {how!r}; allowed: {', '.join(self.REDUCE)}")
        self._reduce = how

    @property
    def body(self) -> nn.Module:
        return self.members[0].body

    @property
    def score(self) -> nn.Linear:
        return self.members[0].score

    def member_scores(self, ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(ids, at) for m in self.members])  # (members, N)

    def forward(self, ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return reduce_member_scores(self.member_scores(ids, at), self.reduce)


def reduce_member_scores(scores: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """(members, N) -> (N,): the members' mean, or their minimum (``how`` "min")."""
    return scores.mean(0) if how == "mean" else scores.min(0).values


def load_reward_model(path: str) -> tuple[RewardModel | RewardEnsemble, object]:
    """(the reward model, its chat template or None) of a ``gptforge rm`` checkpoint or run directory, on
    the CPU in eval mode; ValueError naming the path for any other checkpoint. ``"A,B,..."`` (a path
    that does not exist as written) is a :class:`RewardEnsemble` of those runs, which must share one
    chat template."""
    from pathlib import Path

    if "," in path and not Path(path).exists():
        names = [n.strip() for n in path.split(",")]
        if any(not n for n in names):
            raise ValueError(f"{path!r}: an empty name in the comma-separated list of reward models")
        if len(set(names)) != len(names):
            raise ValueError(f"{path!r}: a reward model named twice; an ensemble's members are different runs")
        members, templates = zip(*(load_reward_model(n) for n in names), strict=True)
        shown = [t.to_dict() if t is not None else None for t in templates]
        for n, t in zip(names[1:], shown[1:], strict=True):
            if t != shown[0]:
                raise ValueError(f"{n}: its chat template differs from {names[0]}'s; an ensemble's members must "
                                 "read replies rendered alike (train them from the same SFT checkpoint)")
        return RewardEnsemble(list(members)).eval(), templates[0]
    return _load_one_reward_model(path)


def _load_one_reward_model(path: str) -> tuple[RewardModel, object]:
    from gptforge.data.chat import template_from_meta
    from gptforge.models.registry import build_model
    from gptforge.run import checkpoint as ckpt
    from gptforge.run import restore
    from gptforge.run.identity import resolve_checkpoint
    from gptforge.run.resume import saved_config
    from gptforge.run.weights import check_weights_fit

    where = resolve_checkpoint(path)
    meta = ckpt.read_meta(where)
    if meta.get("recipe") != "rm":
        kind = meta.get("recipe", "pretrain")
        raise ValueError(f"{path} is {'an' if kind == 'sft' else 'a'} {kind} checkpoint, not a reward model: train one "
                         "with `gptforge rm --init-from SFT --data PREFS.jsonl --out runs/rm`")
    cfg = saved_config(meta, str(where / "meta.json"))
    check_weights_fit(where, cfg.model)  # meta.json against the weights and their header's record, as load.py does
    if meta.get("lora"):  # adapters and head on the recorded base, merged (load.lora_merged checks the base)
        from gptforge.load import lora_merged

        rm = lora_merged(where, meta, cfg, wrap=RewardModel)
    else:
        rm = RewardModel(build_model(cfg.model))
        restore.load_model_weights(rm, where)
    from gptforge.data.tokenizer import tokenizer_from_meta

    return rm.eval(), template_from_meta(meta, where=str(where / "meta.json"), tok=tokenizer_from_meta(meta, where))


def checkpoint_is_reward_model(path: str | None) -> bool:
    """Whether ``path`` names a ``gptforge rm`` checkpoint or run (False for anything unreadable)."""
    if not path:
        return False
    from gptforge.run import checkpoint as ckpt
    from gptforge.run.identity import resolve_checkpoint

    try:
        return ckpt.read_meta(resolve_checkpoint(path)).get("recipe") == "rm"
    except Exception:
        return False


@torch.no_grad()
def preference_accuracy(rm: RewardModel, pairs: Sequence, pad: int, batch_size: int = 16) -> dict[str, float]:
    """A reward model on rendered pairs (``gptforge eval --preferences``): pair accuracy, mean margin,
    the rewards' means and the Bradley–Terry loss, over every pair."""
    from gptforge.data.preference import collate

    device = next(rm.parameters()).device
    cs, rs = [], []
    for i in range(0, len(pairs), batch_size):
        idx = list(range(i, min(i + batch_size, len(pairs))))
        b = collate([pairs[k] for k in idx], idx, pad).to(device)
        c, r = rm.pair_rewards(b.ids, b.mask)
        cs.append(c.cpu())
        rs.append(r.cpu())
    c, r = torch.cat(cs), torch.cat(rs)
    return {"n": len(pairs), **pair_metrics(c, r), "loss": bradley_terry_loss(c, r).item()}


@torch.no_grad()
def win_rate(rm: RewardModel, template, enc, policy: nn.Module, reference: nn.Module, problems: Sequence,
             max_new_tokens: int, system: str | None = None) -> dict[str, float]:
    """A policy against its reference on ``problems``, judged by ``rm``: both answer greedily, ``rm``
    scores each (prompt, reply) rendered with the chat template; a win counts 1, a tie 1/2. Also the
    true exact-match accuracy of both, so a judge that is fooled shows."""
    from gptforge.data.preference import render_side
    from gptforge.eval.generative import generate_replies, prompt_ids
    from gptforge.eval.tasks.verifiable import is_correct

    prompts = [prompt_ids(p, enc, template, system) for p in problems]
    out: dict[str, float] = {"n": len(problems)}
    scores = []
    for name, model in (("policy", policy), ("reference", reference)):
        replies = generate_replies(model, enc, prompts, template, max_new_tokens)
        msgs = [p.messages(with_solution=False) for p in problems]
        seqs = [render_side(m, [{"role": "assistant", "content": r}], template).ids.tolist()
                for m, r in zip(msgs, replies, strict=True)]
        s = score_sequences(rm, seqs, template.bos)
        scores.append(s)
        out[f"{name}_score"] = s.mean().item()
        out[f"{name}_acc"] = sum(is_correct(r, p.answer) for r, p in zip(replies, problems, strict=True)) / len(problems)
    out["win_rate"] = ((scores[0] > scores[1]).float() + 0.5 * (scores[0] == scores[1]).float()).mean().item()
    return out
