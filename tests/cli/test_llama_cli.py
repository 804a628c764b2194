"""Every command on the Llama family: train (and a bit-exact resume against an uninterrupted run),
sample, eval, serve, export hf (checked by transformers), --hf, plan (against a measured peak),
bench and bench-generate (greedy tokens identical to transformers'), and the refusals, as exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gptforge.cli import main
from gptforge.load import ModelSource, load_model
from gptforge.models.llama import LlamaConfig
from gptforge.presets import get_preset
from gptforge.run import checkpoint as ckpt
from gptforge.training.loop import train
from tests.conftest import make_shards, tiny_config

transformers = pytest.importorskip("transformers")

SAMPLE = ["--prompt", "ROMEO:", "--max-new-tokens", "8", "--num-samples", "1", "--seed", "7"]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("llama")
    data = make_shards(root / "data")
    assert main(["train", "--preset", "llama-tiny", "--data.dir", str(data), "--out", str(root / "run"),
                 "--train.max_steps", "4", "--train.val_every", "2", "--train.device", "cpu"]) == 0
    return root / "run"


def test_train_sample_export_and_load_back(llama_run, tmp_path, capsys):
    meta = ckpt.read_meta(ckpt.latest_checkpoint(llama_run))
    assert meta["config"]["model"]["arch"] == "llama" and meta["config"]["model"]["n_kv_head"] == 2
    assert main(["sample", "--ckpt", str(llama_run), *SAMPLE]) == 0
    from_ckpt = capsys.readouterr().out
    assert "ROMEO:" in from_ckpt

    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(llama_run), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    model = load_model(ModelSource(ckpt=str(llama_run)))
    idx = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    capsys.readouterr()
    assert main(["sample", "--hf", str(out), *SAMPLE]) == 0  # --hf reads the directory back as a Llama
    assert capsys.readouterr().out == from_ckpt


def test_init_from_a_hf_llama_directory(llama_run, tmp_path, shard_dir):
    from gptforge.cli.common import init_from
    from gptforge.models.registry import build_model

    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(llama_run), "--out", str(out), "--no-tokenizer"]) == 0
    cfg = get_preset("tiny")  # a GPT-2 preset: --init-from brings the Llama's family and shape
    init = init_from(str(out), cfg)
    assert cfg.model.arch == "llama" and cfg.model.n_kv_head == 2
    model = build_model(cfg.model).eval()
    init(model)
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, 50257, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    assert main(["train", "--preset", "tiny", "--init-from", str(out), "--data.dir", str(shard_dir), "--out",
                 str(tmp_path / "ft"), "--train.max_steps", "2", "--train.val_every", "0", "--train.device",
                 "cpu"]) == 0


def test_llmc_export_refuses_a_llama(llama_run, tmp_path, capsys):
    assert main(["export", "llmc", "--ckpt", str(llama_run), "--out", str(tmp_path / "llmc")]) == 2
    err = capsys.readouterr().err
    assert "model.arch='llama'" in err and "export hf" in err
    assert not (tmp_path / "llmc").exists()


def test_hf_config_refusal_is_exit_2(llama_run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(llama_run), "--out", str(out), "--no-tokenizer"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 32.0}  # a scaling gptforge does not implement
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(["sample", "--hf", str(out), *SAMPLE]) == 2
    assert "yarn" in capsys.readouterr().err
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 32.0}  # implemented, but its other fields are missing
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(["sample", "--hf", str(out), *SAMPLE]) == 2
    assert "rope_scaling.low_freq_factor" in capsys.readouterr().err


def test_eval_and_serve_on_a_llama(llama_run, tmp_path, eval_data, tokenizer):
    out = tmp_path / "eval.json"
    assert main(["eval", "--tasks", "winogrande", "--ckpt", str(llama_run), "--limit", "4", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["winogrande"]["n"] == 4

    from fastapi.testclient import TestClient

    from gptforge.generation import SamplingParams, complete
    from gptforge.serve.app import ServeSettings, create_app

    model = load_model(ModelSource(ckpt=str(llama_run)))
    with TestClient(create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=16))) as client:
        body = {"prompts": ["ROMEO:", "To be"], "max_new_tokens": 8, "temperature": 0.9, "top_k": 40, "seed": 3,
                "stop_at_eot": False}
        r = client.post("/api/generate", json=body)
        assert r.status_code == 200, r.text
        ref = complete(model, tokenizer, body["prompts"], SamplingParams(max_new_tokens=8, temperature=0.9, top_k=40,
                                                                         top_p=1.0, seed=3))
        assert r.json()["completions"] == ref
        assert client.get("/api/info").json()["model"]["arch"] == "llama"


def test_model_arch_override_and_bad_head_count(tmp_path, shard_dir, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--model.arch", "llama", "--model.n_kv_head", "1", "--model.vocab_size",
                 "512", "--data.dir", str(shard_dir), "--out", str(run), "--train.max_steps", "2",
                 "--train.val_every", "0", "--train.device", "cpu"]) == 0
    m = ckpt.read_meta(ckpt.latest_checkpoint(run))["config"]["model"]
    assert (m["arch"], m["n_layer"], m["n_head"], m["n_kv_head"]) == ("llama", 2, 2, 1)  # d2's shape carried over
    assert main(["train", "--preset", "llama-tiny", "--model.n_kv_head", "3", "--dry-run"]) == 2
    assert "n_kv_head" in capsys.readouterr().err


def test_resume_is_bit_exact_with_a_llama(shard_dir, tmp_path):
    def cfg(out):
        c = tiny_config(shard_dir, tmp_path / out, max_steps=8)
        c.model = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=512, dropout=0.1)
        return c

    full = train(cfg("full"))
    part = train(cfg("part"), stop_at_step=3)
    rest = train(cfg("part"), resume="latest")
    for s in range(1, 9):
        assert part.train_losses.get(s, rest.train_losses.get(s)) == full.train_losses[s], s  # bit for bit
    assert rest.val_losses[8] == full.val_losses[8]
    assert full.train_losses[8] < full.train_losses[1]


def test_plan_on_llama(tmp_path):
    from gptforge.models.registry import build_model
    from gptforge.plan import count_params, estimate, measure_peak
    from gptforge.plan.memory import head_path

    for name in ("llama-tiny", "llama-124m", "llama3-1b"):
        cfg = get_preset(name)
        with torch.device("meta"):
            assert count_params(cfg) == build_model(cfg.model).num_parameters()
    out = tmp_path / "plan.json"
    assert main(["plan", "--preset", "llama3-1b", "--world", "8", "--json", str(out)]) == 0
    assert 1.23e9 < json.loads(out.read_text())["params"] < 1.24e9  # Llama-3.2-1B: 1.236B
    for rc in ("none", "mlp"):  # body-heavy (small vocabulary): the per-layer count decides the estimate
        cfg = get_preset("shakespeare-cpu")
        cfg.model = LlamaConfig(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, block_size=128, vocab_size=512,
                                pad_vocab=False, recompute=rc)
        cfg.train.micro_batch, cfg.train.total_batch_tokens, cfg.train.device, cfg.train.dtype = 16, 2048, "cpu", "float32"
        measured, _ = measure_peak(cfg, steps=2)
        # the steps ran here, on the CPU: the plain loss, as training (and `plan --measure`) decides it here
        est = estimate(cfg, 1, dtype="float32", fused=True, fused_ce=head_path(cfg, torch.device("cpu"))[0])
        assert 0.95 < est.peak / measured < 1.2, (rc, est, measured)


def test_bench_and_bench_generate_on_llama(tmp_path):
    from gptforge.bench.train import run_bench

    cfg = get_preset("llama-tiny")
    cfg.model.vocab_size, cfg.train.device = 256, "cpu"
    report = run_bench(cfg, steps=1, warmup=1)
    assert report["results"][0]["tokens_per_s"] > 0
    out = tmp_path / "bg.json"
    assert main(["bench-generate", "--size", "llama-tiny", "--batch", "1", "3", "--new-tokens", "6",
                 "--prompt-tokens", "5", "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 0
    assert all(r["same_tokens"] for r in json.loads(out.read_text())["results"])


@pytest.mark.slow
def test_ddp_and_fsdp_llama_match_one_process(tmp_path):
    """World 2 (gloo, CPU) against one process with 2x accumulation: DDP, and FSDP2 sharding the Llama's
    blocks (with block recomputation), same data and total batch, float32."""
    from gptforge.config import DistConfig
    from tests.training.test_distributed import HERE, _read, _torchrun

    data = make_shards(tmp_path / "data")

    def cfg(out: str, **dist):
        c = tiny_config(data, tmp_path / out, max_steps=4, ckpt_every=0)
        c.model = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=512,
                              recompute="block" if dist.get("fsdp") else "none")
        c.dist = DistConfig(**dist)
        return c

    jobs = [{"config": cfg("ddp").to_dict(), "out": str(tmp_path / "ddp.json")},
            {"config": cfg("fsdp", shard="fsdp").to_dict(), "out": str(tmp_path / "fsdp.json")}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = _torchrun([str(HERE / "dist_worker.py"), str(tmp_path / "jobs.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    one = train(cfg("one"))
    for name in ("ddp", "fsdp"):
        got = _read(tmp_path / f"{name}.json")["train"]
        for s in range(1, 5):
            assert got[s] == pytest.approx(one.train_losses[s], rel=2e-5, abs=1e-6), (name, s)
