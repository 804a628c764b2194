"""Train a byte-level BPE tokenizer on a corpus: ``gptforge tokenizer train``'s library.

    gptforge tokenizer train corpus/ --vocab-size 32768 --out runs/mytok
    gptforge prepare files corpus/ --tokenizer runs/mytok --out data/mytok

What it makes (as nanochat's tokenizer, in a gptforge bundle ``OUT/tokenizer/``):

* **Bytes first.** Ids 0-255 are the 256 bytes (every text encodes, nothing is unknown), then the
  merges in the order they were learnt, then the **special tokens at the end of the id range**:
  with the defaults and ``--vocab-size 32768``, ``<|endoftext|>`` = 32765, ``<|im_start|>`` = 32766,
  ``<|im_end|>`` = 32767. ``--vocab-size`` counts everything, specials included. A corpus too small
  to learn that many merges gives a smaller vocabulary (the command says so).
* **Split pattern** before merging: GPT-4's (``gpt4``, nanochat's choice: digits in groups of 1-3)
  by default, ``gpt2`` for GPT-2's, or any regex (it must match every character of the text, as
  both of these do: tiktoken drops what the pattern does not match).
* ``<|endoftext|>`` is the eos and the document separator that ``prepare`` puts between documents;
  when ``<|im_start|>`` and ``<|im_end|>`` are there, a ChatML chat template comes with it.

Two trainers, both maintained libraries (no hand-written BPE): nanochat's ``rustbpe`` (extra
``data``; the bundle is tiktoken ranks, encoded by tiktoken) and Hugging Face ``tokenizers``'
``BpeTrainer`` (the bundle is a ``tokenizer.json``). ``auto`` takes rustbpe when it is installed: training a 32K vocabulary
on Shakespeare's plays (5 MB, and 20 copies of them, 100 MB) it took about a third of the CPU
time of the tokenizers trainer, at less peak memory (docs/benchmarks.md, "Tokenizer training").

Documents are read with ``prepare``'s readers (:mod:`gptforge.data.prepare.sources`), split into
pieces of at most :data:`PIECE_CHARS` (a document, or a part of a longer one cut at a newline), and
every ``round(1/held_out)``-th piece (evenly spread) is kept out of training for the report, which
gives bytes per token against GPT-2's on the held-out text and on built-in samples of English,
code, math and other languages (nanochat's ``tok_eval``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptforge.data.tokenizer import (
    GPT4_PAT,
    MAX_TOKEN_BYTES,
    MAX_VOCAB,
    R50K_PAT,
    HFTokenizer,
    Tokenizer,
    TokenizerUnavailable,
    gpt2_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tiktoken_from_ranks,
)

TRAINERS = ("auto", "rustbpe", "tokenizers")
PATTERNS = {"gpt4": GPT4_PAT, "gpt2": R50K_PAT}
EOS = "<|endoftext|>"
DEFAULT_SPECIALS = (EOS, "<|im_start|>", "<|im_end|>")
# transformers-compatible ChatML (what Qwen and SmolLM2 use, without a default system prompt)
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                   "{% endif %}")
PIECE_CHARS = 1 << 20  # a longer document is cut (at a newline) into pieces of at most this many characters
# what a trainer is fed: parts of at most CHUNK_CHARS, BUFFER of them at a time (rustbpe buffers a fixed
# count of texts; with whole books as texts that count was the whole corpus), so at most ~32 MB of text
# is waiting in the trainer's buffer whatever the documents' sizes
CHUNK_CHARS = 1 << 16
BUFFER = 512
HELD_OUT_CAP = 10_000_000  # characters of held-out text kept for the report (more are still kept out of training)
DEFAULT_MAX_CHARS = 1_000_000_000
DEFAULT_HELD_OUT = 0.05


class TrainError(ValueError):
    """Bad input to tokenizer training; the message starts with the flag or file at fault."""


@dataclass
class TrainSpec:
    vocab_size: int = 32768
    pattern: str = "gpt4"  # gpt4, gpt2 or a regex
    specials: tuple[str, ...] = DEFAULT_SPECIALS
    trainer: str = "auto"
    max_chars: int = DEFAULT_MAX_CHARS
    held_out: float = DEFAULT_HELD_OUT

    @property
    def regex(self) -> str:
        return PATTERNS.get(self.pattern, self.pattern)

    @property
    def n_ordinary(self) -> int:
        return self.vocab_size - len(self.specials)


@dataclass
class CorpusStats:
    """What the reader saw; filled in while the trainer consumes the text."""
    train_pieces: int = 0
    train_chars: int = 0
    held_out_pieces: int = 0
    held_out: list[str] = field(default_factory=list)  # up to HELD_OUT_CAP characters of it
    bad_rows: int = 0
    first_bad: str = ""
    capped: bool = False  # stopped at max_chars


# --- checks, before anything is read ------------------------------------------------------------------

def check_spec(spec: TrainSpec) -> TrainSpec:
    """Refuse a bad spec with a one-line :class:`TrainError` naming the flag; return it with
    ``trainer`` resolved (``auto`` -> rustbpe when installed, else tokenizers)."""
    if spec.trainer not in TRAINERS:
        raise TrainError(f"--trainer {spec.trainer}: expected one of {', '.join(TRAINERS)}")
    seen: set[str] = set()
    for s in spec.specials:
        if not s:
            raise TrainError("--special: a special token needs text")
        if s in seen:
            raise TrainError(f"--special {s}: given twice; each special token needs its own id")
        if len(s.encode()) == 1:
            raise TrainError(f"--special {s}: one byte is an ordinary token already; a special token needs text "
                             "no ordinary token has (such as <|pad|>)")
        if len(s.encode()) > MAX_TOKEN_BYTES:  # every tokenizer reader's bound: refused here, not after training
            raise TrainError(f"--special {s[:40]}...: {len(s.encode()):,} bytes; a token has at most "
                             f"{MAX_TOKEN_BYTES:,} (use a short name such as <|pad|>)")
        seen.add(s)
    if EOS not in seen:
        raise TrainError(f"--special: {EOS} must be one of the special tokens (it is the eos and the document "
                         "separator prepare puts between documents)")
    lo = 256 + len(spec.specials)
    if not lo <= spec.vocab_size <= MAX_VOCAB:
        raise TrainError(f"--vocab-size {spec.vocab_size}: must be in [{lo:,}, {MAX_VOCAB:,}] (256 byte tokens + "
                         f"{len(spec.specials)} special tokens at least)")
    if spec.max_chars <= 0:
        raise TrainError(f"--max-chars {spec.max_chars}: must be positive")
    if not 0.0 <= spec.held_out <= 0.5:
        raise TrainError(f"--held-out {spec.held_out}: must be a fraction in [0, 0.5]")
    check_pattern(spec.regex, spec.pattern)
    if spec.trainer == "auto":
        try:
            import rustbpe  # noqa: F401
            trainer = "rustbpe"
        except ImportError:
            trainer = "tokenizers"
        spec = TrainSpec(**{**spec.__dict__, "trainer": trainer})
    return spec


def check_pattern(regex: str, given: str) -> None:
    """The pattern must compile in both regex engines it meets: Oniguruma (``tokenizers``) and
    fancy-regex (tiktoken, and rustbpe, which uses the same crate); and it must match every
    character of a probe text (letters, digits, punctuation, whitespace runs, other scripts, emoji),
    since tiktoken drops the characters a pattern skips."""
    import tiktoken
    from tokenizers import Regex

    if not regex:
        raise TrainError("--pattern: empty; give gpt4, gpt2 or a regex")
    try:
        Regex(regex)
        tiktoken.Encoding(name="check", pat_str=regex, mergeable_ranks={bytes([i]): i for i in range(256)},
                          special_tokens={})
    except Exception as e:  # both libraries raise plain Exception / ValueError on a bad regex
        raise TrainError(f"--pattern {given[:80]!r}: not a valid regex ({str(e).splitlines()[0][:160]})") from None
    import regex as re_  # tiktoken's own dependency; its dialect has the possessive quantifiers both patterns use

    try:
        covered = {i for m in re_.finditer(regex, PATTERN_PROBE) for i in range(m.start(), m.end())}
    except re_.error:
        return  # a construct only the two engines above know: the coverage is not checked
    missed = "".join(dict.fromkeys(c for i, c in enumerate(PATTERN_PROBE) if i not in covered))
    if missed:
        raise TrainError(f"--pattern {given[:80]!r}: does not match every character (it skips {missed[:20]!r} in a "
                         "probe text), and tiktoken drops what the pattern skips; end it with an alternative such "
                         "as |\\s+|.")


PATTERN_PROBE = "Hello, world's 12345 text\n\n  \t tabs; 東京 émigré 😀 <|endoftext|> x=y+1\r\n"


# --- reading ------------------------------------------------------------------------------------------

def pieces(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in parts of at most ``limit`` characters, cut after a newline where there is one."""
    start = 0
    while len(text) - start > limit:
        cut = text.rfind("\n", start, start + limit)
        end = cut + 1 if cut > start else start + limit
        yield text[start:end]
        start = end
    if start < len(text):
        yield text[start:]


