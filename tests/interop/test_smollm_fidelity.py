"""SmolLM2-135M-Instruct through gptforge, against transformers (issue 32's fidelity lane).

The real Q4_1 GGUF (``fetch_smollm2``, PyPI) read by gptforge and by transformers' own GGUF loader
(``from_pretrained(dir, gguf_file=...)``), which is the independent reference throughout:

- logits on 20 varied token sequences agree within 1e-4;
- greedy chat replies to 20 prompts are transformers' ``generate(do_sample=False)`` token for token;
- SFT, DPO, GRPO and PPO each run from the GGUF (``--init-from FILE.gguf``) on CPU for 4 steps through
  ``gptforge.cli.main``, and a run stopped by SIGINT after step 2 and resumed ends with exactly the
  uninterrupted run's weights; each run is exported back (``export hf``: transformers generates the
  same greedy tokens as gptforge's model from the checkpoint; ``export gguf --dtype f32``:
  transformers' GGUF load gives gptforge's logits within 1e-4), with SmolLM2's tokenizer, chat
  template, rope theta and tied embeddings carried along.

Both sides are always given the same token ids: transformers' GGUF tokenizer lacks the per-digit
split llama.cpp and SmolLM2's own tokenizer.json apply (see test_gguf_smollm.py's tokenizer test), so
its own encoding differs from the model's on strings with digits. Templates are compared as ids only
on messages without a digit.

Heavy (minutes on 2 cores): marked ``lane`` (deselected by the default run); ``bash
scripts/test_lane.sh -k smollm_fidelity`` runs it.
"""

from __future__ import annotations

import json
import shutil
import signal
import unicodedata
import zlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from gptforge.cli import main  # noqa: E402
from gptforge.data.chat_jinja import JinjaChatTemplate  # noqa: E402
from gptforge.generation import SamplingParams, stream_tokens  # noqa: E402
from gptforge.interop.gguf_read import read_gguf  # noqa: E402
from gptforge.load import ModelSource, load_model  # noqa: E402
from gptforge.run import checkpoint as ckpt  # noqa: E402
from tests.interop import test_gguf_smollm as _gguf_smollm  # noqa: E402

# its session fixtures: the file's path, gptforge's read of it, transformers' (tokenizer, model)
smollm_path, smollm, smollm_hf = _gguf_smollm.smollm_path, _gguf_smollm.smollm, _gguf_smollm.smollm_hf

pytestmark = [pytest.mark.slow, pytest.mark.smollm, pytest.mark.lane]

LONG = ("The quick brown fox jumps over the lazy dog while the river runs north past the old mill. " * 30).strip()
TEXTS = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])",
    '{"name": "SmolLM2", "layers": 30, "heads": [9, 3], "tied": true}',
    "Il était une fois, dans un petit village au bord de la mer, une vieille femme qui parlait aux mouettes.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "机器学习是人工智能的一个分支。",
    "Emoji test: 🚀🔥 ✓ — “quoted” ‘text’ … and ü ß ñ",
    "12 + 34 = 46; 3.14159 * 2 = 6.28318; 1,000,000 > 999,999",
    "    indented\n\n\n\ttabs\tand   spaces   \r\n",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=%20#top",
    "a",
    LONG,  # ~600 tokens: rope far from position 0
    "<|im_start|> typed as text stays text <|im_end|>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about cats."}],
    [{"role": "user", "content": "What is 17 + 25?"}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
]
PROMPTS = [  # 20 chat prompts for the greedy replies
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Explain photosynthesis in one sentence.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
    "What is the boiling point of water in Celsius?",
    "Write a Python function that adds two numbers.",
    "Which is larger, 37 or 48?",
    "What does a cat say?",
    "List the days of the week.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in two sentences.",
    "What is the square root of 144?",
    "Tell me a fun fact about octopuses.",
    "How many continents are there?",
    "What is the opposite of cold?",
    "Suggest a name for a pet goldfish.",
]
NEW_TOKENS = 28


