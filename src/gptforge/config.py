"""Typed run configuration: nested dataclasses, validated on construction, with dotted overrides.

    >>> cfg = get_preset("shakespeare-cpu")
    >>> apply_overrides(cfg, ["--optim.lr", "3e-4", "--train.max_steps", "100"])
    >>> cfg.train.grad_accum(world=1)

Every section validates its own fields in ``__post_init__``; cross-section checks (a batch that
must divide) live in :meth:`Config.validate`. Errors are :class:`ConfigError`, which the CLI turns
into exit status 2 before any compute.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from gptforge.config_recipes import DPOConfig, LoRAConfig, RLConfig, RMConfig  # noqa: F401 (sections; re-exported)
from gptforge.errors import field_types, flagged, saved_field_types
from gptforge.models.gpt2 import GPTConfig
from gptforge.models.registry import model_config, switch_family
from gptforge.numbers import MAX_THREADS
from gptforge.tokens import EOT

MAX_SEED = 2**32  # numpy's and every seeded generator's range
MAX_INT = 2**53  # no count, size or step comes near it: past it a value is a typo (1e30), and torch overflows
COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")


class ConfigError(ValueError):
    """A bad key or value in the configuration; the message names it and what is allowed."""


@dataclass
class DataConfig:
    dir: str = "data/shakespeare"  # folder of llm.c shards: *train*.bin and *val*.bin
    train_split: str = "train"  # shards whose names contain this are training data
    val_split: str = "val"  # shards whose names contain this are validation data
    shuffle: Literal["off", "shards", "documents"] = "off"  # training order; off = llm.c's exactly
    shuffle_seed: int = 1337  # seeds the per-epoch permutations (part of the resumable loader state)
    eot_token: int = EOT  # document separator for shuffle=documents (GPT-2's <|endoftext|>)
    align: Literal["off", "bos"] = "off"  # bos = every row starts at a document (eot_token) where one is in reach

    def __post_init__(self) -> None:
        _check(self.align in ("off", "bos"), "data.align", self.align, "off or bos")
        _check(self.shuffle in ("off", "shards", "documents"), "data.shuffle", self.shuffle, "off, shards or documents")
        _check(self.eot_token >= 0, "data.eot_token", self.eot_token, "a token id >= 0")
        _check(0 <= self.shuffle_seed < MAX_SEED, "data.shuffle_seed", self.shuffle_seed, "an integer in [0, 2**32)")


@dataclass
class OptimConfig:
    lr: float = 6e-4  # peak learning rate
    min_lr_frac: float = 0.0  # final lr as a fraction of the peak (llm.c's -q)
    warmup_steps: int = 700  # linear warmup, then cosine decay to min_lr_frac * lr
    weight_decay: float = 0.1  # applied to >=2-D parameters only
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay
    eps: float = 1e-8  # AdamW's denominator epsilon
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    fused: Optional[bool] = None  # fused AdamW kernel; None = on where the device supports it (CUDA, CPU)
    schedule: Literal["cosine", "wsd"] = "cosine"  # wsd = warmup, stable, linear cooldown (modded-nanogpt)
    cooldown_frac: float = 0.4  # wsd: the last fraction of the steps decays linearly to min_lr_frac * lr
    # AdamW lr of input embeddings that are not tied to the output head (0 = optim.lr). An untied
    # embedding row moves only when its token appears, so it wants a larger lr (modded-nanogpt: ~75x)
    embed_lr: float = 0.0
    name: Literal["adamw", "muon"] = "adamw"  # muon = Muon on the hidden matrices, AdamW (lr above) on the rest
    muon_lr: float = 0.02  # Muon's peak lr (the schedule scales it like optim.lr)
    muon_momentum: float = 0.95  # Muon's momentum
    muon_nesterov: bool = True  # Nesterov momentum in Muon
    muon_ns_steps: int = 5  # Newton-Schulz iterations per update
    muon_weight_decay: float = 0.0  # decoupled, lr-scaled, on the Muon matrices
    muon_params: str = "auto"  # auto = the blocks' Linear weights; or comma-separated name globs (2-D only)

    def __post_init__(self) -> None:
        _check(self.schedule in ("cosine", "wsd"), "optim.schedule", self.schedule, "cosine or wsd")
        _check(0.0 <= self.cooldown_frac <= 1.0, "optim.cooldown_frac", self.cooldown_frac, "a fraction in [0, 1]")
        _check(self.name in ("adamw", "muon"), "optim.name", self.name, "adamw or muon")
        _check(self.muon_lr > 0, "optim.muon_lr", self.muon_lr, "a positive number")
        _check(0 <= self.muon_momentum < 1, "optim.muon_momentum", self.muon_momentum, "in [0, 1)")
        _check(1 <= self.muon_ns_steps < 100, "optim.muon_ns_steps", self.muon_ns_steps, "an integer in [1, 99]")
        _check(self.muon_weight_decay >= 0, "optim.muon_weight_decay", self.muon_weight_decay, "a number >= 0")
        _check(bool(self.muon_params.strip()), "optim.muon_params", self.muon_params, "auto or name globs")
        _check(self.lr > 0, "optim.lr", self.lr, "a positive number")
        _check(self.embed_lr >= 0, "optim.embed_lr", self.embed_lr, "a number >= 0 (0 = optim.lr)")
        _check(0.0 <= self.min_lr_frac <= 1.0, "optim.min_lr_frac", self.min_lr_frac, "a fraction in [0, 1]")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "an integer >= 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a number >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2", (self.beta1, self.beta2), "in [0, 1)")
        _check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "a number >= 0 (0 = off)")
        _check(0 < self.eps < 1, "optim.eps", self.eps, "a small positive number (AdamW's epsilon, e.g. 1e-8)")


@dataclass
class TrainConfig:
    micro_batch: int = 64  # B: sequences per micro-step per rank
    seq_len: int = 1024  # T
    total_batch_tokens: int = 524_288  # tokens per optimizer step, all ranks; reached by grad accumulation
    max_steps: int = 18_865  # optimizer steps of the whole run (the lr schedule spans them)
    # batch-size schedule: the batch grows linearly, in whole micro-batches, from batch_warmup_start x
    # total_batch_tokens at step 0 to the full batch at step batch_warmup_steps (0 = constant batch)
    batch_warmup_steps: int = 0
    batch_warmup_start: float = 0.25  # the batch at step 0, as a fraction of the full batch
    seed: int = 1337  # model init, dropout and sampling seed
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    # CPU threads torch computes with (intra-op), per process; 0 = auto: OMP_NUM_THREADS when set, else
    # 1 per process on CPU (3-7x faster than torch's default on a loaded 2-core machine), torch's own on GPU
    threads: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # autocast dtype; auto = bf16 on CUDA
    compile: Optional[bool] = None  # torch.compile the model; None = on for CUDA
    compile_mode: str = "default"  # torch.compile mode: default | max-autotune | max-autotune-no-cudagraphs | reduce-overhead
    tf32: bool = True  # TF32 matmuls for float32 work on Ampere+ GPUs
    val_every: int = 250  # steps between validation-loss evaluations (0 = never; always at the end)
    val_tokens: int = 10_485_760  # tokens per validation (llm.c: 20 steps x 524288 / ... ), capped by data
    sample_every: int = 0  # steps between printed samples (0 = only at the end)
    sample_tokens: int = 32  # tokens per printed sample
    ckpt_every: int = 5000  # steps between checkpoints (0 = only at the end / on interrupt)
    keep_ckpts: int = 2  # newest checkpoints kept (0 = keep all)
    log_every: int = 1  # steps between log lines
    peak_flops: float = 0.0  # device peak FLOP/s for MFU; 0 = look it up by GPU name (none on CPU)
    out_dir: str = "runs/default"  # the run directory: checkpoints, metrics.jsonl, config.json (= --out)
    log_to: str = ""  # also send metrics to: tensorboard, wandb (comma-separated; extras of the same names)
    # resume from a sharded (dcp/) checkpoint, whose metadata is a pickle that can run code; never
    # taken from a checkpoint's own config (see gptforge.run.identity.require_trust)
    trust_checkpoint: bool = False

    def __post_init__(self) -> None:
        parse_log_to(self.log_to)
        for name in ("micro_batch", "seq_len", "total_batch_tokens", "max_steps"):
            _check(getattr(self, name) > 0, f"train.{name}", getattr(self, name), "a positive integer")
        for name in ("val_every", "sample_every", "ckpt_every", "keep_ckpts", "val_tokens", "sample_tokens"):
            _check(getattr(self, name) >= 0, f"train.{name}", getattr(self, name), "an integer >= 0")
        _check(0 <= self.threads <= MAX_THREADS, "train.threads", self.threads,
               f"an integer in [0, {MAX_THREADS}] (0 = auto)")
        _check(self.log_every >= 1, "train.log_every", self.log_every, "an integer >= 1")
        _check(self.batch_warmup_steps >= 0, "train.batch_warmup_steps", self.batch_warmup_steps, "an integer >= 0")
        _check(0 < self.batch_warmup_start <= 1, "train.batch_warmup_start", self.batch_warmup_start,
               "a fraction in (0, 1]")
        _check(self.compile_mode in COMPILE_MODES, "train.compile_mode", self.compile_mode, ", ".join(COMPILE_MODES))
        _check(0 <= self.seed < MAX_SEED, "train.seed", self.seed, "an integer in [0, 2**32)")
        _check(self.peak_flops >= 0, "train.peak_flops", self.peak_flops, "FLOP/s >= 0 (0 = look up by GPU name)")
        _check(bool(self.out_dir.strip()), "train.out_dir", self.out_dir, "a folder name (--out DIR)")

    def grad_accum(self, world: int = 1) -> int:
        per_step = self.micro_batch * self.seq_len * world
        if self.total_batch_tokens % per_step != 0:
            raise ConfigError(
                f"train.total_batch_tokens={self.total_batch_tokens} is not divisible by "
                f"micro_batch*seq_len*world = {self.micro_batch}*{self.seq_len}*{world} = {per_step}; "
                "choose a total batch that is a multiple of it"
            )
        return self.total_batch_tokens // per_step

    def accum_at(self, step: int, world: int = 1) -> int:
        """Micro-batches in optimizer step ``step`` (0-based) under the batch-size schedule: a linear
        ramp from ``batch_warmup_start`` of the full accumulation to all of it, rounded to whole
        micro-batches, at least one."""
        full = self.grad_accum(world)
        if step >= self.batch_warmup_steps:
            return full
        frac = self.batch_warmup_start + (1 - self.batch_warmup_start) * step / self.batch_warmup_steps
        return min(full, max(1, math.floor(frac * full + 0.5)))  # half rounds up

    def tokens_before(self, step: int, world: int = 1) -> int:
        """Training tokens consumed by steps 0..step-1 (all ranks), the schedule included."""
        full = self.grad_accum(world)
        per_micro = self.total_batch_tokens // full
        ramp = min(step, self.batch_warmup_steps)
        return per_micro * (sum(self.accum_at(s, world) for s in range(ramp)) + (step - ramp) * full)


@dataclass
class EvalConfig:
    """Task evaluation during training (HellaSwag and friends; see gptforge.eval)."""

    every: int = 0  # steps between task evaluations (0 = never); when > 0 also after the last step
    tasks: str = "hellaswag"  # comma-separated: hellaswag, piqa, arc_easy, arc_challenge, winogrande, ...
    limit: int = 0  # first N examples of each task (0 = all)
    batch_tokens: int = 0  # tokens per scoring forward (0 = 32768 on CUDA, 2048 on CPU)

    def __post_init__(self) -> None:
        for name in ("every", "limit", "batch_tokens"):
            _check(getattr(self, name) >= 0, f"eval.{name}", getattr(self, name), "an integer >= 0")
        # the names themselves are checked against the task table when training starts
        # (gptforge.training.evaluate.check_tasks), so this module imports no task code
        _check(bool(self.task_names()), "eval.tasks", self.tasks, "comma-separated task names")

    def task_names(self) -> list[str]:
        return [t.strip() for t in self.tasks.split(",") if t.strip()]


@dataclass
class DistConfig:
    """Multi-GPU / multi-node switches (take effect under torchrun with world > 1)."""

    # none: DDP, every rank holds everything; zero1: optimizer state sharded across ranks
    # (ZeroRedundancyOptimizer, llm.c's -z 1); fsdp: FSDP2 fully_shard per block, parameters,
    # gradients and optimizer state sharded
    shard: Literal["none", "zero1", "fsdp"] = "none"
    reshard_after_forward: bool = True  # FSDP: free gathered params after forward (ZeRO-3); false = ZeRO-2-like
    timeout: float = 1800.0  # seconds a collective may wait before the run fails (hung rank)
    # model parallelism on a device mesh (gptforge.parallel): the data dimension is what is left,
    # world / (tp * pp), split into dp_replicate groups (HSDP: replicate across, FSDP-shard within)
    tp: int = 1  # tensor (+ sequence) parallel degree: Megatron's column/row-parallel layers
    pp: int = 1  # pipeline stages (ranks); the model is split by layers
    dp_replicate: int = 1  # HSDP: replicas of the data dimension (with dist.shard fsdp)
    pp_schedule: Literal["gpipe", "1f1b", "interleaved1f1b"] = "1f1b"  # micro-batches = grad-accum steps
    pp_virtual: int = 2  # stages per rank for interleaved1f1b (the others use 1)
    # count the collectives of every N-th step (bytes per mesh dimension and kind, rank 0's, into
    # metrics.jsonl as "comm"; gptforge.parallel.comm), 0 = never: a check of the planner's
    # communication model, slow on the steps it counts
    count_comm: int = 0

    def __post_init__(self) -> None:
        _check(self.shard in ("none", "zero1", "fsdp"), "dist.shard", self.shard, "none, zero1 or fsdp")
        _check(self.timeout > 0, "dist.timeout", self.timeout, "a positive number of seconds")
        _check(isinstance(self.count_comm, int) and not isinstance(self.count_comm, bool) and self.count_comm >= 0,
               "dist.count_comm", self.count_comm, "an integer >= 0 (count every N-th step; 0 = never)")
        for key in ("tp", "pp", "dp_replicate"):
            _check(isinstance(getattr(self, key), int) and getattr(self, key) >= 1, f"dist.{key}",
                   getattr(self, key), "an integer >= 1")
        _check(self.pp_schedule in ("gpipe", "1f1b", "interleaved1f1b"), "dist.pp_schedule", self.pp_schedule,
               "gpipe, 1f1b or interleaved1f1b")
        _check(isinstance(self.pp_virtual, int) and self.pp_virtual >= 2, "dist.pp_virtual", self.pp_virtual,
               "an integer >= 2 (stages per rank under interleaved1f1b)")

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans (tp * pp); the data dimension is world / this."""
        return self.tp * self.pp

    @staticmethod
    def upgrade(values: dict) -> dict:
        """A config written before dist.shard (dist.zero: int, dist.fsdp: bool) in today's keys."""
        values = dict(values)
        zero, fsdp = values.pop("zero", None), values.pop("fsdp", None)
        if zero is not None or fsdp is not None:
            values.setdefault("shard", "fsdp" if fsdp else "zero1" if zero else "none")
        return values


