"""Named runs as Python functions returning a :class:`~gptforge.config.Config`.

    gptforge train --preset gpt2-124m-fineweb10b --train.micro_batch 32
    gptforge presets            # list them
"""

from __future__ import annotations

from collections.abc import Callable

from gptforge.config import Config, ConfigError, DataConfig, OptimConfig, TrainConfig
from gptforge.models.gpt2 import GPTConfig

PRESETS: dict[str, Callable[[], Config]] = {}


def preset(name: str):
    def register(fn: Callable[[], Config]) -> Callable[[], Config]:
        PRESETS[name] = fn
        return fn

    return register


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        import difflib

        close = difflib.get_close_matches(name, PRESETS, n=2)  # `--preset tinyy`: the one meant, before the list
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint} (known presets: {', '.join(sorted(PRESETS))})")
    return PRESETS[name]()


@preset("shakespeare-cpu")
def shakespeare_cpu() -> Config:
    """The default job: a 4-layer, 128-wide GPT-2 on Shakespeare, a few minutes on a 2-core CPU."""
    return Config(
        model=GPTConfig.from_size("d4", block_size=128),
        data=DataConfig(dir="data/shakespeare"),
        optim=OptimConfig(lr=2e-3, warmup_steps=10, min_lr_frac=0.1, weight_decay=0.1),
        train=TrainConfig(
            micro_batch=8, seq_len=128, total_batch_tokens=1024, max_steps=200,
            val_every=50, val_tokens=16_384, sample_every=0, sample_tokens=48,
            ckpt_every=50, keep_ckpts=2, out_dir="runs/shakespeare-cpu",
        ),
    )


@preset("tiny")
def tiny() -> Config:
    """Seconds-long 2-layer run for tests and smoke checks."""
    return Config(
        model=GPTConfig.from_size("d2", block_size=64),
        data=DataConfig(dir="data/shakespeare"),
        optim=OptimConfig(lr=1e-3, warmup_steps=2, min_lr_frac=0.1),
        train=TrainConfig(
            micro_batch=4, seq_len=32, total_batch_tokens=256, max_steps=10, dtype="float32", compile=False,
            # a smoke run saves rarely and keeps two checkpoints, however long it is made
            val_every=5, val_tokens=1024, sample_every=0, sample_tokens=8, ckpt_every=100, keep_ckpts=2,
            out_dir="runs/tiny",
        ),
    )


def _gpt2_fineweb(size: str, *, micro_batch: int, lr: float, total_batch: int, max_steps: int, warmup: int) -> Config:
    return Config(
        model=GPTConfig.from_size(size, block_size=1024),
        data=DataConfig(dir="data/fineweb10B"),
        optim=OptimConfig(lr=lr, warmup_steps=warmup, min_lr_frac=0.0, weight_decay=0.1),
        train=TrainConfig(
            micro_batch=micro_batch, seq_len=1024, total_batch_tokens=total_batch, max_steps=max_steps,
            val_every=250, val_tokens=20 * 524_288, sample_every=20_000, ckpt_every=5000, keep_ckpts=2,
            out_dir=f"runs/{size}-fineweb10b",
        ),
    )


@preset("gpt2-124m-fineweb10b")
def gpt2_124m_fineweb10b() -> Config:
    """llm.c's GPT-2 124M reproduction: B 64, T 1024, 524,288 tok/step, lr 6e-4, warmup 700,
    18,865 steps (~10B tokens), cosine to 0, weight decay 0.1 (``./train_gpt2cu -b 64 -t 1024
    -d 524288 -l 0.0006 -u 700 -q 0.0 -x 18865 -c 0.1``)."""
    return _gpt2_fineweb("gpt2", micro_batch=64, lr=6e-4, total_batch=524_288, max_steps=18_865, warmup=700)


@preset("gpt2-124m")
def gpt2_124m() -> Config:
    """GPT-2 124M with the llm.c hyperparameters, on whatever data.dir points at."""
    cfg = gpt2_124m_fineweb10b()
    cfg.train.out_dir = "runs/gpt2-124m"
    return cfg


# --- bigger models (llm.c's scripts/run_gpt2_{350M,774M,1558M}.sh, 8 GPUs, ZeRO-1) ----------------------


def _gpt2_llmc(size: str, *, data: str, micro_batch: int, total_batch: int, lr: float, min_lr_frac: float,
               max_steps: int, ckpt_every: int, out: str) -> Config:
    from gptforge.config import DistConfig

    return Config(
        model=GPTConfig.from_size(size, block_size=1024),
        data=DataConfig(dir=data),
        optim=OptimConfig(lr=lr, warmup_steps=700, min_lr_frac=min_lr_frac, weight_decay=0.1),
        train=TrainConfig(
            micro_batch=micro_batch, seq_len=1024, total_batch_tokens=total_batch, max_steps=max_steps,
            val_every=250, val_tokens=20 * 524_288, sample_every=20_000, ckpt_every=ckpt_every, keep_ckpts=2,
            out_dir=f"runs/{out}",
        ),
        dist=DistConfig(shard="zero1"),
    )


