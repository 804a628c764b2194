"""Issue 56 class 7, the tokenizer seam at its edges.

* Overlapping special tokens (``<|im``, ``<|im_start|>``, ``<|im_start|>assistant``, ``im_end|>``): which one
  a text becomes is the ``tokenizers`` library's rule (leftmost, then longest: its added-vocabulary
  matcher), compared on the same tokenizer.json for ``Tokenizer.encode(allowed_special="all")`` and for a
  Jinja chat template's ids (transformers' ``apply_chat_template`` as the reference).
* Every field of a tokenizer bundle's entry (info.json, and a checkpoint's meta.json ``"tokenizer"``),
  walked programmatically: an edit of a field is refused, or the field is one of the settings the
  files cannot confirm (``ENTRY_SETTINGS``) and the tokenizer read back carries the edited value. A field
  a kind adds later is walked by construction (no list of fields here).
* The identity: each part of a tiktoken tokenizer's ``_identity`` changed alone changes its fingerprint.

Plants tried (each fails here): ``reverse=True`` dropped from the longest-first sort in
``Tokenizer.encode`` and in ``JinjaChatTemplate``; ``ranks_sha256`` (the field an edit went through
unrefused before this test) and ``eot`` left out of ``_check_entry_agrees``; ``pattern`` dropped from
``TiktokenTokenizer._identity``; ``eos`` not passed when a bundle is rebuilt.
"""

from __future__ import annotations

import base64
import copy
import json

import pytest

from gptforge.data.tokenizer import TokenizerError, read_tokenizer_dir, save_tokenizer
from gptforge.data.tokenizer.bundle import ENTRY_SETTINGS, tokenizer_from_meta
from gptforge.data.tokenizer.hf_kind import hf_tokenizer_from_dir
from gptforge.data.tokenizer.tiktoken_kind import tiktoken_from_ranks

# overlapping on purpose: prefixes of each other (<|im, <|im_start|>, <|im_start|>assistant) and a suffix of
# another (im_end|> inside <|im_end|>, start|> inside <|im_start|>)
OVERLAPPING = ["<|endoftext|>", "<|im_start|>", "<|im", "<|im_start|>assistant", "<|im_end|>", "im_end|>", "start|>"]
TEXTS = ["<|im_start|>assistant\nhi<|im_end|>", "<|im_start|>user\nthe<|im_end|>\n", "<|im x", "<|im_start|>assistan",
         "<|im_end|>>", "<|im_start|>start|>", "<|im<|im_start|>assistant<|im_start|>", "xim_end|> <|im_end",
         "<|im_start|>assistantassistant", "start|><|im_end|>im_end|>", "<<|im_start|>|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A small byte-level BPE tokenizer.json with overlapping special tokens, made by the tokenizers library."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t.train_from_iterator(["the assistant said hello to the user", "im start im end"] * 20, trainer)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in OVERLAPPING])
    d = tmp_path_factory.mktemp("overlap")
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>",
                                                          "chat_template": CHATML}))
    return d


def test_overlapping_special_tokens_are_matched_as_the_tokenizers_library_matches_them(hf_dir):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))  # the independent reference
    tok = hf_tokenizer_from_dir(hf_dir)
    for text in TEXTS:
        want = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, allowed_special="all") == want, (text, ref.encode(text, add_special_tokens=False).tokens)
    # the boundary itself: the longest of three specials that all start at 0 wins, and a shorter one where
    # the longer does not fit
    ids = tok.special_tokens
    assert tok.encode("<|im_start|>assistant", allowed_special="all") == [ids["<|im_start|>assistant"]]
    assert tok.encode("<|im_start|>assistan", allowed_special="all")[0] == ids["<|im_start|>"]
    assert tok.encode("<|im_", allowed_special="all")[0] == ids["<|im"]


def test_a_chat_templates_ids_take_the_longest_special_token_as_transformers_does(hf_dir):
    from transformers import PreTrainedTokenizerFast

    from gptforge.data.chat_jinja import JinjaChatTemplate

    ref = PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
    tok = hf_tokenizer_from_dir(hf_dir)
    template = JinjaChatTemplate(CHATML, tok, end="<|im_end|>")
    # message text holds no special-token text (gptforge keeps typed special text as text, transformers not)
    talk = [{"role": "system", "content": "im start said"}, {"role": "user", "content": "the user im_ x|"},
            {"role": "assistant", "content": "hello"}]
    for msgs, gen in ((talk, False), (talk[:2], True)):
        want = ref.apply_chat_template(msgs, chat_template=CHATML, tokenize=True, add_generation_prompt=gen)
        want = getattr(want, "input_ids", want)  # transformers 5 returns an encoding
        got = template.render_for_generation(msgs) if gen else template.render(msgs)[0]
        assert list(got) == list(want), template.render_text(msgs, add_generation_prompt=gen)
    # the header is one id, <|im_start|>assistant, not <|im_start|> + "assistant"
    gen_ids = template.render_for_generation([{"role": "user", "content": "hi"}])
    assert gen_ids[-2:] == [tok.special_tokens["<|im_start|>assistant"], ref.convert_tokens_to_ids("Ċ")]


