"""GGUF export for llama.cpp (and Ollama, LM Studio): both families, through the ``gguf`` package,
the llama.cpp project's own writer.

    gptforge export gguf --ckpt runs/chat-sft --out exports/gguf --dtype f16
    llama-cli -m exports/gguf/model-f16.gguf -p "Hello" -n 32 --temp 0

A GPT-2 model is written as llama.cpp's ``gpt2`` architecture and a Llama as ``llama``, with the
tensor names and metadata keys llama.cpp's ``convert_hf_to_gguf.py`` writes for the Hugging Face
versions of the same models (``export hf``). Differences from gptforge's own layout:

* GPT-2's ``c_attn``/``c_fc``/``c_proj`` are ``nn.Linear`` here already, (out, in), which is the
  orientation GGUF wants (llama.cpp's converter transposes HF's Conv1D into it); the tied head is
  written twice, as ``token_embd`` and ``output``, as the converter does.
* A Llama's query and key rows are reordered per head from the rotate-half pairing (HF's, and
  gptforge's) to the interleaved pairs llama.cpp's ``llama`` rotary uses; a tied head is left out
  (llama.cpp falls back to ``token_embd``). A Llama with q/k/v biases (``model.qkv_bias``) is written
  as llama.cpp's ``qwen2``, whose rotary is rotate-half already: its rows stay, its biases are added.
* A model of another family (``model.family``: qwen3, gemma2, gemma3, phi3; mistral as ``llama`` with
  ``llama.attention.sliding_window``) is written in llama.cpp's layout for it (``gguf_families.py``), after
  checking the file would read back to the same fields. llama.cpp's llama ignores the window and its phi3
  turns it off, so a Mistral or Phi-3 whose window is shorter than its context is refused (export hf).
* Rope scaling: ``linear`` as ``rope.scaling.type``/``factor``; ``llama3`` as llama.cpp's converter
  writes Llama 3.1/3.2, per-frequency divisors in the tensor ``rope_freqs.weight``.
* The vocabulary padding rows are sliced off; the tokenizer is GPT-2's BPE (``tokenizer.ggml.model``
  ``gpt2``, pre-tokenizer ``gpt-2``: tokens, merges, token types), plus a chat checkpoint's role and
  end tokens (control tokens) and its template as the Jinja ``tokenizer.chat_template``. A model's own
  tokenizer goes in as its byte-level BPE (``add_model_tokenizer``) or, when it is a SentencePiece
  vocabulary (a GGUF "llama" one read back, Llama 2's tokenizer.json), as llama.cpp's ``llama`` model
  with scores that give its merges (``spm_vocab``).

Weights are float32, float16 or bfloat16 (norms and biases stay float32, as in llama.cpp's own
converter); quantising further (Q8_0, Q4_K_M ...) is llama.cpp's ``llama-quantize`` on this file.
What llama.cpp's architectures cannot express is refused by name before anything is written.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptforge.interop.gguf_families import FAMILY_ARCH, NEOX, check_export, family_tensors, write_keys
from gptforge.tokens import EOT, GPT2_VOCAB

DTYPES = ("f32", "f16", "bf16")


def _gguf():
    from gptforge.extras import require

    return require("gguf", extra="gguf", for_what="gptforge export gguf")


def check_gguf_model(model: torch.nn.Module, chat_template: dict | None, tokenizer: bool = True) -> None:
    """Refuse (ValueError naming the setting) what llama.cpp's gpt2/llama architectures cannot run."""
    cfg = model.config
    arch = getattr(cfg, "arch", "gpt2")
    if arch == "gpt2":
        if not cfg.bias:
            raise ValueError("model.bias=false: llama.cpp's gpt2 architecture has biases in every linear layer and "
                             "norm, so this model cannot be exported to GGUF")
    elif arch == "llama" and cfg.family in FAMILY_ARCH:  # Qwen3, Gemma 2/3, Phi-3, Mistral: gguf_families.py
        check_export(cfg)
    elif arch == "llama" and cfg.family not in ("", "llama", "qwen2"):
        raise ValueError(f"model.family={cfg.family}: gptforge does not write llama.cpp's {cfg.family} architecture "
                         "yet, so this model cannot be exported to GGUF; export hf instead")
    elif arch == "llama":
        # q/k/v biases are written as llama.cpp's qwen2 (gguf_families.NEOX), the rest as its llama: name the one
        cpp = "qwen2" if cfg.qkv_bias else "llama"
        # a head size apart from n_embd/n_head is attention.key_length, which llama.cpp reads for every architecture
        if [f for f in cfg.features() if f != "model.head_size" or cfg.qkv_bias]:
            raise ValueError(f"{', '.join(cfg.features())}: llama.cpp's {cpp} architecture has no such option; set "
                             "model.family to the family that has it (qwen3, mistral, phi3, gemma2, gemma3) to export")
        unsupported = {"qk_norm": cfg.qk_norm, "mlp": cfg.mlp if cfg.mlp != "swiglu" else None,
                       "logit_softcap": cfg.logit_softcap or None}
        for key, value in unsupported.items():
            if value:
                raise ValueError(f"model.{key}={value!r}: llama.cpp's {cpp} architecture has no such option, so this "
                                 "model cannot be exported to GGUF (train with the default to export)")
        if cfg.qkv_bias and cfg.rope_type == "llama3":
            raise ValueError("model.rope_type='llama3' with model.qkv_bias=true: a model with q/k/v biases is written "
                             "as llama.cpp's qwen2 architecture, and gptforge writes Llama 3's per-frequency rope "
                             "divisors (rope_freqs.weight) for its llama architecture only; export hf instead")
    else:
        raise ValueError(f"model.arch={arch!r}: GGUF export knows gpt2 and llama")
    if not tokenizer:
        return
    from gptforge.interop.hf_chat import check_tokenizer_vocab

    try:  # llama.cpp needs a tokenizer in the file: the model's logits must be GPT-2's BPE (+ chat tokens)
        check_tokenizer_vocab(cfg.vocab_size, chat_template)
    except ValueError as e:
        raise ValueError(f"{str(e).split(';')[0]}; a GGUF file must carry the tokenizer, so only models on GPT-2's "
                         "tokenizer (chat tokens included) can be exported to GGUF") from e