@dataclass
class SFTConfig:
    """``gptforge sft``: where the conversations come from and how they are split."""

    data: str = ""  # FILE.jsonl of {"messages": [...]}, or a Hugging Face chat dataset (name, folder, parquet)
    split: str = "train"  # HF dataset split
    val_count: int = 200  # held-out conversations for the val loss
    seed: int = 0  # held-out split and per-epoch order
    skip_bad: bool = False  # count and skip bad conversations instead of stopping

    def __post_init__(self) -> None:
        _check(self.val_count >= 0, "sft.val_count", self.val_count, "an integer >= 0")
        _check(0 <= self.seed < 2**32, "sft.seed", self.seed, "an integer in [0, 2^32)")


@dataclass
class Config:
    model: Any = field(default_factory=GPTConfig)  # the config of the family ``model.arch`` names
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)  # read by the sft recipe only
    rl: RLConfig = field(default_factory=RLConfig)  # read by the GRPO and PPO recipes only
    rm: RMConfig = field(default_factory=RMConfig)  # read by the reward-model recipe only
    dpo: DPOConfig = field(default_factory=DPOConfig)  # read by the DPO recipe only
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # low-rank adapters: sft, dpo, rm, rl (rank 0 = off)

    def __post_init__(self) -> None:
        check_finite_floats(self)

    def validate(self, world: int = 1) -> int:
        """Cross-section checks; returns gradient-accumulation steps for this world size."""
        check_finite_floats(self)  # a preset or a test may have set a field after construction
        _check(bool(self.train.out_dir.strip()), "train.out_dir", self.train.out_dir, "a folder name (--out DIR)")
        uses_eot = self.data.shuffle == "documents" or self.data.align == "bos"
        if uses_eot and self.data.eot_token >= self.model.vocab_size:
            raise ConfigError(f"data.eot_token={self.data.eot_token} is not a token of model.vocab_size="
                              f"{self.model.vocab_size}")
        if self.train.seq_len > self.model.block_size:
            raise ConfigError(
                f"train.seq_len={self.train.seq_len} exceeds model.block_size={self.model.block_size}"
            )
        accum = self.train.grad_accum(world)
        if self.train.batch_warmup_steps and accum == 1:
            raise ConfigError(
                f"train.batch_warmup_steps={self.train.batch_warmup_steps}: the batch grows in whole micro-batches, "
                f"and train.total_batch_tokens={self.train.total_batch_tokens} is one micro-batch (micro_batch "
                f"{self.train.micro_batch} x seq_len {self.train.seq_len} x world {world}); lower train.micro_batch "
                "so the full batch spans several, or set train.batch_warmup_steps 0"
            )
        return accum

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """Rebuild from :meth:`to_dict` output (e.g. a checkpoint's meta.json). Unknown keys are errors."""
        kwargs = {}
        if not isinstance(d, dict):
            raise ConfigError(f"config = {d!r:.80}: expected an object")
        for f in dataclasses.fields(cls):
            if not isinstance(d.get(f.name, {}), dict):  # a section that is not one: named, not a TypeError
                raise ConfigError(f"section {f.name!r} = {d[f.name]!r:.80}: expected an object")
            if f.name == "model":
                try:
                    kwargs["model"] = model_config(d.get("model", {}))
                except ValueError as e:
                    raise ConfigError(str(e)) from e
                continue
            section_cls = section_types()[f.name]
            values = dict(d.get(f.name, {}))
            if section_cls is DistConfig:  # checkpoints from before dist.shard
                values = DistConfig.upgrade(values)
            known = {g.name for g in dataclasses.fields(section_cls)}
            unknown = set(values) - known
            if unknown:
                raise ConfigError(f"unknown key(s) in section {f.name!r}: {sorted(unknown)}")
            try:
                saved_field_types(f.name, section_cls, values)  # JSON types first: the checks compare numbers
                kwargs[f.name] = section_cls(**values)
            except ValueError as e:
                raise ConfigError(str(e)) from e
        return cls(**kwargs)


