"""``gptforge tokenizer``: make tokenizers (``train``; room for ``eval`` / ``show`` later).

    gptforge tokenizer train corpus/ --vocab-size 32768 --out runs/mytok
    gptforge prepare files corpus/ --tokenizer runs/mytok --out data/mytok
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gptforge.cli.common import CliError, count


def args_tokenizer(p: argparse.ArgumentParser) -> None:
    from gptforge.data.tokenizer_train import DEFAULT_HELD_OUT, DEFAULT_MAX_CHARS, DEFAULT_SPECIALS

    p.description = "Make tokenizers: `gptforge tokenizer train` learns a byte-level BPE from a corpus."
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = sub.add_parser(
        "train", help="train a byte-level BPE tokenizer on text files or a Hugging Face dataset",
        description="Train a byte-level BPE (as nanochat's and GPT-4's: 256 byte tokens, merges, then the special "
                    "tokens at the end of the id range) and save it as OUT/tokenizer/ (a bundle that `prepare "
                    "--tokenizer OUT` and `train` read), with OUT/report.json: bytes per token against GPT-2's on "
                    "held-out text and on built-in English, code, math and multilingual samples.",
        epilog="Example: gptforge tokenizer train ~/.cache/gptforge/shakespeare_plays --vocab-size 8192 --out "
               "runs/shakespeare-tok")
    t.add_argument("paths", nargs="*", metavar="PATH",
                   help="text files or folders (walked recursively, sorted): .txt (one document per file), .jsonl / "
                        ".jsonl.gz (one document per line, field --text-field), .parquet (column --text-field)")
    t.add_argument("--out", required=True, help="output folder: OUT/tokenizer/ (the bundle) and OUT/report.json")
    t.add_argument("--vocab-size", type=count, default=32768,
                   help="ids in all: 256 bytes + merges + the special tokens (at most 1,048,576)")
    t.add_argument("--pattern", default="gpt4",
                   help="split pattern applied before merging: gpt4 (GPT-4's / nanochat's, digits in groups of 1-3), "
                        "gpt2 (GPT-2's), or a regex that matches every character")
    t.add_argument("--special", action="append", metavar="TOKEN", default=None,
                   help="a special token (repeat the flag for several; they replace the defaults "
                        f"{' '.join(DEFAULT_SPECIALS)}); <|endoftext|> must be one: it is the eos and the document "
                        "separator. With <|im_start|> and <|im_end|> the tokenizer gets a ChatML chat template")
    t.add_argument("--trainer", default="auto", choices=["auto", "rustbpe", "tokenizers"],
                   help="auto: rustbpe when installed (nanochat's trainer, extra `data`; faster, less memory), "
                        "else tokenizers (Hugging Face's BpeTrainer, writes a tokenizer.json)")
    t.add_argument("--max-chars", type=count, default=DEFAULT_MAX_CHARS,
                   help="stop reading after this many characters of training text")
    t.add_argument("--held-out", type=float, default=DEFAULT_HELD_OUT,
                   help="fraction of documents (pieces of at most 1M characters) kept out of training for the "
                        "report, evenly spread; 0 for none, at most 0.5")
    t.add_argument("--text-field", default="text", help="jsonl field / parquet column / dataset column holding the text")
    t.add_argument("--hf-dataset", metavar="NAME",
                   help="a Hugging Face dataset to stream instead of files (online), e.g. HuggingFaceFW/fineweb-edu")
    t.add_argument("--hf-config", metavar="CONFIG", help="the dataset's configuration (e.g. sample-10BT)")
    t.add_argument("--split", default="train", help="the dataset's split")
    t.add_argument("--force", action="store_true", help="replace a tokenizer already in OUT")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")


def cmd_tokenizer(args: argparse.Namespace) -> int:
    if args.action == "train":
        return _train(args)
    raise CliError(f"tokenizer {args.action}: unknown action")


def _train(args: argparse.Namespace) -> int:
    from gptforge.data.prepare.sources import SourceError
    from gptforge.data.tokenizer import BUNDLE_DIR, INFO, TokenizerError
    from gptforge.data.tokenizer_train import (
        DEFAULT_SPECIALS,
        TrainError,
        TrainSpec,
        check_spec,
        format_report,
        open_source,
        train,
    )
    from gptforge.storage import atomic_dir

    out = Path(args.out)
    try:
        spec = check_spec(TrainSpec(vocab_size=args.vocab_size, pattern=args.pattern,
                                    specials=tuple(args.special) if args.special else DEFAULT_SPECIALS,
                                    trainer=args.trainer, max_chars=args.max_chars, held_out=args.held_out))
        if (out / BUNDLE_DIR / INFO).exists() and not args.force:
            raise CliError(f"--out {out}: already holds a tokenizer ({out / BUNDLE_DIR / INFO}); add --force to "
                           "replace it")
        source = open_source(args.paths, args.hf_dataset, args.hf_config, args.split, args.text_field)
        progress = not args.no_progress
        print(f"training a {spec.vocab_size:,}-id byte-level BPE with {spec.trainer} (pattern {args.pattern[:40]}, "
              f"special tokens {' '.join(spec.specials)}) ...", flush=True)
        # built in a temporary folder beside OUT and renamed into place (storage.atomic_dir): a kill or a full
        # disk leaves the earlier tokenizer whole; --force replaces OUT/tokenizer/ whole (no file of the other
        # kind left behind) and keeps OUT's other entries
        with atomic_dir(out, args.force, what="the tokenizer") as tmp:
            report = train(source, spec, tmp, progress=progress, log=lambda m: print(m, file=sys.stderr),
                           name=out.resolve().name or "tokenizer")
    except (TrainError, SourceError, TokenizerError) as e:
        raise CliError(str(e)) from None
    t = report["train"]
    print(f"trained on {t['train_chars']:,} characters ({t['train_pieces']:,} pieces) in {t['seconds']:.1f} s; "
          f"{t['held_out_pieces']:,} pieces held out")
    print(format_report(report))
    print(f"wrote {out / BUNDLE_DIR} ({t['vocab_size']:,} ids; special tokens "
          f"{', '.join(f'{k}={v}' for k, v in t['special_tokens'].items())}) and {out / 'report.json'}")
    from gptforge.cli.hints import beside, q

    print(f"next: gptforge prepare files CORPUS --tokenizer {q(out)} --out {q(beside(out, 'shards'))}")
    return 0
