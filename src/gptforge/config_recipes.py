"""The config sections of the post-training recipes: ``rl`` (``gptforge rl``), ``rm`` (``gptforge rm``),
``dpo`` (``gptforge dpo``), and ``lora`` (low-rank adapters for sft, dpo, rm and rl).

    gptforge dpo --init-from runs/sft --data prefs.jsonl --out runs/dpo --dpo.beta 0.1 --dpo.loss_type ipo

They live beside :mod:`gptforge.config` (which imports them, so ``from gptforge.config import
RLConfig`` works) only to keep that file short; they validate like every section there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# more held-out task problems than any task holds (arithmetic has ~12,000 distinct ones, compare 8,010,
# gsm8k 1,319): a larger count is a typo that would generate problems for minutes before the first step
MAX_EVAL_PROBLEMS = 100_000
MAX_ROLLOUTS = 1_000_000  # replies an RL step samples (rl.prompts x rl.group): large runs sample ~10^4
MAX_UPDATES_PER_BATCH = 1_000  # rl.updates_per_batch: recipes take 1-10 (TRL's PPO 4); all of one step's updates run
# before the step ends, so a huge count was a step that never ended and a SIGTERM that waited on it for ever
MAX_RESAMPLE_ROUNDS = 32  # rl.resample_flat: a model whose every group is flat would otherwise sample for ever


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
        _check(0 <= self.eval_n <= MAX_EVAL_PROBLEMS, "dpo.eval_n", self.eval_n, f"an integer in [0, {MAX_EVAL_PROBLEMS}]")
        _check(0 <= self.sft_coef <= 100, "dpo.sft_coef", self.sft_coef, "a number in [0, 100] (0 = off)")
        _check(self.max_new_tokens >= 1, "dpo.max_new_tokens", self.max_new_tokens, "an integer >= 1")


@dataclass
class RLConfig:
    """``gptforge rl``: GRPO's own settings. Steps, lr, warmup, weight decay, clipping, checkpoints and
    seed are the shared ``train.*`` / ``optim.*`` keys; ``train.micro_batch`` is replies per forward."""

    task: str = "arithmetic"  # arithmetic | compare | gsm8k
    reward: str = "exact_match"  # a built-in reward (never module:function: code comes from --reward only)
    init_from: str = ""  # the starting and reference model: a checkpoint or run directory
    raw: bool = False  # no chat template: plain "Question: ...\nAnswer:" prompts
    prompts: int = 8  # problems per step, over all ranks
    group: int = 8  # replies sampled per problem
    max_new_tokens: int = 24  # longest reply sampled per problem
    temperature: float = 1.0  # sampling temperature of the replies
    top_k: int = 0  # 0 = off
    kl_coef: float = 0.02  # KL penalty to the starting model
    clip_eps: float = 0.2  # ratio clip
    updates_per_batch: int = 1  # optimizer steps on each sampled batch (> 1: the ratio moves and clips)
    adv_eps: float = 1e-4  # added to the reward std that divides the advantages
    scale_rewards: str = "group"  # GRPO: divide each reply's reward minus its group's mean by the group's std (group), the step's std over every rank (batch), or nothing (none: Dr. GRPO); TRL's scale_rewards
    resample_flat: int = 0  # GRPO: rounds of new problems drawn for each group whose replies all got the same reward (DAPO's dynamic sampling; 0 = off)
    eval_every: int = 0  # steps between held-out evaluations (0 = only at start and end)
    eval_n: int = 200  # held-out problems (never trained on)
    algo: str = "grpo"  # grpo | ppo (value head, GAE, KL in the per-token reward)
    reward_model: str = ""  # a `gptforge rm` checkpoint scoring replies instead of the reward function; "A,B,..." = an ensemble
    reward_reduce: str = "mean"  # an ensemble's score: the members' mean, or their min (worst case)
    reward_norm: bool = False  # whiten a reward model's score (each ensemble member's, before the reduce): shift and scale set on step 1's replies, so the starting policy's score mean 0, std 1 (Ziegler et al. 2019)
    kl_target: float = 0.0  # adaptive KL (Ziegler et al. 2019): rl.kl_coef is the start, moved each step toward this logged kl; 0 = a fixed rl.kl_coef
    kl_horizon: int = 10000  # adaptive KL: replies over which the coefficient may change by a factor of e^0.2 (TRL's horizon)
    gamma: float = 1.0  # PPO: discount
    lam: float = 0.95  # PPO: GAE lambda
    vf_coef: float = 0.1  # PPO: value loss weight
    clip_value: float = 0.2  # PPO: value clip
    value_init: str = "auto"  # PPO: the value model's start: reward_model (TRL's), policy, or auto (the reward model when rl.reward_model is set)

    def __post_init__(self) -> None:
        _check(self.algo in ("grpo", "ppo"), "rl.algo", self.algo, "grpo or ppo")
        _check(self.reward_reduce in ("mean", "min"), "rl.reward_reduce", self.reward_reduce, "mean or min")
        _check(self.value_init in ("auto", "policy", "reward_model"), "rl.value_init", self.value_init,
               "auto, policy or reward_model")
        _check(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "rl.gamma/rl.lam", (self.gamma, self.lam),
               "numbers in [0, 1]")
        _check(self.vf_coef >= 0 and self.clip_value > 0, "rl.vf_coef/rl.clip_value", (self.vf_coef, self.clip_value),
               "vf_coef >= 0 and clip_value > 0")
        for name in ("prompts", "max_new_tokens", "updates_per_batch"):
            _check(getattr(self, name) >= 1, f"rl.{name}", getattr(self, name), "an integer >= 1")
        _check(self.updates_per_batch <= MAX_UPDATES_PER_BATCH, "rl.updates_per_batch", self.updates_per_batch,
               f"an integer in [1, {MAX_UPDATES_PER_BATCH:,}] (optimizer steps on one sampled batch; recipes use 1-10)")
        _check(self.group >= (2 if self.algo == "grpo" else 1), "rl.group", self.group,
               "an integer >= 2 (GRPO compares replies within a group; PPO takes 1)")
        _check(self.temperature > 0, "rl.temperature", self.temperature, "a number > 0 (a group needs sampling)")
        _check(self.top_k >= 0, "rl.top_k", self.top_k, "an integer >= 0 (0 = off)")
        _check(self.kl_coef >= 0, "rl.kl_coef", self.kl_coef, "a number >= 0")
        _check(self.kl_target >= 0, "rl.kl_target", self.kl_target, "a number >= 0 (0 = a fixed rl.kl_coef)")
        _check(self.kl_horizon >= 1, "rl.kl_horizon", self.kl_horizon, "an integer >= 1 (replies)")
        _check(not self.kl_target or self.kl_coef > 0, "rl.kl_coef", self.kl_coef,
               "a number > 0 with rl.kl_target (the adaptive coefficient starts there)")
        _check(0 < self.clip_eps < 1, "rl.clip_eps", self.clip_eps, "a number in (0, 1)")
        _check(self.adv_eps > 0, "rl.adv_eps", self.adv_eps, "a number > 0")
        _check(self.scale_rewards in ("group", "batch", "none"), "rl.scale_rewards", self.scale_rewards,
               "group, batch or none")
        _check(self.algo == "grpo" or self.scale_rewards == "group", "rl.scale_rewards", self.scale_rewards,
               "group (the default) with rl.algo ppo: PPO whitens its GAE advantages instead")
        _check(0 <= self.resample_flat <= MAX_RESAMPLE_ROUNDS, "rl.resample_flat", self.resample_flat,
               f"an integer in [0, {MAX_RESAMPLE_ROUNDS}] (0 = off; each round samples the step's groups again)")
        _check(self.algo == "grpo" or not self.resample_flat, "rl.resample_flat", self.resample_flat,
               "0 with rl.algo ppo (it replaces GRPO's flat groups; PPO's advantages do not come from groups)")
        _check(self.eval_every >= 0, "rl.eval_every", self.eval_every, "an integer >= 0")
        _check(0 <= self.eval_n <= MAX_EVAL_PROBLEMS, "rl.eval_n", self.eval_n, f"an integer in [0, {MAX_EVAL_PROBLEMS}]")
        _check(self.prompts * self.group <= MAX_ROLLOUTS, "rl.prompts x rl.group", (self.prompts, self.group),
               f"at most {MAX_ROLLOUTS:,} replies a step (all are sampled before the update)")


MAX_LORA_RANK = 65_536  # wider than any layer of any model this trains; the real bound is min(in, out), checked on the model


@dataclass
class LoRAConfig:
    """``--lora.rank 8``: train low-rank adapters instead of the whole model (sft, dpo, rm, rl; Hu et al.
    2021, as ``peft`` computes it): W x + (alpha / rank) B A dropout(x), B starting at zero; the base is
    frozen and only the adapters (and a reward model's score head, or PPO's value model, which trains in
    full as TRL's PPOTrainer with peft) train and are checkpointed."""

    rank: int = 0  # r, the adapters' inner width; 0 = off (full fine-tuning)
    alpha: float = 16.0  # the update is scaled by alpha / rank (peft's lora_alpha)
    dropout: float = 0.0  # dropout on the adapters' input (peft's lora_dropout)
    targets: str = ""  # comma-separated module names (gpt2: c_attn,c_proj,c_fc; llama: q_proj,...); "" = the family's default (gpt2 c_attn, llama q_proj,v_proj: peft's)
    base: str = ""  # the frozen base model (a checkpoint, HF directory or GGUF file); "" = --init-from's, recorded at the start

    def __post_init__(self) -> None:
        _check(0 <= self.rank <= MAX_LORA_RANK, "lora.rank", self.rank, f"an integer in [0, {MAX_LORA_RANK}] (0 = off)")
        _check(self.alpha > 0, "lora.alpha", self.alpha, "a number > 0")
        _check(0 <= self.dropout < 1, "lora.dropout", self.dropout, "a number in [0, 1)")
        names = [t.strip() for t in self.targets.split(",")] if self.targets.strip() else []
        _check(all(names), "lora.targets", self.targets, "comma-separated module names, e.g. q_proj,v_proj")

    def target_names(self) -> list[str]:
        """The targets given, in order, without repeats ([] = the family's default)."""
        return list(dict.fromkeys(t.strip() for t in self.targets.split(",") if t.strip()))