@functools.cache
def section_types() -> dict[str, type]:
    """Section name -> its dataclass."""
    hints = field_types(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def check_finite_floats(cfg: Config) -> None:
    """Every float field of every section must be finite: ``inf``/``nan`` in a learning rate, a clip
    or a timeout would pass the range checks (``inf > 0``, ``nan`` compares false both ways) and
    diverge or hang hours later. The one mechanism for all float fields, present and future."""
    for section in dataclasses.fields(cfg):
        sec = getattr(cfg, section.name)
        for f in dataclasses.fields(sec):
            value = getattr(sec, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{section.name}.{f.name}={value!r} is not allowed; expected a finite number")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                raise ConfigError(f"{section.name}.{f.name}={value!r} is not allowed; expected an integer up to 2**53")


LOG_TARGETS = ("tensorboard", "wandb")  # train.log_to: metrics sinks (gptforge.run.sinks)


def parse_log_to(value: str) -> list[str]:
    """``"tensorboard,wandb"`` -> the names; ConfigError naming ``train.log_to`` for anything else."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in LOG_TARGETS]
    if bad:
        raise ConfigError(f"train.log_to={value!r}: unknown {', '.join(bad)}; expected a comma-separated "
                          f"subset of {', '.join(LOG_TARGETS)} (or empty)")
    return list(dict.fromkeys(names))


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


# --- dotted overrides -----------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(key: str, raw: str, tp: Any) -> Any:
    """Convert a command-line string to the field's type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union and type(None) in args:  # Optional[X]: "auto"/"none" -> None
        if raw.lower() in ("auto", "none", "null"):
            return None
        inner = next(a for a in args if a is not type(None))
        return parse_value(key, raw, inner)
    if origin is Literal:
        if raw not in args:
            raise ConfigError(f"--{key} {raw!r}: allowed values are {', '.join(map(str, args))}")
        return raw
    if tp is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigError(f"--{key} {raw!r}: expected a boolean (true/false, on/off, 1/0)")
    if tp in (int, float):  # the one number parser (gptforge.numbers): finite, whole for ints, within 64 bits
        from gptforge.numbers import parse_float, parse_int

        try:
            return parse_int(raw) if tp is int else parse_float(raw)
        except ValueError as e:
            raise ConfigError(f"--{key} {raw!r}: expected {'an integer' if tp is int else 'a finite number'}: "
                              f"{e}") from None
    if tp is str:
        return raw
    raise ConfigError(f"--{key}: fields of type {tp} cannot be set from the command line")


def config_keys(cfg: Config | None = None) -> dict[str, Any]:
    """Every settable dotted key -> its type (the model keys are those of ``cfg``'s model family)."""
    out = {}
    for section, section_cls in section_types().items():
        if section == "model":
            section_cls = type(cfg.model) if cfg is not None else GPTConfig
        for name, tp in field_types(section_cls).items():
            out[f"{section}.{name}"] = tp
    return out


def override_pairs(args: list[str]) -> list[tuple[str, str]]:
    """``--section.key value`` / ``--section.key=value`` arguments -> [(key, value)], in order."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}; overrides look like --section.key value")
        if "=" in a:
            k, v = a[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):  # a forgotten value: blame this flag
                raise ConfigError(f"{a} needs a value; write {a} VALUE (or {a}=VALUE)")
            k, v = a[2:], args[i + 1]
            i += 2
        pairs.append((k, v))
    return pairs


def _default(section, name: str):
    """The value a section's class gives ``name`` when it is left out (an empty string is a setting only where the
    field's own default is one: train.log_to '' sends metrics nowhere else)."""
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else None


def apply_overrides(cfg: Config, args: list[str]) -> Config:
    """Apply ``--section.key value`` (or ``--section.key=value``) pairs, then re-validate each section."""
    pairs = override_pairs(args)
    for k, v in pairs:  # the model family first: it decides which model.* keys exist
        if k == "model.arch":
            try:
                cfg.model = switch_family(cfg.model, v)
            except (TypeError, ValueError) as e:
                raise ConfigError(flagged(f"--model.arch {v!r}", e)) from e
    keys = config_keys(cfg)
    for k, v in pairs:
        if k not in keys:
            import difflib

            close = difflib.get_close_matches(k, keys, n=3)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            raise ConfigError(f"unknown config key --{k}{hint} (see `gptforge train --help-config`)")
        section, name = k.split(".", 1)
        if v == "" and _default(getattr(cfg, section), name) != "":  # '' names no folder, file or word
            raise ConfigError(f"--{k} '' is empty; it names no file, folder or value (give one, or leave the option "
                              f"out for the preset's {getattr(getattr(cfg, section), name)!r})")
        setattr(getattr(cfg, section), name, parse_value(k, v, keys[k]))
    # re-run each section's validation with the new values
    for f in dataclasses.fields(cfg):
        sec = getattr(cfg, f.name)
        try:
            setattr(cfg, f.name, type(sec)(**{g.name: getattr(sec, g.name) for g in dataclasses.fields(sec)}))
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(str(e)) from e
    check_finite_floats(cfg)
    return cfg