def _numeric(text: str) -> bool:
    return any(unicodedata.category(c).startswith("N") for c in text)


def _chat(g) -> JinjaChatTemplate:
    return JinjaChatTemplate(g.chat_template, g.tokenizer)


def _hf_template_ids(hf_tok, messages) -> list[int]:
    ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _sequences(g) -> list[list[int]]:
    """20 token sequences: 15 texts (gptforge's encoding) and 5 conversations rendered for generation."""
    chat = _chat(g)
    seqs = [g.tokenizer.encode_ordinary(t) for t in TEXTS] + [chat.render_for_generation(m) for m in CHATS]
    assert len(seqs) == 20 and max(map(len, seqs)) > 500 and min(map(len, seqs)) == 1
    return seqs


@torch.no_grad()
def _assert_logits_equal(ours: torch.nn.Module, theirs: torch.nn.Module, seqs: list[list[int]], atol: float = 1e-4):
    worst = 0.0
    for ids in seqs:
        x = torch.tensor([ids])
        a, b = ours(x)[0][0], theirs(x).logits[0]
        assert a.shape == b.shape == (len(ids), 49152)
        worst = max(worst, (a - b).abs().max().item())
    assert worst < atol, f"max |logit difference| {worst:.3g} over {len(seqs)} sequences"
    print(f"max |logit difference| {worst:.3g} over {len(seqs)} sequences")  # shown with -s
    return worst


@torch.no_grad()
def _greedy_ours(model: torch.nn.Module, prompts: list[list[int]], n: int, eos: int) -> list[list[int]]:
    """gptforge's batched greedy decoding (left padding, per-row positions), each row cut after eos."""
    steps = torch.stack(list(stream_tokens(model, prompts, SamplingParams(max_new_tokens=n, temperature=0))), 1)
    return [_cut(row, eos) for row in steps.tolist()]


@torch.no_grad()
def _greedy_theirs(model, prompts: list[list[int]], n: int, eos: int, pad: int) -> list[list[int]]:
    """transformers' ``generate(do_sample=False)`` on the same ids, left-padded with an attention mask."""
    T = max(map(len, prompts))
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         eos_token_id=eos, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
    return [_cut(row, eos) for row in out[:, T:].tolist()]


def _cut(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


# ----------------------------------------------------------------------------- the GGUF itself


def test_logits_on_20_sequences_equal_transformers(smollm, smollm_hf):
    _, hf_model = smollm_hf
    _assert_logits_equal(smollm.model, hf_model, _sequences(smollm))


def test_greedy_chat_replies_to_20_prompts_equal_transformers_generate(smollm, smollm_hf):
    hf_tok, hf_model = smollm_hf
    chat = _chat(smollm)
    msgs = [[{"role": "user", "content": p}] for p in PROMPTS]
    prompts = [chat.render_for_generation(m) for m in msgs]
    for m, ids in zip(msgs, prompts, strict=True):  # the template itself, where the tokenizers agree
        if not _numeric(m[0]["content"]):
            assert _hf_template_ids(hf_tok, m) == ids, m
    eos = chat.end
    assert eos == hf_tok.eos_token_id == 2  # <|im_end|>
    ours = _greedy_ours(smollm.model, prompts, NEW_TOKENS, eos)
    theirs = _greedy_theirs(hf_model, prompts, NEW_TOKENS, eos, pad=hf_tok.pad_token_id or 0)
    for p, a, b in zip(PROMPTS, ours, theirs, strict=True):
        assert a == b, (p, smollm.tokenizer.decode(a), smollm.tokenizer.decode(b))
    assert sum(eos in r for r in ours) >= 5  # some replies end within the budget: the end token is compared too
    assert smollm.tokenizer.decode(ours[0]) == "The capital of France is Paris.<|im_end|>"


# ----------------------------------------------------------------------------- every recipe, resumed, exported


def hashed_reward(problem, reply: str) -> float:
    """A graded reward for the RL runs (``--reward tests.interop.test_smollm_fidelity:hashed_reward``):
    any two different replies almost surely score differently, so no group is flat and every step
    moves the weights (the untuned model's exact-match reward would be 0 for every reply)."""
    return (zlib.crc32(reply.encode()) % 1000) / 1000


REWARD = ["--reward", "tests.interop.test_smollm_fidelity:hashed_reward"]
RL = ["--task", "compare", "--prompts", "1", "--group", "2", "--max-new-tokens", "6", "--eval-n", "1",
      "--temperature", "1.0", "--lr", "1e-5", "--steps", "4", "--device", "cpu", "--ckpt-every", "0", *REWARD]
STEPS = 4


def _argv(recipe: str, gguf: str, data: dict[str, str]) -> list[str]:
    if recipe == "sft":
        return ["sft", "--init-from", gguf, "--data", data["conv"], "--val-count", "2", "--train.seq_len", "64",
                "--train.micro_batch", "1", "--train.total_batch_tokens", "64", "--steps", str(STEPS),
                "--optim.lr", "1e-4", "--optim.warmup_steps", "0", "--train.ckpt_every", "0", "--train.device", "cpu"]
    if recipe == "dpo":
        return ["dpo", "--init-from", gguf, "--data", data["prefs"], "--val-count", "2", "--micro-batch", "1",
                "--lr", "1e-5", "--steps", str(STEPS), "--device", "cpu", "--ckpt-every", "0"]
    return ["rl", "--init-from", gguf, "--algo", recipe, *RL]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.latest_checkpoint(run) / "model.safetensors"))


