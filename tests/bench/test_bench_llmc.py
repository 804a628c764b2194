"""The llm.c comparison's parsing and report (gptforge.bench.llmc) and its script's refusals, on CPU.

The llm.c log below is written by hand from the printf formats in llm.c's train_gpt2.cu (the
parameter table, ``device memory usage``, and ``step %4d/%d | loss %7.6f (%+.2fz)| norm ... | %.2f ms
| %.1f%% bf16 MFU | %.0f tok/s``), with the figures of GPU-PROFILE.md's llm.c cuDNN run (H100,
B 64, ~1000 ms/step, 42.5% MFU); it is not a captured log, because no GPU was available here.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from gptforge.bench.llmc import ReportError, compare, main, parse_llmc_log, smi_peak_mib
from gptforge.bench.train import run_bench
from gptforge.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
MS = [1843.21, 1012.40, 1003.77, 1001.02, 999.87, 1000.55, 1002.13, 998.76, 1000.08, 1001.46, 999.31,
      1000.92, 1003.05, 999.64, 1000.27, 1001.88]


def llmc_log(B: int = 64, T: int = 1024, total: int = 524288, ms: list[float] = MS) -> str:
    row = "| {:<21} | {:<50} |"
    sep = "+-----------------------+----------------------------------------------------+"
    table = [("micro batch size B", B), ("sequence length T", T), ("total batch size", total),
             ("learning rate (LR)", "6.000000e-04"), ("max_steps", len(ms)), ("recompute", 0)]
    lines = [sep, row.format("Parameter", "Value"), sep, *[row.format(k, v) for k, v in table], sep,
             row.format("device", "NVIDIA H100 80GB HBM3"), row.format("peak TFlops", "989.4"),
             row.format("precision", "BF16"), sep,
             row.format("weight init method", "d12"), row.format("max_sequence_length T", 1024),
             row.format("vocab_size V", 50257), row.format("padded_vocab_size Vp", 50304),
             row.format("num_layers L", 12), row.format("num_heads NH", 12), row.format("channels C", 768),
             row.format("num_parameters", 124475904), sep,
             "num_parameters: 124475904 => bytes: 248951808",
             "allocated 237 MiB for model parameters",
             f"batch_size B={B} * seq_len T={T} * num_processes=1 and total_batch_size={total}",
             f"=> setting grad_accum_steps={total // (B * T)}",
             "allocating 25218 MiB for activations",
             "device memory usage: 27032 MiB / 81008 MiB",
             "memory per sequence: 394 MiB",
             " -> estimated maximum batch size: 198"]
    for i, t in enumerate(ms, 1):
        lines.append(f"step {i:4d}/{len(ms)} | loss {11.0 - 0.1 * i:7.6f} (+0.00z)| norm 1.2345 (+0.00z)| "
                     f"lr 8.57e-07 | {t:.2f} ms | 42.5% bf16 MFU | {total / t * 1000:.0f} tok/s")
    lines.append(f"total average iteration time: {statistics.mean(ms[1:]):f} ms")
    return "\n".join(lines) + "\n"


def test_parse_llmc_log_reads_the_table_memory_and_steps():
    p = parse_llmc_log(llmc_log())
    assert (p["B"], p["T"], p["total_batch"], p["params"], p["L"], p["C"]) == (64, 1024, 524288, 124475904, 12, 768)
    assert p["device"] == "NVIDIA H100 80GB HBM3" and p["peak_flops"] == pytest.approx(989.4e12)
    assert p["alloc_MiB"] == 27032 and len(p["steps"]) == 16
    assert p["steps"][3] == {"step": 4, "loss": pytest.approx(10.6), "ms": 1001.02, "mfu": 0.425,
                             "tok_s_ema": round(524288 / 1001.02 * 1000)}
    with pytest.raises(ReportError, match="no 'step N/M"):
        parse_llmc_log("allocating 25218 MiB for activations\n", "x.log")


def _tiny_bench(tmp_path, switches: list[str] | None = None) -> dict:
    cfg = get_preset("tiny")
    cfg.model.vocab_size = 256
    cfg.train.device = "cpu"
    cfg.train.peak_flops = 1e12
    run_bench(cfg, steps=2, warmup=1, out=str(tmp_path / "gf.json"), switches=switches)
    return json.loads((tmp_path / "gf.json").read_text())


def test_compare_recomputes_both_with_one_formula_and_peak(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gf = _tiny_bench(tmp_path, ["model.attn_backend=math", "model.fused_ce=true"])  # a real bench JSON (CPU, tiny shape); the log is made at the same shape
    r = gf["results"][0]
    log = llmc_log(B=r["micro_batch"], T=r["seq_len"], total=r["tokens_per_step"])
    c = compare(parse_llmc_log(log), gf, skip=3, smi={"llmc": "1000\n1500\n29000\n28000\n", "gptforge": None})
    lc = c["systems"]["llm.c"]
    ms = statistics.median(MS[3:])
    assert lc["ms_per_step"] == ms and lc["timed_steps"] == 13
    assert lc["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / ms * 1000)
    L, C, T = 12, 768, r["seq_len"]
    assert lc["mfu"] == pytest.approx((6 * 124475904 + 6 * L * C * T) * lc["tokens_per_s"] / 989.4e12)
    g = c["systems"]["gptforge"]
    m = gf["config"]["model"]
    assert g["mfu"] == pytest.approx((6 * r["params"] + 6 * m["n_layer"] * m["n_embd"] * T) * r["tokens_per_s"] / 989.4e12)
    assert c["ratio_tokens_per_s"] == pytest.approx(r["tokens_per_s"] / lc["tokens_per_s"])
    assert lc["peak_MiB_device"] == 28000 and lc["peak_MiB_alloc"] == 27032 and g["peak_MiB_device"] is None
    assert list(c["systems"]) == ["llm.c", "gptforge", "gptforge model.attn_backend=math", "gptforge model.fused_ce=true"]
    assert c["systems"]["gptforge model.attn_backend=math"]["switches"]["attn_backend"] == "math"
    assert "model.fused_ce=true" in c["systems"]["gptforge model.fused_ce=true"]["skipped"]
    with pytest.raises(ReportError, match="the runs differ"):
        compare(parse_llmc_log(llmc_log()), gf, skip=3)


def test_report_command_prints_and_writes_json_and_names_bad_files(tmp_path, capsys):
    gf = _tiny_bench(tmp_path)
    r = gf["results"][0]
    (tmp_path / "llmc.log").write_text(llmc_log(B=r["micro_batch"], T=r["seq_len"], total=r["tokens_per_step"]))
    args = ["report", "--llmc-log", str(tmp_path / "llmc.log"), "--gptforge-json", str(tmp_path / "gf.json"),
            "--json", str(tmp_path / "c.json")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "gptforge / llm.c tokens/s:" in out and "llm.c" in out
    assert json.loads((tmp_path / "c.json").read_text())["B"] == r["micro_batch"]
    assert main(["report", "--llmc-log", str(tmp_path / "nope.log"), "--gptforge-json", str(tmp_path / "gf.json")]) == 2
    assert "nope.log: no such file" in capsys.readouterr().err
    assert smi_peak_mib("500\n") is None


def test_shard_command_writes_an_llmc_shard(tmp_path):
    from gptforge.data.shards import read_header

    assert main(["shard", str(tmp_path / "t.bin"), "--tokens", "5000"]) == 0
    assert read_header(tmp_path / "t.bin")[2] == 5000


@pytest.mark.parametrize("args, message", [
    ([], "Options:"),
    (["/nonexistent"], "is not an llm.c checkout"),
    (["{llmc}", "-b", "3", "-d", "1000"], "-d 1000 is not a multiple of B*T = 3072"),
    (["{llmc}", "-x", "2", "-w", "3"], "must exceed the warm-up"),
    (["{llmc}"], "no NVIDIA GPU here"),
])
def test_script_refuses_clearly_before_running_anything(tmp_path, args, message):
    llmc = tmp_path / "llmc"
    llmc.mkdir()
    (llmc / "train_gpt2.cu").write_text("// stand-in\n")
    (llmc / "Makefile").write_text("# stand-in\n")
    args = [a.replace("{llmc}", str(llmc)) for a in args]
    bin_dir = tmp_path / "bin"  # a PATH with the script's text tools and no nvidia-smi/nvcc, on any machine
    bin_dir.mkdir()
    for tool in ("sed", "tr"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "bench_vs_llmc.sh"), *args, "--out", str(tmp_path / "o")]
                          if args else [shutil.which("bash"), str(ROOT / "scripts" / "bench_vs_llmc.sh")],
                          capture_output=True, text=True, timeout=60, env={"PATH": str(bin_dir)})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "o" / "llmc-build").exists()


def _fake_gpu_tools(tmp_path, cap: str = "9.0"):
    """A PATH with a fake nvidia-smi (one H100, compute capability ``cap``), nvcc, and a make that writes its
    arguments down and fails, so the script stops right after building: what it would build, on any machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sed", "tr", "head", "tar", "rm", "mkdir", "dirname", "cat", "tail", "sleep", "kill", "ln"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    scripts = {
        "nvidia-smi": f'case "$*" in *-L*) echo "GPU 0: NVIDIA H100 80GB HBM3";; *compute_cap*) echo "{cap}";; esac',
        "nvcc": "exit 0",
        "make": f'echo "$@" > {tmp_path}/make.args; exit 1',
        "fakepython": 'case "$*" in *is_available*) exit 0;; *) echo "";; esac',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("arch, expected", [([], "GPU_COMPUTE_CAPABILITY=90"), (["--arch", "80"], "GPU_COMPUTE_CAPABILITY=80"),
                                            (["--arch", "none"], None)])
