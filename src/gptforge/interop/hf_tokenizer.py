"""Tokenizer files of a Hugging Face export: GPT-2's ranks as vocab.json/merges.txt, a model's own
tokenizer as tokenizer.json (tiktoken ranks converted as transformers' TikTokenConverter does), and
generation_config.json with where a reply stops. ``export_hf`` of every family writes them through
:func:`write_tokenizer`."""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.reading import read_json
from gptforge.tokens import EOT, EOT_TEXT


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
    from gptforge.data.tokenizer import bytes_to_unicode

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
        from gptforge.data.tokenizer import load_ranks

        return load_ranks(path)
    from gptforge.data.tokenizer import gpt2_tokenizer

    return dict(gpt2_tokenizer().enc._mergeable_ranks)  # tiktoken keeps the ranks only on this attribute


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


def tokenizer_json_of(tok) -> str:
    """A tokenizer as Hugging Face ``tokenizer.json`` text: an hf tokenizer's own; tiktoken ranks
    (a trained or GPT-2-style tokenizer) converted as transformers' TikTokenConverter does: the split
    pattern, then byte-level BPE whose merges are the ranks in order, ``ignore_merges`` (a piece
    that is a whole token is taken as it is, as tiktoken does), the special tokens as added tokens."""
    if tok.kind == "hf":
        return tok._text
    vocab, merges = ranks_to_vocab_merges(dict(tok.enc._mergeable_ranks))
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for s, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }, ensure_ascii=False)


def write_model_tokenizer(out: Path, tok, chat, model_max_length: int) -> list[Path]:
    """A model's own (non-GPT-2) tokenizer as Hugging Face files: its ``tokenizer.json`` as it is,
    and a ``tokenizer_config.json`` naming bos/eos and carrying the chat template's Jinja, so
    ``AutoTokenizer.from_pretrained(out).apply_chat_template`` renders what gptforge renders."""
    names = {i: s for s, i in tok.special_tokens.items()}
    eos = chat.end if chat is not None and chat.end in names else tok.eos_token_id
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "bos_token": names.get(tok.bos_token_id), "eos_token": names.get(eos),
              "pad_token": names.get(tok.eot_token), "clean_up_tokenization_spaces": False}
    template = chat.jinja() if chat is not None else getattr(tok, "chat_template", None)  # a base model's tokenizer's own
    if template:
        config["chat_template"] = template
    paths = [out / "tokenizer.json", out / "tokenizer_config.json"]
    paths[0].write_text(tokenizer_json_of(tok), encoding="utf-8")
    paths[1].write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return paths + write_generation_config(out, tok.bos_token_id, eos, tok.eot_token)


def write_generation_config(out: Path, bos: int | None, eos: int | None, pad: int | None) -> list[Path]:
    """``generation_config.json``, and the same ids in ``config.json``: where a reader's ``generate`` stops
    (a chat model's end-of-turn token, as gptforge's chat stops; a base model's end of text) and pads.
    Without it transformers ran a chat export past its end-of-turn token into the next turn."""
    ids = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    gen = out / "generation_config.json"
    gen.write_text(json.dumps({**{k: v for k, v in ids.items() if v is not None}, "_from_model_config": False},
                              indent=2) + "\n")
    cfg_path = out / "config.json"
    if cfg_path.is_file():  # the exporters write config.json first
        cfg = read_json(cfg_path, what="config.json")
        cfg.update({k: v for k, v in ids.items() if v is not None})
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return [gen]


def write_tokenizer(out: Path, chat, model_max_length: int, tok=None) -> list[Path]:
    """GPT-2's tokenizer files, with the chat tokens and template when ``chat`` (a ChatTemplate) is
    given: what both exporters write (gptforge's Llama uses GPT-2's BPE too). ``tok``: the model's
    tokenizer when it is not GPT-2's (written by :func:`write_model_tokenizer`)."""
    if tok is not None and not tok.is_gpt2:
        return write_model_tokenizer(out, tok, chat, model_max_length)
    files = write_hf_tokenizer(out, model_max_length=model_max_length)
    if chat is not None:
        from gptforge.interop.hf_chat import write_hf_chat_template

        write_hf_chat_template(out, chat)
    # a chat reply ends at the template's end-of-turn token (<|end|>), a base model's text at <|endoftext|>
    return files + write_generation_config(out, EOT, chat.end if chat is not None else EOT, EOT)
