"""llama.cpp's GGUF layouts of the families that are gptforge's Llama with fields set (``qwen3``,
``gemma2``, ``gemma3``, ``phi3``; Mistral is ``llama``, whose ``attention.sliding_window`` llama.cpp does not
apply, nor its phi3: ``gguf_config.IGNORES_WINDOW``), both ways.

What llama.cpp's converter (``convert_hf_to_gguf.py``) does to each, and so what is undone here:

* the rotary of qwen3, gemma2, gemma3 and phi3 is NEOX (rotate-half, as HF's): q/k rows stay in
  order; Mistral, as ``llama``, gets the interleaving permutation Llama gets;
* Gemma's RMSNorm weights are stored as 1 + w (llama.cpp multiplies by the weight alone);
* Phi-3's q/k/v are one ``attn_qkv`` and its gate/up one ``ffn_up`` (gate rows first);
* Gemma's post norms are ``post_attention_norm`` and ``post_ffw_norm``, its pre-MLP norm ``ffn_norm``;
  q/k norms are ``attn_q_norm``/``attn_k_norm``;
* metadata: ``attention.key_length``/``value_length`` (a head_dim apart), ``attention.sliding_window``,
  Gemma 2's ``attn_logit_softcapping``/``final_logit_softcapping`` (a file without them is llama.cpp's
  window 4096 and caps 50 and 30, so a Gemma 2 with a cap off has no GGUF form). What llama.cpp does not store it
  fixes: Gemma's embedding scale sqrt(n_embd), its layer kinds (every 2nd / 6th layer full), Gemma 3's
  sliding layers' rope base 10,000, and the query scale (1/sqrt(head_dim), or 1/sqrt(n_embd/n_head)
  for the 27B models, told apart by their layer counts). A model whose fields differ from what the
  file would say is refused by the field's name at export (read back through ``gguf_config.config_fields``,
  which reads these keys; this module writes them and lays out the tensors).
"""

from __future__ import annotations

from pathlib import Path

import torch

# the reading side (what a family's keys set) lives in gguf_config, below this module: the reader takes it from
# there, and check_export reads a model back through it, so the imports run one way
from gptforge.interop.gguf_config import (  # noqa: F401 - ARCHS and config_fields are read from here too
    ARCHS,
    BLOCK_NAMES,
    IGNORES_WINDOW,
    SWA_PERIOD,
    config_fields,
    llama_config_from_gguf,
)
from gptforge.interop.gguf_tokenizer import GGUFReadError

FAMILY_ARCH = {"qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3", "mistral": "llama"}
NEOX = ("qwen2", "qwen3", "gemma2", "gemma3", "phi3")  # rotate-half rotary in llama.cpp: q/k rows as HF's


def _window(cfg, arch: str) -> int:
    """The window the file carries: none where it spans the context (plain causal attention, and a key llama.cpp's
    qwen3 would refuse), except Gemma's, whose loaders need it."""
    from gptforge.interop.hf_llama import window_spans_context

    return 0 if window_spans_context(cfg) and arch not in SWA_PERIOD else cfg.sliding_window


def write_keys(w, cfg) -> None:
    """The family's metadata beyond Llama's (``gguf.export_gguf`` writes those)."""
    arch = FAMILY_ARCH[cfg.family]
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if _window(cfg, arch):
        w.add_sliding_window(_window(cfg, arch))
    if arch == "gemma2":
        if cfg.attn_softcap:
            w.add_attn_logit_softcapping(cfg.attn_softcap)
        if cfg.logit_softcap:
            w.add_final_logit_softcapping(cfg.logit_softcap)


def scalars_of(cfg, arch: str) -> dict:
    """The metadata :func:`write_keys` and the Llama keys give ``cfg``, as the reader sees it (float32)."""
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))  # noqa: E731 - the file stores float32
    s = {f"{arch}.{k}": v for k, v in (("block_count", cfg.n_layer), ("embedding_length", cfg.n_embd),
                                        ("attention.head_count", cfg.n_head), ("attention.head_count_kv", cfg.kv_heads),
                                        ("feed_forward_length", cfg.hidden_dim), ("context_length", cfg.block_size),
                                        ("attention.layer_norm_rms_epsilon", f32(cfg.norm_eps)),
                                        ("rope.freq_base", f32(cfg.rope_theta)),
                                        ("rope.dimension_count", cfg.head_dim),
                                        ("attention.key_length", cfg.head_dim),
                                        ("attention.value_length", cfg.head_dim))}
    if _window(cfg, arch):
        s[f"{arch}.attention.sliding_window"] = _window(cfg, arch)
    if arch == "gemma2":  # as write_keys writes them: a cap that is off is no key (and llama.cpp's 50 or 30)
        s.update({f"{arch}.{key}": f32(cap) for key, cap in (("attn_logit_softcapping", cfg.attn_softcap),
                                                              ("final_logit_softcapping", cfg.logit_softcap)) if cap})
    if cfg.rope_type == "linear":
        s.update({f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": f32(cfg.rope_factor)})
    return s


def check_export(cfg) -> None:
    """ValueError naming each field of ``cfg`` the family's GGUF cannot carry (read back through the reader)."""
    from gptforge.interop.hf_llama import MATH_FIELDS, field_meaning

    arch = FAMILY_ARCH[cfg.family]
    if cfg.qkv_bias or cfg.rope_type == "llama3":
        raise ValueError(f"model.family={cfg.family} with model.qkv_bias or model.rope_type='llama3': llama.cpp's "
                         f"{arch} has neither here; export hf instead")
    if arch in IGNORES_WINDOW and 0 < cfg.sliding_window < cfg.block_size:
        raise ValueError(f"model.family={cfg.family} with model.sliding_window={cfg.sliding_window} shorter than "
                         f"model.block_size={cfg.block_size}: llama.cpp's {arch} architecture ignores "
                         f"{arch}.attention.sliding_window and attends over the whole context, so past "
                         f"{cfg.sliding_window} tokens it would compute another model; export hf instead (its config "
                         "keeps the window)")
    names = set() if cfg.tie_embeddings else {"output.weight"}
    try:
        back = llama_config_from_gguf(scalars_of(cfg, arch) | {"general.architecture": arch}, {}, names,
                                      Path("<export>"), cfg.vocab_size)
    except GGUFReadError as e:
        raise ValueError(f"model.family={cfg.family}: llama.cpp's {arch} cannot carry this model "
                         f"({str(e).removeprefix('<export>: ')}); export hf instead") from None
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32)) if isinstance(x, float) else x  # noqa: E731
    differ = [f for f in MATH_FIELDS if f32(field_meaning(back, f)) != f32(field_meaning(cfg, f))]
    if differ:
        raise ValueError(f"model.family={cfg.family}: llama.cpp's {arch} architecture fixes or cannot store "
                         + ", ".join(f"model.{f}={getattr(cfg, f)!r} (it would read {getattr(back, f)!r})"
                                     for f in differ) + "; export hf instead")


