"""Time one GRPO step's two halves, sampling the replies and the update, at the code on PYTHONPATH.

    PYTHONPATH=OLD/src python scripts/bench_rl_step.py --ckpt runs/sft --threads 1   # then NEW/src: ratios

Median of ``--steps`` steps after one warm-up; the problems and the sampling seed are fixed, so two
checkouts of the code time the same work. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="a chat (SFT) checkpoint")
    ap.add_argument("--task", default="compare")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    a = ap.parse_args()

    from gptforge.cli.common import words
    from gptforge.config import RLConfig
    from gptforge.data.chat import ChatTokenizer, plain_tokenizer
    from gptforge.generation import SamplingParams
    from gptforge.load import ModelSource, load_model
    from gptforge.training.grpo import grpo_step, rl_config
    from gptforge.training.rewards import load_reward, score
    from gptforge.training.rollouts import problem_stream, sample_replies

    if a.threads:
        torch.set_num_threads(a.threads)
    source = ModelSource(ckpt=a.ckpt)
    model = load_model(source).eval()
    tok, template = words(source, model)  # the checkpoint's own tokenizer and chat template
    enc = ChatTokenizer(plain_tokenizer(tok), template)
    cfg = rl_config(model.config, "runs/bench-rl", a.ckpt)  # the settings `gptforge rl` would use, plus these
    cfg.rl = RLConfig(task=a.task, prompts=a.prompts, group=a.group, max_new_tokens=a.max_new_tokens,
                      temperature=a.temperature, top_k=a.top_k, init_from=a.ckpt)
    cfg.optim.lr = 1e-4
    problems_at, _ = problem_stream(cfg.rl, cfg.train.seed)
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    reward = load_reward("exact_match")
    sample_s, update_s = [], []
    for step in range(a.steps + 1):
        t0 = time.perf_counter()
        params = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k or None, seed=step)
        ro = sample_replies(model, enc, template, problems_at(step), a.group, params)
        t1 = time.perf_counter()
        r = torch.tensor(score(reward, ro.problems, ro.texts)).view(a.prompts, a.group)
        grpo_step(model, model, ref, opt, ro, r, cfg, pad=template.bos)
        t2 = time.perf_counter()
        if step:  # step 0 warms up
            sample_s.append(t1 - t0)
            update_s.append(t2 - t1)
    print(json.dumps({"replies": a.prompts * a.group, "sample_s": round(statistics.median(sample_s), 3),
                      "update_s": round(statistics.median(update_s), 3), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
