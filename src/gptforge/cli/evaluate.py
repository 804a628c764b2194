"""``gptforge eval``: multiple-choice and last-word tasks through the batched scorer, and generative
tasks (arithmetic, gsm8k) by greedy exact match with the checkpoint's chat template.

    gptforge eval --tasks hellaswag,piqa --ckpt runs/shakespeare-cpu --limit 200
    gptforge eval --tasks arithmetic,gsm8k --ckpt runs/sft
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gptforge.cli.common import CliError, add_model_source, chat_template_of, load, model_source

# --- eval -----------------------------------------------------------------------------------------

def args_eval(p: argparse.ArgumentParser) -> None:
    p.description = ("Zero-shot multiple-choice and last-word evaluation with one batched scorer. "
                     "Get the data first with `gptforge assets evals` (offline) or `--online`.")
    p.add_argument("--tasks", default="hellaswag",
                   help=f"comma-separated: {', '.join(known_tasks())} (default %(default)s)")
    add_model_source(p)
    p.add_argument("--limit", type=int, default=0, help="first N examples of each task (0 = all)")
    p.add_argument("--json", help="write the results to this JSON file")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="autocast dtype; auto = bf16 on CUDA where supported")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per scoring forward (default 32768 on CUDA, 2048 on CPU)")
    p.add_argument("--bench", action="store_true",
                   help="time the batched scorer against the one-at-a-time reference (examples/s)")
    p.add_argument("--repeats", type=int, default=3, help="--bench: timed repeats, best kept (default %(default)s)")
    p.add_argument("--raw", action="store_true", help="generative tasks: ignore the checkpoint's chat template")
    p.add_argument("--system", help="generative tasks: a system prompt (chat template only)")


def cmd_eval(args: argparse.Namespace) -> int:
    from gptforge.eval.run import run_eval
    from gptforge.parallel.distributed import cleanup, init_distributed

    source = model_source(args)
    if args.limit < 0 or (args.batch_tokens is not None and args.batch_tokens < 1) or args.repeats < 1:
        raise CliError("--limit must be >= 0 (0 = all), --batch-tokens and --repeats >= 1")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in known_tasks()]
    if unknown or not names:
        raise CliError(f"--tasks: {'unknown task(s) ' + ', '.join(unknown) if unknown else 'no task given'}; "
                       f"known: {', '.join(known_tasks())}")
    generative, args.tasks = split_generative(args.tasks)  # arithmetic, gsm8k: answers are generated
    if generative:
        eval_generative(args, generative)
        if not args.tasks:
            return 0
    info = init_distributed(args.device)  # under torchrun every rank scores a share of the examples
    model = load(source)
    timer = None
    if args.bench:
        from gptforge.bench.eval import run_eval_bench
        from gptforge.data.tokenizer import get_tokenizer

        def timer(model, prepared, device, autocast, batch_tokens, log):
            return run_eval_bench(model, prepared, get_tokenizer(), device, autocast, batch_tokens,
                                  repeats=args.repeats, log=log)
    try:
        run_eval(model.to(info.device), args.tasks, info, limit=args.limit, dtype=args.dtype,
                 batch_tokens=args.batch_tokens, timer=timer, json_out=args.json, source=source.describe())
    finally:
        cleanup(info)
    return 0


# --- generative eval (called from cmd_eval for the tasks it knows) --------------------------------

def known_tasks() -> list[str]:
    """Every task ``--tasks`` takes: the scored (multiple-choice, last-word) and the generative ones."""
    from gptforge.eval.generative import GENERATIVE
    from gptforge.eval.tasks import TASKS

    return [*TASKS, *GENERATIVE]


def split_generative(tasks: str) -> tuple[list[str], str]:
    """(generative task names, the remaining comma-separated multiple-choice tasks)."""
    from gptforge.eval.generative import GENERATIVE

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    return [t for t in names if t in GENERATIVE], ",".join(t for t in names if t not in GENERATIVE)


def eval_generative(args: argparse.Namespace, names: list[str]) -> None:
    """`gptforge eval --tasks arithmetic,gsm8k`: greedy exact match, with the checkpoint's chat template."""
    import torch

    from gptforge.data.tokenizer import get_tokenizer
    from gptforge.eval.generative import evaluate_generative
    from gptforge.runtime import resolve_device

    template = None if args.raw else chat_template_of(args.ckpt)
    model = load(model_source(args)).to(resolve_device(args.device)).eval()
    with torch.no_grad():
        results = evaluate_generative(model, get_tokenizer(), names, template, limit=args.limit,
                                      system=args.system)
    from gptforge.eval.stats import GENERATIVE_CHANCE, fmt_ci, wilson

    print(f"{'task':<12} {'n':>6} {'accuracy':>9} {'95% CI':>12} {'chance':>7} {'format':>7}  "
          f"({'chat template' if template else 'raw prompt'}; exact match of a generated answer)")
    for r in results:
        note = f"  ({r.too_long} prompts longer than the context count as wrong)" if r.too_long else ""
        chance = GENERATIVE_CHANCE.get(r.task)
        print(f"{r.task:<12} {r.n:>6} {r.accuracy:>9.4f} {fmt_ci(wilson(r.accuracy * r.n, r.n)):>12} "
              f"{'-' if chance is None else f'{chance:.3f}':>7} {r.format_rate:>7.4f}{note}")
    if args.json:
        rows = [{**r.__dict__, "acc_ci95": list(wilson(r.accuracy * r.n, r.n)), "chance": GENERATIVE_CHANCE.get(r.task)}
                for r in results]
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
