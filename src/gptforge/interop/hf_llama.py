"""Hugging Face ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` <-> gptforge ``Llama``, both ways.

gptforge's Llama uses HF's parameter names and rotary layout, so the key map is the identity; only
the vocabulary padding (rows up to a multiple of 128) is added on the way in and sliced off on the way
out. Rope scaling ``linear`` and ``llama3`` (Llama 3.1/3.2) map to ``model.rope_*``; a ``qwen2``
directory is a Llama with q/k/v biases (``model.qkv_bias``), and a model with them exports as one.
Qwen3, Mistral, Phi-3, Gemma 2/3 and Granite are the same Llama with fields set (``interop/hf_families.py``
maps them, Qwen2's sliding windows too; ``interop/hf_llama_config.py`` reads config.json). A HF config that asks for something gptforge does not
implement (another rope scaling, biases on o_proj or the MLP, a head_dim apart from hidden/heads or
a sliding window on a plain Llama, an activation other than SiLU) is refused by name before any
weight is read: a model is never loaded wrong.

    >>> model = load_hf_llama("./my-llama-dir")        # a save_pretrained directory (or a hub name, online)
    >>> export_hf_llama(model, "exports/llama-hf")      # LlamaForCausalLM.from_pretrained loads it

Reading a local directory needs only ``safetensors``; ``transformers`` is used for hub names. Weights
come from safetensors only, never from a pickle (``pytorch_model.bin``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gptforge.data.chat import ChatTemplate
from gptforge.interop.hf_folder import check_out_dir, pad_rows, read_hf_json
from gptforge.interop.hf_llama_config import (  # noqa: F401 - re-export: the readers' callers import them here
    HFConfigError,
    llama_config_from_hf,
    rope_to_hf,
)
from gptforge.interop.hf_tokenizer import write_tokenizer
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.models.registry import at_layers
from gptforge.sizecheck import (
    check_model_size,
    count_layers,
    elements,
    layered_elements,
    safetensors_shapes,
)
from gptforge.tokens import EOT, GPT2_VOCAB

CHAT_VOCAB = ChatTemplate.gpt2().vocab_size

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # a buffer older transformers saved; recomputed here


def _read_config(name_or_dir: str) -> dict:
    path = Path(name_or_dir) / "config.json"
    if path.is_file():
        return read_hf_json(path)
    try:
        from transformers import AutoConfig
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise FileNotFoundError(f"{path} not found, and reading a hub name needs `transformers`: "
                                "pip install 'gptforge[hf]'") from e
    try:
        return AutoConfig.from_pretrained(name_or_dir).to_dict()
    except OSError as e:
        raise FileNotFoundError(f"could not load Hugging Face config {name_or_dir!r}: {e}\n"
                                "Give a hub name (needs network) or a directory written by save_pretrained().") from e


def _read_weights(name_or_dir: str) -> dict[str, torch.Tensor]:
    """A hub model's weights, safetensors only (a local directory is read by ``_read_checked``, its shapes
    checked against the config first), by the family's own transformers class: LlamaForCausalLM would drop
    Qwen3's q/k norms and Gemma's extra norms, and give Phi-3's fused q/k/v and gate/up matrices back as new
    random ones under Llama's names. In float32, as stored or wider (transformers 5 would narrow to the
    config's dtype)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name_or_dir, use_safetensors=True, dtype=torch.float32).state_dict()


def load_hf_llama(name_or_dir: str, **overrides) -> Llama:
    """gptforge ``Llama`` (eval mode) from a HF LlamaForCausalLM directory or hub name. A local
    directory's weight shapes are checked against the config from the safetensors header (the
    expected shapes come from a model on the meta device) before anything is allocated."""
    local = Path(name_or_dir) / "config.json"
    try:
        cfg = llama_config_from_hf(_read_config(name_or_dir), **overrides)  # refuse before reading weights
    except HFConfigError as e:  # which file (or hub model) the refused field is in
        raise HFConfigError(f"{local if local.is_file() else name_or_dir}: {e}") from None
    if Path(name_or_dir).is_dir():
        sd = _read_checked(Path(name_or_dir), cfg)
    else:  # nothing present yet: the memory it needs, before the download
        from gptforge.interop.hf_folder import HFModelError

        claimed = layered_elements(lambda k: _hf_shapes(at_layers(cfg, k), once=True), cfg.n_layer)
        check_model_size(name_or_dir, "its config", claimed, None, HFModelError, "Llama")
        sd = _read_weights(name_or_dir)
    head, embed = sd.get("lm_head.weight"), sd.get("model.embed_tokens.weight")
    if cfg.tie_embeddings and head is not None and embed is not None and not torch.equal(head, embed):
        # tie_word_embeddings true, yet the file holds a head of its own: transformers does not tie them then
        # (it warns and keeps both), so neither does gptforge; dropping the head would be another model
        cfg = LlamaConfig(**{**cfg.to_dict(), "tie_embeddings": False})
    model = Llama(cfg)
    load_hf_llama_state_dict(model, sd)
    return model.eval()