@preset("gpt2-350m")
def gpt2_350m() -> Config:
    """llm.c's GPT-2 350M (d24) on FineWeb 100B: B 64, T 1024, 524,288 tok/step, lr 3e-4, warmup 700,
    60,000 steps (~31.5B tokens), cosine to 0, weight decay 0.1, ZeRO-1 (``-b 64 -t 1024 -d 524288
    -z 1 -c 0.1 -l 0.0003 -q 0.0 -u 700 -n 2000 -x 60000 -e d24``)."""
    return _gpt2_llmc("gpt2-medium", data="data/fineweb100B", micro_batch=64, total_batch=524_288, lr=3e-4,
                      min_lr_frac=0.0, max_steps=60_000, ckpt_every=2000, out="gpt2-350m")


@preset("gpt2-774m")
def gpt2_774m() -> Config:
    """llm.c's GPT-2 774M (d36) on FineWeb 100B: B 32, T 1024, 524,288 tok/step, lr 2.5e-4, warmup 700,
    286,102 steps (~150B tokens), cosine to 0, ZeRO-1 (``-b 32 -d 524288 -z 1 -c 0.1 -l 0.00025 -q 0.0
    -u 700 -n 4000 -x 286102 -e d36``)."""
    return _gpt2_llmc("gpt2-large", data="data/fineweb100B", micro_batch=32, total_batch=524_288, lr=2.5e-4,
                      min_lr_frac=0.0, max_steps=286_102, ckpt_every=4000, out="gpt2-774m")


@preset("gpt2-1.5b")
def gpt2_1558m() -> Config:
    """llm.c's GPT-2 1558M (d48) on FineWeb-EDU 100B: B 16, T 1024, 1,048,576 tok/step, lr 6e-4, warmup
    700, 32,000 steps (~33.6B tokens), cosine to 10%, ZeRO-1 (``-b 16 -t 1024 -d 1048576 -z 1 -c 0.1
    -l 0.0006 -q 0.1 -u 700 -n 2000 -x 32000 -e d48``)."""
    return _gpt2_llmc("gpt2-xl", data="data/edu_fineweb100B", micro_batch=16, total_batch=1_048_576, lr=6e-4,
                      min_lr_frac=0.1, max_steps=32_000, ckpt_every=2000, out="gpt2-1.5b")


# --- the Llama family (models/llama.py) ----------------------------------------------------------------


@preset("llama-tiny")
def llama_tiny() -> Config:
    """Seconds-long 2-layer Llama (RoPE, GQA 4:2, SwiGLU, untied head) for tests and smoke checks."""
    from gptforge.models.registry import size_config

    cfg = tiny()
    cfg.model = size_config("llama-tiny", block_size=64)
    cfg.train.out_dir = "runs/llama-tiny"
    return cfg


@preset("llama-124m")
def llama_124m() -> Config:
    """A Llama with GPT-2 124M's compute per token (12 x 768, SwiGLU 2048, untied head, GPT-2 tokenizer)
    and llm.c's GPT-2 124M hyperparameters, so a run against gpt2-124m compares architectures only."""
    from gptforge.models.registry import size_config

    cfg = gpt2_124m_fineweb10b()
    cfg.model = size_config("llama-124m")
    cfg.train.out_dir = "runs/llama-124m"
    return cfg


@preset("llama3-1b")
def llama3_1b() -> Config:
    """Llama-3.2-1B's shape (16 x 2048, GQA 32:8, 128,256 vocabulary, tied) at T 2048, 1M tokens per
    step, ZeRO-1: for ``plan``. Trained on GPT-2 shards, most of its vocabulary would go unused."""
    from gptforge.models.registry import size_config

    cfg = _gpt2_llmc("gpt2-xl", data="data/fineweb10B", micro_batch=8, total_batch=1_048_576, lr=3e-4,
                     min_lr_frac=0.1, max_steps=30_000, ckpt_every=2000, out="llama3-1b")
    cfg.model = size_config("llama3-1b", block_size=2048)
    cfg.train.seq_len = 2048
    return cfg


@preset("speedrun-d4")
def speedrun_d4() -> Config:
    """The speedrun recipe at shakespeare-cpu's size, the CPU opponent of shakespeare-cpu in
    `gptforge race` (docs/benchmarks.md): d4's shape as a Llama (RoPE, RMSNorm, untied head) with
    ReLU², QK-norm, logit soft-cap 30 and zero-initialised output projections; Muon on the block
    matrices, AdamW on the rest with the untied embedding at a 6x lr; warmup-stable-decay; the batch
    growing from 256 to 1,024 tokens over 16 steps; 46 steps (40,704 tokens, a third of
    shakespeare-cpu's). Every choice is a switch (the race table turns each off)."""
    import dataclasses

    from gptforge.models.registry import switch_family

    cfg = shakespeare_cpu()
    cfg.model = dataclasses.replace(switch_family(cfg.model, "llama"), mlp="relu2", qk_norm=True,
                                    logit_softcap=30.0, zero_init_proj=True)
    cfg.optim = OptimConfig(name="muon", muon_lr=0.04, lr=8e-3, embed_lr=0.05, warmup_steps=5, schedule="wsd",
                            cooldown_frac=0.5, min_lr_frac=0.0, weight_decay=0.1)
    cfg.train.micro_batch = 2  # 4 micro-batches make the full 1,024-token batch, so it can grow
    cfg.train.batch_warmup_steps = 16
    cfg.train.max_steps = 46
    cfg.train.out_dir = "runs/speedrun-d4"
    return cfg


