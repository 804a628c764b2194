"""Every recipe on every family, through the CLI's doors, against transformers (issue 57, part 4).

Each family (Llama 3 and Qwen2 as controls, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3, Granite, OLMo 2) is a tiny
random
Hugging Face directory with its own tokenizer and chat template (``tests/models/family_dirs.py``),
brought in by ``gptforge import hf``. On it: ``sft`` and ``sft --lora.rank`` (a finite loss, the
weights moved, the training ids the family's ``apply_chat_template`` ids), ``dpo``, ``rm``, ``rl``
(finite, moved), ``eval`` (every greedy reply of a left-padded batch equals transformers' ``generate``
on ``apply_chat_template``), ``chat`` (its prompt ids are ``apply_chat_template``'s, its reply is
transformers' greedy one), ``serve`` (one ``/v1/chat/completions`` request: transformers' greedy text)
and ``export`` (hf: transformers reloads the same logits, the LoRA run merged; gguf: gptforge's reader
gives the same logits and the tokenizer splits as the family's). Prompts plus replies run past the
sliding window of 8 (Mistral, Phi-3, Gemma's mixed layers), so the window is in the KV cache of every
generation checked here. What a family's template refuses (a system role: Mistral, Gemma) is refused
by every door by name, in one line, exit 2.

The whole matrix (70 checks, 7 families built and imported once each, every recipe a 1-step run) costs
about 30 CPU-seconds: it is in the default run.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.load import ModelSource, load_model  # noqa: E402
from gptforge.run.checkpoint import latest_checkpoint, read_meta  # noqa: E402
from tests.models.family_dirs import FAMILIES, WINDOW, build_family  # noqa: E402

RECIPES = ("sft", "lora", "dpo", "rm", "rl", "eval", "chat", "serve", "export_hf", "export_gguf")
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")  # the families' published turn ends
SMALL = ["--val-count", "4", "--train.max_steps", "1", "--train.micro_batch", "2", "--train.seq_len", "64",
         "--train.total_batch_tokens", "128", "--train.val_every", "0", "--train.device", "cpu",
         "--optim.lr", "1e-2", "--optim.warmup_steps", "0"]
# what the GGUF's tokenizer must split as the family's tokenizer.json does: spaces leading, doubled and
# trailing, newlines and tabs, digits, byte fallback (accents, Cyrillic, CJK, an emoji), the template's words
TEXTS = ["Which is larger, 12 or 7?", "the king  said:\n\nseven swords", " What is 3+4? The answer is 7.",
         "  two leading, three trailing   ", "\ttab\tand\nnewline\n", "naïve café — Привет 中文 \U0001F600",
         "1234567 + 89 = 1234656", "[INST] hi [/INST]", "<start_of_turn>user not a control token here",
         "don't you'll I'M we'RE", "queen\u2581crown"]
# Tolerance, derived: logits are float32 chains of dot products of at most max(C, H, T) = 64 terms over at
# most 6 layers and the head; two implementations ordering those sums differently differ by at most about
# terms x (layers + 1) x eps32 x |logit| (< 10 here): 64 * 7 * 1.2e-7 * 10 ~ 5.4e-4. Measured: ~1e-6.
ATOL = 64 * 7 * 1.2e-7 * 10
# Greedy generation compares argmaxes, and ATOL's worst case would call half the steps near-ties. Rounding
# errors of reordered sums add as a random walk (sqrt of the terms) in practice: relative to |logit|,
# 1.2e-7 * sqrt(64) * 7 ~ 6.7e-6, against the ~1e-6 measured. Each reference step's winner must lead by
# twice that (_hf_greedy checks it), so a flip means gptforge computed something else, not a CPU's rounding.
TIE = 1.2e-7 * 64**0.5 * 7


# ----------------------------------------------------------------------------- one family, imported once

@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """family name -> its world, built on first use: the HF directory and its transformers model and
    tokenizer, conversation and preference files, and ``gptforge import hf`` of the directory; runs of
    recipes are added (``_run``) as the tests ask for them, so sft runs once for dpo, rm, rl and export."""
    built: dict[str, SimpleNamespace] = {}

    def get(name: str) -> SimpleNamespace:
        if name not in built:
            from gptforge.eval.tasks.preferences import preference_set, write_preferences
            from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations

            root = tmp_path_factory.mktemp(name)
            hf, tok = build_family(name, root / "hf")
            assert main(["import", "hf", "--model", str(root / "hf"), "--out", str(root / "imported")]) == 0
            stops = [tok.convert_tokens_to_ids(t) for t in END_OF_TURN if t in tok.get_vocab()]
            built[name] = SimpleNamespace(
                name=name, root=root, hf=hf, tok=tok, imported=root / "imported", runs={},
                stops=[*stops, tok.eos_token_id],
                conv=write_conversations(arithmetic_problems(16, seed=2), root / "conv.jsonl"),
                prefs=write_preferences(preference_set("compare", 12, seed=1), root / "prefs.jsonl"))
        return built[name]

    return get


def _run(fam: SimpleNamespace, recipe: str) -> Path:
    """The run directory of ``recipe`` on ``fam`` (sft, lora, dpo, rm, rl), run once through the CLI."""
    if recipe not in fam.runs:
        out = fam.root / recipe
        if recipe in ("sft", "lora", "lora_qv"):  # lora: every linear layer; lora_qv: peft's default, q and v
            lora = {"sft": [], "lora_qv": ["--lora.rank", "4", "--lora.alpha", "8"],
                    "lora": ["--lora.rank", "4", "--lora.alpha", "8", "--lora.targets", ",".join(LINEAR)]}[recipe]
            argv = ["sft", "--init-from", str(fam.imported), "--data", str(fam.conv), *lora, *SMALL]
        elif recipe in ("dpo", "rm"):
            argv = [recipe, "--init-from", str(_run(fam, "sft")), "--data", str(fam.prefs), *SMALL]
        else:  # rl: a graded reward, so a random model's replies get advantages (the built-in ones all score 0)
            argv = ["rl", "--init-from", str(_run(fam, "sft")), "--task", "compare", "--steps", "1", "--prompts", "2",
                    "--group", "2", "--max-new-tokens", "12", "--eval-n", "0", "--lr", "1e-2", "--device", "cpu",
                    "--reward", "tests.training.graded_reward:graded"]
        assert main([*argv, "--out", str(out)]) == 0, recipe
        fam.runs[recipe] = out
    return fam.runs[recipe]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    saved = load_file(latest_checkpoint(path) / "model.safetensors")  # as saved: a reward model's under body.
    return {k.removeprefix("body."): v for k, v in saved.items()}


def _assert_trained(before: Path, after: Path) -> dict:
    """A finite training loss in the newest checkpoint's meta, and some weight moved."""
    meta = read_meta(latest_checkpoint(after))
    loss = meta.get("train_loss")
    assert loss is not None and torch.isfinite(torch.tensor(float(loss))), meta.get("train_loss")
    a, b = _weights(before), _weights(after)
    moved = [k for k in a if k in b and not torch.equal(a[k], b[k])]
    assert moved, "no weight changed"
    return meta


