"""A Hugging Face GPT-2 directory that carries a ``tokenizer.json`` (the hub's ``gpt2`` does, and so does
every ``GPT2TokenizerFast.save_pretrained``) speaks GPT-2's tokenizer: gptforge reads it as GPT-2's
ranks, so gptforge's chat template applies and ``sft --init-from`` tunes it into a chat model (it was
refused as "a tokenizer with no chat template"). A tokenizer.json that differs from GPT-2's, or that
brings its own chat template, stays the model's own."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_tok_dir(tmp_path_factory):
    """GPT-2's tokenizer as transformers saves it: vocab.json + merges.txt converted by transformers'
    own GPT2TokenizerFast into tokenizer.json (the hub's gpt2 layout)."""
    from transformers import GPT2TokenizerFast

    from gptforge.interop.hf_tokenizer import write_hf_tokenizer

    d = tmp_path_factory.mktemp("gpt2tok")
    write_hf_tokenizer(d)
    GPT2TokenizerFast.from_pretrained(d).save_pretrained(d)
    assert (d / "tokenizer.json").exists()
    return d


TEXT = "Which is larger, 37 or 48? The answer is 48.\n\n  It's naïve café 日本語 <|endoftext|> done"


def _tok(d):
    from gptforge.load import ModelSource, load_tokenizer_of

    return load_tokenizer_of(ModelSource(hf=str(d)))


def test_gpt2_tokenizer_json_is_gpt2s_tokenizer(gpt2_tok_dir):
    from transformers import AutoTokenizer

    from gptforge.data.chat import ChatTemplate, default_template

    tok = _tok(gpt2_tok_dir)
    assert tok.is_gpt2 and tok.kind == "tiktoken"
    ref = AutoTokenizer.from_pretrained(gpt2_tok_dir)  # the independent encoder of the same file
    assert tok.encode(TEXT) == ref(TEXT, split_special_tokens=True)["input_ids"]
    assert default_template(tok).to_dict() == ChatTemplate.gpt2().to_dict()  # a base GPT-2 is tuned with gptforge's


def test_other_tokenizer_json_stays_its_own(gpt2_tok_dir, tmp_path):
    # the same file with two merges swapped: another encoder, however close
    j = json.loads((gpt2_tok_dir / "tokenizer.json").read_text())
    merges = j["model"]["merges"]
    merges[100], merges[101] = merges[101], merges[100]
    swapped = tmp_path / "swapped"
    shutil.copytree(gpt2_tok_dir, swapped)
    (swapped / "tokenizer.json").write_text(json.dumps(j))
    tok = _tok(swapped)
    assert tok.kind == "hf" and not tok.is_gpt2
    # GPT-2's file with a chat template of its own: the template is the model's, so its tokenizer stays
    templated = tmp_path / "templated"
    shutil.copytree(gpt2_tok_dir, templated)
    cfg = json.loads((templated / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (templated / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = _tok(templated)
    assert tok.kind == "hf" and tok.chat_template
