"""SFT: the conversation loader's masks and packing, bad data named by file and row, a short SFT
run that lowers held-out assistant loss below the base model's, and a bit-exact resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.data.sft import ConversationLoader, SFTDataError, read_conversations, render_all
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from tests.conftest import child_env


def _base(tmp_path, pad_vocab: bool = True):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, pad_vocab=pad_vocab)
    return ckpt.save_checkpoint(tmp_path / "base", 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})


def _sft_args(base, data, out, *extra):
    return ["sft", "--init-from", str(base), "--data", str(data), "--out", str(out), "--val-count", "16",
            "--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens", "256",
            "--train.device", "cpu", "--train.dtype", "float32", "--train.log_every", "100", *extra]


def test_loader_packs_whole_conversations_with_masked_targets(tokenizer):
    t = ChatTemplate.gpt2()
    convs = [(f"c{i}", p.messages()) for i, p in enumerate(arithmetic_problems(20, seed=3))]
    rendered = render_all(convs, t, 65, tokenizer)
    loader = ConversationLoader(rendered, B=3, T=64, shuffle=False)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (3, 64)
    # the first row holds conversations 0, 1, ... whole, in order, then padding
    n0, n1 = len(rendered[0].ids), len(rendered[1].ids)
    row = torch.cat([x[0], y[0, -1:]])
    assert row[:n0].tolist() == rendered[0].ids.tolist()
    assert row[n0 : n0 + n1].tolist() == rendered[1].ids.tolist()
    # targets: exactly the assistant tokens (and <|end|>) of those conversations, all else -1
    for r in range(3):
        assert (y[r] != -1).any()  # every row trains on something (no empty-mask NaN loss)
    want = [int(i) for c in rendered[:2] for i, m in zip(c.ids, c.mask, strict=True) if m]
    got = [int(tok) for tok in y[0] if tok != -1]
    assert got[: len(want)] == want
    assert t.decode(got, tokenizer).count("<|end|>") == got.count(50260)
    assert all("The answer is" in s for s in t.decode(got, tokenizer).split("<|end|>")[:-1])


def test_loader_state_resumes_same_batches_and_ranks_split(tokenizer):
    t = ChatTemplate.gpt2()
    rendered = render_all([(str(i), p.messages()) for i, p in enumerate(arithmetic_problems(30))], t, 65, tokenizer)
    a = ConversationLoader(rendered, B=2, T=64, seed=5)
    for _ in range(7):  # past an epoch boundary
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    b = ConversationLoader(rendered, B=2, T=64, seed=5)
    b.load_state_dict(state)
    for _ in range(5):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # two ranks with B=1 see the rows one rank with B=2 sees
    one = ConversationLoader(rendered, B=2, T=64, seed=5)
    r0, r1 = (ConversationLoader(rendered, B=1, T=64, rank=r, world=2, seed=5) for r in (0, 1))
    x, _ = one.next_batch()
    assert torch.equal(x, torch.cat([r0.next_batch()[0], r1.next_batch()[0]]))
    with pytest.raises(SFTDataError, match="other conversations"):
        ConversationLoader(rendered[:-1], B=2, T=64).load_state_dict(state)


@pytest.mark.parametrize("line, msg", [
    (b'{"messages": [{"role": "bot", "content": "hi"}]}', "unknown role 'bot'"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "not UTF-8"),
    (b'{"messages": [{"role": "user", "content": "' + b"word " * 80 + b'"}, {"role": "assistant", "content": "x"}]}',
     "longer than the context"),
])
def test_bad_rows_are_named_or_skipped(tmp_path, tokenizer, capsys, line, msg):
    data = write_conversations(arithmetic_problems(40), tmp_path / "conv.jsonl")
    with open(data, "ab") as f:
        f.write(line + b"\n")
    base = _base(tmp_path)
    assert main(_sft_args(base, data, tmp_path / "run", "--dry-run")) == 0  # dry run reads no data
    assert main(_sft_args(base, data, tmp_path / "run", "--train.max_steps", "1")) == 2
    err = capsys.readouterr().err
    assert msg in err and "conv.jsonl:41" in err
    stats: dict[str, int] = {}
    convs = read_conversations(str(data), skip_bad=True, stats=stats)
    render_all(convs, ChatTemplate.gpt2(), 65, tokenizer, skip_bad=True, stats=stats)
    assert stats == {"skipped": 1}


def test_unpadded_base_model_is_refused(tmp_path, tokenizer, capsys):
    data = write_conversations(arithmetic_problems(40), tmp_path / "conv.jsonl")
    assert main(_sft_args(_base(tmp_path, pad_vocab=False), data, tmp_path / "run")) == 2
    assert "pad_vocab true" in capsys.readouterr().err


@pytest.mark.slow
def test_sft_lowers_heldout_assistant_loss_and_carries_template(tmp_path, tokenizer, capsys):
    data = write_conversations(arithmetic_problems(400, seed=1), tmp_path / "conv.jsonl")
    base, run = _base(tmp_path), tmp_path / "run"
    assert main(_sft_args(base, data, run, "--train.max_steps", "15", "--optim.lr", "1e-2",
                          "--train.val_every", "15", "--base-loss")) == 0
    out = capsys.readouterr().out
    # the end-of-run sample is a chat turn: a held-out user message, then the model's reply
    sample = out[out.index("--- sample 0 (step 15; sampled at temperature 0.7, top-k 50)"):].splitlines()
    assert sample[1].startswith("user> ") and "<|" not in sample[1] and sample[2].startswith("assistant> ")
    assert "--- sft summary" in out and f"gptforge chat --ckpt {run}" in out and "val loss    best" in out
    val = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in val if r["kind"] == "val"]
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run))
    # the base model (random) scores the same held-out assistant tokens near ln(vocab)
    assert meta["base_val_loss"] == pytest.approx(math.log(50261), abs=0.5)
    assert val[-1] < meta["base_val_loss"] - 4.0, val
    assert ChatTemplate.from_dict(meta["chat_template"]) == ChatTemplate.gpt2()
    assert meta["config"]["model"]["vocab_size"] == 50261


@pytest.mark.slow
def test_sft_resume_is_bit_exact(tmp_path, tokenizer):
    from gptforge.cli.common import init_from
    from gptforge.training.sft import run_sft, sft_config

    data = write_conversations(arithmetic_problems(200, seed=2), tmp_path / "conv.jsonl")
    base = _base(tmp_path)

    def cfg_for(out):
        from gptforge.config import apply_overrides

        cfg = sft_config(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64), str(out), data=str(data))
        cfg.sft.val_count = 16
        init = init_from(str(base), cfg)
        apply_overrides(cfg, ["--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens",
                              "256", "--train.max_steps", "6", "--train.device", "cpu", "--train.dtype", "float32",
                              "--train.val_every", "0", "--train.ckpt_every", "0", "--optim.warmup_steps", "2"])
        return cfg, init

    t = ChatTemplate.gpt2()
    cfg, init = cfg_for(tmp_path / "full")
    full = run_sft(cfg, t, init_weights=init)
    cfg, init = cfg_for(tmp_path / "part")
    part = run_sft(cfg, t, init_weights=init, stop_at_step=3)
    assert part.interrupted and part.steps_done == 3
    # resume through the CLI: config, template and data settings come from the checkpoint
    assert main(["sft", "--out", str(tmp_path / "part"), "--resume"]) == 0
    assert ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "part"))["train_loss"] == full.train_losses[6]
    a = GPT(cfg.model)
    b = GPT(cfg.model)
    restore.load_model_weights(a, ckpt.latest_checkpoint(tmp_path / "full"))
    restore.load_model_weights(b, ckpt.latest_checkpoint(tmp_path / "part"))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k


@pytest.mark.slow
def test_sft_under_torchrun_matches_one_process_with_accumulation(tmp_path, tokenizer):
    """World 2 x micro-batch 2 sees the rows one process sees as 2 micro-steps of 2 (the loader
    builds one global batch and each rank takes its slice), so the losses agree."""
    import subprocess
    import sys

    data = write_conversations(arithmetic_problems(300, seed=4), tmp_path / "conv.jsonl")
    base = _base(tmp_path)

    def args(out):
        return _sft_args(base, data, out, "--train.micro_batch", "2", "--train.max_steps", "4",
                         "--train.val_every", "4", "--optim.lr", "3e-3")

    assert main(args(tmp_path / "one")) == 0
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "gptforge", *args(tmp_path / "two")], env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def losses(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r.get("loss", r.get("val_loss")) for r in rows if r["kind"] in ("train", "val")]

    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(one) == len(two) == 5
    assert two == pytest.approx(one, rel=1e-4)
