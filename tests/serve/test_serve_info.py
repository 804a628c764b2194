"""GET /api/info says what is served: checkpoint path and step, model family and size, tokens trained
(checked against the checkpoint's own meta.json and the run's config), and the page shows it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.cli import main  # noqa: E402
from gptforge.load import ModelSource, load_model
from gptforge.serve.app import ServeSettings, create_app
from gptforge.serve.describe import describe_served


def test_info_names_the_checkpoint_step_family_size_and_tokens(shard_dir, tmp_path, tokenizer):
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(run), "--train.max_steps", "3",
                 "--model.vocab_size", "512", "--train.device", "cpu", "--train.val_every", "0"]) == 0
    model = load_model(ModelSource(ckpt=str(run)))
    app = create_app(model, tokenizer, ServeSettings(), served=describe_served(model, ckpt=str(run)))
    with TestClient(app) as c:
        info = c.get("/api/info").json()
        page = c.get("/").text
    s = info["served"]
    ckpt = run / "checkpoints" / "step_000003"
    cfg = json.loads((run / "config.json").read_text())
    assert s["source"] == "ckpt" and s["path"] == str(ckpt.resolve()) and s["run_dir"] == str(run.resolve())
    assert s["step"] == json.loads((ckpt / "meta.json").read_text())["step"] == 3
    assert s["tokens_trained"] == 3 * cfg["train"]["total_batch_tokens"]
    assert s["family"] == "gpt2"
    assert (s["layers"], s["width"], s["heads"]) == (cfg["model"]["n_layer"], cfg["model"]["n_embd"], cfg["model"]["n_head"])
    assert s["parameters"] == sum(p.numel() for p in model.parameters())
    assert "info.served" in page and "tokens trained" in page  # the page shows them

    meta = json.loads((ckpt / "meta.json").read_text())  # a checkpoint that records its family
    meta["config"]["model"]["arch"] = "llama"
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert describe_served(model, ckpt=str(run))["family"] == "llama"
    # issue 34: an RL (or SFT, DPO, RM) step is not train.total_batch_tokens: unknown, not step x batch
    meta["config"]["rl"]["init_from"] = "runs/sft"
    (ckpt / "meta.json").write_text(json.dumps(meta))
    s = describe_served(model, ckpt=str(run))
    assert s["tokens_trained"] is None and s["recipe"] == "rl" and s["fine_tuned_from"] == "runs/sft"


def test_info_for_weights_from_elsewhere(tmp_path, tokenizer):
    import torch

    from gptforge.interop.llmc import write_llmc_model
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    f = write_llmc_model(model, tmp_path / "m.bin")
    s = describe_served(model, llmc=str(f))
    assert s["source"] == "llmc" and s["path"] == str(f.resolve()) and s["step"] is None
    assert s["tokens_trained"] is None and s["layers"] == 1 and s["width"] == 16
    # an imported checkpoint has a step but no training history
    out = tmp_path / "imported"
    assert main(["import", "llmc", "--model", str(f), "--out", str(out)]) == 0
    s = describe_served(model, ckpt=str(out))
    assert s["step"] == 0 and s["tokens_trained"] is None
