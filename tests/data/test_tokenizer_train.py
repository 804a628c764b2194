"""`gptforge tokenizer train`: the trained tokenizer, read back through the seam, encodes as the
libraries that made it do (tokenizers' own encode of the tokenizer.json; rustbpe's own encoder),
never merges across a split of its pattern (checked with the `regex` module, independently of both
trainers), round-trips, has the vocabulary and special-token ids asked for; and bad input is one
line and exit status 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.data.tokenizer import GPT4_PAT, R50K_PAT, load_ranks, load_tokenizer
from gptforge.data.tokenizer_train import (
    CHATML_TEMPLATE,
    DEFAULT_SPECIALS,
    CorpusStats,
    TrainSpec,
    check_spec,
    chunks,
    open_source,
    pieces,
    split_corpus,
    train,
)

VOCAB = 700
TRAINERS = ["tokenizers", "rustbpe"]
pytest.importorskip("tokenizers")


# --- tiny corpora made here ---------------------------------------------------------------------------

SYLLABLES = ["ka", "to", "ri", "mu", "sen", "dal", "or", "ve", "qui", "lo", "ne", "sta", "ph", "ith", "ung"]
UNICODE = ["é", "ü", "ß", "ñ", "ø", "東京", "日本語", "한국어", "Привет", "مرحبا", "γειά", "😀", "👍🏽", "e\u0301", "\u00a0"]
SPECIAL_TEXT = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|>user\n", "<|endoftext"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))


def _document(rng: random.Random, n_words: int) -> str:
    out = []
    for _ in range(n_words):
        r = rng.random()
        if r < 0.75:
            w = _word(rng)
            out.append(w.capitalize() if rng.random() < 0.1 else w)
        elif r < 0.85:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 7))))
        elif r < 0.93:
            out.append(rng.choice([",", ".", "'s", "'ll", "!", "(", ")", ":", "--", "'"]))
        else:
            out.append(rng.choice(UNICODE))
        out.append(rng.choice([" "] * 12 + ["\n", "  ", "\t", "\n\n", ""]))
    return "".join(out)


def make_corpus(folder: Path, n_docs: int = 40, n_words: int = 1500, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        (folder / f"doc{i:03d}.txt").write_text(_document(rng, n_words), encoding="utf-8")
    return folder


def probe_strings(n: int = 3000, seed: int = 1) -> list[str]:
    """Unicode, whitespace runs, digits, punctuation and special-token text typed in ordinary text."""
    rng = random.Random(seed)
    alphabet = ["a", "Z", " ", "  ", "\t", "\n", "\r\n", "   \n", "0", "7", "42", "1234567", ",", ".", "'s", "'LL",
                "'", "\"", "-", "_", "{", "}", "\\", "/", "#", "\u200b", "\ufeff", "\x00", "\x7f", *UNICODE,
                *SPECIAL_TEXT]
    out = ["", " ", "\n", "  \n\n ", "12345678901234567890", "<|endoftext|>", "hello world", "Hello   World!!"]
    while len(out) < n:
        k = rng.randint(1, 12)
        out.append("".join(rng.choice(alphabet) if rng.random() < 0.5 else _word(rng) for _ in range(k)))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module", params=TRAINERS)
def trained(request, corpus, tmp_path_factory):
    if request.param == "rustbpe":
        pytest.importorskip("rustbpe")
    out = tmp_path_factory.mktemp(f"tok-{request.param}")
    spec = TrainSpec(vocab_size=VOCAB, trainer=request.param, held_out=0.1)
    report = train(open_source([str(corpus)]), spec, out, progress=False, log=lambda m: None)
    return request.param, out, report


# --- what the trained tokenizer is ---------------------------------------------------------------------

def test_bundle_loads_back_with_the_vocabulary_and_specials_asked_for(trained):
    trainer, out, report = trained
    tok = load_tokenizer(out)
    assert tok.kind == {"tokenizers": "hf", "rustbpe": "tiktoken"}[trainer]
    assert (out / "tokenizer" / "info.json").is_file()
    assert tok.n_vocab == VOCAB == report["train"]["vocab_size"]
    # documented: the special tokens are the last ids, in the order given
    assert tok.special_tokens == {s: VOCAB - len(DEFAULT_SPECIALS) + k for k, s in enumerate(DEFAULT_SPECIALS)}
    assert tok.eos_token_id == tok.eot_token == tok.token_id("<|endoftext|>") == VOCAB - 3
    assert tok.bos_token_id is None
    assert tok.chat_template == CHATML_TEMPLATE
    # the 256 bytes are each one token; every ordinary id decodes to bytes
    ids = {tok.encode_ordinary(bytes([b]).decode("latin-1"))[0] for b in range(32, 127)}
    assert len(ids) == 95
    assert all(tok.decode_single_token_bytes(i) for i in range(VOCAB - 3))


def test_encode_equals_the_library_that_made_it(trained, corpus):
    trainer, out, _ = trained
    tok = load_tokenizer(out)
    strings = probe_strings(10_000)
    ours = [tok.encode_ordinary(s) for s in strings]
    assert len(strings) >= 10_000
    if trainer == "tokenizers":
        from tokenizers import Tokenizer

        ref = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
        ref.encode_special_tokens = True  # special-token text typed by a user stays text
        theirs = [e.ids for e in ref.encode_batch(strings, add_special_tokens=False)]
    else:
        import rustbpe

        # rustbpe is deterministic: the same text gives the same ranks; its own encoder is the reference
        stats = CorpusStats()
        texts = list(split_corpus(open_source([str(corpus)]).items(), stats, 0.1, 10 ** 12))
        ref = rustbpe.Tokenizer()
        ref.train_from_iterator(chunks(texts), VOCAB - 3, pattern=GPT4_PAT)
        assert dict(ref.get_mergeable_ranks()) == load_ranks(out / "tokenizer" / "ranks.tiktoken", None)
        theirs = [ref.encode(s) for s in strings]
    bad = [(s, a, b) for s, a, b in zip(strings, ours, theirs, strict=True) if a != b]
    assert not bad, bad[:3]
    assert sum(map(len, ours)) > len(strings)  # not all empty


def test_transformers_fast_tokenizer_agrees(corpus, tmp_path):
    """The tokenizer.json the tokenizers trainer writes, read by transformers, with the chat template."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    train(open_source([str(corpus)]), TrainSpec(vocab_size=VOCAB, trainer="tokenizers"), out, progress=False,
          log=lambda m: None)
    tok = load_tokenizer(out)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer" / "tokenizer.json"),
                                              split_special_tokens=True)
    for s in probe_strings(400, seed=7):
        assert hf.encode(s, add_special_tokens=False) == tok.encode_ordinary(s), s
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    hf.chat_template = tok.chat_template
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_tokens_never_cross_a_split_of_the_gpt4_pattern(trained):
    """Independent of both trainers: the `regex` module's split of GPT-4's pattern; every token lies
    inside one piece (a wrong split pattern in the trainer or the saved tokenizer fails here)."""
    regex = pytest.importorskip("regex")
    _, out, _ = trained
    tok = load_tokenizer(out)
    for s in probe_strings(1500, seed=3):
        bounds, pos = {0}, 0
        for piece in regex.findall(GPT4_PAT, s):
            pos += len(piece.encode())
            bounds.add(pos)
        pos = 0
        for t in tok.encode_ordinary(s):
            end = pos + len(tok.decode_single_token_bytes(t))
            assert not any(pos < b < end for b in bounds), (s, tok.encode_ordinary(s))
            pos = end
        assert pos == len(s.encode())
    # digits go in groups of at most three (GPT-4's pattern; GPT-2's would let them merge further)
    assert all(len(tok.decode_single_token_bytes(t)) <= 3 for t in tok.encode_ordinary("1234567890" * 5))


