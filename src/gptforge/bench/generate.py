"""Decode speed: gptforge's KV-cache generation against transformers' ``generate`` on the same weights.

Both models hold the same random weights (the family's ``to_transformers``: ``interop.hf`` for
GPT-2, ``interop.hf_llama`` for Llama), get the same prompt and decode greedily for the same
number of tokens; the JSON records tokens/s for each batch size, the ratio, and whether both produced
the same tokens (they must: greedy, same weights). Each measurement is one untimed warm-up call, then ``repeats`` timed calls (median),
alternating between the two implementations.

    gptforge bench-generate --size gpt2 --batch 1 8 --new-tokens 64 --json bench_generate.json
"""

from __future__ import annotations

import json
import platform
from typing import Any

import torch

from gptforge.bench.timing import timed_pair


def _check_batches_fit(cfg, batches, prompt_tokens: int, new_tokens: int, dtype_bytes: int) -> None:
    """ValueError naming --batch when the largest batch's KV cache and prefill logits alone exceed the memory
    free now (``--batch 1e9`` asked the CPU allocator for 128 GB in a traceback); a batch that passes may still
    not fit the activations, but none that fails could."""
    from gptforge import resources

    head_dim = cfg.n_embd // cfg.n_head
    kv_width = getattr(cfg, "n_kv_head", None) or cfg.n_head
    per_row = ((prompt_tokens + new_tokens) * cfg.n_layer * 2 * kv_width * head_dim * dtype_bytes
               + prompt_tokens * cfg.vocab_size * 4)  # the cache, and the prompt's float32 logits
    B, free = max(batches), resources.free_memory()
    if free is not None and B * per_row > free.bytes:
        raise ValueError(f"--batch {B:,}: its KV cache and prompt logits alone need {B * per_row / 2**30:,.1f} GiB, and "
                         f"{free}; give a batch below {max(1, free.bytes // per_row):,}")


def run_bench_generate(size: str = "gpt2", batches: list[int] | tuple[int, ...] = (1, 8), prompt_tokens: int = 16,
                       new_tokens: int = 64, repeats: int = 3, device: str = "auto", out: str | None = None,
                       dtype: torch.dtype = torch.float32, threads: int = 0) -> dict[str, Any]:
    from gptforge.extras import require

    require("transformers", extra="hf", for_what="gptforge bench-generate")
    from gptforge.generation import generate
    from gptforge.interop import hf_module
    from gptforge.models.registry import build_model, size_config
    from gptforge.progress import progress_bar
    from gptforge.runtime import resolve_device, set_threads

    dev = torch.device(resolve_device(device))
    set_threads(threads, dev)  # 0: as train.threads 0 (one per process on CPU: a shared CPU's cores are not all ours)
    torch.manual_seed(0)
    cfg = size_config(size)
    if prompt_tokens + new_tokens > cfg.block_size:
        raise ValueError(f"--prompt-tokens + --new-tokens = {prompt_tokens + new_tokens} exceeds the context {cfg.block_size}")
    _check_batches_fit(cfg, batches, prompt_tokens, new_tokens, torch.finfo(dtype).bits // 8)
    ours = build_model(cfg).eval()
    hf = hf_module(cfg.arch).to_transformers(ours)  # transformers' model of the same family, same weights
    ours = ours.to(dev, dtype)
    hf = hf.to(dev, dtype).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(1))
    rows = []
    # every generate call counted (a warm-up and `repeats` timed, each implementation, each batch): at gpt2's
    # 124M on a CPU the first row comes after a minute and the whole run takes minutes
    calls = len(batches) * 2 * (1 + repeats)
    bar = progress_bar(calls, f"bench-generate {size} ({ours.num_parameters() / 1e6:.1f}M)", "call")
    for B in batches:
        idx = prompt.expand(B, -1).contiguous().to(dev)

        def run_ours(idx=idx):
            out = generate(ours, idx, new_tokens, temperature=0.0)
            bar.update(1)
            return out

        def run_hf(idx=idx):
            with torch.no_grad():
                out = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
            bar.update(1)
            return out

        a, b = timed_pair(run_ours, run_hf, dev, repeats)
        t_ours, t_hf, tok_ours, tok_hf = a.median, b.median, a.result, b.result
        rows.append({
            "batch": B,
            "gptforge_tokens_per_s": round(B * new_tokens / t_ours, 1),
            "transformers_tokens_per_s": round(B * new_tokens / t_hf, 1),
            "speedup": round(t_hf / t_ours, 2),
            "gptforge_s": round(t_ours, 4), "transformers_s": round(t_hf, 4),
            "same_tokens": bool(torch.equal(tok_ours.cpu(), tok_hf.cpu())),
        })
        bar.clear()
        print(json.dumps(rows[-1]), flush=True)
    bar.close()
    import transformers

    result = {
        "what": "greedy decode tokens/s (generate call incl. prompt prefill), gptforge KV cache vs transformers",
        "size": size, "params": ours.num_parameters(), "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "repeats": repeats, "dtype": str(dtype).replace("torch.", ""), "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "results": rows,
    }
    if out:
        from gptforge import storage

        storage.write_json(out, result)  # temporary name, fsync, rename
    return result
