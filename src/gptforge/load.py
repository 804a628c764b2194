"""One way to get a model for every command that takes one: ``load_model(source)``.

    >>> model = load_model(ModelSource(ckpt="runs/shakespeare-cpu"))   # newest checkpoint of a run
    >>> model = load_model(ModelSource(hf="gpt2"))                     # Hugging Face (hub or directory)
    >>> model = load_model(ModelSource(llmc="gpt2_124M.bin"))          # an llm.c model file
    >>> model = load_model(ModelSource(random="d2"))                   # random weights of a named size

Weights come from safetensors or llm.c files, never from a pickle. The model family is whatever
the source says (a checkpoint's ``model.arch``, a Hugging Face ``model_type``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gptforge import environment
from gptforge.config import Config
from gptforge.models.registry import build_model, size_config
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from gptforge.run.identity import read_newest, resolve_checkpoint
from gptforge.run.resume import saved_config
from gptforge.run.weights import check_weights_fit

KINDS = ("ckpt", "hf", "llmc", "random", "gguf")


@dataclass(frozen=True)
class ModelSource:
    ckpt: str | None = None  # a checkpoint directory, or a run directory (its newest checkpoint)
    hf: str | None = None  # a Hugging Face hub name (online) or save_pretrained directory
    llmc: str | None = None  # an llm.c model file
    random: str | None = None  # a model size name: random weights (benchmarks, smoke tests)
    gguf: str | None = None  # a GGUF file (llama.cpp's format; dequantized to float32)

    def given(self) -> list[str]:
        return [k for k in KINDS if getattr(self, k) is not None]

    def describe(self) -> dict[str, str | None]:
        return {k: getattr(self, k) for k in KINDS}

    @classmethod
    def from_path(cls, path: str) -> ModelSource:
        """A file is an llm.c model; a directory with a ``config.json`` (and no gptforge ``meta.json``)
        a Hugging Face ``save_pretrained`` directory; any other directory a gptforge checkpoint or run
        (``--init-from``; a run directory has a config.json too, beside its checkpoints/)."""
        p = Path(path)
        if p.is_file():
            return cls(gguf=path) if p.suffix.lower() == ".gguf" else cls(llmc=path)
        if (p / "config.json").is_file() and not (p / "meta.json").exists() and not ckpt.ckpt_root(p).is_dir():
            return cls(hf=path)
        if (p / "adapter_config.json").is_file() and not (p / "meta.json").exists():  # peft's: the HF reader names it
            return cls(hf=path)
        return cls(ckpt=path)


def load_model(source: ModelSource, announce_after: float | None = None) -> torch.nn.Module:
    """The model ``source`` names, in eval mode, on the CPU. A load that lasts past ``announce_after``
    seconds (default ``ANNOUNCE_AFTER_S``; 0: at once, as ``serve`` does) says on stderr what it is
    reading (kind, path, size) and then how long it took."""
    if len(source.given()) != 1:
        raise ValueError("give exactly one of --ckpt DIR, --hf NAME_OR_DIR, --llmc FILE, --gguf FILE or --random SIZE")
    with Announce(describe_source(source), after=announce_after):
        return _load_model(source)


def _load_model(source: ModelSource) -> torch.nn.Module:
    if source.gguf is not None:
        from gptforge.interop.gguf_read import read_gguf

        g = read_gguf(source.gguf)
        _remember_gguf_words(_gguf_key(source.gguf), g)  # a command asks for its tokenizer next: not built twice
        return g.model
    if source.hf is not None:
        # the family by config.json's model_type (an unknown one is refused there), then its loader
        from gptforge.interop import hf_module
        from gptforge.interop.hf_folder import hf_family

        return hf_module(hf_family(source.hf)).load_hf(source.hf)
    if source.llmc is not None:
        from gptforge.interop.llmc import read_llmc_model

        return read_llmc_model(source.llmc)
    if source.random is not None:
        torch.manual_seed(0)
        return build_model(size_config(source.random)).eval()
    # a run still training there may prune the checkpoint while it is read: then its newest is read
    return read_newest(source.ckpt, lambda where: _load_checkpoint(where, source.ckpt))


def _load_checkpoint(where: Path, given: str) -> torch.nn.Module:
    meta = ckpt.read_meta(where)
    cfg = saved_config(meta, str(where / "meta.json"))
    recipe = meta.get("recipe")
    if recipe == "rm":  # the one place every text command (sample, chat, serve, eval tasks) loads through
        raise ValueError(f"{where} is a reward model (`gptforge rm`): a reward model does not generate text. Score "
                         f"preference pairs with `gptforge eval --ckpt {given} --preferences FILE.jsonl`, "
                         f"export it with `gptforge export hf`, or use it in `gptforge rl --reward-model`")
    if meta.get("lora"):  # adapters only: onto their base, merged (W + alpha/r BA), a plain family model
        check_weights_fit(where, cfg.model)  # meta.json against the header's record (n_head, lora.alpha) first
        return lora_merged(where, meta, cfg).eval()
    check_weights_fit(where, cfg.model, prefix="policy." if recipe == "ppo" else "")  # shapes bounded by the file first
    model = build_model(cfg.model)
    # model.safetensors only (FSDP checkpoints hold a consolidated copy): never dcp/, whose metadata is
    # a pickle; verified against meta.json's checksum. A PPO checkpoint holds the policy and the value
    # model: the policy is the model.
    restore.load_model_weights(model, where, prefix="policy." if recipe == "ppo" else "")
    return model.eval()


# --- the dtype a model's weights were stored in -------------------------------------------------------

DTYPES = ("float32", "bfloat16", "float16")


def stored_dtype(source: ModelSource) -> tuple[str, str]:
    """(dtype, why): the floating type ``source``'s weights are stored in, which an export writes by default
    (as transformers' ``save_pretrained`` keeps a model's own dtype). Every model is computed in float32
    here; this is what it was before loading:

    * a Hugging Face directory: its config.json's ``torch_dtype`` (``dtype`` since transformers 4.56);
    * a GGUF file: float16 or bfloat16 when every matrix is stored so; float32 for F32 and for quantized
      matrices (their dequantized values, scale x integer + offset, need float32 to be kept exactly);
    * an llm.c file: float32 (version 3) or bfloat16 (version 5);
    * a checkpoint: what ``gptforge import`` recorded of its source (``source_dtype``), else float32
      (a run's weights are float32 masters, whatever autocast it trained under)."""
    if source.hf is not None:
        cfg_path = Path(source.hf) / "config.json"
        if cfg_path.is_file():
            from gptforge.reading import read_json

            try:  # size-bounded; a damaged config.json is the loader's to report, not this guess's
                cfg = read_json(cfg_path, ValueError, "config.json")
            except (OSError, ValueError):
                cfg = {}
            for key in ("torch_dtype", "dtype"):
                if isinstance(cfg, dict) and cfg.get(key) in DTYPES:
                    return cfg[key], f"{cfg_path}'s {key}"
        return "float32", "its config.json names no dtype"
    if source.gguf is not None:
        from gptforge.interop.gguf_read import read_gguf

        types = set(read_gguf(source.gguf, weights=False).matrix_types)
        own = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
        if len(types) == 1 and next(iter(types)) in own:
            return own[next(iter(types))], f"the GGUF file's matrices are {next(iter(types))}"
        return "float32", (f"the GGUF file's matrices are {', '.join(sorted(types))}: dequantized, they are exact "
                           "only in float32")
    if source.llmc is not None:
        from gptforge.interop.llmc import read_model_header

        v = read_model_header(source.llmc)["version"]
        return ("bfloat16" if v == 5 else "float32"), f"the llm.c file is version {v}"
    if source.ckpt is not None:
        rec = read_newest(source.ckpt, ckpt.read_meta).get("source_dtype")
        if isinstance(rec, dict) and rec.get("dtype") in DTYPES:
            return rec["dtype"], f"imported from {rec.get('why') or 'its source'}"
        return "float32", "a gptforge checkpoint's weights are float32"
    return "float32", "random weights are made in float32"


# --- saying what is loading ----------------------------------------------------------------------------

# A load slower than this says what it reads: the newcomer's "no silent minute" (within 2 s), while a
# tiny model that loads at once prints nothing (its command's own lines, and a one-line error, stay alone).
# seconds a load runs before it says what it reads; GPTFORGE_ANNOUNCE_AFTER changes it (the test suite sets it
# high, so an error that ends a slow load on a loaded machine stays the one line its test expects). None: read
# from the environment when a load starts (gptforge.environment names a malformed value), never at import
ANNOUNCE_AFTER_S: float | None = None


def human_bytes(n: int) -> str:
    """``538.0 MB``: decimal units, as file managers and the hub show sizes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _weights_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file() and f.suffix in (".safetensors", ".bin"))


def describe_source(source: ModelSource) -> str:
    """What ``source`` is, for a person: its kind of weights, its path and size, e.g. ``GGUF file
    model.gguf (101.4 MB)``. Reads only directory listings and file sizes; never raises (a source that
    is not there is named as given, and its loader says what is wrong)."""
    try:
        if source.gguf is not None:
            return f"GGUF file {source.gguf} ({human_bytes(Path(source.gguf).stat().st_size)})"
        if source.llmc is not None:
            return f"llm.c model file {source.llmc} ({human_bytes(Path(source.llmc).stat().st_size)})"
        if source.random is not None:
            return f"random weights of size {source.random}"
        if source.hf is not None:
            d = Path(source.hf)
            if not d.is_dir():
                return f"Hugging Face model {source.hf} (from the hub)"
            return f"Hugging Face directory {source.hf} ({human_bytes(_weights_bytes(d))} of weights)"
        where = resolve_checkpoint(source.ckpt)
        return f"gptforge checkpoint {where} ({human_bytes(_weights_bytes(where))} of weights)"
    except Exception:  # a missing file or checkpoint: its loader names it in its own error
        kind = source.given()[0] if source.given() else "model"
        return f"{kind} {getattr(source, kind, '')}"


class Announce:
    """``with Announce("GGUF file m.gguf (101.4 MB)"):`` prints ``loading GGUF file m.gguf (101.4 MB) ...``
    on stderr once the block has run ``after`` seconds (a timer thread: the load itself is one long call),
    and ``loaded in 12.3 s`` when it ends, if it was announced. Rank 0 only under torchrun."""

    def __init__(self, what: str, after: float | None = None) -> None:
        if after is None:
            after = ANNOUNCE_AFTER_S if ANNOUNCE_AFTER_S is not None else environment.number("GPTFORGE_ANNOUNCE_AFTER", 1.0)
        self.what, self.after = what, after
        self._lock, self._said, self._done = threading.Lock(), False, False

    def _say(self) -> None:
        with self._lock:
            if not self._done:
                self._said = True
                print(f"loading {self.what} ...", file=sys.stderr, flush=True)

    def __enter__(self) -> Announce:
        self._t0 = time.perf_counter()
        self._timer = None
        if os.environ.get("RANK", "0") != "0":
            pass
        elif self.after <= 0:  # at once (serve): said before the load starts, not raced by a thread
            self._say()
        else:
            self._timer = threading.Timer(self.after, self._say)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            if self._said and exc_type is None:
                print(f"loaded in {time.perf_counter() - self._t0:.1f} s", file=sys.stderr, flush=True)


def lora_merged(where: Path, meta: dict, cfg: Config, merge: bool = True, wrap=None) -> torch.nn.Module:
    """A LoRA checkpoint's model: its base (``lora.base``, any model source, checked against the recorded
    sha256), its adapters on, folded in when ``merge``. A base or adapters that do not fit is refused
    as a ValueError naming the file. ``wrap``: the module the run trained around the family model (a
    reward model's ``RewardModel``), whose own head the checkpoint holds beside the adapters."""
    from gptforge.models.lora import add_lora, merge_lora, weights_fingerprint

    lc, rec = cfg.lora, meta["lora"]
    if lc.rank < 1:  # adapters saved, and no rank to scale them by (alpha / rank): a damaged saved config
        raise ValueError(f"{where}/meta.json: lora.rank={lc.rank} in a LoRA checkpoint (its meta.json records adapters); "
                         "the checkpoint is damaged")
    base = load_model(ModelSource.from_path(lc.base)) if lc.base else None
    if base is None:
        raise ValueError(f"{where}/meta.json: a LoRA checkpoint that names no lora.base; its base model is unknown")
    got = weights_fingerprint(base)
    if got != rec.get("base_sha256"):
        raise ValueError(f"{where}: its adapters were trained on {rec.get('base')!r} (weights sha256 "
                         f"{str(rec.get('base_sha256'))[:12]}), but {lc.base!r} now holds weights sha256 {got[:12]}")
    model = build_model(cfg.model)
    try:
        model.load_state_dict(base.state_dict())
    except RuntimeError as e:
        raise ValueError(f"{where}: lora.base {lc.base!r} does not fit the model meta.json describes") from e
    add_lora(model, cfg.model.arch, lc.rank, lc.alpha, 0.0, lc.target_names())
    full = wrap(model) if wrap is not None else model
    base_ids = {id(p) for n, p in model.named_parameters() if ".lora_" not in n}
    full.lora_state_keys = sorted(n for n, p in full.named_parameters() if id(p) not in base_ids)  # type: ignore[attr-defined]
    # shapes checked: another rank or targets is named there. A PPO run's adapters are its policy's
    # (``policy.*``; its value model, saved beside them, is not the model)
    restore.load_model_weights(full, where, prefix="policy." if meta.get("recipe") == "ppo" else "")
    del full.lora_state_keys
    if merge:
        merge_lora(model)
    return full


# --- a model's words: its tokenizer and chat template -------------------------------------------------

def load_tokenizer_of(source: ModelSource, model: torch.nn.Module | None = None):
    """The tokenizer ``source``'s model speaks (the one seam: :mod:`gptforge.data.tokenizer`).

    * a checkpoint: the ``tokenizer/`` bundle its meta.json records (GPT-2's for checkpoints written
      before tokenizers were data);
    * a Hugging Face directory: its ``tokenizer.json`` (and ``tokenizer_config.json``), else GPT-2's
      (a GPT-2 directory carries ``vocab.json`` + ``merges.txt``, GPT-2's own ranks); a hub name:
      its tokenizer.json from the hub (online), else GPT-2's;
    * an llm.c file or random weights: GPT-2's.

    With ``model``, its logits must cover every id the tokenizer produces (a 3,000-row model fed a
    50,257-token tokenizer is refused here, not mid-generation)."""
    from gptforge.data import tokenizer as tk

    recorded = True  # the model names its tokenizer (else GPT-2's is assumed, as before tokenizers were data)
    if source.ckpt is not None:
        def read(where: Path):
            meta = ckpt.read_meta(where)
            return "tokenizer" in meta, tk.tokenizer_from_meta(meta, where)

        recorded, tok = read_newest(source.ckpt, read)
    elif source.hf is not None:
        tok = _hf_tokenizer(source.hf)
        recorded = not tok.is_gpt2
    elif source.gguf is not None:  # the file's own tokenizer.ggml.* and chat template
        tok = _gguf_words(source.gguf)[0]
    else:
        tok, recorded = tk.gpt2_tokenizer(), False
    if model is not None and recorded:  # an assumed GPT-2 on a smaller model: prompts are checked per id
        tk.check_fits(tok, model.config.vocab_size, where=f"the model's vocab_size ({source.given()[0]})")
    return tok


def _hf_tokenizer(name_or_dir: str):
    from gptforge.data import tokenizer as tk

    d = Path(name_or_dir)
    if d.is_dir():  # a tokenizer.json that is there but damaged (a folder, a dangling link) is named, not skipped
        there = (d / "tokenizer.json").exists() or (d / "tokenizer.json").is_symlink()
        return _gpt2_if_same(tk.hf_tokenizer_from_dir(d)) if there else tk.gpt2_tokenizer()
    try:  # the online path: the hub's tokenizer files, when the repository has them
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(name_or_dir, "tokenizer.json"))
    except Exception:  # no hub access, or no tokenizer.json there (GPT-2's repository has one too)
        return tk.gpt2_tokenizer()
    for extra in ("tokenizer_config.json",):
        try:
            hf_hub_download(name_or_dir, extra)
        except Exception:  # optional file
            pass
    # outside the try: a downloaded tokenizer that is damaged or hostile is refused naming the file, not
    # silently swapped for GPT-2's (the model's text would have been decoded with the wrong vocabulary)
    return _gpt2_if_same(tk.hf_tokenizer_from_dir(path.parent))


