"""Where a profiled step goes (gptforge.bench.trace): CPU self time against torch.profiler's own
aggregation, GPU kernel time and the nesting rule against sums worked out by hand, the family of real
kernel names (the H100 profile's, Inductor's, gptforge's own Triton kernels), and bad trace files."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import torch.nn.functional as F

from gptforge.bench.trace import TraceError, family, format_summary, load_events, main, name_times, summarize


def _write(path, events):
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_cpu_self_time_equals_the_profilers_own_aggregation(tmp_path):
    """Every op's self time from the exported trace equals ``prof.key_averages()``'s self CPU time, which
    torch computes from its own event tree, not from the file. Tolerance: the trace prints durations to
    the nanosecond (0.0005 us rounding each), and a self time is a duration less its children's, so an
    op's error is at most 0.0005 us x (its events + their children): 0.001 us per event in the trace."""
    x = torch.randn(64, 96, requires_grad=True)
    w = torch.randn(128, 96, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            h = F.gelu(F.linear(F.layer_norm(x, (96,)), w))
            F.cross_entropy(h, torch.arange(64) % 128).backward()
            h.detach().t().contiguous().to(torch.bfloat16)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = load_events(tmp_path / "t.json")
    source, got = name_times(events)
    ref = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    assert source == "cpu self" and set(got) == set(ref)
    tol = 0.001 * len(events)
    for name, us in ref.items():
        assert got[name][0] == pytest.approx(us, abs=tol), name
    assert {"aten::mm", "aten::gelu", "aten::native_layer_norm", "aten::_to_copy"} <= set(got)


def test_nested_ops_count_their_own_time_once_per_thread(tmp_path):
    """Self time by hand: a parent 0-10 us with children 2-5 (holding 3-4) and 6-9, a second thread's op
    overlapping in time but not nested, one op starting as another ends (a sibling, not a child), and an
    op and its child starting at the same instant, the child listed first (the longer one is the parent)."""
    events = [_op("parent", 0, 10), _op("child", 2, 3), _op("grandchild", 3, 1), _op("child", 6, 3),
              _op("other_thread", 1, 8, tid=2), _op("after", 10, 2), _op("inner", 20, 5), _op("outer", 20, 8),
              {"ph": "i", "name": "instant", "ts": 4}, _op("annotation", 0, 100, cat="user_annotation")]
    _, got = name_times(load_events(_write(tmp_path / "t.json", events)))
    assert got == {"parent": [4.0, 1], "child": [5.0, 2], "grandchild": [1.0, 1], "other_thread": [8.0, 1],
                   "after": [2.0, 1], "inner": [5.0, 1], "outer": [3.0, 1]}


def test_gpu_kernel_time_by_family_per_step(tmp_path):
    """With device events the CPU ops are ignored (their time overlaps the kernels'); memcpy and memset are
    device time too. Two steps: every figure is halved; a family's names heaviest first."""
    k = lambda name, dur, cat="kernel": _op(name, 0, dur, cat=cat)  # noqa: E731
    events = [k("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 600), k("sm90_xmma_gemm_bf16bf16", 200),
              k("triton_red_fused__log_softmax_0", 300), k("_ce_loss_dlogits_kernel", 100),
              k("triton_poi_fused__to_copy_3", 50), k("triton_poi_fused_cat_7", 30),
              k("Memcpy DtoD (Device -> Device)", 20, "gpu_memcpy"), k("Memset (Device)", 10, "gpu_memset"),
              k("triton_red_fused_sum_9", 40), _op("aten::mm", 0, 5000)]
    s = summarize(_write(tmp_path / "t.json", events), steps=2)
    fams = {r["family"]: r for r in s["families"]}
    assert s["source"] == "gpu kernels" and s["total_ms"] == pytest.approx(1.35 / 2)
    assert {f: r["ms"] for f, r in fams.items()} == pytest.approx(
        {"matmul": 0.4, "cross-entropy": 0.2, "copies": 0.05, "sums": 0.02, "fills": 0.005})
    assert [r["family"] for r in s["families"]] == ["matmul", "cross-entropy", "copies", "sums", "fills"]
    assert [n["name"] for n in fams["copies"]["top"]] == [
        "triton_poi_fused__to_copy_3", "triton_poi_fused_cat_7", "Memcpy DtoD (Device -> Device)"]
    assert fams["copies"]["top"][0]["calls"] == 0.5 and fams["matmul"]["share"] == pytest.approx(0.8 / 1.35)
    text = format_summary(s)
    assert "gpu kernels" in text and "triton_poi_fused_cat_7" in text


@pytest.mark.parametrize("name,fam", [
    # the H100 profile's kernels (../shared/GPU-PROFILE.md) and cuBLAS/cuDNN names
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>", "attention"),
    # Inductor's fused kernels: named after every op they hold, so the heavier op decides
    ("triton_red_fused__log_softmax__to_copy_0", "cross-entropy"),
    ("triton_per_fused__to_copy_add_native_layer_norm_native_layer_norm_backward_5", "layernorm"),
    ("triton_poi_fused__to_copy_gelu_gelu_backward_8", "gelu"),
    ("triton_red_fused__to_copy_sum_11", "sums"),
    ("triton_poi_fused__to_copy_12", "copies"), ("triton_poi_fused_cat_13", "copies"),
    ("triton_poi_fused_clone_2", "copies"), ("triton_poi_fused_embedding_1", "embedding"),
    # gptforge's own Triton kernels and torch's
    ("_ce_loss_dlogits_kernel", "cross-entropy"), ("_add_ln_bwd_kernel", "layernorm"),
    ("_bias_gelu_fwd_kernel", "gelu"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "fills"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "copies"),
    # CPU ops
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::copy_", "copies"), ("aten::fill_", "fills"),
    ("aten::_fused_adamw_", "optimizer"), ("aten::sum", "sums"), ("aten::add", "other"),
])
def test_a_kernel_name_goes_to_its_family(name, fam):
    assert family(name) == fam


def test_a_compressed_trace_reads_as_the_plain_one(tmp_path):
    events = [_op("aten::mm", 0, 7), _op("aten::copy_", 7, 3)]
    plain = summarize(_write(tmp_path / "t.json", events))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert summarize(tmp_path / "t.json.gz") == plain and plain["total_ms"] == pytest.approx(0.01)


def _bad_files(tmp_path):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "text.json").write_text("torch.profiler said hello\n")
    (tmp_path / "latin1.json").write_bytes(b'{"traceEvents": ["\xff"]}')
    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "object.json").write_text('{"schemaVersion": 1}')
    (tmp_path / "number.json").write_text("3")
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    (tmp_path / "only_instants.json").write_text('{"traceEvents": [{"ph": "i", "ts": 1}, {"ph": "X", "ts": "a"}]}')
    (tmp_path / "plain.json.gz").write_text('{"traceEvents": []}')  # named .gz, not compressed
    with gzip.open(tmp_path / "text.json.gz", "wt") as f:
        f.write("not json")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [' * 50)[:30])
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    return ["missing.json", "dir.json", "text.json", "latin1.json", "deep.json", "object.json", "number.json",
            "empty.json", "only_instants.json", "plain.json.gz", "text.json.gz", "cut.json.gz", "dangling.json",
            "/dev/null"]


def test_every_bad_trace_is_one_error_naming_the_file(tmp_path, capsys):
    for name in _bad_files(tmp_path):
        path = tmp_path / name
        with pytest.raises(TraceError) as e:
            summarize(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value), name
        assert main([str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err, (name, err)


def test_a_trace_over_the_limit_is_refused_before_it_is_parsed(tmp_path):
    events = [_op("aten::mm", i, 1) for i in range(100)]
    path = _write(tmp_path / "t.json", events)
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    for p in (path, tmp_path / "t.json.gz"):
        with pytest.raises(TraceError, match="bytes"):
            load_events(p, limit=1000)
        assert len(load_events(p)) == 100


def test_steps_must_be_positive_and_the_cli_writes_json(tmp_path, capsys):
    path = _write(tmp_path / "t.json", [_op("aten::mm", 0, 4000)])
    with pytest.raises(TraceError, match="steps"):
        summarize(path, steps=0)
    assert main([str(path), "--steps", "0"]) == 2
    assert main([str(path), "--steps", "2", "--json", str(tmp_path / "s.json")]) == 0
    assert "matmul" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["families"][0] == {
        "family": "matmul", "ms": 2.0, "share": 1.0, "top": [{"name": "aten::mm", "ms": 2.0, "calls": 0.5}]}


def test_bench_keeps_its_report_when_the_trace_cannot_be_summarised(tmp_path, monkeypatch, capsys):
    """The timings stand when the split cannot be made (a trace over the size limit, say): the report is
    written, the table printed, and one line says why the split is missing."""
    from gptforge.bench import train as bench_train
    from gptforge.cli import main as cli

    def timed(cfg, steps, warmup, device, trace=None):
        return {"tokens_per_s": 1.0, "ms_per_step": 1.0, "phase_ms": dict.fromkeys(
            ("data", "forward", "backward", "optimizer"), 0.0), "mfu_llmc": None, "process_max_rss_MiB": 0,
            "cpu_user_s_per_step": 0, "cpu_sys_s_per_step": 0, "minor_faults_per_step": 0}

    def too_big(path, steps):
        raise TraceError(f"trace {path}: more than 4 bytes uncompressed")

    monkeypatch.setattr(bench_train, "bench_one", timed)
    monkeypatch.setattr(bench_train, "summarize_trace", too_big)
    out, trace = tmp_path / "b.json", tmp_path / "t.json"
    assert cli(["bench", "--preset", "tiny", "--train.device", "cpu", "--trace", str(trace), "--json", str(out)]) == 0
    assert "trace" not in json.loads(out.read_text())["results"][0]
    err = capsys.readouterr().err
    assert f"the trace is written but not summarised: trace {trace}: more than 4 bytes" in err
