"""`gptforge chat` driven through stdin (multi-turn history, system prompt, greedy replies checked
against independent generation), and `gptforge eval --tasks arithmetic` on a chat checkpoint."""

from __future__ import annotations

import io
import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate, ChatTokenizer
from gptforge.eval.generative import GENERATIVE, evaluate_generative
from gptforge.generation import SamplingParams, complete
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt


def _chat_ckpt(tmp_path):
    torch.manual_seed(0)
    t = ChatTemplate.gpt2()
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    model = GPT(cfg)
    with torch.no_grad():  # make <|end|> likely after a few tokens so replies end on their own sometimes
        model.transformer.wte.weight[t.end] *= 20
    path = ckpt.save_checkpoint(tmp_path / "sft", 1, model, None,
                                {"config": Config(model=cfg).to_dict(), "chat_template": t.to_dict()})
    return path, model.eval(), t


def test_chat_multi_turn_through_stdin(tmp_path, tokenizer, monkeypatch, capsys):
    path, model, t = _chat_ckpt(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2 + 3?\n\n/reset\nHi\nAnd again?\n/quit\n"))
    assert main(["chat", "--ckpt", str(path), "--system", "Be brief.", "--temperature", "0",
                 "--max-new-tokens", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    replies = [line[len("assistant> "):] for line in out.splitlines() if line.startswith("assistant> ")]
    assert len(replies) == 3 and "(history cleared)" in out
    # independent reference: the same conversations rendered and completed greedily
    enc = ChatTokenizer(tokenizer, t)
    p = SamplingParams(max_new_tokens=6, temperature=0, stop_token=t.end)
    sys_msg = [{"role": "system", "content": "Be brief."}]

    def ref(msgs):
        return complete(model, enc, [t.render_for_generation(sys_msg + msgs, tokenizer)], p)[0]["text"]

    r1 = ref([{"role": "user", "content": "What is 2 + 3?"}])
    r2 = ref([{"role": "user", "content": "Hi"}])  # after /reset: no earlier turn
    r3 = ref([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": r2.strip()},
              {"role": "user", "content": "And again?"}])
    assert replies == [r1, r2, r3]


def test_chat_says_when_old_turns_leave_a_full_context(tmp_path, monkeypatch, capsys):
    """Issue 34: when the context fills, the oldest exchange leaves the conversation, and chat says so."""
    path, _, _ = _chat_ckpt(tmp_path)  # block_size 64
    turns = "".join(f"Please tell me about the number {i} and its neighbours.\n" for i in range(4))
    monkeypatch.setattr("sys.stdin", io.StringIO(turns + "/quit\n"))
    assert main(["chat", "--ckpt", str(path), "--temperature", "0", "--max-new-tokens", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(the context of 64 tokens is full: the oldest 2 messages left the conversation)" in out


def test_chat_refuses_base_model(tmp_path, capsys):
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    base = ckpt.save_checkpoint(tmp_path / "b", 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})
    assert main(["chat", "--ckpt", str(base)]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_eval_arithmetic_generative(tmp_path, tokenizer, capsys):
    path, model, t = _chat_ckpt(tmp_path)
    assert main(["eval", "--tasks", "arithmetic,compare", "--ckpt", str(path), "--limit", "6", "--device", "cpu",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "arithmetic" in out and "chat template" in out and "95% CI" in out
    res, cmp = json.loads((tmp_path / "r.json").read_text())
    assert res["n"] == 6 and res["accuracy"] == 0.0  # a random model gets nothing right
    assert res["chance"] is None and cmp["chance"] == 0.5  # an open number vs one of two named numbers
    assert res["acc_ci95"][0] == 0.0 and res["acc_ci95"][1] == pytest.approx(0.390, abs=1e-3)  # Wilson, 0 of 6



def test_generative_scoring_with_scripted_replies(tmp_path, tokenizer, monkeypatch):
    _, model, t = _chat_ckpt(tmp_path)
    probs = GENERATIVE["arithmetic"].problems(4)
    # replies: right, right but with a wrong worked line (exact match looks at the final answer only),
    # wrong answer, no answer line
    scripted = [probs[0].solution, "1 + 1 = 3. The answer is " + probs[1].answer + ".",
                probs[2].solution.replace(f"is {probs[2].answer}.", f"is {int(probs[2].answer) + 1}."), "I think 5"]
    monkeypatch.setattr("gptforge.eval.generative.generate_replies", lambda *a, **k: scripted)
    r = evaluate_generative(model, tokenizer, ["arithmetic"], t, limit=4)[0]
    assert (r.n, r.accuracy, r.format_rate) == (4, 0.5, 0.75)


def test_sample_on_a_chat_checkpoint_decodes_chat_tokens(tmp_path, tokenizer, capsys):
    path, model, t = _chat_ckpt(tmp_path)
    # the boosted <|end|> row makes the model emit it: tiktoken alone could not decode that id
    assert main(["sample", "--ckpt", str(path), "--prompt", "Hi", "--num-samples", "1", "--max-new-tokens", "12",
                 "--temperature", "0", "--device", "cpu"]) == 0
    ids = tokenizer.encode("Hi")
    want = complete(model, ChatTokenizer(tokenizer, t), [ids], SamplingParams(max_new_tokens=12, temperature=0))
    out = capsys.readouterr().out
    assert want[0]["text"] in out and "<|end|>" in want[0]["text"]


def test_export_hf_of_a_chat_checkpoint_carries_the_template(tmp_path, tokenizer, capsys):
    import pytest

    transformers = pytest.importorskip("transformers")
    path, model, t = _chat_ckpt(tmp_path)
    assert main(["export", "hf", "--ckpt", str(path), "--out", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    got = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(got) == t.render_for_generation(msgs, tokenizer)
