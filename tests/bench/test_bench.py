"""The bench command's behaviour (not its speed): what it reports and what it refuses to measure."""

import json

import pytest

from gptforge.bench.train import LADDER, run_bench
from gptforge.presets import get_preset


def _tiny():
    cfg = get_preset("tiny")
    cfg.model.vocab_size = 256
    cfg.train.device = "cpu"
    return cfg


def test_bench_writes_json_with_phases_and_mfu(tmp_path):
    cfg = _tiny()
    cfg.train.peak_flops = 1e12  # no datasheet peak on CPU: MFU only with an explicit one
    report = run_bench(cfg, steps=2, warmup=1, out=str(tmp_path / "b.json"), sweep_micro_batch=[2, 4])
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["results"] == json.loads(json.dumps(report["results"]))
    names = [r["name"] for r in saved["results"]]
    assert names == ["B=2", "B=4"]
    for r in saved["results"]:
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0
        assert set(r["phase_ms"]) == {"data", "forward", "backward", "optimizer"}
        assert r["phase_ms"]["backward"] > 0
        N, L, C, T = r["params"], 2, 64, 32  # d2 preset, seq_len 32, block 64
        assert r["mfu_llmc"] == pytest.approx((6 * N + 6 * L * C * T) * r["tokens_per_s"] / 1e12)
        assert r["mfu_palm"] == pytest.approx((6 * (N - 64 * C) + 12 * L * C * T) * r["tokens_per_s"] / 1e12)
        assert r["process_max_rss_MiB"] > 0
        assert r["cpu_user_s_per_step"] > 0 and r["cpu_sys_s_per_step"] >= 0 and r["minor_faults_per_step"] >= 0
        assert 0 <= r["sys_frac"] < 1
        assert r["tokens_per_step"] == cfg.train.total_batch_tokens  # 256 divides by 2*32 and 4*32
    assert saved["results"][1]["grad_accum"] == 2 and saved["results"][0]["grad_accum"] == 4
    assert saved["allocator"]  # what served the memory, beside the numbers it shapes


def test_ladder_on_cpu_skips_what_cpu_cannot_do_and_says_why(tmp_path):
    cfg = _tiny()
    report = run_bench(cfg, steps=1, warmup=0, ladder=True)
    by_name = {r["name"]: r for r in report["results"]}
    assert list(by_name) == [r.name for r in LADDER]
    assert "TF32" in by_name["+tf32"]["skipped"]
    assert "model.fused_ce=auto" in by_name["+fused_ce"]["skipped"]  # the default's rung: plain on CPU
    # the climb starts from the plain loss (auto would be the fused classifier from the first CUDA rung on)
    fp32, bf16 = by_name["fp32"], by_name["+bf16"]
    assert LADDER[0].changes.get("model.fused_ce") is False and LADDER[-1].changes == {"model.fused_ce": None}
    assert fp32["precision"] == "float32" and not fp32["flash"] and not fp32["pad_vocab"]
    assert bf16["precision"] == "bfloat16"
    assert by_name["+pad_vocab"]["pad_vocab"] and by_name["+flash"]["flash"]
    assert by_name["+fused_adamw"]["fused_adamw"] and not by_name["+pad_vocab"]["fused_adamw"]
    assert by_name["+compile"]["compile"]


def test_bench_writes_a_profiler_trace(tmp_path):
    trace = tmp_path / "trace.json"
    run_bench(_tiny(), steps=1, warmup=1, trace=str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::" in e.get("name", "") for e in events)  # real ops were recorded
