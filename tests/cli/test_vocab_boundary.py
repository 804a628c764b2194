"""Issue 56 class 7: a tokenizer one id larger than the model, and the reverse, at every door.

A trained 320-id tokenizer (ids 0..319) with three Llama models from transformers of 319, 320 and 321
rows (``vocab_size``; each padded to 384 embedding rows by the importer). The independent expectation is
the arithmetic of ids: a tokenizer of n ids needs logits 0..n-1, so a model of n-1 is refused by name at
every door (train on the tokenizer's shards, import, sample, chat, serve, export hf and gguf), and models
of n and n+1 work (a GGUF file lists n+1 tokens, the last one unused). sft is the one door that widens a
model's logits onto its padded rows (a base of n-1 takes the tokenizer's n), and the shared checks are
tested at n-1, n and n+1 directly: ``check_fits`` on the logits (``vocab_size``), the chat templates'
``check_model`` on the embedding rows (``padded_vocab_size``), stored templates' ids.

Plants tried (each fails here): ``tok.n_vocab > vocab_size`` -> ``>=`` and -> ``> vocab_size + 1`` in
check_fits; ``rows < self.tok.n_vocab`` -> ``<=`` and ``rows < self.vocab_size`` -> ``<=`` in the two
check_model; ``tok.n_vocab > vocab_size`` -> ``>=`` in JinjaChatTemplate.from_dict; ``v >= vocab_size``
-> ``v > vocab_size`` in ChatTemplate.from_dict; load_tokenizer_of's check_fits skipped.
"""

from __future__ import annotations

import io
import json
import shutil
from types import SimpleNamespace

import pytest

from gptforge.cli import main
from tests.conftest import WORDS, word_corpus

N = 320  # the tokenizer's ids: 0..319


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gptforge.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("vocab")
    word_corpus(root / "corpus")
    assert main(["tokenizer", "train", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", str(N),
                 "--trainer", "tokenizers", "--no-progress"]) == 0
    tok = load_tokenizer(root / "tok")
    assert tok.n_vocab == N and tok.chat_template
    for V in (N - 1, N, N + 1):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
        d = root / f"hf{V}"
        LlamaForCausalLM(cfg).save_pretrained(d)
        shutil.copy(root / "tok" / "tokenizer" / "tokenizer.json", d / "tokenizer.json")
        (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                             "chat_template": tok.chat_template}))
    rows = [{"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w} {w}."}]}
            for w in WORDS[:8]]
    (root / "convs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root, tok


REFUSAL = f"the model's vocab_size (hf)={N - 1} is smaller than the tokenizer"
ADVICE = f"which produces ids up to {N - 1}: the vocabulary does not fit the model (use --model.vocab_size {N} or more)"


def _doors(root, V, out):
    d = str(root / f"hf{V}")
    return {
        "import": ["import", "hf", "--model", d, "--out", str(out / "imp")],
        "sample": ["sample", "--hf", d, "--prompt", "The king", "--num-samples", "1", "--max-new-tokens", "3",
                   "--device", "cpu"],
        "chat": ["chat", "--hf", d, "--max-new-tokens", "3", "--device", "cpu"],
        "export hf": ["export", "hf", "--hf", d, "--out", str(out / "ehf")],
        "export gguf": ["export", "gguf", "--hf", d, "--out", str(out / "egguf")],
    }


def test_every_door_refuses_a_model_one_id_short_of_its_tokenizer_by_name(world, tmp_path, capsys, monkeypatch):
    root, _ = world
    for door, argv in _doors(root, N - 1, tmp_path).items():
        monkeypatch.setattr("sys.stdin", io.StringIO("Say crown\n/quit\n"))
        capsys.readouterr()
        assert main(argv) == 2, door
        err = capsys.readouterr().err
        assert REFUSAL in err and ADVICE in err and len(err.strip().splitlines()) == 1, (door, err)
        assert not any((tmp_path / o).exists() for o in ("imp", "ehf", "egguf")), door  # refused before writing
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    # --port 0, a free port: serve binds it before loading, then refuses
    assert main(["serve", "--hf", str(root / f"hf{N - 1}"), "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert REFUSAL in err and ADVICE in err, err


@pytest.mark.parametrize("V", [N, N + 1])
def test_every_door_works_for_a_model_as_large_as_its_tokenizer_or_one_row_larger(world, tmp_path, capsys, monkeypatch, V):
    root, tok = world
    for door, argv in _doors(root, V, tmp_path).items():
        monkeypatch.setattr("sys.stdin", io.StringIO("Say crown\n/quit\n"))
        assert main(argv) == 0, (door, capsys.readouterr().err)
    pytest.importorskip("gguf")
    from gguf import GGUFReader

    r = GGUFReader(str(next((tmp_path / "egguf").glob("*.gguf"))))
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    assert len(tokens) == V and tokens[N - 1] == "<|im_end|>"  # every tokenizer id in place
    assert tokens[N:] == [f"<|unused_{i}|>" for i in range(N, V)]  # the model's extra row, unused
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    meta = read_meta(latest_checkpoint(tmp_path / "imp"))
    assert meta["config"]["model"]["vocab_size"] == V and meta["tokenizer"]["n_vocab"] == N


def test_sft_widens_a_base_one_id_short_onto_its_padded_rows(world, tmp_path):
    """sft's own rule (prepare_chat_model): the chat tokens need embedding rows, which the padded base has;
    its logits are widened to the tokenizer's n ids, and the run's checkpoint then fits its tokenizer."""
    from gptforge.run.checkpoint import latest_checkpoint, read_meta

    root, _ = world
    for V, want in ((N - 1, N), (N + 1, N + 1)):
        assert main(["sft", "--init-from", str(root / f"hf{V}"), "--data", str(root / "convs.jsonl"), "--out",
                     str(tmp_path / f"s{V}"), "--val-count", "2", "--train.max_steps", "1", "--train.micro_batch", "2",
                     "--train.seq_len", "32", "--train.total_batch_tokens", "64", "--train.val_every", "0",
                     "--train.device", "cpu"]) == 0
        assert read_meta(latest_checkpoint(tmp_path / f"s{V}"))["config"]["model"]["vocab_size"] == want


def test_training_on_the_tokenizers_shards_refuses_a_vocab_one_short_and_takes_an_equal_one(world, tmp_path, capsys):
    root, _ = world
    assert main(["prepare", "files", str(root / "corpus"), "--out", str(tmp_path / "data"), "--tokenizer",
                 str(root / "tok"), "--val-tokens", "2000", "--workers", "1", "--no-progress"]) == 0
    common = ["train", "--preset", "llama-tiny", "--data.dir", str(tmp_path / "data"), "--train.max_steps", "1",
              "--train.micro_batch", "2", "--train.seq_len", "32", "--model.block_size", "64",
              "--train.total_batch_tokens", "64", "--train.val_every", "0", "--train.val_tokens", "128",
              "--train.device", "cpu", "--train.compile", "false", "--eval.every", "0"]
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "short"), "--model.vocab_size", str(N - 1)]) == 2
    err = capsys.readouterr().err
    assert f"model.vocab_size={N - 1} is smaller than the tokenizer" in err and f"--model.vocab_size {N} or more" in err
    assert main([*common, "--out", str(tmp_path / "equal"), "--model.vocab_size", str(N)]) == 0