def _ids(fam: SimpleNamespace, messages: list[dict], generation: bool) -> list[int]:
    out = fam.tok.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True, return_dict=False)
    return list(out)


def _hf_greedy(fam: SimpleNamespace, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' greedy replies (one prompt at a time, no padding), cut before the first stop token.
    Every step's winner leads the runner-up by more than twice TIE x |logit|, so gptforge (within rounding)
    must pick the same token: a near-tie would make the comparison depend on the CPU, not on gptforge."""
    out = []
    for ids in prompts:
        with torch.no_grad():
            r = fam.hf.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=fam.stops,
                                pad_token_id=fam.stops[0], return_dict_in_generate=True, output_logits=True)
        top2 = torch.stack(r.logits)[:, 0].topk(2, dim=-1).values  # (steps, 2)
        margin = (top2[:, 0] - top2[:, 1]) / top2[:, 0].abs().clamp(min=1.0)
        assert margin.min() > 2 * TIE, f"a near-tie in the reference ({margin.min():.1e}): change the seed"
        got = r.sequences[0, len(ids):].tolist()
        out.append(next((got[:i] for i, t in enumerate(got) if t in fam.stops), got))
    return out


def _decode(fam: SimpleNamespace, ids: list[int]) -> str:
    """Text of ids as gptforge writes it. Its decoder, not transformers': a run of byte-fallback tokens
    that is not UTF-8 as a whole becomes one U+FFFD per byte there, while gptforge keeps the valid bytes
    (``,2`` stays ``,2``); the ids compared are transformers' own."""
    from gptforge.load import load_tokenizer_of

    if not hasattr(fam, "words"):
        fam.words = load_tokenizer_of(ModelSource(ckpt=str(fam.imported)))
    return fam.words.decode(ids)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]