def _gpt2_if_same(tok):
    """GPT-2's own tokenizer where a ``tokenizer.json`` is exactly GPT-2's BPE (the hub's ``gpt2`` and
    every GPT-2 ``save_pretrained`` carry one) and names no chat template; else ``tok``. Such a model
    speaks GPT-2's tokenizer, as a vocab.json + merges.txt directory does: gptforge's chat tokens on
    its padded rows apply (sft, dpo, rm and rl tune it into a chat model) and its exports name GPT-2's
    ranks. Same means the same encoder: no normalizer, GPT-2's byte-level split, a plain BPE, only
    ``<|endoftext|>`` (50256) added, and GPT-2's vocabulary and merges in order."""
    from gptforge.tokens import EOT, EOT_TEXT

    j = tok._json
    model, pre = j.get("model") or {}, j.get("pre_tokenizer") or {}
    if (tok.chat_template or tok.n_vocab != EOT + 1 or tok.special_tokens != {EOT_TEXT: EOT}
            or len(j.get("added_tokens") or []) != 1 or j.get("normalizer") is not None
            or pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or pre.get("use_regex") is False
            or model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback")
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")
            or len(model.get("merges") or []) != 50000):
        return tok
    from gptforge.data import tokenizer as tk

    vocab, merges = _gpt2_vocab_merges()
    theirs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    same = model.get("vocab") == {**vocab, EOT_TEXT: EOT} and theirs == merges
    return tk.gpt2_tokenizer() if same else tok