def split_corpus(items: Iterable[Any], stats: CorpusStats, held_out: float, max_chars: int,
                 on_chars: Callable[[int], None] | None = None) -> Iterator[str]:
    """The training text, piece by piece; held-out pieces go to ``stats.held_out`` instead. Piece i
    is held out when floor((i+1) * held_out) > floor(i * held_out): exactly that fraction, evenly
    spread, the same every run. Stops when ``max_chars`` of training text have been yielded."""
    i = 0
    held_chars = 0
    for item in items:
        if item.text is None:
            stats.bad_rows += 1
            stats.first_bad = stats.first_bad or f"{item.where}: {item.reason}"
            continue
        for piece in pieces(item.text):
            held = int((i + 1) * held_out) > int(i * held_out)
            i += 1
            if held:
                stats.held_out_pieces += 1
                if held_chars < HELD_OUT_CAP:
                    stats.held_out.append(piece[:HELD_OUT_CAP - held_chars])
                    held_chars += len(stats.held_out[-1])
                continue
            room = max_chars - stats.train_chars
            if len(piece) >= room:
                piece, stats.capped = piece[:room], True
            stats.train_pieces += 1
            stats.train_chars += len(piece)
            if on_chars:
                on_chars(len(piece))
            yield piece
            if stats.capped:
                return


