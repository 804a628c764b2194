"""Hostile and careless use of the tokenizer seam (issue 31, "Bad input"): a damaged, foreign or lying
tokenizer bundle in a checkpoint, bad ``--tokenizer`` values, hostile ``tokenizer train`` input and
hostile chat templates each give a one-line refusal naming the file and the field, exit 2, no
traceback, through every command (they all read a model's words through one seam)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from gptforge.cli import main
from tests.conftest import WORDS, word_corpus
from tests.run.faults import rewrite_meta

SMALL = ["--train.micro_batch", "2", "--train.seq_len", "64", "--train.total_batch_tokens", "128",
         "--train.val_every", "0", "--train.device", "cpu"]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A trained tokenizer, shards made with it, a 2-step Llama on them and a 2-step sft of it."""
    root = tmp_path_factory.mktemp("hostile")
    word_corpus(root / "corpus", docs=12)
    assert main(["tokenizer", "train", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", "300",
                 "--trainer", "tokenizers", "--no-progress"]) == 0
    assert main(["prepare", "files", str(root / "corpus"), "--out", str(root / "data"), "--tokenizer",
                 str(root / "tok"), "--val-tokens", "1000", "--workers", "1", "--no-progress"]) == 0
    assert main(["train", "--preset", "llama-tiny", "--data.dir", str(root / "data"), "--out", str(root / "run"),
                 "--train.max_steps", "2", "--train.val_tokens", "128", "--train.compile", "false",
                 "--eval.every", "0", *SMALL]) == 0
    rows = [{"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w} {w}."}]}
            for w in WORDS * 2]
    (root / "convs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["sft", "--init-from", str(root / "run"), "--data", str(root / "convs.jsonl"), "--out",
                 str(root / "sft"), "--val-count", "4", "--train.max_steps", "2", *SMALL]) == 0
    return root


def copy_run(own: Path, tmp_path: Path, name: str = "sft") -> tuple[Path, Path]:
    """A copy of one of the fixture's runs (run dir, its checkpoint) to damage."""
    run = tmp_path / name
    shutil.copytree(own / name, run)
    return run, next((run / "checkpoints").glob("step_*"))


def edit_meta(ck: Path, fn) -> None:
    """A hostile checkpoint is self-consistent: the weights' header records the meta.json it comes with."""
    rewrite_meta(ck, fn)


def refused(argv: list[str], capsys, *needles: str, stdin: str = "hi\n/quit\n", monkeypatch=None) -> str:
    """``argv`` exits 2 with one error line holding every needle, and no traceback."""
    capsys.readouterr()
    if monkeypatch is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    for n in needles:
        assert n in line, line
    return line


def sample(run: Path) -> list[str]:
    return ["sample", "--ckpt", str(run), "--prompt", "The king", "--num-samples", "1", "--max-new-tokens", "2",
            "--device", "cpu"]


def sft_resume(run: Path, own: Path) -> list[str]:
    return ["sft", "--resume", str(run), "--out", str(run), "--data", str(own / "convs.jsonl"),
            "--train.max_steps", "3", "--train.device", "cpu"]


# --- meta.json's "tokenizer" entry: wrong types and lies -----------------------------------------------

def _tok(fn):
    return lambda m: fn(m["tokenizer"])


ENTRY_DAMAGE = {
    # wrong types where ids belong used to be TypeError: unhashable type: 'list' deep in the reader
    "special_tokens": (_tok(lambda t: t.__setitem__("special_tokens", {"<|endoftext|>": [297]})), "special_tokens"),
    "bos": (_tok(lambda t: t.__setitem__("bos", [1])), "tokenizer.bos"),
    "eos": (_tok(lambda t: t.__setitem__("eos", {"a": 1})), "tokenizer.eos"),
    # lies the fingerprint does not cover: the document separator and size are the files'
    "n_vocab": (_tok(lambda t: t.__setitem__("n_vocab", 5000)), "tokenizer.n_vocab"),
    "specials-swap": (_tok(lambda t: t.__setitem__("special_tokens", {k: 597 - v if v != 298 else v
                                                                      for k, v in t["special_tokens"].items()})),
                      "tokenizer."),
    "builtin": (_tok(lambda t: t.__setitem__("builtin", "cl100k_base")), "tokenizer.builtin"),
    "sha": (_tok(lambda t: t["files"].__setitem__("tokenizer.json", 5)), "tokenizer.files['tokenizer.json']"),
    "many-files": (_tok(lambda t: t["files"].update({f"f{i}": "0" * 64 for i in range(40)})), "tokenizer.files"),
    "name": (_tok(lambda t: t.pop("name")), "tokenizer.name"),
}