@functools.cache
def _gpt2_vocab_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2's ranks as tokenizer.json spells them (vocab, merges in order): ~1 s to derive, once."""
    from gptforge.interop.hf_tokenizer import gpt2_ranks, ranks_to_vocab_merges

    return ranks_to_vocab_merges(gpt2_ranks())


def load_chat_template_of(source: ModelSource, tok, fallback: bool = False):
    """The chat template ``source``'s model was tuned with: a checkpoint's meta.json ``chat_template``
    (gptforge's own format or a model's Jinja); for a Hugging Face model the Jinja template in its
    ``tokenizer_config.json``; else None (a base model). ``fallback`` (a recipe choosing the template
    to tune with): a base checkpoint's tokenizer's own template (a trained tokenizer's ChatML), else
    gptforge's for GPT-2's tokenizer."""
    from gptforge.data.chat import default_template, template_from_meta, template_from_tokenizer

    if source.ckpt is not None:
        chat = read_newest(source.ckpt, lambda where: template_from_meta(
            ckpt.read_meta(where), where=str(where / "meta.json"), tok=tok))
        if chat is not None or not fallback:
            return chat
    elif source.hf is not None and not fallback:
        return template_from_tokenizer(tok)
    elif source.gguf is not None:
        template = _gguf_words(source.gguf)[1]
        if template:
            from gptforge.data.chat_jinja import JinjaChatTemplate

            return JinjaChatTemplate(template, tok, name=Path(source.gguf).stem,
                                     where=f"{source.gguf} (tokenizer.chat_template)")
    return default_template(tok) if fallback else None


_GGUF_WORDS: dict[tuple, tuple] = {}  # (path, size, mtime) -> (tokenizer, chat template); the last 4 files


def _gguf_key(path: str) -> tuple:
    p = Path(path)
    st = p.stat() if p.is_file() else None
    return str(p.resolve()), st.st_size if st else -1, st.st_mtime_ns if st else -1


def _remember_gguf_words(key: tuple, g) -> None:
    _GGUF_WORDS[key] = g.tokenizer, g.chat_template
    while len(_GGUF_WORDS) > 4:
        del _GGUF_WORDS[next(iter(_GGUF_WORDS))]


def _gguf_words(path: str):
    """(tokenizer, chat template text) of a GGUF file, read from its metadata only (no weights) unless
    ``load_model`` read the file already; read once per file version, though a command asks for both
    in turn (building the 49,152-token tokenizer takes half a second of CPU)."""
    key = _gguf_key(path)
    if key not in _GGUF_WORDS:
        from gptforge.interop.gguf_read import read_gguf

        _remember_gguf_words(key, read_gguf(path, weights=False))
    return _GGUF_WORDS[key]