def test_decode_encode_round_trip_and_special_text_stays_text(trained):
    _, out, _ = trained
    tok = load_tokenizer(out)
    for s in probe_strings(2000, seed=5):
        ids = tok.encode_ordinary(s)
        assert tok.decode(ids) == s
        assert not set(ids) & set(tok.special_tokens.values())
    assert tok.encode("<|im_start|>x<|im_end|>", allowed_special="all")[0] == VOCAB - 2
    assert tok.encode("a<|endoftext|>", allowed_special={"<|endoftext|>"})[-1] == VOCAB - 3


def test_report_counts_the_held_out_text(trained, corpus):
    _, out, report = trained
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["rows"] == report["rows"]
    rows = {r["kind"]: r for r in report["rows"]}
    assert set(rows) == {"held-out", "english", "code", "math", "multilingual"}
    # the held-out pieces: every 10th of the 40 documents (0.1), the same ones every run
    docs = sorted(corpus.glob("*.txt"))
    held = [d.read_text() for i, d in enumerate(docs) if (i + 1) % 10 == 0]
    assert report["train"]["held_out_pieces"] == 4 and report["train"]["train_pieces"] == 36
    tok = load_tokenizer(out)
    assert rows["held-out"]["tokens"] == sum(len(tok.encode_ordinary(t)) for t in held)
    assert rows["held-out"]["bytes"] == sum(len(t.encode()) for t in held)
    if "gpt2_tokens" in rows["held-out"]:
        from gptforge.data.tokenizer import gpt2_tokenizer

        g = gpt2_tokenizer()
        assert rows["held-out"]["gpt2_tokens"] == sum(len(g.encode_ordinary(t)) for t in held)
        assert rows["held-out"]["tokens_vs_gpt2"] == pytest.approx(rows["held-out"]["tokens"] / rows["held-out"]["gpt2_tokens"])