def _long_ids(fam: SimpleNamespace, n: int = 30) -> torch.Tensor:
    """Two rows of ``n`` ids (past the window of 8): a rendered conversation's, and random ones."""
    conv = [{"role": "user", "content": "Which is larger, 12 or 7?"},
            {"role": "assistant", "content": "12 is larger than 7. The answer is 12."}]
    ids = (_ids(fam, conv, False) * 4)[:n]
    rand = torch.randint(0, len(fam.tok), (n,), generator=torch.Generator().manual_seed(3))
    return torch.stack([torch.tensor(ids), rand])


# ----------------------------------------------------------------------------- each recipe, checked


def check_sft(fam):
    run = _run(fam, "sft")
    meta = _assert_trained(fam.imported, run)
    # the ids sft trains on are the family's own apply_chat_template ids (the template came with the import)
    from gptforge.data.chat import template_from_meta
    from gptforge.data.tokenizer import tokenizer_from_meta

    ckpt = latest_checkpoint(run)
    tok = tokenizer_from_meta(meta, ckpt)
    template = template_from_meta(meta, tok=tok)
    conv = [json.loads(line)["messages"] for line in fam.conv.read_text().splitlines()[:3]]
    for c in conv:
        assert list(template.render(c, tok)[0]) == _ids(fam, c, False)