def _read_checked(d: Path, cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError

    from gptforge.interop.hf_folder import HFModelError, read_safetensors, safetensors_files
    from gptforge.storage.tensors import open_safetensors

    files = safetensors_files(d)
    claimed = layered_elements(lambda k: _hf_shapes(at_layers(cfg, k), once=True), cfg.n_layer)
    # the total first: no table or model of the claimed size is built before it is known to fit
    found = safetensors_shapes(files, HFModelError)
    check_model_size(str(d / "config.json"), "config.json", claimed, elements(found.values()), HFModelError, "Llama",
                     layers=(cfg.n_layer, count_layers(found)))
    try:  # the layer count from the header names first: even on the meta device, 10**6 layers take minutes
        names = [k for f in files for k in open_safetensors(f).keys()]
    except (OSError, SafetensorError) as e:
        raise HFModelError(f"{d}: not a readable safetensors file ({e})") from None
    layers = len({k.split(".")[2] for k in names if k.startswith("model.layers.")})
    if layers != cfg.n_layer:
        raise HFModelError(f"{d}: the weights do not fit Llama as config.json sizes it (num_hidden_layers="
                           f"{cfg.n_layer}, the weights hold {layers} layers); refusing a partly random model")
    return read_safetensors(files, _hf_shapes(cfg), optional=("lm_head.weight",) if cfg.tie_embeddings
                            else (), ignored=IGNORED_SUFFIXES, rename=lambda k: k, family=cfg.family or "Llama")


def _hf_shapes(cfg: LlamaConfig, once: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor of a HF LlamaForCausalLM of ``cfg``'s sizes, from a model on the meta device (``once``:
    a tied head left out, as the smallest file holds it)."""
    with torch.device("meta"):  # shapes only: nothing is allocated however wide the config says it is
        expected = {k: tuple(v.shape) for k, v in Llama(cfg).state_dict().items()}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):  # HF stores the real rows, unpadded
        expected[k] = (cfg.vocab_size, cfg.n_embd)
    if cfg.family == "phi3":  # its q/k/v and gate/up matrices are stored fused
        from gptforge.interop.hf_families import fused_shapes

        expected = fused_shapes(expected, cfg)
    if once and cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    return expected


def load_hf_llama_state_dict(model: Llama, sd_hf: dict[str, torch.Tensor]) -> None:
    """Copy HF Llama tensors into ``model``: same names, vocabulary rows padded."""
    cfg = model.config
    if cfg.family == "phi3":
        from gptforge.interop.hf_families import split_fused

        sd_hf = split_fused(sd_hf, cfg)
    sd = {}
    for k, v in sd_hf.items():
        if k.endswith(IGNORED_SUFFIXES):
            continue
        if k in ("model.embed_tokens.weight", "lm_head.weight"):
            v = pad_rows(v, cfg.padded_vocab_size)
        sd[k] = v
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)  # the same tensor as embed_tokens (some files store it anyway)
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in sd.items()
             if k in own and v.shape != own[k].shape]
    if wrong:
        raise ValueError(f"weights do not fit the config's shapes: {'; '.join(wrong[:3])}")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def hf_llama_config(cfg: LlamaConfig) -> dict:
    """config.json for transformers' LlamaForCausalLM describing ``cfg`` (refuses what it cannot express);
    with q/k/v biases, Qwen2ForCausalLM's (the same model, biases on q/k/v only)."""
    if cfg.family not in ("", "llama", "qwen2"):
        return _family_config(cfg)
    # Qwen2's config carries a sliding window (use_sliding_window, layer_types): a model with q/k/v biases keeps it;
    # Llama's a head_dim apart from hidden/heads
    carried = ("model.sliding_window", "model.layer_types") if cfg.qkv_bias else ("model.head_size",)
    unsupported = {"qk_norm": cfg.qk_norm, "mlp": cfg.mlp if cfg.mlp != "swiglu" else None,
                   "logit_softcap": cfg.logit_softcap or None,
                   **{f: getattr(cfg, f.removeprefix("model."), True) for f in cfg.features() if f not in carried}}
    for key, value in unsupported.items():
        if value:
            raise ValueError(f"{key if key.startswith('model.') else 'model.' + key}={value!r}: Hugging Face "
                             f"{'Qwen2' if cfg.qkv_bias else 'Llama'}ForCausalLM has no such option, so this model "
                             f"cannot be exported as a {'Qwen2' if cfg.qkv_bias else 'Llama'} (train with the default, "
                             "or set model.family to a family that has it, to export)")
    config = _llama_config(cfg)
    return _read_back(cfg, config) if cfg.sliding_window or cfg.head_size else config


def _llama_config(cfg: LlamaConfig) -> dict:
    """LlamaForCausalLM's config.json (Qwen2's with q/k/v biases) for ``cfg``'s shared fields, unchecked."""
    gpt2_vocab = cfg.vocab_size in (GPT2_VOCAB, CHAT_VOCAB)  # GPT-2's BPE (a chat model adds its tokens)
    scaling = rope_to_hf(cfg)
    config = {
        "architectures": ["Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"],
        "model_type": "qwen2" if cfg.qkv_bias else "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers < 5 reads these two ...
        "rope_scaling": scaling,
        "rope_parameters": {**(scaling or {"rope_type": "default"}), "rope_theta": cfg.rope_theta},  # ... >= 5 this
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": 0.02,
        "bos_token_id": EOT if gpt2_vocab else None,
        "eos_token_id": EOT if gpt2_vocab else None,
        "torch_dtype": "float32",
    }
    if cfg.qkv_bias:  # Qwen2's config: no bias switches (q/k/v have them, o_proj not), its window's layers
        for key in ("attention_bias", "mlp_bias", "head_dim"):
            del config[key]
        window, pattern = cfg.sliding_window or None, cfg.sliding_pattern
        config.update(use_sliding_window=bool(window), sliding_window=window,
                      max_window_layers=pattern.find("s") if window else cfg.n_layer)
        if window:  # which layers slide, as transformers' Qwen2 reads them
            config["layer_types"] = ["sliding_attention" if k == "s" else "full_attention" for k in pattern]
    return config


# the fields whose values decide the math: an exported family config must read back to the same ones
MATH_FIELDS = ("n_layer", "n_head", "n_embd", "intermediate_size", "vocab_size", "rope_theta", "rope_type",
               "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context", "qkv_bias",
               "norm_eps", "mlp", "qk_norm", "logit_softcap", "tie_embeddings", "head_size", "sliding_window",
               "layer_types", "attn_softcap", "query_pre_attn_scalar", "embed_scale", "norm_plus_one", "post_norms",
               "rope_local_theta", "attn_scale", "residual_scale", "logits_scaling", "pre_norms", "qk_norm_full")


def _family_config(cfg: LlamaConfig) -> dict:
    """config.json for ``cfg.family`` (Qwen3, Mistral, Phi-3, Gemma 2/3), checked by reading it back:
    a field the family's config cannot carry is refused by name, not dropped."""
    from gptforge.interop.hf_families import family_config

    return _read_back(cfg, family_config(cfg, _llama_config(cfg)))


def _read_back(cfg: LlamaConfig, config: dict) -> dict:
    """``config`` if the import reads it back to ``cfg``'s math (MATH_FIELDS), else ValueError naming the fields."""
    try:
        back = llama_config_from_hf(config)
    except HFConfigError as e:
        raise ValueError(f"model.family={cfg.family or config['model_type']}: this model's config cannot be written "
                         f"as one ({e})") from None
    differ = [f for f in MATH_FIELDS if field_meaning(back, f) != field_meaning(cfg, f)]
    if differ:
        raise ValueError(f"model.family={cfg.family or config['model_type']}: Hugging Face's "
                         f"{config['architectures'][0]} cannot express "
                         + ", ".join(f"model.{f}={getattr(cfg, f)!r}" for f in differ)
                         + "; export as a family that has them, or train with the family's values")
    return config


def window_spans_context(cfg: LlamaConfig) -> bool:
    """A window at least as long as the context: every query sees every earlier key, plain causal attention
    (the readers drop such a window). Not for Gemma 3, whose sliding layers keep their own rope base."""
    return 0 < cfg.block_size <= cfg.sliding_window and cfg.family != "gemma3"


def field_meaning(cfg: LlamaConfig, field: str):
    """What ``field`` means for the math, two spellings of one model compared equal (head_size 0 or
    n_embd/n_head, an intermediate_size 0 or its derived width, layer_types empty or all sliding, a window
    as long as the context or none)."""
    if field == "head_size":
        return cfg.head_dim
    if field == "intermediate_size":
        return cfg.hidden_dim
    if field == "sliding_window":
        return 0 if window_spans_context(cfg) else cfg.sliding_window
    if field == "layer_types":
        return "f" * cfg.n_layer if window_spans_context(cfg) else cfg.sliding_pattern
    if field == "query_pre_attn_scalar":
        return cfg.query_pre_attn_scalar or cfg.head_dim
    if field == "attn_scale":  # the scores' scale, however it is spelled (Granite's is always written)
        from gptforge.interop.hf_families import attention_scale

        return attention_scale(cfg)
    return getattr(cfg, field)


def llama_state_dict_for_hf(model: Llama) -> dict[str, torch.Tensor]:
    """``model``'s weights under HF names: float32 on the CPU, padding sliced off, a tied head once."""
    cfg = model.config
    sd = {}
    for k, v in model.state_dict().items():
        v = v.detach().float().cpu()
        if k in ("model.embed_tokens.weight", "lm_head.weight"):
            v = v[: cfg.vocab_size]
        sd[k] = v.contiguous()
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight")  # tie_word_embeddings: stored once, as HF does
    if cfg.family == "phi3":  # Phi3ForCausalLM stores q/k/v and gate/up fused
        from gptforge.interop.hf_families import fuse

        sd = fuse(sd, cfg)
    return sd


def to_transformers(model: Llama):
    """A transformers ``LlamaForCausalLM`` holding ``model``'s weights, in memory (benchmarks, tests)."""
    import transformers

    full = hf_llama_config(model.config)
    config = {k: v for k, v in full.items() if k not in ("architectures", "model_type")}
    kind = full["architectures"][0].removesuffix("ForCausalLM")
    config_kind = "Gemma3Text" if kind == "Gemma3" else kind
    hf = getattr(transformers, f"{kind}ForCausalLM")(getattr(transformers, f"{config_kind}Config")(**config))
    missing, unexpected = hf.load_state_dict(llama_state_dict_for_hf(model), strict=False)
    if unexpected or [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]:
        raise ValueError(f"weights do not fit transformers' Llama: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def export_hf_llama(model: Llama, out_dir: str | Path, force: bool = False, tokenizer: bool = True,
                    chat_template: dict | None = None, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write ``model`` as a HF LlamaForCausalLM directory (safetensors + config.json [+ GPT-2 tokenizer]).
    ``chat_template``: a checkpoint's meta.json template; the tokenizer gets its tokens and Jinja, as
    the GPT-2 exporter writes them (gptforge's Llama uses GPT-2's BPE and padded rows)."""
    from safetensors.torch import save_file

    from gptforge.interop.hf_chat import check_tokenizer_vocab
    from gptforge.storage import ordinary_file_mode

    cfg = model.config
    config = hf_llama_config(cfg)  # refuse before touching the output directory
    chat = check_tokenizer_vocab(cfg.vocab_size, chat_template) if tokenizer else None
    out = check_out_dir(out_dir, force)
    sd = {k: v.to(dtype).contiguous() for k, v in llama_state_dict_for_hf(model).items()}  # ``dtype``: as written
    files = [out / "model.safetensors", out / "config.json"]
    save_file(sd, str(files[0]), metadata={"format": "pt"})
    ordinary_file_mode(files[0])  # safetensors writes 0600; the other files get the umask's mode
    files[1].write_text(json.dumps({**config, "torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n")
    if tokenizer:
        files += write_tokenizer(out, chat, model_max_length=cfg.block_size)
    return files


load_hf = load_hf_llama  # the names gptforge.interop.hf_module's callers use
export_hf = export_hf_llama