# --- reading ---------------------------------------------------------------------------------------------

def test_pieces_cut_long_documents_at_newlines():
    text = ("abc\n" * 10) + "x" * 25
    parts = list(pieces(text, limit=10))
    assert "".join(parts) == text and all(len(p) <= 10 for p in parts)
    assert parts[0] == "abc\nabc\n"
    assert list(pieces("", 10)) == [] and list(pieces("abc", 10)) == ["abc"]


def test_held_out_fraction_is_exact_and_spread_and_max_chars_caps():
    from gptforge.data.prepare.sources import Item

    items = [Item(f"doc{i}", f"f:{i}") for i in range(100)] + [Item(None, "f:100", "not valid UTF-8")]
    stats = CorpusStats()
    train_docs = list(split_corpus(items, stats, 0.25, 10 ** 9))
    assert stats.held_out == [f"doc{i}" for i in range(3, 100, 4)] and len(train_docs) == 75
    assert stats.bad_rows == 1 and "f:100" in stats.first_bad
    stats = CorpusStats()
    assert list(split_corpus(items, stats, 0.0, 10)) == ["doc0", "doc1", "do"] and stats.capped


def test_jsonl_and_parquet_inputs(tmp_path):
    rng = random.Random(4)
    docs = [_document(rng, 300) for _ in range(30)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    out = tmp_path / "j"
    assert main(["tokenizer", "train", str(tmp_path / "c.jsonl"), "--text-field", "body", "--out", str(out),
                 "--vocab-size", "400", "--trainer", "tokenizers"]) == 0  # with its progress bars
    assert load_tokenizer(out).n_vocab == 400
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs}), tmp_path / "c.parquet")
    out = tmp_path / "p"
    assert main(["tokenizer", "train", str(tmp_path / "c.parquet"), "--out", str(out), "--vocab-size", "400",
                 "--no-progress", "--pattern", "gpt2"]) == 0
    tok = load_tokenizer(out)
    assert tok.n_vocab == 400 and tok.decode(tok.encode_ordinary(docs[0])) == docs[0]
    report = json.loads((out / "report.json").read_text())
    assert report["train"]["pattern"] == R50K_PAT


