"""What a model's own samples offer GRPO on a generated task: greedy accuracy beside pass@k, per operation.

    python scripts/rl_headroom.py --ckpt OUT/sft/checkpoints/step_000240 --task arithmetic3 --n 100 --k 16

The first ``--n`` held-out problems of ``--task`` (the eval set `gptforge eval` and `gptforge rl`'s held-out
score use) are answered greedily, and ``--k`` times by sampling at ``--temperature`` with no top-k (what
`gptforge rl` samples by default), through the RL recipe's own ``sample_replies`` and ``is_correct``. Per
operation it prints one JSON line: greedy right, the sampled accuracy, pass@k, the problems greedy gets
wrong but some sample gets right (what GRPO can turn), those greedy gets right but some sample wrong, and
the flat groups (all k right or all wrong: advantages 0). Measured on SmolLM2 (`arithmetic3`, pass@16) in the
record git keeps: `git show 73bfdcc:docs/benchmarks.md`, "Session eight".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import torch

from gptforge.eval.generative import GENERATED, generate_replies, prompt_ids
from gptforge.eval.tasks.verifiable import is_correct
from gptforge.generation import SamplingParams
from gptforge.load import ModelSource, load_chat_template_of, load_model, load_tokenizer_of
from gptforge.training.rollouts import sample_replies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint or run directory (a chat model)")
    ap.add_argument("--task", default="arithmetic3", choices=sorted(GENERATED))
    ap.add_argument("--n", type=int, default=100, help="held-out problems (the eval set's first N)")
    ap.add_argument("--k", type=int, default=16, help="samples per problem")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4, help="problems per sampling batch (x k rows)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    src = ModelSource(ckpt=a.ckpt)
    model = load_model(src).eval()
    enc = load_tokenizer_of(src, model)
    template = load_chat_template_of(src, enc)
    problems = GENERATED[a.task][1](a.n)[: a.n]
    t0 = time.time()
    greedy = generate_replies(model, enc, [prompt_ids(p, enc, template) for p in problems], template, a.max_new_tokens)
    right = [is_correct(r, p.answer) for r, p in zip(greedy, problems, strict=True)]
    hits: list[int] = []
    for i in range(0, a.n, a.batch):
        part = problems[i : i + a.batch]
        params = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=None, seed=1000 + i)
        texts = sample_replies(model, enc, template, part, a.k, params).texts
        hits += [sum(is_correct(t, p.answer) for t in texts[j * a.k : (j + 1) * a.k]) for j, p in enumerate(part)]
        print(f"{i + len(part)}/{a.n} problems, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    def op(p) -> str:  # "What is 581 - 286?" -> "-"; a task without an operator is one group
        m = re.search(r"\d+ ([-+*/x]) \d+", p.question)
        return m.group(1) if m else "all"

    for name in sorted({op(p) for p in problems}):
        idx = [i for i, p in enumerate(problems) if op(p) == name]
        print(json.dumps({"ckpt": a.ckpt, "task": a.task, "op": name, "n": len(idx), "k": a.k, "temperature": a.temperature,
                          "greedy_right": sum(right[i] for i in idx),
                          "sampled_accuracy": round(sum(hits[i] for i in idx) / (a.k * len(idx)), 4),
                          f"pass@{a.k}": sum(hits[i] > 0 for i in idx),
                          "greedy_wrong_some_sample_right": sum(not right[i] and hits[i] > 0 for i in idx),
                          "greedy_right_some_sample_wrong": sum(right[i] and hits[i] < a.k for i in idx),
                          "flat_groups": sum(hits[i] in (0, a.k) for i in idx),
                          "seconds": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
