"""SFT on a Llama-family model through the CLI: it trains, carries the chat template, resumes to the
same weights as an uninterrupted run, and `export hf` writes a chat Llama whose tokenizer renders
like gptforge's template (AutoTokenizer.apply_chat_template) and whose logits transformers matches."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
from gptforge.load import ModelSource, load_model
from gptforge.models.registry import build_model, size_config
from gptforge.run import checkpoint as ckpt

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5. The answer is 5."},
]


@pytest.fixture(scope="module")
def llama_sft(tmp_path_factory, tokenizer):
    """A random llama-tiny base, and 6 SFT steps on it with checkpoints at 3 and 6."""
    root = tmp_path_factory.mktemp("llama_sft")
    torch.manual_seed(0)
    cfg = size_config("llama-tiny", block_size=64)
    base = ckpt.save_checkpoint(root / "base", 0, build_model(cfg), None, {"config": Config(model=cfg).to_dict()})
    data = write_conversations(arithmetic_problems(120, seed=3), root / "conv.jsonl")
    run = root / "run"
    assert main(["sft", "--init-from", str(base), "--data", str(data), "--out", str(run), "--val-count", "16",
                 "--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens", "256",
                 "--train.max_steps", "6", "--train.ckpt_every", "3", "--train.keep_ckpts", "3",
                 "--train.val_every", "3", "--train.sample_every", "0", "--optim.lr", "1e-2", "--optim.warmup_steps", "2", "--train.device", "cpu",
                 "--train.dtype", "float32", "--train.log_every", "100", "--base-loss"]) == 0
    return root, data, run


def _weights(path):
    return load_model(ModelSource(ckpt=str(path))).state_dict()


def test_sft_on_a_llama_trains_and_carries_the_template(llama_sft):
    _, _, run = llama_sft
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    assert meta["config"]["model"]["arch"] == "llama" and meta["config"]["model"]["n_kv_head"] == 2
    assert meta["config"]["model"]["vocab_size"] == ChatTemplate.gpt2().vocab_size
    assert ChatTemplate.from_dict(meta["chat_template"]) == ChatTemplate.gpt2()
    val = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in val if r["kind"] == "val"]
    assert val[-1] < meta["base_val_loss"] - 2.0, (meta["base_val_loss"], val)  # random base: ~ln(50261)


def test_sft_resume_on_a_llama_reaches_the_same_weights(llama_sft, tmp_path):
    _, data, run = llama_sft
    part = tmp_path / "part"
    shutil.copytree(run, part)
    shutil.rmtree(ckpt.ckpt_root(part) / "step_000006")  # interrupted after the step-3 checkpoint
    assert ckpt.latest_checkpoint(part).name == "step_000003"
    assert main(["sft", "--data", str(data), "--out", str(part), "--resume"]) == 0
    done = ckpt.latest_checkpoint(part)
    assert done.name == "step_000006"
    assert ckpt.read_meta(done)["train_loss"] == ckpt.read_meta(ckpt.latest_checkpoint(run))["train_loss"]
    a, b = _weights(ckpt.latest_checkpoint(run)), _weights(done)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_export_hf_of_a_chat_llama_round_trips_template_and_logits(llama_sft, tmp_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    _, _, run = llama_sft
    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    t = ChatTemplate.gpt2()
    # a chat export's eos is its end-of-turn token, where gptforge's chat stops (issue 34: it was <|endoftext|>)
    assert (config["model_type"], config["vocab_size"], config["eos_token_id"]) == ("llama", t.vocab_size, t.end)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = t.render(CONV, tokenizer)[0]
    assert list(tok.apply_chat_template(CONV, tokenize=True, return_dict=False)) == ids
    gen = tok.apply_chat_template(CONV[:2], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(gen) == t.render_for_generation(CONV[:2], tokenizer)
    assert tok.decode(ids) == t.decode(ids, tokenizer)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    model = load_model(ModelSource(ckpt=str(run))).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(x).logits, model(x)[0], atol=1e-4, rtol=1e-4)