def test_script_builds_llmc_for_the_gpus_architecture(tmp_path, arch, expected):
    """llm.c's Makefile never detects the GPU (its check is an always-empty make variable), so without
    GPU_COMPUTE_CAPABILITY nvcc 13 compiles compute_75 PTX for the driver to JIT: the script passes the
    GPU's own capability unless told --arch none."""
    llmc = tmp_path / "llmc"
    llmc.mkdir()
    (llmc / "train_gpt2.cu").write_text("// stand-in\n")
    (llmc / "Makefile").write_text("# stand-in\n")
    bin_dir = _fake_gpu_tools(tmp_path)
    proc = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "bench_vs_llmc.sh"), str(llmc), "--cudnn", "0",
                           *arch, "--python", str(bin_dir / "fakepython"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60, env={"PATH": str(bin_dir)})
    assert proc.returncode == 2 and "llm.c build failed" in proc.stderr, proc.stderr
    made = (tmp_path / "make.args").read_text().split()
    assert made[:4] == ["-C", str(tmp_path / "o" / "llmc-build"), "train_gpt2cu", "NO_MULTI_GPU=1"]
    assert [a for a in made if a.startswith("GPU_COMPUTE_CAPABILITY")] == ([expected] if expected else [])
    assert (tmp_path / "o" / "llmc-build.cmd").read_text().split()[1:] == made


@pytest.mark.parametrize("args, message", [(["--arch", "sm_90"], "--arch sm_90: expected auto, none"),
                                           (["--llmc-args", "-ge 2; rm -rf x"], "--llmc-args")])
def test_script_refuses_a_bad_arch_or_llmc_args(tmp_path, args, message):
    llmc = tmp_path / "llmc"
    llmc.mkdir()
    (llmc / "train_gpt2.cu").write_text("// stand-in\n")
    (llmc / "Makefile").write_text("# stand-in\n")
    bin_dir = _fake_gpu_tools(tmp_path)
    proc = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "bench_vs_llmc.sh"), str(llmc), *args,
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir)})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "make.args").exists()