# --- every field of a bundle's entry -------------------------------------------------------------------------

def _tiktoken_tok(tmp_path):
    ranks = {bytes([b]): b for b in range(256)} | {b"th": 256, b"the": 257}
    path = tmp_path / "r.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    tok = tiktoken_from_ranks(path, special_tokens={"<|endoftext|>": 258, "<|bos|>": 259, "<|im_end|>": 260},
                              bos="<|bos|>", eos="<|endoftext|>")
    tok.chat_template = "{{ messages }}"
    return tok


def _leaves(o, path=()):
    """Every (path, value) of a JSON object, dict keys included as ("key-of", path) entries."""
    if isinstance(o, dict):
        for k, v in o.items():
            if path:  # a key of a nested mapping (a special token's text, a file's name) is data too
                yield ("key-of", *path, k), k
            yield from _leaves(v, (*path, k))
    else:
        yield path, o


def _edited(info, path, value):
    out = copy.deepcopy(info)
    if path[0] == "key-of":
        o = out
        for k in path[1:-1]:
            o = o[k]
        o[path[-1] + "X"] = o.pop(path[-1])
        return out, path[-1] + "X"
    o = out
    for k in path[:-1]:
        o = o[k]
    if path in (("bos",), ("eos",)):  # another special token's id: one the tokenizer can be built with
        new = next(i for i in sorted(info["special_tokens"].values()) if i not in (info["bos"], info["eos"]))
    elif isinstance(value, int):
        new = value + 1
    else:  # a string: change its last character (a hex digest stays hex)
        new = value[:-1] + ("0" if value[-1] != "0" else "1")
    o[path[-1]] = new
    return out, new


def _read_back(kind, folder, info):
    if kind == "info.json":
        (folder / "tokenizer" / "info.json").write_text(json.dumps(info))
        return read_tokenizer_dir(folder)
    return tokenizer_from_meta({"tokenizer": info}, folder)  # a checkpoint's meta.json entry


@pytest.mark.parametrize("door", ["info.json", "meta.json"])
@pytest.mark.parametrize("tk_kind", ["tiktoken", "hf"])
def test_an_edit_of_any_bundle_field_is_refused_or_is_a_setting_the_tokenizer_then_carries(tk_kind, door, tmp_path, hf_dir):
    tok = _tiktoken_tok(tmp_path) if tk_kind == "tiktoken" else hf_tokenizer_from_dir(hf_dir)
    info = save_tokenizer(tok, tmp_path / "b")
    good = json.loads((tmp_path / "b" / "tokenizer" / "info.json").read_text())
    assert _read_back(door, tmp_path / "b", good).fingerprint == tok.fingerprint  # the unedited bundle reads
    walked = set()
    for path, value in _leaves(info):
        walked.add(path[0] if path[0] != "key-of" else path[1])
        edited, new = _edited(info, path, value)
        if path[0] in ENTRY_SETTINGS and path[0] != "bos":  # bos is the document separator: eot confirms it
            back = _read_back(door, tmp_path / "b", edited)
            carried = {"name": back.name, "chat_template": back.chat_template, "eos": back.eos_token_id}[path[0]]
            assert carried == new, (path, carried, new)
            continue
        with pytest.raises((TokenizerError, FileNotFoundError)):  # a file renamed in files: not there
            back = _read_back(door, tmp_path / "b", edited)
            pytest.fail(f"edited {path} to {new!r} and it was read back ({back.describe()})")
    # every field the kind writes was walked (the walk comes from the entry, so a new field is in it)
    assert walked == set(info), set(info) - walked


@pytest.mark.parametrize("door", ["info.json", "meta.json"])
def test_an_edit_of_bos_alone_is_refused_since_eot_confirms_it(door, tmp_path):
    tok = _tiktoken_tok(tmp_path)
    info = save_tokenizer(tok, tmp_path / "b")
    with pytest.raises(TokenizerError, match=r"tokenizer\.eot = 259 but the tokenizer its files make has 260"):
        _read_back(door, tmp_path / "b", {**info, "bos": 260})


def test_each_part_of_a_tiktoken_identity_changes_the_fingerprint(tmp_path):
    import tiktoken

    from gptforge.data.tokenizer.tiktoken_kind import TiktokenTokenizer

    base = _tiktoken_tok(tmp_path)
    enc = base.enc

    def make(pat=enc._pat_str, ranks=enc._mergeable_ranks, specials=enc._special_tokens, sha=base.ranks_sha256):
        e = tiktoken.Encoding(name="v", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
        return TiktokenTokenizer(e, "v", sha)

    assert make().fingerprint == base.fingerprint  # the same parts: the same identity
    variants = {
        "ranks_sha256": make(sha="0" * 64),
        "pattern": make(pat=r"\S+|\s+"),
        "special_tokens": make(specials={**enc._special_tokens, "<|im_end|>": 261}),
        "kind": None,  # the kind is a constant of the class; an hf tokenizer's identity is its whole JSON
    }
    ident = base._identity()
    assert set(ident) == set(variants), "a new part of the identity needs a variant here"
    for part, tok in variants.items():
        if tok is not None:
            assert tok._identity()[part] != ident[part] and tok.fingerprint != base.fingerprint, part
