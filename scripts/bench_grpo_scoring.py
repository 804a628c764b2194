"""Time GRPO's scoring (the reference's log-probs, the policy's forward and backward) packed against unpacked.

    nice -n 15 python scripts/bench_grpo_scoring.py --threads 1            # SmolLM2-135M-Instruct, LoRA rank 8
    python scripts/bench_grpo_scoring.py --plan-only                       # tokens and head rows, no timing

Unpacked: one right-padded [prompt, reply] row per reply (the step before packing, ``token_logprobs``).
Packed: a group's replies share rows that hold the prompt once (``gptforge.training.packing``). Both score
the same sampled replies (``rl.prompts`` x ``rl.group`` of ``--task``, one sampling seed) in micro-batches of
``--micro-batch`` replies, the policy being the GGUF model with LoRA adapters (rank 8, all 7 projections,
lora_B drawn at std 0.02 so the policy differs from the reference, its base). The two ways alternate,
``--reps`` times each after a warm-up of each; prints one JSON line: tokens through the model, output-head
rows, median wall and CPU seconds, the ratios, and the largest float32 log-prob difference between the two ways.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def unpacked(prompts, replies, pad, device):
    """(ids (n, T) right-padded prompt + reply, reply mask over targets from ``start`` on, start)."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, replies, strict=True)]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), T - 1)
    for k, (s, p, r) in enumerate(zip(seqs, prompts, replies, strict=True)):
        ids[k, : len(s)] = torch.tensor(s)
        mask[k, len(p) - 1 : len(p) - 1 + len(r)] = 1.0
    start = min(len(p) for p in prompts) - 1
    return ids.to(device), mask[:, start:].to(device), start