@pytest.mark.parametrize("case", sorted(ENTRY_DAMAGE))
def test_a_damaged_tokenizer_entry_is_refused_naming_the_field(own, tmp_path, capsys, case):
    fn, field = ENTRY_DAMAGE[case]
    run, ck = copy_run(own, tmp_path)
    edit_meta(ck, fn)
    refused(sample(run), capsys, "meta.json", field)
    refused(sft_resume(run, own), capsys, "meta.json", field)


def test_the_fixture_runs_are_good(own, capsys):
    assert main(sample(own / "sft")) == 0


# --- hostile chat templates in meta.json ------------------------------------------------------------

def set_template(ck: Path, template) -> None:
    edit_meta(ck, lambda m: m["chat_template"].__setitem__("template", template))


def test_a_template_that_renders_an_empty_prompt_is_refused(own, tmp_path, capsys, monkeypatch):
    """It was `ValueError: every prompt needs at least one token (use [50256] ...)` out of chat and
    eval, a traceback naming GPT-2's id on a model that has no such token."""
    run, ck = copy_run(own, tmp_path)
    set_template(ck, "{% if false %}x{% endif %}")
    refused(["chat", "--ckpt", str(run), "--max-new-tokens", "2", "--device", "cpu"], capsys, "meta.json",
            "empty prompt", monkeypatch=monkeypatch)
    refused(["eval", "--ckpt", str(run), "--tasks", "arithmetic", "--limit", "2", "--device", "cpu"], capsys,
            "meta.json", "empty prompt")


