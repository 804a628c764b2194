"""The tokenizer seam (gptforge.data.tokenizer): encode equals the independent implementations, bundles
round-trip and refuse damage, and no module reaches past the seam for GPT-2's tokenizer."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

from gptforge.data import tokenizer as tk

SRC = Path(__file__).resolve().parents[2] / "src" / "gptforge"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def random_strings(n: int, seed: int = 0) -> list[str]:
    """Unicode, whitespace runs, digits, punctuation, contractions and special-token text typed as text."""
    rng = random.Random(seed)
    pools = ["hello", "world", " the", "Ünïcödé", "naïve", "日本語", "中文字符", "😀🎉", "👩‍👩‍👧", "Привет", "مرحبا",
             "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "123", "4567890", "3.14", "1,000", "'s", "'ll", "'VE",
             "don't", "!!", "?", "...", "<|", "|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "def f(x):",
             "    return x", "{}", "#", "\u00a0", "\u2028", "a\u0301", "ﬁ", "ß", "İ", "𝔘𝔫𝔦"]
    return ["".join(rng.choice(pools) for _ in range(rng.randint(0, 12))) for _ in range(n)]


def train_small(tmp_path: Path, vocab: int = 600) -> Path:
    """A small byte-level BPE (GPT-4's split, ChatML specials) trained with the tokenizers library,
    written as a Hugging Face directory with a tokenizer_config.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(tk.GPT4_PAT), "isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(random_strings(400, seed=1) + ["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    d = tmp_path / "hfdir"
    d.mkdir()
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": "<|endoftext|>"}))
    return d


# --- fidelity against independent implementations ---------------------------------------------------


def test_hf_tokenizer_encodes_as_transformers_on_10000_strings(tmp_path):
    from transformers import PreTrainedTokenizerFast

    d = train_small(tmp_path)
    ours = tk.load_tokenizer(d)
    assert ours._fast is not None  # a trained BPE with ignore_merges runs on its tiktoken twin: checked here
    ref = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    strings = random_strings(10_000)
    for s in strings:
        ids = ours.encode_ordinary(s)
        assert ids == ref(s, add_special_tokens=False, split_special_tokens=True)["input_ids"], s
        assert ours.decode(ids) == s
    assert [a.tolist() for a in ours.encode_batch_numpy(strings[:500])] == [ours.encode_ordinary(s) for s in strings[:500]]
    # special tokens parse only where allowed
    s = "a<|im_start|>b<|endoftext|>"
    assert ours.encode(s, allowed_special="all") == ref(s, add_special_tokens=False)["input_ids"]
    assert ours.special_tokens["<|im_start|>"] not in ours.encode_ordinary(s)


def test_gpt2_encodes_as_the_tokenizers_library_on_10000_strings(tokenizer):
    """tiktoken's GPT-2 against the tokenizers library running the same ranks as byte-level BPE merges
    (the conversion export hf writes): two implementations of one tokenizer."""
    from tokenizers import Tokenizer

    from gptforge.interop.hf_tokenizer import tokenizer_json_of

    ref = Tokenizer.from_str(tokenizer_json_of(tokenizer))
    ref.encode_special_tokens = True
    for s in random_strings(10_000, seed=2):
        ids = tokenizer.encode_ordinary(s)
        assert ids == ref.encode(s, add_special_tokens=False).ids, s
        assert tokenizer.decode(ids) == s
    assert tokenizer.encode_ordinary("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]


def test_decoding_every_id_streams_and_joins_like_the_library(tmp_path):
    """Per-token bytes (what a generation stream prints) joined equal the library's own decode."""
    from tokenizers import Tokenizer

    d = train_small(tmp_path)
    ours = tk.load_tokenizer(d)
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = list(range(ours.n_vocab))
    random.Random(0).shuffle(ids)
    for chunk in (ids[i : i + 7] for i in range(0, len(ids), 7)):
        assert ours.decode(chunk) == ref.decode(chunk, skip_special_tokens=False)
    assert ours.decode([ours.n_vocab + 5]) == f"<|{ours.n_vocab + 5}|>"  # a padded row never crashes a stream


# --- bundles --------------------------------------------------------------------------------------------


def test_a_bundle_round_trips_and_keeps_its_fingerprint(tmp_path, tokenizer):
    d = train_small(tmp_path)
    hf = tk.load_tokenizer(d)
    assert hf.eos_token_id == hf.eot_token == hf.special_tokens["<|endoftext|>"]
    info = tk.save_tokenizer(hf, tmp_path / "b")
    again = tk.load_tokenizer(tmp_path / "b")
    assert again.fingerprint == hf.fingerprint == info["fingerprint"]
    assert again.encode_ordinary("héllo world 42") == hf.encode_ordinary("héllo world 42")
    # a respelled tokenizer.json (indentation) is the same tokenizer
    (tmp_path / "re").mkdir()
    (tmp_path / "re" / "tokenizer.json").write_text(json.dumps(json.loads((d / "tokenizer.json").read_text()), indent=3))
    assert tk.load_tokenizer(tmp_path / "re").fingerprint == hf.fingerprint
    # GPT-2 is recorded by name: no copy of its ranks
    g = tk.save_tokenizer(tokenizer, tmp_path / "g")
    assert g["files"] == {} and g["builtin"] == "gpt2" and tk.load_tokenizer(tmp_path / "g").is_gpt2
    assert hf.fingerprint != tokenizer.fingerprint and not hf.is_gpt2


def test_damaged_bundles_are_refused_naming_the_file(tmp_path):
    d = train_small(tmp_path)
    tk.save_tokenizer(tk.load_tokenizer(d), tmp_path / "b")
    f = tmp_path / "b" / "tokenizer" / "tokenizer.json"
    f.write_text(f.read_text().replace('"<|im_end|>"', '"<|im_END|>"'))
    with pytest.raises(tk.TokenizerError, match="tokenizer.json: does not match the sha256"):
        tk.load_tokenizer(tmp_path / "b")
    info = tmp_path / "b" / "tokenizer" / "info.json"
    tk.save_tokenizer(tk.load_tokenizer(d), tmp_path / "b")
    meta = json.loads(info.read_text())
    meta["fingerprint"] = "0" * 64
    info.write_text(json.dumps(meta))
    with pytest.raises(tk.TokenizerError, match="fingerprint"):
        tk.load_tokenizer(tmp_path / "b")
    meta["files"] = {"../../etc/passwd": "0"}
    info.write_text(json.dumps(meta))
    with pytest.raises(tk.TokenizerError, match="not a file name of the bundle"):
        tk.load_tokenizer(tmp_path / "b")
    info.write_text("{not json")
    with pytest.raises(tk.TokenizerError, match="info.json: not valid JSON"):
        tk.load_tokenizer(tmp_path / "b")


def _broken(tmp_path: Path, name: str, edit) -> Path:
    d = train_small(tmp_path) if not (tmp_path / "hfdir").exists() else tmp_path / "hfdir"
    obj = json.loads((d / "tokenizer.json").read_text())
    edit(obj)
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(obj))
    return out


@pytest.mark.parametrize("name, edit, message", [
    ("dup_id", lambda o: o["model"]["vocab"].__setitem__("zzzz", 5), "duplicate id"),
    ("neg_id", lambda o: o["model"]["vocab"].__setitem__("zzzz", -1), "outside"),
    ("huge_id", lambda o: o["model"]["vocab"].__setitem__("zzzz", 1 << 40), "outside"),
    ("str_id", lambda o: o["model"]["vocab"].__setitem__("zzzz", "7"), "not an integer id"),
    ("merge_unknown", lambda o: o["model"]["merges"].insert(0, ["qqq", "rrr"]), "not in model.vocab"),
    ("merge_shape", lambda o: o["model"]["merges"].insert(0, ["a"]), "expected two tokens"),
    ("special_collides", lambda o: o["added_tokens"].append(
        {"id": 10_000, "content": next(iter(o["model"]["vocab"])), "special": True}), "collides with the ordinary"),
    ("special_dup_id", lambda o: o["added_tokens"].append({"id": 40, "content": "<|new|>", "special": True}),
     "already has: duplicate id"),
    ("no_model", lambda o: o.pop("model"), "no \"model\" object"),
])
def test_bad_tokenizer_files_are_one_line_refusals(tmp_path, name, edit, message):
    path = _broken(tmp_path, name, edit)
    with pytest.raises(tk.TokenizerError, match=message) as e:
        tk.load_tokenizer(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_huge_truncated_and_binary_files_are_refused_before_parsing(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: nothing is read or allocated before the size check
        f.truncate(tk.MAX_TOKENIZER_BYTES + 1)
    with pytest.raises(tk.TokenizerError, match="larger than any tokenizer"):
        tk.load_tokenizer(big)
    d = train_small(tmp_path)
    text = (d / "tokenizer.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(tk.TokenizerError, match="not valid JSON.*truncated"):
        tk.load_tokenizer(tmp_path / "cut.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(tk.TokenizerError, match="not UTF-8"):
        tk.load_tokenizer(tmp_path / "bin.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tk.TokenizerError):
        tk.load_tokenizer(tmp_path / "deep.json")


def test_a_vocabulary_larger_than_the_model_is_refused(tokenizer):
    with pytest.raises(tk.TokenizerError, match="does not fit the model"):
        tk.check_fits(tokenizer, 3000)
    tk.check_fits(tokenizer, 50304)  # padded rows are fine


# --- the seam is the only door ------------------------------------------------------------------------

# Modules that may name GPT-2's tokenizer directly, and why: each is a default for callers that pass
# none (old checkpoints, tests), or GPT-2-specific by nature. Any other module takes its tokenizer
# from its model (gptforge.load.load_tokenizer_of / cli.common.words) or from the run's recipe.
GPT2_DEFAULT_OK = {
    "data/chat.py": "gptforge's own template belongs to GPT-2's vocabulary",
    "load.py": "llm.c files, random weights and GPT-2 HF directories speak GPT-2",
    "interop/hf_tokenizer.py": "GPT-2's ranks as vocab.json/merges.txt for GPT-2 exports",
    "eval/run.py": "default of prepare_tasks(enc=None)",
    "serve/app.py": "default of create_app(enc=None)",
    "training/recipe.py": "default of a recipe built without a tokenizer",
    "training/evaluate.py": "default of print_samples(enc=None)",
    "bench/prepare.py": "benchmarks GPT-2's encoder",
    "data/tokenizer_train.py": "GPT-2 is the bytes-per-token report's baseline",
}
# Modules that may import tiktoken itself, and why
TIKTOKEN_OK = {
    "data/tokenizer_train.py": "checks a split pattern compiles in tiktoken's regex engine",
    "run/metrics.py": "records tiktoken's version in env.json",
}


def test_no_module_reaches_past_the_seam_for_a_tokenizer():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("data/tokenizer/"):  # the seam itself (its kinds, bundles and checks)
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == "get_tokenizer" or (name in ("get_encoding", "Encoding") and rel not in TIKTOKEN_OK):
                offenders.append(f"{rel}:{node.lineno}: {name}()")
            if name == "gpt2_tokenizer" and rel not in GPT2_DEFAULT_OK:
                offenders.append(f"{rel}:{node.lineno}: gpt2_tokenizer() outside the seam's allowed defaults")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and rel not in TIKTOKEN_OK:
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m == "tiktoken" or m.startswith("tiktoken.") for m in mods):
                    offenders.append(f"{rel}:{node.lineno}: imports tiktoken (use gptforge.data.tokenizer)")
    assert not offenders, "\n".join(offenders)


def test_a_bpe_without_ignore_merges_stays_on_the_library(tmp_path):
    """The tiktoken twin takes a whole-token piece whole; a file without ignore_merges may not, so it
    keeps the tokenizers library (and still equals it)."""
    from tokenizers import Tokenizer

    d = train_small(tmp_path)
    obj = json.loads((d / "tokenizer.json").read_text())
    obj["model"]["ignore_merges"] = False
    (tmp_path / "plain.json").write_text(json.dumps(obj))
    ours = tk.load_tokenizer(tmp_path / "plain.json")
    assert ours._fast is None
    ref = Tokenizer.from_str(json.dumps(obj))
    ref.encode_special_tokens = True
    for s in random_strings(500, seed=3):
        assert ours.encode_ordinary(s) == ref.encode(s, add_special_tokens=False).ids