# --- the shared checks every door calls, at n-1, n and n+1 ---------------------------------------------------

def test_the_shared_checks_at_the_boundary(world, tmp_path):
    from gptforge.data.chat import ChatTemplate
    from gptforge.data.chat_jinja import JinjaChatTemplate
    from gptforge.data.tokenizer import TokenizerError, check_fits
    from gptforge.errors import ChatFormatError
    from gptforge.load import ModelSource, load_tokenizer_of

    root, tok = world
    check_fits(tok, N)  # logits 0..n-1: every id of the tokenizer
    check_fits(tok, N + 1)
    with pytest.raises(TokenizerError, match=f"model.vocab_size={N - 1} is smaller .* ids up to {N - 1}"):
        check_fits(tok, N - 1)

    jinja = JinjaChatTemplate(tok.chat_template, tok)
    jinja.check_model(SimpleNamespace(padded_vocab_size=N))  # embedding rows 0..n-1
    with pytest.raises(ChatFormatError, match=f"the model has {N - 1} embedding rows .* ids up to {N - 1}"):
        jinja.check_model(SimpleNamespace(padded_vocab_size=N - 1))
    d = jinja.to_dict()
    JinjaChatTemplate.from_dict(d, tok, vocab_size=N)
    with pytest.raises(ChatFormatError, match=f"ids up to {N - 1}, beyond model.vocab_size={N - 1}"):
        JinjaChatTemplate.from_dict(d, tok, vocab_size=N - 1)

    gpt2 = ChatTemplate.gpt2()  # gptforge's own chat ids on GPT-2's padded rows: 50257..vocab_size-1
    gpt2.check_model(SimpleNamespace(padded_vocab_size=gpt2.vocab_size))
    with pytest.raises(ChatFormatError, match=f"has {gpt2.vocab_size - 1} embedding rows"):
        gpt2.check_model(SimpleNamespace(padded_vocab_size=gpt2.vocab_size - 1))
    top = max([gpt2.bos, gpt2.end, *gpt2.roles.values()])
    ChatTemplate.from_dict(gpt2.to_dict(), vocab_size=top + 1)  # the largest id is the last row
    with pytest.raises(ChatFormatError, match=f"={top}: expected a token id, an integer >= 0 and below model.vocab_size={top}"):
        ChatTemplate.from_dict(gpt2.to_dict(), vocab_size=top)

    # the one function every door's words() calls, for each kind of source
    assert main(["import", "hf", "--model", str(root / f"hf{N}"), "--out", str(tmp_path / "ck")]) == 0
    for source in (ModelSource(ckpt=str(tmp_path / "ck")), ModelSource(hf=str(root / f"hf{N}"))):
        for V in (N, N + 1):
            assert load_tokenizer_of(source, SimpleNamespace(config=SimpleNamespace(vocab_size=V))).n_vocab == N
        with pytest.raises(TokenizerError, match=f"={N - 1} is smaller than the tokenizer"):
            load_tokenizer_of(source, SimpleNamespace(config=SimpleNamespace(vocab_size=N - 1)))