def expected_shapes(cfg, out: dict[str, tuple]) -> dict[str, tuple]:
    """``gguf_read._expected_shapes``' Llama shapes adjusted for the family: q/o by head_size, q/k norms,
    Gemma's post norms, Phi-3's fused matrices."""
    C, H, hd = cfg.n_embd, cfg.hidden_dim, cfg.head_dim
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        out[b + "attn_q.weight"], out[b + "attn_output.weight"] = (cfg.n_head * hd, C), (C, cfg.n_head * hd)
        if cfg.qk_norm:
            out[b + "attn_q_norm.weight"] = out[b + "attn_k_norm.weight"] = (hd,)
        if cfg.post_norms:
            out[b + "post_attention_norm.weight"] = out[b + "post_ffw_norm.weight"] = (C,)
        if cfg.family == "phi3":
            qkv = sum(out.pop(b + f"attn_{x}.weight")[0] for x in "qkv")
            out[b + "attn_qkv.weight"] = (qkv, C)
            del out[b + "ffn_gate.weight"]
            out[b + "ffn_up.weight"] = (2 * H, C)
    return out


def block_name(rest: str, cfg) -> str:
    """A block tensor's gptforge (HF) name, where a family's differs from ``gguf_config.BLOCK_NAMES``."""
    if cfg.post_norms:  # Gemma: ffn_norm is the MLP's input norm, post_attention_norm the attention output's
        return {"post_attention_norm.weight": "post_attention_layernorm.weight",
                "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}.get(rest, "")
    return ""


def read_block(rest: str, w: torch.Tensor, cfg) -> dict[str, torch.Tensor]:
    """One block tensor -> {its gptforge suffix: tensor} for what a family stores differently, or {}."""
    if cfg.norm_plus_one and rest.endswith("norm.weight"):
        w = w - 1.0  # llama.cpp's converter stored Gemma's 1 + w
    if rest == "attn_q_norm.weight":
        return {"self_attn.q_norm.weight": w}
    if rest == "attn_k_norm.weight":
        return {"self_attn.k_norm.weight": w}
    if cfg.family == "phi3" and rest == "attn_qkv.weight":
        q, k, v = w.split([cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim])
        return {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v}
    if cfg.family == "phi3" and rest == "ffn_up.weight":
        gate, up = w.chunk(2)
        return {"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up}
    name = block_name(rest, cfg)
    if name or cfg.norm_plus_one and rest.endswith("norm.weight"):
        return {name or BLOCK_NAMES[rest]: w}
    return {}


def family_tensors(model: torch.nn.Module, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``gguf.llama_tensors``' output (unpermuted for a NEOX arch) turned into the family's layout."""
    cfg = model.config
    sd = model.state_dict()
    for i in range(cfg.n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        if cfg.qk_norm:
            out[b + "attn_q_norm.weight"] = sd[p + "self_attn.q_norm.weight"]
            out[b + "attn_k_norm.weight"] = sd[p + "self_attn.k_norm.weight"]
        if cfg.post_norms:
            out[b + "post_attention_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
            out[b + "ffn_norm.weight"] = sd[p + "pre_feedforward_layernorm.weight"]
            out[b + "post_ffw_norm.weight"] = sd[p + "post_feedforward_layernorm.weight"]
        if cfg.family == "phi3":
            out[b + "attn_qkv.weight"] = torch.cat([out.pop(b + f"attn_{x}.weight") for x in "qkv"])
            out[b + "ffn_up.weight"] = torch.cat([out.pop(b + "ffn_gate.weight"), out.pop(b + "ffn_up.weight")])
    if cfg.norm_plus_one:  # llama.cpp multiplies by the stored weight: Gemma's 1 + w
        out = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in out.items()}
    return out