def lora_policy(gguf: str = "", rank: int = 8):
    """(model, chat tokenizer, template): the GGUF (default SmolLM2-135M-Instruct) in eval mode, frozen, with
    LoRA of ``rank`` (alpha 2 x rank; 0: none) on all 7 projections, lora_B drawn non-zero from seed 0 so the
    policy differs from its base and every run samples the same replies. Shared with bench_grpo_sampling.py."""
    from gptforge.cli.common import words
    from gptforge.data.chat import ChatTokenizer, plain_tokenizer
    from gptforge.load import ModelSource, load_model
    from gptforge.models.lora import add_lora, lora_layers

    if not gguf:
        from gptforge.interop.smollm2 import fetch_smollm2

        gguf = str(fetch_smollm2())
    source = ModelSource(gguf=gguf)
    model = load_model(source).eval()
    tok, template = words(source, model, fallback=True)
    enc = ChatTokenizer(plain_tokenizer(tok), template)
    if rank:
        torch.manual_seed(0)  # lora_A's draw too: the same policy, so the same replies, every run
        add_lora(model, model.config.arch, rank=rank, alpha=2.0 * rank, dropout=0.0,
                 targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        model.requires_grad_(False)
        for _, m in lora_layers(model):
            torch.nn.init.normal_(m.lora_B.weight, std=0.02)
    return model, enc, template


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="", help="the model (default: SmolLM2-135M-Instruct, `gptforge assets smollm2`)")
    ap.add_argument("--task", default="arithmetic3")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=16, help="replies per forward (rl's train.micro_batch)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plan-only", action="store_true", help="print the token counts and stop (no timing)")
    a = ap.parse_args()

    from gptforge.config import RLConfig
    from gptforge.generation import SamplingParams
    from gptforge.models.lora import BaseOf, lora_layers
    from gptforge.training.grpo import token_logprobs
    from gptforge.training.packing import pack_replies, packed_logprobs
    from gptforge.training.rollouts import problem_stream, sample_replies

    torch.set_num_threads(a.threads)
    model, enc, template = lora_policy(a.gguf, rank=8)
    for _, m in lora_layers(model):  # as a LoRA run (training/lora.py): only the adapters train
        m.lora_A.weight.requires_grad_(True)
        m.lora_B.weight.requires_grad_(True)
    ref = BaseOf(model)
    rl = RLConfig(task=a.task, prompts=a.prompts, group=a.group, max_new_tokens=a.max_new_tokens,
                  temperature=a.temperature)
    problems = problem_stream(rl, 0)[0](0)
    t0 = time.perf_counter()
    ro = sample_replies(model, enc, template, problems, a.group,
                        SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                                       top_k=rl.top_k or None, seed=1))
    sample_s = time.perf_counter() - t0
    N, T, pad, dev = len(ro.replies), a.temperature, template.bos, torch.device("cpu")
    chunks = [range(i, min(i + a.micro_batch, N)) for i in range(0, N, a.micro_batch)]
    P = [[ro.prompts[i] for i in c] for c in chunks]
    R = [[ro.replies[i] for i in c] for c in chunks]
    flat = [unpacked(p, r, pad, dev) for p, r in zip(P, R, strict=True)]
    packs = [pack_replies(p, r, model.config.block_size, pad, dev) for p, r in zip(P, R, strict=True)]
    counts = {"replies": N, "reply_tokens": sum(len(r) for r in ro.replies),
              "prompt_tokens": [len(p) for p in ro.prompts[:: a.group]],
              "tokens_unpacked": sum(ids[:, :-1].numel() for ids, _, _ in flat),
              "tokens_packed": sum(p.tokens for p in packs),
              "head_rows_unpacked": sum(ids.size(0) * (ids.size(1) - 1 - s) for ids, _, s in flat),
              "head_rows_packed": sum(p.ids.size(0) * p.keep for p in packs),
              "rows_packed": sum(p.ids.size(0) for p in packs), "sample_s": round(sample_s, 2)}
    if a.plan_only:
        print(json.dumps(counts))
        return

    def run_unpacked():
        out = []
        for ids, mask, s in flat:
            with torch.no_grad():
                token_logprobs(ref, ids, T, s)
            model.train()
            lp = token_logprobs(model, ids, T, s)
            ((lp * mask).sum() / N).backward()
            model.eval()
            out.append(lp.detach()[mask.bool()])
        return torch.cat(out)

    def run_packed():
        out = []
        for p in packs:
            with torch.no_grad():
                packed_logprobs(ref, p, T)
            model.train()
            lp = packed_logprobs(model, p, T)
            ((lp * p.mask).sum() / N).backward()
            model.eval()
            out.append(lp.detach()[p.mask.bool()])
        return torch.cat(out)

    def timed(fn):
        model.zero_grad(set_to_none=True)
        t, c = time.perf_counter(), time.process_time()
        lp = fn()
        return time.perf_counter() - t, time.process_time() - c, lp

    wall: dict[str, list[float]] = {"unpacked": [], "packed": []}
    cpu: dict[str, list[float]] = {"unpacked": [], "packed": []}  # this process's CPU seconds: steadier on a busy machine
    diff = 0.0
    for rep in range(a.reps + 1):  # rep 0 warms both up
        order = [("unpacked", run_unpacked), ("packed", run_packed)]
        got = {}
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            w, c, got[name] = timed(fn)
            if rep:
                wall[name].append(w)
                cpu[name].append(c)
        diff = max(diff, (got["unpacked"] - got["packed"]).abs().max().item())
    med = {k: statistics.median(v) for k, v in wall.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(json.dumps({**counts, "unpacked_s": round(med["unpacked"], 3), "packed_s": round(med["packed"], 3),
                      "ratio": round(med["unpacked"] / med["packed"], 2),
                      "unpacked_cpu_s": round(mcpu["unpacked"], 3), "packed_cpu_s": round(mcpu["packed"], 3),
                      "cpu_ratio": round(mcpu["unpacked"] / mcpu["packed"], 2),
                      "wall_unpacked": [round(x, 3) for x in wall["unpacked"]],
                      "wall_packed": [round(x, 3) for x in wall["packed"]],
                      "cpu_unpacked": [round(x, 3) for x in cpu["unpacked"]],
                      "cpu_packed": [round(x, 3) for x in cpu["packed"]],
                      "max_abs_logp_diff": diff, "threads": torch.get_num_threads(),
                      "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