def export_gguf(model: torch.nn.Module, out_dir: str | Path, dtype: str = "f32", force: bool = False,
                chat_template: dict | None = None, name: str = "gptforge", tokenizer: Any = True,
                chat: Any = None) -> Path:
    """Write ``model`` as ``out_dir/model-<dtype>.gguf``; returns the file's path. ``tokenizer=False``
    leaves the tokenizer out: llama.cpp cannot load such a file (for tools that add their own, and
    tests: reading 50k tokens back takes the ``gguf`` reader seconds)."""
    from gptforge.interop.hf_folder import check_out_dir

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    own = tokenizer if hasattr(tokenizer, "fingerprint") and not tokenizer.is_gpt2 else None  # a model's own
    spm = spm_vocab(own, model.config.vocab_size) if own is not None else None  # refused before the folder is touched
    if own is not None and spm is None:
        pre = gguf_pre_tokenizer(own)
    check_gguf_model(model, chat_template, bool(tokenizer) and own is None)  # before the output folder is touched
    gguf = _gguf()
    out = check_out_dir(out_dir, force)
    path = out / f"model-{dtype}.gguf"
    cfg = model.config
    # a Llama with q/k/v biases is llama.cpp's qwen2 (as convert_hf_to_gguf.py writes Qwen2ForCausalLM)
    arch = "qwen2" if getattr(cfg, "qkv_bias", False) else getattr(cfg, "arch", "gpt2")
    family = getattr(cfg, "family", "") in FAMILY_ARCH
    if family:
        arch = FAMILY_ARCH[cfg.family]
    w = gguf.GGUFWriter(None, arch)  # the file is given at the end: a temporary renamed into place
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype])
    w.add_context_length(cfg.block_size)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    if arch == "gpt2":
        w.add_feed_forward_length(4 * cfg.n_embd)
        w.add_layer_norm_eps(1e-5)  # nn.LayerNorm's default, as models/gpt2.py uses
        tensors = gpt2_tensors(model)
    else:
        w.add_feed_forward_length(cfg.hidden_dim)
        w.add_head_count_kv(cfg.kv_heads)
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_vocab_size(cfg.vocab_size)
        if cfg.rope_type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg.rope_factor)
        elif cfg.rope_type == "llama3":  # the divisors go in tensor rope_freqs.weight (llama_tensors)
            w.add_rope_scaling_orig_ctx_len(cfg.rope_original_context)  # read by YaRN only; pins the inverse
        tensors = llama_tensors(model)
        if family:
            write_keys(w, cfg)
            tensors = family_tensors(model, tensors)
        elif cfg.head_size:  # heads apart from n_embd/n_head (a Llama's head_dim, Mistral Nemo's under llama)
            w.add_key_length(cfg.head_dim)
            w.add_value_length(cfg.head_dim)
    if spm is not None:
        add_spm_tokenizer(w, own, chat, spm)
    elif own is not None:
        add_model_tokenizer(w, cfg.vocab_size, own, chat, pre)
    elif tokenizer:
        add_tokenizer(w, cfg.vocab_size, chat_template)
    add_weights(w, tensors, dtype)
    from gptforge.storage import atomic_path

    # never under the final name until whole: a full disk or a kill leaves the previous file (issue 33)
    with atomic_path(path, what="the GGUF export") as tmp:
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def add_weights(w: Any, tensors: dict[str, torch.Tensor], dtype: str) -> None:
    """Add ``tensors`` to the writer in ``dtype`` (f32, f16, bf16); 1-D tensors and norms stay float32."""
    gguf = _gguf()
    for tname, t in tensors.items():
        data = t.detach().float().cpu().numpy()
        keep_f32 = data.ndim <= 1 or tname.endswith("_norm.weight")  # norms and biases, as llama.cpp converts
        if keep_f32 or dtype == "f32":
            w.add_tensor(tname, np.ascontiguousarray(data, dtype=np.float32))
        elif dtype == "f16":
            w.add_tensor(tname, np.ascontiguousarray(data, dtype=np.float16))
        else:  # bf16: the writer takes the bytes (rows, 2 x cols) and the type
            w.add_tensor(tname, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)