class Runs:
    """One recipe's uninterrupted run and its stopped-and-resumed twin."""

    def __init__(self, recipe: str, full: Path, part: Path, step2: dict, seconds: float):
        self.recipe, self.full, self.part, self.step2_meta, self.seconds = recipe, full, part, step2, seconds


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.synthetic import training_problems, write_conversations

    d = tmp_path_factory.mktemp("smol_data")
    return {"conv": str(write_conversations(training_problems(12, seed=2), d / "conv.jsonl")),
            "prefs": str(write_preferences(preference_set("compare", 8, seed=1), d / "prefs.jsonl"))}


def _run_twice(recipe: str, gguf: str, data: dict, root: Path) -> Runs:
    """``STEPS`` steps uninterrupted; then the same run stopped by SIGINT after step 2 (the real
    handler: checkpoint, exit 130) and ``--resume``d to the end."""
    import os
    import time

    argv, full, part = _argv(recipe, gguf, data), root / "full", root / "part"
    extra = REWARD if recipe in ("grpo", "ppo") else []
    t0 = time.perf_counter()
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main([*argv, "--out", str(full)]) == 0
        os.environ["GPTFORGE_FAULT_INJECT"] = "0:2:int"
        try:
            assert main([*argv, "--out", str(part)]) == 130
        finally:
            del os.environ["GPTFORGE_FAULT_INJECT"]
        saved = ckpt.latest_checkpoint(part)
        meta2 = ckpt.read_meta(saved)
        assert meta2["step"] == 2
        assert main([argv[0], "--out", str(part), "--resume", *extra]) == 0
    finally:
        signal.signal(signal.SIGINT, before)  # a stopped run leaves its handler for the grace window
    assert ckpt.read_meta(ckpt.latest_checkpoint(part))["step"] == STEPS
    shutil.rmtree(saved)  # 1.6-3.2 GB each: keep only what the checks read
    return Runs(recipe, full, part, meta2, time.perf_counter() - t0)


@pytest.fixture(scope="module", params=["sft", "dpo", "grpo", "ppo"])
def runs(request, smollm_path, data, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"smol_{request.param}")
    r = _run_twice(request.param, str(smollm_path), data, root)
    yield r
    shutil.rmtree(root, ignore_errors=True)


def _policy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("policy."): v for k, v in weights.items() if not k.startswith("value.")}