def open_source(paths: list[str], hf_dataset: str | None = None, hf_config: str | None = None,
                split: str = "train", text_field: str = "text"):
    """``prepare``'s document sources: local files / folders, or a Hugging Face dataset (streamed)."""
    from gptforge.data.prepare.sources import FilesSource, HFStreamSource, SourceError

    if hf_dataset and paths:
        raise TrainError("give input files or --hf-dataset, not both")
    if hf_dataset:
        return HFStreamSource(hf_dataset, name=hf_config, split=split, text_field=text_field)
    if not paths:
        raise TrainError("no input: give text files or folders (.txt, .jsonl, .jsonl.gz, .parquet) or --hf-dataset NAME")
    try:
        return FilesSource(paths, text_field=text_field)
    except SourceError as e:
        raise TrainError(str(e)) from None


# --- the two trainers -----------------------------------------------------------------------------------

def chunks(texts: Iterable[str], limit: int = CHUNK_CHARS) -> Iterator[str]:
    """What the trainers are fed: ``texts`` cut (at newlines) into parts of at most ``limit``."""
    for t in texts:
        yield from pieces(t, limit)


def train_tokenizers_json(texts: Iterable[str], spec: TrainSpec, progress: bool = False) -> str:
    """Hugging Face ``tokenizers``' BpeTrainer: byte-level BPE over ``spec.regex`` pieces; the
    specials appended after the learnt tokens. Returns the tokenizer.json text."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RustTokenizer

    # ignore_merges: a piece that is a whole token is taken whole (tiktoken's rule, and Llama 3's
    # tokenizer.json): both trainers' tokenizers then encode by the same rule, and the seam can run this
    # one on tiktoken (5-8x faster in prepare; docs/benchmarks.md, "Prepare throughput")
    tok = RustTokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # max_token_length: no token longer than a tokenizer.json gptforge reads back may hold (one enormous
    # line of a repeated pattern merged into an 8,192-character token, and the bundle was refused)
    trainer = trainers.BpeTrainer(vocab_size=spec.n_ordinary, min_frequency=0, show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
                                  max_token_length=MAX_TOKEN_BYTES)
    tok.train_from_iterator(chunks(texts), trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in spec.specials])
    return tok.to_str()


def train_rustbpe_ranks(texts: Iterable[str], spec: TrainSpec) -> dict[bytes, int]:
    """nanochat's rustbpe: mergeable ranks (bytes -> rank) for tiktoken, specials not included."""
    from gptforge.extras import require

    rustbpe = require("rustbpe", extra="data", for_what="gptforge tokenizer train --trainer rustbpe")
    t = rustbpe.Tokenizer()
    t.train_from_iterator(chunks(texts), spec.n_ordinary, buffer_size=BUFFER, pattern=spec.regex)
    return dict(t.get_mergeable_ranks())


def write_ranks(ranks: dict[bytes, int], path: Path) -> None:
    """tiktoken's ranks format: one ``base64(token) rank`` line per token, by rank (what tiktoken's
    ``dump_tiktoken_bpe`` writes, without its blobfile dependency)."""
    import base64

    with open(path, "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")