@preset("speedrun-124m")
def speedrun_124m() -> Config:
    """modded-nanogpt's choices on llama-124m, each a switch: ReLU², QK-norm, logit soft-cap 30,
    zero-initialised output projections, untied head (the Llama's), Muon on the block matrices
    (AdamW on embeddings, head and norms), warmup-stable-decay, BOS-aligned rows with
    document-causal FlexAttention; 1,750 steps of 524,288 tokens (0.92B, a tenth of gpt2-124m's).
    Not yet measured on a GPU (on a CPU use --model.doc_mask sdpa: FlexAttention has no CPU backward)."""
    import dataclasses

    cfg = llama_124m()
    cfg.model = dataclasses.replace(cfg.model, mlp="relu2", qk_norm=True, logit_softcap=30.0, zero_init_proj=True,
                                    attention="document", doc_mask="flex")
    cfg.optim = OptimConfig(name="muon", muon_lr=0.05, muon_momentum=0.95, lr=8e-3, beta1=0.8, beta2=0.95,
                            weight_decay=0.0, warmup_steps=0, schedule="wsd", cooldown_frac=0.45, min_lr_frac=0.1)
    cfg.data.align = "bos"
    cfg.train.max_steps = 1750
    cfg.train.out_dir = "runs/speedrun-124m"
    return cfg


# --- GPT-3 scale, for `gptforge plan` (models/gpt2.py SIZES holds the shapes) ---------------------------


def _gpt3(size: str, *, lr: float, batch: int, tokens: float = 300e9, vocab: int = 50_257, out: str = "") -> Config:
    """GPT-3's recipe (Brown et al. 2020): T 2048, Adam (0.9, 0.95), weight decay 0.1, warmup over 375M
    tokens, cosine to 10% over the token budget, at ``batch`` sequences per step."""
    from gptforge.config import DistConfig

    steps = int(round(tokens / (batch * 2048)))
    return Config(
        model=GPTConfig.from_size(size, block_size=2048, vocab_size=vocab, pad_vocab=vocab == 50_257),
        data=DataConfig(dir="data/fineweb100B"),
        optim=OptimConfig(lr=lr, beta2=0.95, warmup_steps=max(1, int(375e6 // (batch * 2048))), min_lr_frac=0.1,
                          weight_decay=0.1),
        train=TrainConfig(micro_batch=1, seq_len=2048, total_batch_tokens=batch * 2048, max_steps=steps,
                          val_every=1000, val_tokens=20 * 524_288, sample_every=0, ckpt_every=1000, keep_ckpts=2,
                          out_dir=f"runs/{out or size}"),
        dist=DistConfig(shard="fsdp"),
    )


@preset("gpt3-175b")
def gpt3_175b() -> Config:
    """GPT-3 175B (96 x 12288, 96 heads) at T 2048, 1,536 sequences (3.1M tokens) per step as in
    Megatron-LM's Table 2, lr 6e-5, 300B tokens (95,367 steps): ``gptforge plan --preset gpt3-175b
    --gpus 1024 --gpu h100-80`` picks its layout."""
    return _gpt3("gpt3-175b", lr=6e-5, batch=1536)


@preset("gpt3-13b")
def gpt3_13b() -> Config:
    """GPT-3 13B (40 x 5120, 40 heads) at T 2048, 1,024 sequences (2M tokens) per step, lr 1e-4,
    300B tokens."""
    return _gpt3("gpt3-13b", lr=1e-4, batch=1024)


# Megatron-LM Table 1 (Narayanan et al. 2021): size -> global batch; vocabulary 51,200, T 2048
MEGATRON_TABLE1 = {"megatron-1.7b": 512, "megatron-3.6b": 512, "megatron-7.5b": 512, "megatron-18b": 1024,
                   "megatron-39b": 1536, "megatron-76b": 1792, "megatron-145b": 2304, "megatron-310b": 2160,
                   "megatron-530b": 2520, "megatron-1t": 3072}


def _megatron(size: str, batch: int) -> Callable[[], Config]:
    def make() -> Config:
        return _gpt3(size, lr=6e-5, batch=batch, vocab=51_200)

    make.__doc__ = (f"Megatron-LM Table 1's {size.split('-')[1].upper()} GPT ({size} in models/gpt2.py SIZES): "
                    f"vocabulary 51,200, T 2048, global batch {batch}; for ``gptforge plan``.")
    return make


for _size, _batch in MEGATRON_TABLE1.items():
    preset(_size)(_megatron(_size, _batch))