def test_recipe_resumes_bit_exactly_and_trained(runs, smollm):
    a, b = _weights(runs.full), _weights(runs.part)
    assert a.keys() == b.keys()
    same = [k for k in a if not torch.equal(a[k], b[k])]
    assert not same, f"{runs.recipe}: resumed weights differ from the uninterrupted run's in {same[:5]}"
    if runs.recipe == "ppo":
        assert any(k.startswith("value.") for k in a)  # the value model is checkpointed and resumed too
    # the runs really trained: the policy moved away from the GGUF's weights
    start = smollm.model.state_dict()
    moved = [k for k, v in _policy(a).items() if k in start and not torch.equal(v, start[k][: v.shape[0]])]
    assert len(moved) > 100, f"{runs.recipe}: only {len(moved)} tensors moved in {STEPS} steps"
    records = [json.loads(line) for line in (runs.full / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records if r["kind"] in ("train", "dpo", "rl")} >= set(range(1, STEPS + 1))


PROBE = [[{"role": "user", "content": p}] for p in ("What is the capital of France?", "Write a haiku about rain.",
                                                     "Which is larger, 37 or 48?", "Say hello.")]


@pytest.mark.parametrize("runs", ["sft", "grpo"], indirect=True)  # one export a recipe is enough: it reads a checkpoint
def test_recipe_exports_to_hf_and_transformers_generates_the_same(runs, smollm, tmp_path):
    """``export hf``: transformers loads the folder (a LlamaForCausalLM with SmolLM2's rope theta and tied
    embeddings) and its greedy tokens equal gptforge's from the checkpoint; the exported tokenizer's
    ``apply_chat_template`` gives the template's ids."""
    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(runs.part), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["rope_theta"] == 100_000.0 and cfg["tie_word_embeddings"] is True
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (9, 3, 49152)
    ours = load_model(ModelSource(ckpt=str(runs.part))).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    chat = _chat(smollm)
    prompts = [chat.render_for_generation(m) for m in PROBE]
    for m, ids in zip(PROBE, prompts, strict=True):
        if not _numeric(m[0]["content"]):
            assert _hf_template_ids(hf_tok, m) == ids, m
    a = _greedy_ours(ours, prompts, 20, chat.end)
    b = _greedy_theirs(theirs, prompts, 20, chat.end, pad=0)
    assert a == b, [(smollm.tokenizer.decode(x), smollm.tokenizer.decode(y)) for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("runs", ["sft", "dpo", "ppo"], indirect=True)  # ppo: its checkpoint holds a value model too
def test_recipe_exports_to_gguf_and_transformers_reads_the_same_logits(runs, smollm, tmp_path):
    """``export gguf --dtype f32``: transformers' GGUF loader reads the file to gptforge's logits within
    1e-4, and the file carries SmolLM2's tokenizer (gptforge reads it back to the same ids) and chat
    template."""
    out = tmp_path / "gguf"
    assert main(["export", "gguf", "--ckpt", str(runs.part), "--out", str(out), "--dtype", "f32"]) == 0
    (f,) = out.glob("*.gguf")
    back = read_gguf(f)
    assert back.chat_template == smollm.chat_template
    assert back.metadata["tokenizer.ggml.pre"] == "smollm"
    assert back.metadata["general.architecture"] == "llama"
    seqs = _sequences(smollm)
    assert [back.tokenizer.encode_ordinary(t) for t in TEXTS] == seqs[: len(TEXTS)]
    ours = load_model(ModelSource(ckpt=str(runs.part))).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(out), gguf_file=f.name, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), gguf_file=f.name)
    for m in CHATS:
        if not any(_numeric(x["content"]) for x in m):
            assert _hf_template_ids(hf_tok, m) == _chat(back).render_for_generation(m), m
    _assert_logits_equal(ours, theirs, [seqs[i] for i in (0, 7, 11, 15, 19)])  # the ~600-token one among them