def build_tokenizer(texts: Iterable[str], spec: TrainSpec, out: Path, name: str, progress: bool = False) -> Tokenizer:
    """Train on ``texts`` with ``spec.trainer`` (resolved), save the bundle in ``out/tokenizer/``
    and return it as read back from there."""
    chat = CHATML_TEMPLATE if {"<|im_start|>", "<|im_end|>"} <= set(spec.specials) else None
    if spec.trainer == "tokenizers":
        text = train_tokenizers_json(texts, spec, progress)
        tok: Tokenizer = HFTokenizer(text, name=name, where=f"{out}/tokenizer/tokenizer.json", eos=EOS,
                                     chat_template=chat)
        save_tokenizer(tok, out)
        del text
    elif spec.trainer == "rustbpe":
        ranks = train_rustbpe_ranks(texts, spec)
        if made := [s for s in spec.specials if s.encode() in ranks]:  # tiktoken would refuse it, naming a temp file
            raise TrainError(f"--special {made[0]}: training on this corpus made it an ordinary token too (the text "
                             "holds it as a word); a special token needs text the corpus never has, such as <|pad|>")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ranks.tiktoken"
            write_ranks(ranks, path)
            specials = {s: len(ranks) + k for k, s in enumerate(spec.specials)}
            tok = tiktoken_from_ranks(path, spec.regex, specials, name=name)
            tok.chat_template = chat
            save_tokenizer(tok, out)
            del ranks
    else:
        raise TrainError(f"--trainer {spec.trainer}: resolve it with check_spec first")
    del tok  # freed before the bundle is read back (checked as any bundle is), so the two never add up
    return load_tokenizer(out)


# --- the report -----------------------------------------------------------------------------------------

# fixed samples of kinds of text (nanochat's tok_eval compares on news, Korean, code, math, science)
SAMPLES: dict[str, str] = {
    "english": (
        "The committee met on Tuesday to review the proposal for a new public library in the town centre. "
        "Residents had raised concerns about parking, opening hours and the cost of the building, which the "
        "council estimates at twelve million pounds. \"We want a place where children can read after school,\" "
        "said one parent, who has lived in the area for twenty years. The architects presented three designs; "
        "the second, a low brick building with a garden on its roof, received the most support. A final "
        "decision is expected next month, after a period of public consultation.\n"),
    "code": (
        "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
        "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
        "    out, i, j = [], 0, 0\n"
        "    while i < len(a) and j < len(b):\n"
        "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
        "        else:\n            out.append(b[j]); j += 1\n"
        "    return out + a[i:] + b[j:]\n\n\n"
        "for (int k = 0; k < n; ++k) {\n    sum += x[k] * w[k];  // dot product\n}\n"
        "const config = { lr: 3e-4, batchSize: 32, warmup: 1000 };\n"),
    "math": (
        "Let f(x) = 3x^2 - 12x + 7. Then f'(x) = 6x - 12, so f has a minimum at x = 2, where f(2) = -5. "
        "Compute 48,271 * 16,807 = 811,290,697 and 2^31 - 1 = 2147483647. The integral of x^3 from 0 to 4 is "
        "4^4/4 = 64. Solve 7y + 19 = 131: y = 16. 3.14159265358979 is close to 355/113 = 3.1415929. "
        "If a + b = 1024 and a - b = 256, then a = 640 and b = 384.\n"),
    "multilingual": (
        "La bibliothèque municipale ouvrira ses portes le mois prochain. Die Bibliothek öffnet nächsten Monat. "
        "La biblioteca abrirá sus puertas el próximo mes. Библиотека откроется в следующем месяце. "
        "图书馆将于下个月开放。 図書館は来月開館します。 도서관은 다음 달에 문을 엽니다. "
        "Η βιβλιοθήκη θα ανοίξει τον επόμενο μήνα. المكتبة ستفتح أبوابها الشهر المقبل.\n"),
}


def compression_report(tok: Tokenizer, held_out: list[str], reference: Tokenizer | None = None) -> dict[str, Any]:
    """Bytes per token of ``tok`` (and of ``reference``, GPT-2's by default when its ranks are here)
    on the held-out text and on each built-in sample."""
    if reference is None:
        try:
            reference = gpt2_tokenizer()
        except TokenizerUnavailable:
            reference = None
    kinds = ({"held-out": held_out} if held_out else {}) | {k: [v] for k, v in SAMPLES.items()}
    rows = []
    for kind, texts in kinds.items():
        n_bytes = sum(len(t.encode()) for t in texts)
        ours = sum(len(a) for a in tok.encode_batch_numpy(texts))
        row: dict[str, Any] = {"kind": kind, "bytes": n_bytes, "tokens": ours,
                               "bytes_per_token": n_bytes / max(ours, 1)}
        if reference is not None:
            ref = sum(len(a) for a in reference.encode_batch_numpy(texts))
            row |= {"gpt2_tokens": ref, "gpt2_bytes_per_token": n_bytes / max(ref, 1),
                    "tokens_vs_gpt2": ours / max(ref, 1)}
        rows.append(row)
    return {"tokenizer": tok.entry() | {"chat_template": None}, "reference": reference.name if reference else None,
            "rows": rows}