def gpt2_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """gptforge GPT state -> llama.cpp's gpt2 tensor names (out, in orientation; padding sliced off)."""
    sd, V = model.state_dict(), model.config.vocab_size
    out = {"token_embd.weight": sd["transformer.wte.weight"][:V], "position_embd.weight": sd["transformer.wpe.weight"],
           "output_norm.weight": sd["transformer.ln_f.weight"], "output_norm.bias": sd["transformer.ln_f.bias"]}
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(model.config.n_layer):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                out[f"blk.{i}.{theirs}.{kind}"] = sd[f"transformer.h.{i}.{ours}.{kind}"]
    out["output.weight"] = sd["lm_head.weight"][:V]  # tied to wte in gptforge; written again, as the converter does
    return out


def rotate_half_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder a q/k projection's rows (n_heads * head_dim, in) so that, within each head, the pair
    rotated together is (2i, 2i+1) instead of rotate-half's (i, i + head_dim/2). The dot products
    q.k, and so attention, are unchanged; only which channels llama.cpp's rotary pairs moves."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).transpose(1, 2).reshape(rows, cols)


def llama_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """gptforge Llama state (HF names) -> llama.cpp's llama (or, with q/k/v biases, qwen2) tensor names;
    llama3 rope scaling as llama.cpp's per-frequency divisors, ``rope_freqs.weight``."""
    from gptforge.models import rope

    cfg = model.config
    sd, V = model.state_dict(), cfg.vocab_size
    out = {"token_embd.weight": sd["model.embed_tokens.weight"][:V], "output_norm.weight": sd["model.norm.weight"]}
    if cfg.rope_type == "llama3":
        out["rope_freqs.weight"] = rope.rope_factors(cfg.head_dim, cfg.rope_theta, **rope.scaling_of(cfg))
    # qwen2's rotary in llama.cpp is NEOX (rotate-half, as HF's), as are qwen3's, gemma's and phi3's: rows stay
    order = (lambda w, n: w) if cfg.qkv_bias or cfg.family in NEOX else rotate_half_to_interleaved
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        out[f"blk.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[f"blk.{i}.attn_q.weight"] = order(sd[p + "self_attn.q_proj.weight"], cfg.n_head)
        out[f"blk.{i}.attn_k.weight"] = order(sd[p + "self_attn.k_proj.weight"], cfg.kv_heads)
        if cfg.qkv_bias:
            for x in "qkv":
                out[f"blk.{i}.attn_{x}.bias"] = sd[p + f"self_attn.{x}_proj.bias"]
        out[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"]
        out[f"blk.{i}.attn_output.weight"] = sd[p + "self_attn.o_proj.weight"]
        out[f"blk.{i}.ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        out[f"blk.{i}.ffn_gate.weight"] = sd[p + "mlp.gate_proj.weight"]
        out[f"blk.{i}.ffn_up.weight"] = sd[p + "mlp.up_proj.weight"]
        out[f"blk.{i}.ffn_down.weight"] = sd[p + "mlp.down_proj.weight"]
    if not cfg.tie_embeddings:  # tied: llama.cpp uses token_embd for the output when "output" is absent
        out["output.weight"] = sd["lm_head.weight"][:V]
    return out


@functools.lru_cache(maxsize=1)
def gpt2_vocab_merges() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """GPT-2's tokens by id (in the byte-to-unicode spelling llama.cpp's gpt2 tokenizer reads) and
    its merges as "a b" strings, from the same ranks ``export hf`` writes vocab.json/merges.txt from."""
    from gptforge.interop.hf_tokenizer import gpt2_ranks, ranks_to_vocab_merges

    vocab, merges = ranks_to_vocab_merges(gpt2_ranks())
    tokens = [""] * GPT2_VOCAB
    for tok, i in vocab.items():
        tokens[i] = tok
    tokens[EOT] = "<|endoftext|>"
    return tuple(tokens), tuple(f"{a} {b}" for a, b in merges)


# the contractions as Llama 3's and Qwen2's tokenizer.json write them, and as llama.cpp's regexes do (its engine
# has no inline (?i:)); llama.cpp's converter names these tokenizers llama-bpe and qwen2 (it identifies them
# by their splits, not by the regex text), so the two spellings are one pre-tokenizer here as there
_CONTRACTIONS_HF = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_CONTRACTIONS_LLAMA_CPP = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"


def _llama_cpp_spelling(regex: Any) -> Any:
    return regex.replace(_CONTRACTIONS_HF, _CONTRACTIONS_LLAMA_CPP, 1) if isinstance(regex, str) else regex


def gguf_pre_tokenizer(tok: Any) -> str:
    """llama.cpp's name for the tokenizer's split pattern (it runs its own copy of each known regex)."""
    from gptforge.data.tokenizer import GPT4_PAT, R50K_PAT
    from gptforge.interop.gguf_tokenizer import PRE_TOKENIZERS

    pattern = getattr(tok, "pattern", None)
    if pattern is None and tok.kind == "hf":
        pre = tok._json.get("pre_tokenizer") or {}
        parts = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
        splits = [_llama_cpp_spelling(p.get("pattern", {}).get("Regex"))
                  for p in parts if isinstance(p, dict) and p.get("type") == "Split"]
        # a tokenizer read from a GGUF file (gguf_tokenizer.py) keeps llama.cpp's regexes for its
        # tokenizer.ggml.pre, in order: SmolLM2's "smollm" splits every digit first
        ignore = bool((tok._json.get("model") or {}).get("ignore_merges"))
        named = [n for n, (regexes, ign) in PRE_TOKENIZERS.items() if splits == regexes and ign == ignore]
        last = parts[-1] if parts and isinstance(parts[-1], dict) else {}
        if named and len(splits) == len(parts) - 1 and last.get("type") == "ByteLevel" and not last.get("use_regex", True):
            return named[0]
        # GPT-2's own tokenizer.json (and every ByteLevelBPETokenizer's): no Split, a ByteLevel that splits with
        # GPT-2's regex itself; llama.cpp's gpt-2 runs that regex. A space it would put before the text is not
        # llama.cpp's, so that one stays refused below
        if len(parts) == 1 and last.get("type") == "ByteLevel" and last.get("use_regex", True) \
                and not last.get("add_prefix_space", False) and not ignore:
            return "gpt-2"
        pattern = splits[0] if splits else None
    known = {R50K_PAT: "gpt-2", GPT4_PAT: "llama-bpe"}
    if pattern not in known:
        raise ValueError(f"the model's {tok.describe()} splits text with a pattern llama.cpp has no name for, so a "
                         "GGUF file cannot describe it; export hf instead (its tokenizer.json carries the pattern)")
    return known[pattern]


def add_model_tokenizer(w: Any, vocab_size: int, tok: Any, chat: Any, pre: str) -> None:
    """tokenizer.ggml.* for a model's own byte-level BPE (a trained tokenizer, GPT-4's split): its
    vocabulary and merges as tokenizer.json spells them, its special tokens as control tokens, the
    model's padded rows as unused; the chat template's Jinja and end-of-turn token."""
    gguf = _gguf()
    from gptforge.interop.hf_tokenizer import tokenizer_json_of

    doc = json.loads(tokenizer_json_of(tok))
    model = doc["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"the model's {tok.describe()} is not a byte-level BPE; export hf instead")
    tokens = [f"<|unused_{i}|>" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for piece, i in model["vocab"].items():
        tokens[i], types[i] = piece, gguf.TokenType.NORMAL
    for a in doc.get("added_tokens") or []:  # matched whole in text but not control: llama.cpp's USER_DEFINED
        if not a.get("special") and 0 <= a.get("id", -1) < vocab_size:
            tokens[a["id"]], types[a["id"]] = a["content"], gguf.TokenType.USER_DEFINED
    for piece, i in tok.special_tokens.items():
        tokens[i], types[i] = piece, gguf.TokenType.CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_token_id if tok.bos_token_id is not None else tok.eot_token)
    end = chat.end if chat is not None else tok.eos_token_id
    w.add_eos_token_id(end if end is not None else tok.eot_token)
    if chat is not None:
        w.add_eot_token_id(chat.end)
        w.add_chat_template(chat.jinja())
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


# Gemma's tokenizer.json (transformers' GemmaConverter): a normalizer writing spaces as U+2581 and a split on
# spaces that, after it, finds none; llama.cpp's SentencePiece tokenizer with no space prefix does the same
_SPACES_AS_METASPACE = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
_SPLIT_ON_SPACES = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}


def _longer_left_first(merges: list[list[str]]) -> list[list[str]]:
    """Each run of consecutive merges that make one piece, ordered longer left part first (the order a
    SentencePiece vocabulary's scores give, ``spm_merges``). transformers 5's converter from a
    ``tokenizer.model`` lists a piece's splits the other way round (shorter left part first); within such
    a run the order splits no text differently: two splits of one piece never share a piece, so they
    never compete for the same pair, and the merges after the run are the same either way."""
    out: list[list[str]] = []
    i = 0
    while i < len(merges):
        j = i + 1
        while j < len(merges) and "".join(merges[j]) == "".join(merges[i]):
            j += 1
        out += sorted(merges[i:j], key=lambda m: -len(m[0]))
        i = j
    return out


def spm_vocab(tok: Any, vocab_size: int) -> dict | None:
    """A SentencePiece-shaped tokenizer (what ``gguf_tokenizer`` builds from a GGUF "llama" vocabulary: llama.cpp's
    split as a normalizer; and what transformers gives Llama 2, Mistral, TinyLlama: a BPE with byte fallback
    under a Metaspace pre-tokenizer) as llama.cpp's SentencePiece keys: tokens, scores and token types by id,
    and the flags. (A Metaspace 'first' tokenizer goes out with ``add_space_prefix``: llama.cpp then prepends
    '▁' to text that already begins with a space, and after control tokens, where transformers does not.)
    None for a tokenizer of another shape (the byte-level BPE path takes it). Scores: llama.cpp merges the
    adjacent pair whose merged piece scores best, so each merged piece gets the score that reproduces the
    merge order; the scores are accepted only if ``gguf_tokenizer.spm_merges`` (transformers' GGUF loader's
    order) gives back exactly the tokenizer's merges, else refused: a BPE whose merges no scores express
    would split text differently after the round trip."""
    from gptforge.interop.gguf_tokenizer import (
        TOKEN_BYTE,
        TOKEN_CONTROL,
        TOKEN_NORMAL,
        TOKEN_UNKNOWN,
        TOKEN_UNUSED,
        TOKEN_USER_DEFINED,
        spm_merges,
        spm_normalizer,
    )

    doc = getattr(tok, "_json", None) if getattr(tok, "kind", None) == "hf" else None
    model, pre = (doc.get("model") or {}, doc.get("pre_tokenizer") or {}) if isinstance(doc, dict) else ({}, {})
    if not (model.get("type") == "BPE" and model.get("byte_fallback")):
        return None
    what = f"the model's {tok.describe()} (a BPE with byte fallback under a Metaspace pre-tokenizer)"
    # what gptforge reads from a GGUF (and Llama 2's own tokenizer.json): llama.cpp's split as a normalizer, a
    # space before each stretch of text or none, and no pre-tokenizer
    llama_cpp = next((p for p in (True, False) if doc.get("normalizer") == spm_normalizer(p)), None)
    if llama_cpp is not None and not pre:
        space_prefix = llama_cpp
    elif doc.get("normalizer") == _SPACES_AS_METASPACE and pre in ({}, _SPLIT_ON_SPACES):
        space_prefix = False  # Gemma's (transformers' GemmaConverter): spaces written as U+2581, nothing prepended
    elif pre.get("type") != "Metaspace":
        return None
    else:
        scheme = pre.get("prepend_scheme", "always")
        if doc.get("normalizer") is not None or pre.get("replacement", "\u2581") != "\u2581" or pre.get("split") \
                or scheme not in ("first", "never"):
            raise ValueError(f"{what}: normalizer {json.dumps(doc.get('normalizer'))[:40]}, Metaspace replacement "
                             f"{pre.get('replacement')!r}, split {pre.get('split')!r}, prepend_scheme {scheme!r}: "
                             "llama.cpp's SentencePiece tokenizer has no normalizer, writes spaces as U+2581, does not "
                             "split on them and prepends one to the text ('first') or nowhere ('never'); export hf "
                             "instead")
        space_prefix = scheme == "first"  # llama.cpp prepends it even to text that begins with a space
    tokens = [f"<|unused_{i}|>" for i in range(vocab_size)]
    types = [TOKEN_UNUSED] * vocab_size
    for piece, i in model["vocab"].items():
        if not 0 <= i < vocab_size:
            raise ValueError(f"{what}: token {piece!r:.40} has id {i}, outside the model's {vocab_size} rows")
        is_byte = len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
        tokens[i], types[i] = piece, TOKEN_BYTE if is_byte else TOKEN_NORMAL
    for a in doc.get("added_tokens") or []:
        if 0 <= a.get("id", -1) < vocab_size:
            tokens[a["id"]] = a["content"]
            types[a["id"]] = TOKEN_CONTROL if a.get("special") else TOKEN_USER_DEFINED
    unk = tokens.index("<unk>") if "<unk>" in tokens else None
    if unk is not None:
        types[unk] = TOKEN_UNKNOWN
    merges = _longer_left_first([m.split(" ", 1) if isinstance(m, str) else list(m) for m in model.get("merges") or []])
    ids = {t: i for i, t in enumerate(tokens)}
    scores, level, last = [0.0] * vocab_size, 0, None  # a run of merges sorted as spm_merges sorts one score's
    for left, right in merges:
        i = ids.get(left + right)
        key = (len(left), len(right), ids.get(left, -1), ids.get(right, -1))
        if i is None or ids.get(left) is None or ids.get(right) is None:
            raise ValueError(f"{what}: merge {left!r:.30} + {right!r:.30} does not make a token of its vocabulary, so "
                             "no SentencePiece scores express it; export hf instead")
        if scores[i] == 0.0 and (last is None or key[:2] > last[1][:2] or (key[:2] == last[1][:2] and i < last[0])):
            level += 1  # a new score unless this merge sorts after the previous one at that score
        scores[i] = scores[i] or -float(level)
        last = (i, key)
    if spm_merges(tokens, scores) != merges:
        raise ValueError(f"{what}: its merges are not in the order a SentencePiece vocabulary's scores give (every split "
                         "of a piece together, the best piece first), so llama.cpp would split text differently; "
                         "export hf instead")
    single = ((doc.get("post_processor") or {}).get("single") or []) if isinstance(doc.get("post_processor"), dict) else []
    first_last = [("SpecialToken" in s) for s in (single[:1] + single[-1:])] if single else [False, False]
    return {"tokens": tokens, "scores": scores, "types": types, "unk": unk, "space_prefix": space_prefix,
            "add_bos": first_last[0] and len(single) > 1, "add_eos": first_last[-1] and len(single) > 1}


def add_spm_tokenizer(w: Any, tok: Any, chat: Any, spm: dict) -> None:
    """tokenizer.ggml.* for a SentencePiece vocabulary (``spm_vocab``), as llama.cpp's converter writes Llama 2's."""
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(spm["tokens"])
    w.add_token_scores(spm["scores"])
    w.add_token_types([int(t) for t in spm["types"]])
    if tok.bos_token_id is not None:
        w.add_bos_token_id(tok.bos_token_id)
    end = chat.end if chat is not None else tok.eos_token_id
    if end is not None:
        w.add_eos_token_id(end)
    if spm["unk"] is not None:
        w.add_unk_token_id(spm["unk"])
    if chat is not None:
        w.add_eot_token_id(chat.end)
        w.add_chat_template(chat.jinja())
    w.add_add_bos_token(spm["add_bos"])
    w.add_add_eos_token(spm["add_eos"])
    w.add_add_space_prefix(spm["space_prefix"])


def add_tokenizer(w: Any, vocab_size: int, chat_template: dict | None) -> None:
    """tokenizer.ggml.* for GPT-2's BPE (+ a chat template's tokens and Jinja)."""
    gguf = _gguf()
    from gptforge.data.chat import ChatTemplate

    tokens, merges = gpt2_vocab_merges()
    tokens = list(tokens)
    types = [gguf.TokenType.NORMAL] * GPT2_VOCAB
    types[EOT] = gguf.TokenType.CONTROL
    chat = ChatTemplate.from_dict(chat_template) if chat_template else None
    if chat is not None:
        names = chat.names
        for i in range(GPT2_VOCAB, vocab_size):
            tokens.append(names.get(i, f"<|unused_{i}|>"))
            types.append(gguf.TokenType.CONTROL if i in names else gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(list(merges))
    w.add_bos_token_id(chat.bos if chat else EOT)
    w.add_eos_token_id(chat.end if chat else EOT)  # a chat reply ends at <|end|>, as gptforge's chat stops
    if chat is not None:
        w.add_eot_token_id(chat.end)
        w.add_chat_template(chat.jinja())
    w.add_add_bos_token(False)  # gptforge's prompts carry no implicit bos (a chat template writes its own)
    w.add_add_eos_token(False)
