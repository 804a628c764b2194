"""Hugging Face GPT-2 <-> gptforge weights: an explicit key map plus the Conv1D transposes, and an
exporter that writes a directory ``transformers.GPT2LMHeadModel.from_pretrained`` loads.

    >>> from gptforge.interop.hf import load_hf
    >>> model = load_hf("gpt2")            # online, hub name
    >>> model = load_hf("./my-gpt2-dir")   # offline, a save_pretrained directory

    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/shakespeare-hf

The export needs no ``transformers``: weights go to ``model.safetensors`` (padded vocabulary sliced
back to 50,257 rows, tied ``lm_head`` stored once), ``config.json`` is written by hand, and the
tokenizer files (``vocab.json`` + ``merges.txt``) are derived offline from the tiktoken ranks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from gptforge.errors import CheckpointError
from gptforge.models.registry import FAMILIES
from gptforge.tokens import EOT, EOT_TEXT

# HF GPT-2 uses Conv1D (weight shape (in, out)); we use nn.Linear (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers HF keeps in some versions that are not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


# Hugging Face ``config.json`` model_type -> the gptforge model family that implements it, from the
# registry (Family.hf_model_type). Anything else is refused by name instead of loading as a randomly
# initialised GPT-2; a family registered with hf_model_type="llama" plugs in with no change here.
HF_MODEL_TYPES: dict[str, str] = {f.hf_model_type: f.name for f in FAMILIES.values() if f.hf_model_type}


class HFModelError(CheckpointError):
    """A Hugging Face directory/model gptforge cannot load faithfully; the message names what was found."""


def _transformers():
    """transformers, or one line naming the extra (every --hf load starts here)."""
    from gptforge.extras import require

    return require("transformers", extra="hf", for_what="loading Hugging Face weights (--hf)")


def hf_model_type(name_or_dir: str) -> str:
    """``model_type`` from a local directory's config.json, or the hub config of a model name."""
    _transformers()  # before reading anything: a missing package is reported first
    local = Path(name_or_dir)
    if local.is_dir():
        cfg_path = local / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{local}: no config.json; give a directory written by save_pretrained()")
        try:
            cfg = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HFModelError(f"{cfg_path}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
            raise HFModelError(f"{cfg_path}: no 'model_type' string; is this a Hugging Face model directory?")
        return cfg["model_type"]
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_dir).model_type
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"could not load Hugging Face model {name_or_dir!r}: {e}\n"
            "Give a hub name (needs network) or a directory written by save_pretrained()."
        ) from e


def hf_family(name_or_dir: str) -> str:
    """The gptforge family that loads this Hugging Face model, or HFModelError naming its model_type."""
    model_type = hf_model_type(name_or_dir)
    if model_type not in HF_MODEL_TYPES:
        raise HFModelError(
            f"{name_or_dir}: config.json model_type {model_type!r} is not a model family gptforge implements "
            f"(it loads {', '.join(sorted(HF_MODEL_TYPES))}); refusing rather than sampling from random weights"
        )
    return HF_MODEL_TYPES[model_type]