def check_lora(fam, recipe: str = "lora"):
    """LoRA on every linear layer: only adapters train; the merged export reloads in transformers with the
    logits peft gives the family's own model with the exported adapters (independent of gptforge's merge),
    and gptforge's LoRA model agrees: the family's window, soft-caps and norms kept through the merge."""
    from safetensors.torch import load_file

    run = _run(fam, recipe)
    meta = read_meta(latest_checkpoint(run))
    assert meta.get("lora") and torch.isfinite(torch.tensor(float(meta["train_loss"])))
    saved = load_file(latest_checkpoint(run) / "model.safetensors")  # the adapters alone, B moved from its 0
    assert saved and all(".lora_" in k for k in saved) and any(v.abs().max() > 0 for k, v in saved.items()
                                                               if "lora_B" in k)
    ids = _long_ids(fam)
    got = _logits(load_model(ModelSource(ckpt=str(run))).eval(), ids)  # the base with the adapters
    # the adapters move the logits clearly past ATOL, so the peft comparison below tells applied ones from dropped
    # ones (Granite's logits / 8 and residual branches x 0.22 leave one step's adapters ~2e-3, the others' > 0.1)
    assert (got - _logits(load_model(ModelSource(ckpt=str(fam.imported))).eval(), ids)).abs().max() > 2 * ATOL
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(fam.root / f"{recipe}_hf")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(fam.root / f"{recipe}_hf").eval()
    assert type(back).__name__ == type(fam.hf).__name__ and not any("lora" in k for k in back.state_dict())
    peft = pytest.importorskip("peft")
    adapters = fam.root / f"{recipe}_adapters"
    assert main(["export", "hf", "--ckpt", str(run), "--adapters-only", "--out", str(adapters)]) == 0
    theirs = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(fam.root / "hf"),
                                            adapters).eval()
    with torch.no_grad():
        want = theirs(ids).logits
        torch.testing.assert_close(back(ids).logits, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_phi3_lora_on_q_and_v_alone_loads_in_peft_on_the_fused_qkv(families):
    """peft's default targets on Phi-3, whose transformers model fuses q, k, v into qkv_proj: the exported
    adapter is qkv_proj's (rank 2r: q's and v's, k's rows zero) and peft gives gptforge's logits."""
    check_lora(families("phi3"), "lora_qv")
    config = json.loads((families("phi3").root / "lora_qv_adapters" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["qkv_proj"] and config["rank_pattern"] == {"qkv_proj": 8}


def check_dpo(fam):
    _assert_trained(_run(fam, "sft"), _run(fam, "dpo"))


def check_rm(fam, capsys):
    """The reward model trains, and its export is the family's *ForSequenceClassification with its scores
    (Granite has none in transformers: refused by name, one line, exit 2)."""
    run = _run(fam, "rm")
    _assert_trained(_run(fam, "sft"), run)
    out = fam.root / "rm_hf"
    if fam.name == "granite":
        _one_line_exit_2(["export", "hf", "--ckpt", str(run), "--out", str(out)], capsys,
                         "GraniteForSequenceClassification")
        assert not out.exists()
        return
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(out)]) == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    from gptforge.training.rm import load_reward_model

    rm = load_reward_model(str(run))[0].eval()
    ids = _long_ids(fam)
    with torch.no_grad():
        want = hf(ids).logits[:, 0]
        got = rm(ids, torch.full((ids.size(0),), ids.size(1) - 1))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def check_rl(fam):
    _assert_trained(_run(fam, "sft"), _run(fam, "rl"))


def check_eval(fam):
    """eval's generative task: a batch of prompts of different lengths (left-padded, KV cache), every
    greedy reply equal to transformers' on the family's apply_chat_template ids."""
    from gptforge.eval.generative import GENERATIVE, task_problems

    out = fam.root / "eval.json"
    assert main(["eval", "--ckpt", str(fam.imported), "--tasks", "arithmetic", "--limit", "4", "--device", "cpu",
                 "--json", str(out), "--force"]) == 0
    rows = json.loads(out.read_text())[0]["replies"]
    problems = task_problems("arithmetic", 4)
    prompts = [_ids(fam, p.messages(with_solution=False), True) for p in problems]
    assert len({len(p) for p in prompts}) > 1  # rows of different lengths: the batch is left-padded
    new = GENERATIVE["arithmetic"].max_new_tokens
    assert min(map(len, prompts)) + new > WINDOW
    want = [_decode(fam, r).strip() for r in _hf_greedy(fam, prompts, new)]
    assert [r["reply"] for r in rows] == want


def check_chat(fam, monkeypatch, capsys):
    """chat: the ids it sends the model are apply_chat_template's; its reply is transformers' greedy one."""
    import gptforge.generation as generation

    seen = []
    real = generation.stream_text

    def spy(model, enc, prompts, params, *a, **k):
        seen.append([list(p) for p in prompts])
        return real(model, enc, prompts, params, *a, **k)

    monkeypatch.setattr(generation, "stream_text", spy)
    message = "Which is larger, 31 or 13?"
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{message}\n/quit\n"))
    capsys.readouterr()
    assert main(["chat", "--ckpt", str(fam.imported), "--max-new-tokens", "12", "--temperature", "0",
                 "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    ids = _ids(fam, [{"role": "user", "content": message}], True)
    assert seen == [[ids]]
    reply = _decode(fam, _hf_greedy(fam, [ids], 12)[0])
    assert reply.strip() and reply.strip() in printed


def check_serve(fam):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gptforge.cli.common import words
    from gptforge.serve.app import create_app

    source = ModelSource(ckpt=str(fam.imported))
    model = load_model(source)
    tok, chat = words(source, model)
    client = TestClient(create_app(model, tok, chat_template=chat.to_dict()))
    messages = [{"role": "user", "content": "What is 12 + 19?"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    want = _decode(fam, _hf_greedy(fam, [_ids(fam, messages, True)], 12)[0])
    text = r.json()["choices"][0]["message"]["content"]
    assert text and text.strip() == want.strip()


def check_export_hf(fam):
    """export hf of the SFT run: transformers reloads the family's class with the same logits, and the
    same chat template ids."""
    run = _run(fam, "sft")
    out = fam.root / "sft_hf"
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(out)]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(back).__name__ == type(fam.hf).__name__
    ids = _long_ids(fam)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, _logits(load_model(ModelSource(ckpt=str(run))).eval(), ids),
                                   atol=ATOL, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    conv = [{"role": "user", "content": "What is 3 + 4?"}]
    assert list(tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False)) == \
        _ids(fam, conv, True)


def check_export_gguf(fam, capsys):
    """export gguf of the SFT run: gptforge's reader gives the same logits, and the file's tokenizer
    splits text as the family's HF tokenizer does (Granite: not written yet, refused by name)."""
    pytest.importorskip("gguf")
    from gptforge.interop import gguf_config, gguf_families
    from gptforge.interop.gguf_read import read_gguf

    run = _run(fam, "sft")
    out = fam.root / "sft_gguf"
    argv = ["export", "gguf", "--ckpt", str(run), "--out", str(out)]
    if fam.name in ("granite", "olmo2"):  # llama.cpp's granite and olmo2 layouts are not written yet
        _one_line_exit_2(argv, capsys, f"model.family={fam.name}", "export hf")
        assert not out.exists()
        return
    if gguf_families.FAMILY_ARCH.get(fam.name) in gguf_families.IGNORES_WINDOW:
        # llama.cpp's llama and phi3 attend over the whole context: a window of 8 has no GGUF form there, refused
        # in one line; the rest checks the file it would otherwise be (its tokenizer, its layout), guard lifted
        # on both sides (the reader too runs such a file's window as llama.cpp does: not at all)
        assert main(argv) == 2 and not out.exists()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(gguf_families, "IGNORES_WINDOW", ())
            m.setattr(gguf_config, "IGNORES_WINDOW", ())
            assert main(argv) == 0
            g = read_gguf(next(out.glob("*.gguf")))
    else:
        assert main(argv) == 0
        g = read_gguf(next(out.glob("*.gguf")))
    ids = _long_ids(fam)
    torch.testing.assert_close(_logits(g.model, ids), _logits(load_model(ModelSource(ckpt=str(run))).eval(), ids),
                               atol=ATOL, rtol=0)
    # A SentencePiece vocabulary with a space prefix (Mistral's, Phi-3's) is read as llama.cpp reads it: a '▁'
    # before the text even where it already begins with a space, where the family's tokenizer.json (Metaspace,
    # prepend_scheme 'first') prepends none. llama.cpp's split of t is then the HF split of " " + t, for every t:
    # HF prepends no '▁' to " " + t and writes its space as one, and for t without a leading space both give "▁t"
    from gguf import GGUFReader

    key = GGUFReader(next(out.glob("*.gguf"))).get_field("tokenizer.ggml.add_space_prefix")
    space_prefix = key is not None and bool(key.contents())
    for text in TEXTS:
        want = fam.tok((" " if space_prefix else "") + text, add_special_tokens=False, split_special_tokens=True)
        assert g.tokenizer.encode_ordinary(text) == want["input_ids"], text
    from gptforge.data.chat_jinja import JinjaChatTemplate  # the file's template, rendered for its tokenizer

    conv = [{"role": "user", "content": "Which is larger, 12 or 7?"}]
    want = _ids(fam, conv, True)
    if space_prefix:  # llama.cpp's rule, as above, for each stretch of text between control tokens
        import re

        text = fam.tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        control = {t.content: i for i, t in fam.tok.added_tokens_decoder.items() if t.special}
        want = []
        for piece in re.split("(" + "|".join(map(re.escape, sorted(control, key=len, reverse=True))) + ")", text):
            want += [control[piece]] if piece in control else \
                fam.tok(" " + piece, add_special_tokens=False)["input_ids"] if piece else []
    assert JinjaChatTemplate(g.chat_template, g.tokenizer).render_for_generation(conv, g.tokenizer) == want


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_on_every_family(families, recipe, name, monkeypatch, capsys):
    fam = families(name)
    check = globals()[f"check_{recipe}"]
    kw = {"monkeypatch": monkeypatch, "capsys": capsys} if recipe == "chat" else \
        {"capsys": capsys} if recipe in ("rm", "export_gguf") else {}
    check(fam, **kw)


# ----------------------------------------------------------------------------- what a family refuses, by name

NO_SYSTEM = {"mistral": "Conversation roles must alternate", "gemma2": "System role not supported",
             "gemma3": "System role not supported"}  # the templates' own words


def _one_line_exit_2(argv: list[str], capsys, *named: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2, argv[0]
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in named:
        assert n in err, (n, err)


@pytest.mark.parametrize("name", list(NO_SYSTEM))
def test_a_template_without_a_system_role_is_refused_by_every_door(families, name, capsys, monkeypatch):
    """Mistral's and Gemma's templates raise on a system message: chat --system, eval --system, sft on a
    conversation with one (pointing at the row and --skip-bad) and /v1 with one say the template's
    words, one line, exit 2 (400 for /v1); nothing is trained or generated past it."""
    fam = families(name)
    words = NO_SYSTEM[name]
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n/quit\n"))
    _one_line_exit_2(["chat", "--ckpt", str(fam.imported), "--system", "Be brief.", "--device", "cpu"], capsys, words)
    _one_line_exit_2(["eval", "--ckpt", str(fam.imported), "--tasks", "compare", "--limit", "2", "--system",
                      "Be brief.", "--device", "cpu"], capsys, words)
    bad = fam.root / "with_system.jsonl"
    row = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"}]}
    bad.write_text(fam.conv.read_text() + json.dumps(row) + "\n")
    _one_line_exit_2(["sft", "--init-from", str(fam.imported), "--data", str(bad), "--out", str(fam.root / "bad"),
                      *SMALL], capsys, words, f"{bad}:17", "--skip-bad")
    assert not list((fam.root / "bad").rglob("model.safetensors"))
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gptforge.cli.common import words as words_of
    from gptforge.serve.app import create_app

    source = ModelSource(ckpt=str(fam.imported))
    model = load_model(source)
    tok, chat = words_of(source, model)
    r = TestClient(create_app(model, tok, chat_template=chat.to_dict())).post(
        "/v1/chat/completions", json={"messages": [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400 and words in r.text, r.text


def test_fused_kernels_refuse_what_they_cannot_compute_by_name(families, capsys):
    """Gemma 2's final soft-cap is not in the fused loss kernel, its attention soft-cap in no SDPA kernel:
    sft on it with either names both fields, one line, exit 2, before any step."""
    fam = families("gemma2")
    for flag, named in ((["--model.fused_ce", "true"], ("model.fused_ce", "model.logit_softcap")),
                        (["--model.attn_backend", "flash"], ("model.attn_softcap", "model.attn_backend"))):
        _one_line_exit_2(["sft", "--init-from", str(fam.imported), "--data", str(fam.conv), "--out",
                          str(fam.root / "fused"), *SMALL, *flag], capsys, *named)