# --- the command and its refusals ------------------------------------------------------------------------

def test_cli_trains_prints_the_table_and_refuses_to_overwrite(corpus, tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["tokenizer", "train", str(corpus), "--out", str(out), "--vocab-size", "512", "--no-progress",
            "--special", "<|endoftext|>", "--special", "<|pad|>"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "held-out" in text and "multilingual" in text and "bytes/token" in text
    tok = load_tokenizer(out)
    assert tok.special_tokens == {"<|endoftext|>": 510, "<|pad|>": 511} and tok.chat_template is None
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--force", "--trainer", "tokenizers"]) == 0  # the other kind replaces it whole
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == ["info.json", "tokenizer.json"]
    assert load_tokenizer(out).kind == "hf"


@pytest.mark.parametrize(("extra", "needle"), [
    (["--vocab-size", "258"], "--vocab-size 258"),
    (["--vocab-size", str((1 << 20) + 1)], "--vocab-size"),
    (["--pattern", "(unclosed"], "--pattern"),
    (["--pattern", r"\w+"], "does not match every character"),
    (["--special", "<|endoftext|>", "<|endoftext|>"], "--special <|endoftext|>: given twice"),
    (["--special", "<|im_end|>"], "<|endoftext|> must be one"),
    (["--special", "x"], "--special x: one byte is an ordinary token"),
    (["--held-out", "0.9"], "--held-out"),
    (["--max-chars", "0"], "--max-chars"),
])
def test_bad_options_are_one_line_exit_2(corpus, tmp_path, capsys, extra, needle):
    if extra[0] == "--special" and len(extra) == 3:
        extra = ["--special", extra[1], "--special", extra[2]]
    assert main(["tokenizer", "train", str(corpus), "--out", str(tmp_path / "o"), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("gptforge tokenizer: error:"), err
    assert not (tmp_path / "o").exists()


def test_bad_inputs_are_one_line_exit_2(tmp_path, capsys):
    def run(*paths: str) -> str:
        assert main(["tokenizer", "train", *paths, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    assert "no input" in run()
    assert f"{tmp_path / 'missing.txt'}" in run(str(tmp_path / "missing.txt"))
    (tmp_path / "empty").mkdir()
    assert "empty: folder holds no" in run(str(tmp_path / "empty"))
    (tmp_path / "a.csv").write_text("x")
    assert "a.csv" in run(str(tmp_path / "a.csv"))
    (tmp_path / "blank.txt").write_text("")
    assert "blank.txt: no text to train on" in run(str(tmp_path / "blank.txt"))
    (tmp_path / "bad.jsonl").write_text('{"text": 3}\n')
    err = run(str(tmp_path / "bad.jsonl"))
    assert "no text to train on" in err and "bad.jsonl:1" in err
    assert not (tmp_path / "o").exists()


def test_auto_takes_rustbpe_when_installed():
    try:
        import rustbpe  # noqa: F401
        want = "rustbpe"
    except ImportError:
        want = "tokenizers"
    assert check_spec(TrainSpec()).trainer == want


def test_a_hugging_face_dataset_source_streams_into_training(tmp_path):
    """The --hf-dataset path is `datasets` streaming (prepare's HFStreamSource); offline here through
    the json builder on a local file, as prepare's FineWeb path is tested."""
    pytest.importorskip("datasets")
    from gptforge.data.prepare.sources import HFStreamSource

    rng = random.Random(9)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": _document(rng, 200)}) + "\n" for _ in range(20)))
    assert isinstance(open_source([], hf_dataset="some/name"), HFStreamSource)
    source = HFStreamSource("json", data_files=[str(tmp_path / "d.jsonl")])
    report = train(source, TrainSpec(vocab_size=300, trainer="tokenizers", held_out=0.25), tmp_path / "o",
                   progress=True, log=lambda m: None)
    assert report["train"]["train_pieces"] == 15 and report["train"]["held_out_pieces"] == 5
    assert load_tokenizer(tmp_path / "o").n_vocab == 300