def format_report(report: dict[str, Any]) -> str:
    """The report as a table (tokens vs GPT-2 < 1.00: fewer tokens than GPT-2 on that text)."""
    gpt2 = report.get("reference") is not None
    head = f"{'text':<13}{'bytes':>12}{'tokens':>12}{'bytes/token':>13}"
    if gpt2:
        head += f"{'GPT-2 tokens':>14}{'GPT-2 b/tok':>13}{'tokens vs GPT-2':>17}"
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        line = f"{r['kind']:<13}{r['bytes']:>12,}{r['tokens']:>12,}{r['bytes_per_token']:>13.2f}"
        if gpt2:
            line += f"{r['gpt2_tokens']:>14,}{r['gpt2_bytes_per_token']:>13.2f}{r['tokens_vs_gpt2']:>16.3f}x"
        lines.append(line)
    if not gpt2:
        lines.append("(GPT-2 column left out: its ranks are not here; `gptforge assets tokenizer` fetches them)")
    return "\n".join(lines)


# --- the whole command -------------------------------------------------------------------------------------

def train(source: Any, spec: TrainSpec, out: str | os.PathLike, progress: bool = True,
          log: Callable[[str], None] = print, name: str | None = None) -> dict[str, Any]:
    """Read ``source`` (a :mod:`prepare.sources` source), train, save ``out/tokenizer/`` and
    ``out/report.json``; return the report (with ``"train"``: what was read and how long it took).
    ``name``: the tokenizer's name (default: ``out``'s folder name)."""
    out = Path(out)
    spec = check_spec(spec)
    stats = CorpusStats()
    bar = None
    if progress:
        from tqdm import tqdm

        size = sum(f["bytes"] for f in source.describe().get("files", [])) or None  # ~characters, for files
        total = min(spec.max_chars, size) if size else (spec.max_chars if spec.max_chars < DEFAULT_MAX_CHARS else None)
        bar = tqdm(total=total, unit="char",
                   unit_scale=True, desc=f"reading + training ({spec.trainer})", file=sys.stderr, leave=False)
    t0 = time.perf_counter()
    texts = split_corpus(source.items(), stats, spec.held_out, spec.max_chars, bar.update if bar is not None else None)
    # peek: an empty corpus is refused before the trainer starts (rustbpe panics on some bad input)
    first = next(texts, None)
    if first is None or stats.train_chars == 0:
        if bar is not None:
            bar.close()
        bad = f"; {stats.bad_rows} bad rows, the first: {stats.first_bad}" if stats.bad_rows else ""
        d = source.describe()
        names = [f["path"] for f in d.get("files", [])] or [str(d.get("path", "the input"))]
        where = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise TrainError(f"{where}: no text to train on ({stats.held_out_pieces} pieces held out){bad}")
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(_chain(first, texts), spec, out, name=name or out.resolve().name or "tokenizer",
                          progress=progress)
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    if stats.bad_rows:
        log(f"skipped {stats.bad_rows:,} bad rows (the first: {stats.first_bad})")
    if tok.n_vocab < spec.vocab_size:
        log(f"note: the corpus gave only {tok.n_vocab - 256 - len(spec.specials):,} merges, so the vocabulary has "
            f"{tok.n_vocab:,} ids, not {spec.vocab_size:,} (give more text or a smaller --vocab-size)")
    report = compression_report(tok, stats.held_out)
    report["train"] = {"trainer": spec.trainer, "vocab_size": tok.n_vocab, "pattern": spec.regex,
                       "special_tokens": tok.special_tokens, "train_chars": stats.train_chars,
                       "train_pieces": stats.train_pieces, "held_out_pieces": stats.held_out_pieces,
                       "held_out_chars_evaluated": sum(map(len, stats.held_out)), "stopped_at_max_chars": stats.capped,
                       "bad_rows": stats.bad_rows, "seconds": round(seconds, 3)}
    from gptforge.storage import write_json

    write_json(out / "report.json", report, what="the tokenizer report", indent=1)
    return report


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
