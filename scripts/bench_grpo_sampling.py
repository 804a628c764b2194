"""Time GRPO's sampling (``training.rollouts.sample_replies``) with the prefill shared per distinct prompt against
every row's own prefill.

    nice -n 15 python scripts/bench_grpo_sampling.py --threads 1            # SmolLM2-135M-Instruct, LoRA rank 8
    python scripts/bench_grpo_sampling.py --plan-only                       # tokens per forward, no timing

Both ways sample ``--prompts`` x ``--group`` replies of ``--task`` (one seed) from the GGUF model with LoRA
adapters as in scripts/bench_grpo_scoring.py (rank 8, all 7 projections, lora_B drawn at std 0.02).
Separate: ``stream_tokens(share_prefill=False)``, the batch's first forward runs all B rows' left-padded
prompts. Shared: it runs each distinct prompt once and copies its KV cache to the rows repeating it. The two
ways alternate, ``--reps`` times each after a warm-up of each; prints one JSON line: the tokens through the
model (prefill, decode), a FLOP-proportional prediction of the ratio, median wall and CPU seconds, the
ratios, and how many replies differ between the two ways (float32: a different batch shape may round differently).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="", help="the model (default: SmolLM2-135M-Instruct, `gptforge assets smollm2`)")
    ap.add_argument("--task", default="arithmetic3")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24, help="rl.max_new_tokens (its default)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lora-rank", type=int, default=8, help="0: the bare model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plan-only", action="store_true", help="print the token counts and stop (no timing)")
    a = ap.parse_args()

    from bench_grpo_scoring import lora_policy  # scripts/ is this script's sys.path[0]

    from gptforge import generation
    from gptforge.config import RLConfig
    from gptforge.eval.generative import prompt_ids
    from gptforge.generation import SamplingParams
    from gptforge.training import rollouts

    torch.set_num_threads(a.threads)
    model, enc, template = lora_policy(a.gguf, rank=a.lora_rank)  # the scoring bench's policy
    head = model.lm_head.weight.numel()  # the output head (tied or not); embeddings are lookups, no FLOPs
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head)
    rl = RLConfig(task=a.task, prompts=a.prompts, group=a.group, max_new_tokens=a.max_new_tokens,
                  temperature=a.temperature)
    problems = rollouts.problem_stream(rl, 0)[0](0)
    params = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=rl.top_k or None, seed=1)
    prompts = [prompt_ids(p, enc, template) for p in problems for _ in range(a.group)]
    B, T0, U = len(prompts), max(len(p) for p in prompts), len({tuple(p) for p in prompts})

    def sample(share: bool):
        rollouts.stream_tokens = functools.partial(generation.stream_tokens, share_prefill=share)
        t, c = time.perf_counter(), time.process_time()
        ro = rollouts.sample_replies(model, enc, template, problems, a.group, params)
        return time.perf_counter() - t, time.process_time() - c, ro

    def flops(rows: int, steps: int) -> float:
        """Matmul FLOPs, 2 per weight per token (attention's scores left out: under 2% at ~90 positions):
        the prefill runs the blocks over rows x T0 slots and the head over its last slot; each later step
        runs blocks and head over B rows."""
        return 2.0 * (body * rows * T0 + head * rows) + 2.0 * (body + head) * B * (steps - 1)

    _, _, ro = sample(True)  # the steps sample_replies runs (it stops when every reply has ended)
    steps = max(len(r) for r in ro.replies)
    counts = {"rows": B, "distinct_prompts": U, "prompt_tokens": sorted({len(p) for p in prompts}), "T0": T0,
              "steps": steps, "prefill_tokens_separate": B * T0, "prefill_tokens_shared": U * T0,
              "decode_tokens": B * (steps - 1),
              "tokens_separate": B * T0 + B * (steps - 1), "tokens_shared": U * T0 + B * (steps - 1),
              "predicted_ratio_flops": round(flops(B, steps) / flops(U, steps), 2),
              "body_params": body, "head_params": head}
    if a.plan_only:
        print(json.dumps(counts))
        return
    wall: dict[str, list[float]] = {"separate": [], "shared": []}
    cpu: dict[str, list[float]] = {"separate": [], "shared": []}
    differ = 0
    for rep in range(a.reps + 1):  # rep 0 warms both up
        order = [("separate", False), ("shared", True)]
        got = {}
        for name, share in order if rep % 2 == 0 else order[::-1]:
            w, c, got[name] = sample(share)
            if rep:
                wall[name].append(w)
                cpu[name].append(c)
        differ = max(differ, sum(x != y for x, y in zip(got["separate"].replies, got["shared"].replies, strict=True)))
    med = {k: statistics.median(v) for k, v in wall.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(json.dumps({**counts, "separate_s": round(med["separate"], 3), "shared_s": round(med["shared"], 3),
                      "ratio": round(med["separate"] / med["shared"], 2),
                      "separate_cpu_s": round(mcpu["separate"], 3), "shared_cpu_s": round(mcpu["shared"], 3),
                      "cpu_ratio": round(mcpu["separate"] / mcpu["shared"], 2),
                      "wall_separate": [round(x, 3) for x in wall["separate"]],
                      "wall_shared": [round(x, 3) for x in wall["shared"]],
                      "replies_differing": differ, "threads": torch.get_num_threads(),
                      "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