HOSTILE_TEMPLATES = {
    "class": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "Python internals"),
    "globals": ("{{ cycler.__init__.__globals__.os.system('echo PWNED') }}", "Python internals"),
    "loop": ("{% for i in range(100000000) %}{% for j in range(100000000) %}x{% endfor %}{% endfor %}", "Range too big"),
    "huge": ("{{ 'x' * 1000000000 }}", "characters"),
    "raises": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "recursion": ("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "not-text": (5, "chat_template.template"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEMPLATES))
def test_a_hostile_template_is_refused_by_chat_and_sft_resume(own, tmp_path, capsys, monkeypatch, case):
    template, needle = HOSTILE_TEMPLATES[case]
    run, ck = copy_run(own, tmp_path)
    set_template(ck, template)
    refused(["chat", "--ckpt", str(run), "--max-new-tokens", "2", "--device", "cpu"], capsys, "meta.json", needle,
            monkeypatch=monkeypatch)
    refused(sft_resume(run, own), capsys, "meta.json", needle)
    assert "PWNED" not in capsys.readouterr().out


def served_app(run: Path, monkeypatch):
    """The app `gptforge serve --ckpt run` would serve (uvicorn's server captured, not started; the
    port serve binds first is a free one)."""
    import socket

    import uvicorn

    got = {}

    class Captured:
        def __init__(self, config):
            got["app"] = config.app

        def run(self, sockets=None):
            for s in sockets or []:
                s.close()

    monkeypatch.setattr(uvicorn, "Server", Captured)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--ckpt", str(run), "--device", "cpu", "--port", str(port)]) == 0
    return got["app"]


def test_serve_answers_a_refusing_template_with_a_400(own, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    run, ck = copy_run(own, tmp_path)
    set_template(ck, "{{ raise_exception('roles must alternate') }}")
    client = TestClient(served_app(run, monkeypatch), raise_server_exceptions=False)
    messages = [{"role": "user", "content": "Say crown"}]
    r = client.post("/api/chat", json={"messages": messages, "max_new_tokens": 2})
    assert r.status_code == 400 and "roles must alternate" in r.text, (r.status_code, r.text)
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and "roles must alternate" in r.text, (r.status_code, r.text)
    assert r.json()["error"]["param"] == "messages"  # OpenAI's shape on /v1


def test_an_unexpected_failure_is_a_500_with_an_id_in_the_familys_shape(own, tmp_path, monkeypatch, caplog):
    """The one error boundary: any other exception in a route is a 500 in the route family's shape whose
    id is in the server log, never an unstructured traceback page."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    import gptforge.generation as generation

    run, _ = copy_run(own, tmp_path)
    client = TestClient(served_app(run, monkeypatch), raise_server_exceptions=False)

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(generation.SamplingParams, "check", boom)  # every generating route passes it
    r = client.post("/v1/completions", json={"prompt": "The king", "max_tokens": 2})
    assert r.status_code == 500 and "internal error" in r.json()["error"]["message"], r.text
    rid = r.json()["error"]["message"].split()[2]
    assert rid in caplog.text


# --- prepare --tokenizer: careless values ---------------------------------------------------------------

def prepare(own: Path, out: Path, spec) -> list[str]:
    return ["prepare", "files", str(own / "corpus"), "--out", str(out), "--tokenizer", str(spec), "--val-tokens",
            "1000", "--workers", "1", "--no-progress"]


def test_a_named_tiktoken_encoding_offline_is_one_line(own, tmp_path, capsys, monkeypatch):
    """It was requests' ConnectionError traceback."""
    import tiktoken

    def offline(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    refused(prepare(own, tmp_path / "o", "cl100k_base"), capsys, "--tokenizer cl100k_base", ".tiktoken")


def test_a_named_tiktoken_encoding_is_saved_with_its_shards(own, tmp_path, monkeypatch):
    """It prepared nothing: 'its ranks file is not known, so it cannot be saved'. Its ranks go into the
    bundle and read back with the same fingerprint (r50k_base is GPT-2's)."""
    import tiktoken

    from gptforge.data.tokenizer import gpt2_tokenizer, load_tokenizer, shard_tokenizer

    gpt2 = gpt2_tokenizer().enc
    assert load_tokenizer_named(monkeypatch, tiktoken, gpt2, "r50k_base").is_gpt2
    fake = tiktoken.Encoding(name="cl100k_base", pat_str=gpt2._pat_str, mergeable_ranks=gpt2._mergeable_ranks,
                             special_tokens={"<|endoftext|>": 50256, "<|fim_prefix|>": 50257})
    tok = load_tokenizer_named(monkeypatch, tiktoken, fake, "cl100k_base")
    assert main(prepare(own, tmp_path / "o", "cl100k_base")) == 0
    back = shard_tokenizer(tmp_path / "o")
    assert back.fingerprint == tok.fingerprint and back.special_tokens == tok.special_tokens
    assert load_tokenizer(tmp_path / "o").encode_ordinary("The king.") == tok.encode_ordinary("The king.")


def load_tokenizer_named(monkeypatch, tiktoken, enc, name):
    from gptforge.data.tokenizer import load_tokenizer

    monkeypatch.setattr(tiktoken, "get_encoding", lambda n: enc)
    return load_tokenizer(name)


BAD_SPECS = {
    "missing-file": (lambda d: "/nope/tok.json", "/nope/tok.json"),
    "not-a-tokenizer": (lambda d: (d / "x.json").write_text('{"a": 1}') and d / "x.json", "x.json"),
    "binary": (lambda d: (d / "x.bin").write_bytes(bytes(range(256)) * 4) and d / "x.bin", "x.bin"),
    "bad-ranks": (lambda d: (d / "x.tiktoken").write_text("not base64\n") and d / "x.tiktoken", "x.tiktoken"),
    "deep-json": (lambda d: (d / "x.json").write_text("[" * 100000 + "]" * 100000) and d / "x.json", "x.json"),
    "empty-folder": (lambda d: d, "hostile"),
    "truncated-info": (lambda d: (d / "info.json").write_text("{") and d, "info.json"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_prepare_refuses_a_bad_tokenizer_naming_it(own, tmp_path, capsys, case):
    make, needle = BAD_SPECS[case]
    d = tmp_path / "hostile"
    d.mkdir()
    refused(prepare(own, tmp_path / "o", make(d)), capsys, "--tokenizer", needle)


# --- tokenizer train: hostile input ----------------------------------------------------------------------

def train_tok(paths, out: Path, *extra: str) -> list[str]:
    return ["tokenizer", "train", *map(str, paths), "--out", str(out), "--trainer", "tokenizers", "--no-progress",
            *(extra or ("--vocab-size", "300"))]


def test_one_enormous_line_trains_a_tokenizer_gptforge_reads(tmp_path, capsys):
    """A corpus of one 2 MB line of a repeated pattern merged into an 8,192-character token, and the
    trainer's own output was refused: 'model.vocab holds a 8,192-character token (at most 4096)'."""
    from gptforge.data.tokenizer import MAX_TOKEN_BYTES, load_tokenizer

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("ab" * 1_000_000)
    assert main(train_tok([tmp_path / "c"], tmp_path / "tok")) == 0, capsys.readouterr().err
    tok = load_tokenizer(tmp_path / "tok")
    assert max(len(tok.decode_single_token_bytes(i)) for i in range(tok.n_vocab)
               if i not in tok.special_tokens.values()) <= MAX_TOKEN_BYTES


def _write(d: Path, name: str, data) -> Path:
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(data) if isinstance(data, bytes) else (d / name).write_text(data)
    return d


HOSTILE_CORPORA = {
    "empty-file": (lambda d: _write(d, "a.txt", ""), "no text to train on"),
    "empty-folder": (lambda d: _write(d, "a.bin", b"\0"), "holds no"),
    "binary": (lambda d: _write(d, "a.txt", bytes(range(256)) * 100), "not valid UTF-8"),
    "jsonl-no-text": (lambda d: _write(d, "a.jsonl", '{"text": 5}\n[1]\nnot json\n'), "a.jsonl"),
    "missing": (lambda d: d / "nope", "no such file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CORPORA))
def test_tokenizer_train_refuses_a_corpus_without_text(tmp_path, capsys, case):
    make, needle = HOSTILE_CORPORA[case]
    refused(train_tok([make(tmp_path / "c")], tmp_path / "tok"), capsys, needle)


@pytest.mark.parametrize("value", ["0", "-1", "10000000000", "abc", "1.5", "nan", "258"])
def test_tokenizer_train_refuses_a_bad_vocab_size(own, tmp_path, capsys, value):
    refused(train_tok([own / "corpus"], tmp_path / "tok", "--vocab-size", value), capsys, "--vocab-size")


def test_tokenizer_train_refuses_an_out_that_is_a_file(own, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    refused(train_tok([own / "corpus"], tmp_path / "f"), capsys, str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "x"


# --- shards whose tokenizer is not the model's, or not known -----------------------------------------------

TRAIN = ["--train.max_steps", "1", "--train.micro_batch", "2", "--train.seq_len", "32", "--train.total_batch_tokens",
         "64", "--train.val_every", "0", "--train.device", "cpu", "--train.val_tokens", "128", "--eval.every", "0",
         "--train.compile", "false"]


@pytest.fixture(scope="module")
def other_shards(own, tmp_path_factory):
    """Shards of the same corpus made by another trained tokenizer (320 ids)."""
    root = tmp_path_factory.mktemp("other")
    assert main(["tokenizer", "train", str(own / "corpus"), "--out", str(root / "tok2"), "--vocab-size", "320",
                 "--trainer", "tokenizers", "--no-progress"]) == 0
    assert main(prepare(own, root / "data2", root / "tok2")) == 0
    return root / "data2"


def test_shards_of_another_trained_tokenizer_are_refused_naming_both(own, other_shards, tmp_path, capsys):
    from gptforge.data.tokenizer import load_tokenizer, shard_tokenizer

    ours, theirs = load_tokenizer(own / "tok").short, shard_tokenizer(other_shards).short
    run, _ = copy_run(own, tmp_path, "run")
    refused(["train", "--resume", "--out", str(run), "--data.dir", str(other_shards), "--train.max_steps", "4"],
            capsys, ours, theirs)
    refused(["train", "--preset", "llama-tiny", "--data.dir", str(other_shards), "--out", str(tmp_path / "x"),
             "--init-from", str(own / "sft"), *TRAIN], capsys, ours, theirs)


def _manifest(fn):
    def damage(d: Path) -> None:
        shutil.rmtree(d / "tokenizer")
        m = json.loads((d / "manifest.json").read_text())
        (d / "manifest.json").write_text(json.dumps(fn(m)))
    return damage


def _info_dir(d: Path) -> None:
    (d / "tokenizer" / "info.json").unlink()
    (d / "tokenizer" / "info.json").mkdir()


SHARD_DAMAGE = {
    # these trained a fresh GPT-2-sized model on ids of another tokenizer, and its checkpoint claimed GPT-2
    "manifest-not-object": (_manifest(lambda m: [1, 2]), "manifest.json"),
    "manifest-settings-list": (_manifest(lambda m: {**m, "settings": [1]}), "manifest.json: settings"),
    "manifest-tokenizer-int": (_manifest(lambda m: {**m, "settings": {**m["settings"], "tokenizer": 5}}),
                               "settings.tokenizer"),
    "bundle-removed": (lambda d: shutil.rmtree(d / "tokenizer"), "holds no copy"),
    "info-truncated": (lambda d: (d / "tokenizer" / "info.json").write_text("{"), "info.json: not valid JSON"),
    "info-is-a-folder": (_info_dir, "info.json: not a file"),  # was "holds no copy of it"
}


@pytest.mark.parametrize("case", sorted(SHARD_DAMAGE))
def test_shards_whose_tokenizer_is_not_known_are_refused(own, tmp_path, capsys, case):
    damage, needle = SHARD_DAMAGE[case]
    data = tmp_path / "data"
    shutil.copytree(own / "data", data)
    damage(data)
    refused(["train", "--preset", "llama-tiny", "--data.dir", str(data), "--out", str(tmp_path / "x"), *TRAIN],
            capsys, needle)


# --- a self-consistent hostile bundle (every checksum and fingerprint recomputed: meta.json is not signed) ----

def reforge(ck: Path, edit) -> None:
    """Edit the checkpoint's tokenizer.json and recompute every sha256 and fingerprint that names it."""
    import hashlib

    tj = json.loads((ck / "tokenizer" / "tokenizer.json").read_text())
    edit(tj)
    text = json.dumps(tj)
    (ck / "tokenizer" / "tokenizer.json").write_text(text)
    ident = json.dumps({"kind": "hf", "tokenizer_json": tj}, sort_keys=True, separators=(",", ":"))  # Tokenizer.fingerprint
    fp, sha = hashlib.sha256(ident.encode()).hexdigest(), hashlib.sha256(text.encode()).hexdigest()
    info = json.loads((ck / "tokenizer" / "info.json").read_text())
    info["files"]["tokenizer.json"], info["fingerprint"] = sha, fp
    (ck / "tokenizer" / "info.json").write_text(json.dumps(info))

    def fix(meta):
        meta["tokenizer"]["files"]["tokenizer.json"], meta["tokenizer"]["fingerprint"] = sha, fp
        meta["files"]["tokenizer/tokenizer.json"] = sha
        meta["files"]["tokenizer/info.json"] = hashlib.sha256((ck / "tokenizer" / "info.json").read_bytes()).hexdigest()
    edit_meta(ck, fix)


def test_a_split_pattern_that_gives_up_is_a_refusal_not_a_rust_panic(own, tmp_path, capsys, monkeypatch):
    """Oniguruma's retry limit on a catastrophic pattern is a Rust panic: pyo3's PanicException, a
    BaseException that went through every `except Exception` as a traceback. The pattern blows up only
    after the prefix 'xq', which none of the load-time probe's runs hold (split_bounds: what the probe
    cannot promise), so it loads, and the one text it gives up on is refused at encode time."""
    run, ck = copy_run(own, tmp_path)
    def edit(tj):  # ignore_merges off keeps it on the tokenizers library (no tiktoken twin), whose panic this is
        tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"xq(a|aa)+c|\s+|."
        tj["model"]["ignore_merges"] = False

    reforge(ck, edit)
    assert main(sample(run)) == 0  # text the pattern copes with
    argv = sample(run)
    argv[argv.index("The king")] = "xq" + "a" * 40 + "!"
    refused(argv, capsys, "tokenizer.json", "gives up")
    import io  # in chat, one message the tokenizer gives up on is not sent; the session goes on

    monkeypatch.setattr("sys.stdin", io.StringIO("xq" + "a" * 40 + "!\nThe king\n/quit\n"))
    capsys.readouterr()
    assert main(["chat", "--ckpt", str(run), "--max-new-tokens", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(message not sent:" in out and "gives up" in out and out.count("assistant>") == 1


# issue 56, class 3: a split that is not linear in a line's length is refused when the tokenizer is read, through
# every door that reads one (a checkpoint's bundle, --tokenizer of a Hugging Face folder or a tiktoken bundle);
# each case: the pattern, and what the one-line refusal must say of it (the mechanism that caught it)
SLOW_SPLITS = {
    "nested": (r"(\w+\s?)*$|\s+|.", "nested quantifiers"),  # static: the fragment is named
    "nested-lazy": (r"(?:[a-z]+\d?){2,}?|.", "nested quantifiers"),
    "alternation": (r"(a|aa)+c|\s+|.", "gives up"),  # the probe: Oniguruma's retry limit on a run of 'a'
    "quadratic": (r"\w+\w+x|.", "us a character"),  # the probe: 1,000x a linear split's time per character
}


@pytest.mark.parametrize("case", sorted(SLOW_SPLITS))
def test_a_slow_split_in_a_checkpoint_is_refused_at_load(own, tmp_path, capsys, case):
    """Through the checkpoint's tokenizer bundle (sample, sft --resume read it): refused before any text is
    encoded, naming the file, the field and the pattern, with what to do."""
    pattern, needle = SLOW_SPLITS[case]
    run, ck = copy_run(own, tmp_path)

    def edit(tj):
        tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
        tj["model"]["ignore_merges"] = False

    reforge(ck, edit)
    line = refused(sample(run), capsys, "tokenizer.json", "pre_tokenizer.pretokenizers[0].pattern.Regex", needle, "Fix:")
    assert repr(pattern)[:60] in line
    refused(sft_resume(run, own), capsys, "tokenizer.json", needle)


@pytest.mark.parametrize("case", ["nested", "quadratic"])
def test_prepare_refuses_a_slow_split_of_a_hf_folder(own, tmp_path, capsys, case):
    """``prepare --tokenizer DIR`` of a Hugging Face folder: one line, before a worker starts."""
    pattern, needle = SLOW_SPLITS[case]
    d = tmp_path / "hf"
    d.mkdir()
    tj = json.loads((own / "tok" / "tokenizer" / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
    (d / "tokenizer.json").write_text(json.dumps(tj))
    refused(prepare(own, tmp_path / "o", d), capsys, "--tokenizer", str(d / "tokenizer.json"), needle, "Fix:")
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.bin"))


@pytest.mark.parametrize("normalizer", [
    {"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 10000},
    {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": ""},
                                                           "content": "b" * 1000}]},
])
def test_a_normalizer_that_multiplies_text_is_refused(own, tmp_path, capsys, normalizer):
    """A 10,000-character Replace made a 1,000-character prompt 1.6 GB of encoding."""
    run, ck = copy_run(own, tmp_path)
    reforge(ck, lambda tj: tj.__setitem__("normalizer", normalizer))
    refused(sample(run), capsys, "tokenizer.json", "normalizer", "multiply")
    refused(sft_resume(run, own), capsys, "tokenizer.json", "normalizer", "multiply")


def sft_init(src: Path, own: Path, out: Path) -> list[str]:
    return ["sft", "--init-from", str(src), "--data", str(own / "convs.jsonl"), "--out", str(out), "--val-count", "4",
            "--train.max_steps", "1", *SMALL]


def test_a_tokenizers_own_hostile_template_is_refused_naming_its_file(own, tmp_path, capsys):
    """The template a base model's tokenizer brings (sft tunes with it) was named only 'chat_template'."""
    run, ck = copy_run(own, tmp_path, "run")
    edit_meta(ck, lambda m: m["tokenizer"].__setitem__("chat_template", "{{ ''.__class__.__mro__ }}"))
    refused(sft_init(run, own, tmp_path / "s1"), capsys, "meta.json (tokenizer.chat_template)", "Python internals")
    assert main(["export", "hf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "hf")]) == 0
    cfg = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for %}"
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(cfg))
    refused(sft_init(tmp_path / "hf", own, tmp_path / "s2"), capsys, "tokenizer_config.json (chat_template)", "syntax")


# --- a tiktoken bundle -------------------------------------------------------------------------------

@pytest.fixture
def tiktoken_bundle(tmp_path):
    """A 258-id tiktoken bundle (256 bytes, one merge, <|endoftext|>), and a writer of forged copies whose
    sha256 and fingerprint are recomputed (so only the checks of what they say can refuse them)."""
    import hashlib

    from gptforge.data.tokenizer import save_tokenizer, tiktoken_from_ranks
    from gptforge.data.tokenizer_train import write_ranks

    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 256
    write_ranks(ranks, tmp_path / "r.tiktoken")
    save_tokenizer(tiktoken_from_ranks(tmp_path / "r.tiktoken", special_tokens={"<|endoftext|>": 257}, name="small"),
                   tmp_path / "good")
    good = json.loads((tmp_path / "good" / "tokenizer" / "info.json").read_text())
    lines = (tmp_path / "r.tiktoken").read_text().splitlines(keepends=True)

    def forge(name: str, drop: int | None = None, specials: dict | None = None, **fields) -> Path:
        text = "".join(line for k, line in enumerate(lines) if k != drop)
        d = tmp_path / name / "tokenizer"
        d.mkdir(parents=True)
        (d / "ranks.tiktoken").write_text(text)
        info = json.loads(json.dumps(good))
        sha = hashlib.sha256(text.encode()).hexdigest()
        info["files"]["ranks.tiktoken"] = sha
        if specials is not None:
            info["special_tokens"] = specials
        info.update(fields)
        ident = {"kind": "tiktoken", "ranks_sha256": sha, "pattern": info["pattern"],
                 "special_tokens": sorted(info["special_tokens"].items())}
        info["fingerprint"] = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        (d / "info.json").write_text(json.dumps(info))
        return d.parent

    return forge


def test_a_tiktoken_bundle_missing_a_byte_is_refused(tiktoken_bundle, own, tmp_path, capsys):
    """tiktoken panicked (PanicException: 'no entry found for key') on the first text holding byte 0x00."""
    bundle = tiktoken_bundle("nobyte", drop=0)
    refused(prepare(own, tmp_path / "o", bundle), capsys, "info.json", "ranks", "0x00")


def test_a_tiktoken_bundle_without_an_eos_is_refused(tiktoken_bundle, own, tmp_path, capsys):
    """It was KeyError: '<|endoftext|>' out of tiktoken's eot_token."""
    bundle = tiktoken_bundle("noeos", specials={"<|pad|>": 257}, eos=None)
    refused(prepare(own, tmp_path / "o", bundle), capsys, "info.json", "no bos or eos")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_prepare_names_the_document_a_split_gives_up_on(own, tmp_path, capsys, workers):
    """A pattern the load-time probe cannot reach (it blows up only after 'xq') loads; the one document it gives
    up on is named (file, and what to do), in the main process and through a worker pool alike."""
    d = tmp_path / "hf"
    d.mkdir()
    tj = json.loads((own / "tok" / "tokenizer" / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"xq(a|aa)+c|\s+|."
    tj["model"]["ignore_merges"] = False  # the tokenizers library, whose engine gives up (no tiktoken twin)
    (d / "tokenizer.json").write_text(json.dumps(tj))
    corpus = tmp_path / "corpus"
    shutil.copytree(own / "corpus", corpus)
    (corpus / "zz_bad.txt").write_text("the king\nxq" + "a" * 40 + "!\n")
    argv = prepare(own, tmp_path / "o", d)
    argv[2], argv[argv.index("--workers") + 1] = str(corpus), workers
    refused(argv, capsys, "zz_bad.txt", "gives up", "Fix: remove or split this document")


@pytest.mark.parametrize(("pattern", "needle"), [(r"(\w+\s?)*$|.", "nested quantifiers"),
                                              (r"\s*\s*\s*x|.", "1,000,000-character line")])
def test_a_tiktoken_bundle_with_a_slow_split_is_refused(tiktoken_bundle, own, tmp_path, capsys, pattern, needle):
    """A tiktoken bundle's split pattern is read from its info.json: the same check, in tiktoken's own
    engine (fancy-regex), where a cubic pattern grows 16x for 4x the text."""
    bundle = tiktoken_bundle("slow", pattern=pattern)
    refused(prepare(own, tmp_path / "o", bundle), capsys, "info.json", "pattern", needle, "Fix:")


# --- a Hugging Face model's tokenizer ----------------------------------------------------------------------

def test_a_damaged_hub_tokenizer_is_refused_not_swapped_for_gpt2(tmp_path, monkeypatch):
    """A downloaded tokenizer.json that gptforge refuses was silently replaced by GPT-2's."""
    import huggingface_hub

    from gptforge.data.tokenizer import TokenizerError
    from gptforge.load import ModelSource, load_tokenizer_of

    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}')
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **kw: str(tmp_path / name))
    with pytest.raises(TokenizerError, match="tokenizer.json: model.merges"):
        load_tokenizer_of(ModelSource(hf="someone/model"))


def test_a_hf_directory_whose_tokenizer_json_is_a_folder_is_refused(own, tmp_path, capsys):
    """It was GPT-2's tokenizer on a 300-id model, silently."""
    assert main(["export", "hf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "tokenizer.json").unlink()
    (tmp_path / "hf" / "tokenizer.json").mkdir()
    refused(["sample", "--hf", str(tmp_path / "hf"), "--prompt", "The king", "--num-samples", "1",
             "--max-new-tokens", "2", "--device", "cpu"], capsys, "tokenizer.json", "not a file")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_hf_tokenizers_side_file_that_is_a_folder_is_named(own, tmp_path, capsys, name):
    """tokenizer_config.json (bos, eos, the chat template) as a folder was skipped in silence."""
    assert main(["export", "hf", "--ckpt", str(own / "run"), "--out", str(tmp_path / "hf")]) == 0
    if name == "chat_template.jinja":
        cfg = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(cfg))
    else:
        (tmp_path / "hf" / name).unlink()
    (tmp_path / "hf" / name).mkdir()
    refused(prepare(own, tmp_path / "o", tmp_path / "hf"), capsys, name, "not a file")


def test_a_huge_added_token_is_refused(own, tmp_path, capsys):
    """A 1 MB special token went into every special-token regex (chat rendering, encode(allowed_special))."""
    run, ck = copy_run(own, tmp_path)
    reforge(ck, lambda tj: tj["added_tokens"][-1].__setitem__("content", "<|" + "x" * (1 << 20) + "|>"))
    refused(sample(run), capsys, "tokenizer.json", "added_tokens[2].content")


def test_chat_says_a_refused_message_and_goes_on(own, tmp_path, capsys, monkeypatch):
    """A message the template refuses ends that message, not the session (as a too-long one already did)."""
    import io

    run, ck = copy_run(own, tmp_path)
    set_template(ck, "{% if messages[-1]['content'] == 'bad' %}{{ raise_exception('no bad words') }}{% endif %}"
                     "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr("sys.stdin", io.StringIO("bad\nSay crown\n/quit\n"))
    capsys.readouterr()
    assert main(["chat", "--ckpt", str(run), "--max-new-tokens", "3", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(message not sent:" in out and "no bad words" in out and out.count("assistant>") == 1