def load_hf_state_dict(name_or_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Return (config dict, state dict) of a HF GPT-2 model from a hub name or local directory.
    Refuses another architecture (by ``model_type``) and a checkpoint whose weights do not all
    fit (missing, unexpected or mis-shaped), naming them."""
    GPT2LMHeadModel = _transformers().GPT2LMHeadModel
    family = hf_family(name_or_dir)
    if family != "gpt2":
        raise HFModelError(f"{name_or_dir}: a {family} model; the GPT-2 loader cannot read it")
    try:
        with _quiet_transformers():  # its load report and progress bar: we judge the report ourselves
            hf, report = GPT2LMHeadModel.from_pretrained(name_or_dir, output_loading_info=True)
    except OSError as e:
        raise FileNotFoundError(
            f"could not load Hugging Face model {name_or_dir!r}: {e}\n"
            "Give a hub name (needs network) or a directory written by save_pretrained()."
        ) from e
    bad = {k: [str(x) for x in report.get(k, ()) if not str(x).endswith(IGNORED_SUFFIXES)]
           for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        found = "; ".join(f"{k.split('_')[0]} {v[:3]}{' ...' if len(v) > 3 else ''}" for k, v in bad.items() if v)
        raise HFModelError(f"{name_or_dir}: its weights do not fit GPT-2 ({found}); refusing a partly random model")
    c = hf.config
    cfg = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, n_positions=c.n_positions, vocab_size=c.vocab_size)
    return cfg, hf.state_dict()


def load_hf(name_or_dir: str, **overrides):
    """A gptforge GPT with Hugging Face GPT-2 weights (a hub name online, or a local
    ``save_pretrained`` directory offline), in eval mode. ``overrides``: other GPTConfig fields
    (``flash``, ``pad_vocab``, ...). Needs ``transformers`` (extra ``hf``)."""
    from gptforge.models.gpt2 import GPT, GPTConfig

    hf_cfg, sd_hf = load_hf_state_dict(name_or_dir)
    cfg = GPTConfig(n_layer=hf_cfg["n_layer"], n_head=hf_cfg["n_head"], n_embd=hf_cfg["n_embd"],
                    block_size=hf_cfg["n_positions"], vocab_size=hf_cfg["vocab_size"], **overrides)
    model = GPT(cfg)
    missing, unexpected = model.load_state_dict(hf_to_gptforge(sd_hf, cfg), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to wte
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    return model.eval()


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def hf_to_gptforge(sd_hf: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Map a HF GPT-2 state dict onto gptforge names, transposing Conv1D and padding the vocab."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd_hf.items():
        if k.endswith(IGNORED_SUFFIXES):
            continue
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = _pad_rows(v, cfg.padded_vocab_size)
        out[k] = v.contiguous()
    return out


def gptforge_to_hf(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Inverse of :func:`hf_to_gptforge`: slice the padded vocab back, transpose to Conv1D."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.endswith(".attn.mask"):
            continue
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = v[: cfg.vocab_size]
        out[k] = v.contiguous()
    return out


def _pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    if w.size(0) >= rows:
        return w
    pad = torch.zeros(rows - w.size(0), w.size(1), dtype=w.dtype)
    return torch.cat([w, pad], dim=0)


# ----------------------------------------------------------------------------- export


def check_out_dir(out: str | Path, force: bool) -> Path:
    """Refuse to write into a non-empty directory unless ``force`` (exports overwrite file names)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--out {out} is not empty; choose an empty directory or pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    return out


def hf_config(cfg) -> dict:
    """config.json for transformers' GPT2LMHeadModel describing a gptforge GPTConfig."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,  # 4 * n_embd
        "activation_function": "gelu_new",  # tanh GELU, as in models/gpt2.py
        "layer_norm_epsilon": 1e-5,  # nn.LayerNorm's default
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "torch_dtype": "float32",
    }


def to_transformers(model: torch.nn.Module):
    """A transformers ``GPT2LMHeadModel`` holding ``model``'s (a gptforge GPT's) weights, in memory
    (benchmarks, tests); ``interop.hf_llama.to_transformers`` is the Llama family's."""
    GPT2Config, GPT2LMHeadModel = _transformers().GPT2Config, _transformers().GPT2LMHeadModel

    cfg = model.config
    config = {k: v for k, v in hf_config(cfg).items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf = GPT2LMHeadModel(GPT2Config(**config))
    missing, unexpected = hf.load_state_dict(gptforge_to_hf(model.state_dict(), cfg), strict=False)
    if unexpected or not all(k.endswith((".attn.bias", ".attn.masked_bias")) for k in missing):
        raise ValueError(f"weights do not fit transformers' GPT-2: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return hf.eval()


def export_hf(model: torch.nn.Module, out_dir: str | Path, force: bool = False, tokenizer: bool = True,
              chat_template: dict | None = None) -> list[Path]:
    """Write ``model`` (a gptforge GPT) as a Hugging Face GPT-2 directory. Returns the files written.
    ``chat_template``: a checkpoint's meta.json template; the tokenizer gets its tokens and Jinja."""
    from safetensors.torch import save_file

    from gptforge.interop.hf_chat import check_tokenizer_vocab

    cfg = model.config
    if not cfg.bias:
        raise ValueError("Hugging Face GPT-2 has biases in every Linear and LayerNorm; a model.bias=false model "
                         "cannot be exported to GPT2LMHeadModel")
    chat = check_tokenizer_vocab(cfg.vocab_size, chat_template) if tokenizer else None  # before writing
    out = check_out_dir(out_dir, force)
    sd = gptforge_to_hf({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, cfg)
    sd.pop("lm_head.weight", None)  # tied to transformer.wte.weight (tie_word_embeddings)
    files = [out / "model.safetensors", out / "config.json"]
    save_file(sd, str(files[0]), metadata={"format": "pt"})
    files[1].write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
    if tokenizer:
        files += write_tokenizer(out, chat, model_max_length=cfg.block_size)
    return files


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (as in OpenAI's encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run byte-pair merging on ``token`` using only merges ranked below ``max_rank``."""
    parts = [bytes([b]) for b in token]
    while True:
        best_i, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_i, best_rank = i, r
        if best_i < 0:
            return parts
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]


def ranks_to_vocab_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """tiktoken ranks -> (vocab.json mapping, merges in rank order). Each multi-byte token is the
    merge of the two parts BPE reaches with the merges ranked before it."""
    b2u = bytes_to_unicode()

    def u(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {u(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = _bpe_parts(ranks, tok, rank)
        if len(parts) != 2:
            raise ValueError(f"token {tok!r} (rank {rank}) is not a single merge of earlier tokens")
        merges.append((u(parts[0]), u(parts[1])))
    return vocab, merges


def gpt2_ranks() -> dict[bytes, int]:
    """The GPT-2 BPE ranks: the offline file when present, else tiktoken's own (online) copy."""
    from gptforge import assets

    path = assets.gpt2_ranks_path()
    if path.exists():
        from tiktoken.load import load_tiktoken_bpe

        return load_tiktoken_bpe(str(path), expected_hash=assets.GPT2_RANKS_SHA256)
    from gptforge.data.tokenizer import get_tokenizer

    return dict(get_tokenizer()._mergeable_ranks)  # tiktoken keeps the ranks only on this attribute


def write_hf_tokenizer(out: Path, model_max_length: int = 1024) -> list[Path]:
    """vocab.json, merges.txt and the small config files GPT2Tokenizer(Fast).from_pretrained needs."""
    vocab, merges = ranks_to_vocab_merges(gpt2_ranks())
    vocab[EOT_TEXT] = EOT
    eot = "<|endoftext|>"
    files = {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
        "tokenizer_config.json": json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length, "add_prefix_space": False,
            "bos_token": eot, "eos_token": eot, "unk_token": eot,
        }, indent=2),
        "special_tokens_map.json": json.dumps({"bos_token": eot, "eos_token": eot, "unk_token": eot}, indent=2),
    }
    paths = []
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    return paths


def write_tokenizer(out: Path, chat, model_max_length: int) -> list[Path]:
    """GPT-2's tokenizer files, with the chat tokens and template when ``chat`` (a ChatTemplate) is
    given: what both exporters write (gptforge's Llama uses GPT-2's BPE too)."""
    files = write_hf_tokenizer(out, model_max_length=model_max_length)
    if chat is not None:
        from gptforge.interop.hf_chat import write_hf_chat_template

        write_hf_chat_template(out, chat)
    return files
