"""Model parallelism on CPU (gloo): tensor + sequence parallel, pipeline stages (GPipe, 1F1B,
interleaved), their product, FSDP2 x TP, PP x FSDP2 and HSDP, Muon under TP, recomputation, for both
families and for Llamas with every field the newer families add (FAMILY: TP2, PP2, TP2 x PP2; OLMO: TP2,
and OLMO_FULL: PP2), each
against one process training the same global batch; a checkpoint carried across
meshes (TP2 x PP2 -> 1 process -> TP2) and resumed under its own mesh; each layout's counted
communication against the planner's prediction (gptforge.plan.cost.comm_volume); impossible layouts
refused. Every layout trains 10 steps (Muon 3: see test_layout_matches_one_process).

Two torchrun launches (4 ranks, then 2) run every job; the 1-process references run here between
them. Tolerances (float32 throughout):
- losses and gradient norms: relative 1e-5. Sharding only reorders sums (a row-parallel matmul adds
  partial products across ranks, a norm's weight gradient is summed over sequence shards), which
  moves a float32 loss by a few ulps (observed <= 1.7e-7 relative over 10 steps; grad norms <= 1e-6).
- final weights: absolute 5e-4 per entry. AdamW divides by sqrt(v): where a gradient entry is tiny,
  reordered sums change m/sqrt(v) noticeably, but one step moves an entry by at most about lr
  (3e-3) and 10 steps by at most ~3e-2; observed differences are <= 1.3e-5 here, and up to 1.5e-4 in
  other shapes tried. A real
  layout error (e.g. the fused q/k/v rows in the wrong order) moves weights by ~0.1; a missing
  gradient reduction shows in the loss and norm.
The family jobs (FAMILIES) add only work that is elementwise, per position or per head (caps, scales,
norms, masks, rope), done on each rank as on one process (OLMO_FULL's QK-norm over every head runs whole
on a pipeline stage), so only the same sums are reordered and the
same bounds hold (observed over 10 steps: loss 1.6e-7, norm 1.3e-6 relative, weights 1.9e-6); a stage
that numbers its layers from 0 moves the first loss by 1.5e-3 relative.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptforge.config import Config, ConfigError, DistConfig, OptimConfig
from gptforge.models.llama import LlamaConfig
from gptforge.parallel.mesh import check_layout
from gptforge.plan.cost import comm_volume, run_layout
from gptforge.run.metrics import read_metrics
from gptforge.training.loop import train
from tests.conftest import make_shards, tiny_config
from tests.training.test_distributed import _torchrun

HERE = Path(__file__).parent
STEPS = 10
VOCAB = 500  # padded to 512: the vocabulary-sharded head must mask the padded rows, not slice them


# Gemma 3's shape of model: heads 16 wide apart from n_embd/n_head = 8, QK-norm, (1 + weight) norms around both
# sublayers, scaled embeddings, GeGLU; layer 0 slides (a 4-token window in 16, its own rope base), layer 1 is
# full, so a pipeline stage that numbered its layers from 0 would slide layer 1; the caps are small enough to bite
# (scores after QK-norm reach ~3, logits ~0.1: a missing cap moves the first loss by far more than 1e-5)
# Granite's multipliers on it too: each branch halved before its add, the logits divided by 2 before the cap.
FAMILY = dict(qk_norm=True, head_size=16, sliding_window=4, layer_types="sf", rope_local_theta=100.0,
              attn_softcap=1.0, query_pre_attn_scalar=24.0, embed_scale=32 ** 0.5, norm_plus_one=True,
              post_norms=True, mlp="geglu", logit_softcap=0.2, residual_scale=0.5, logits_scaling=2.0)
# OLMo 2's block (norms after attention and MLP, none before: Gemma's pre-norms exclude it) with Granite's
# attention multiplier (Gemma's query_pre_attn_scalar excludes it) and a per-head QK-norm: under TP the
# attention and MLP take the un-normed residual's sequence shards. OLMO_FULL normalises q and k over every
# head at once, which only pipeline parallelism runs (parallel/mesh.py's PIPELINE_ONLY).
OLMO = dict(post_norms=True, pre_norms=False, qk_norm=True, attn_scale=0.6)
OLMO_FULL = dict(OLMO, qk_norm_full=True)
FAMILIES = {"family": FAMILY, "olmo": OLMO, "olmo_full": OLMO_FULL}


def _cfg(data: Path, out: Path, arch: str = "gpt2", n_layer: int = 2, optim: str = "adamw", **dist) -> Config:
    # 2 micro-batches of 2 x 16 tokens per step on one process (1 per rank under a data dimension of 2)
    cfg = tiny_config(data, out, max_steps=STEPS, micro_batch=2, total_batch_tokens=64, val_every=0,
                      val_tokens=64, ckpt_every=0, keep_ckpts=0)
    cfg.model.dropout = 0.0
    cfg.model.vocab_size = VOCAB
    cfg.model.n_layer = n_layer
    if arch == "llama":  # GQA (4 query heads over 2 key/value heads) and QK-norm, untied head
        cfg.model = LlamaConfig(n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=VOCAB,
                                qk_norm=True)
    if arch in FAMILIES:  # every field the newer families add (Qwen3, Mistral, Phi-3, Gemma 2/3, Granite, OLMo 2)
        cfg.model = LlamaConfig(n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=VOCAB,
                                **FAMILIES[arch])
    if optim == "muon":  # 3 steps: an extra beyond the layouts (see test_layout_matches_one_process)
        cfg.optim = OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, warmup_steps=2, min_lr_frac=0.1)
        cfg.train.max_steps = MUON_STEPS
    cfg.dist = DistConfig(**dist)
    cfg.train.trust_checkpoint = True  # DCP checkpoints these tests wrote themselves
    return cfg


def _job(cfg: Config, name: str, tmp: Path, **extra) -> dict:
    return {"config": cfg.to_dict(), "out": str(tmp / f"{name}.json"), **extra}


def _launch(jobs: list[dict], tmp: Path, nproc: int, name: str) -> str:
    """Runs ``jobs`` under torchrun; returns what the workers printed (stdout and stderr)."""
    spec = tmp / f"{name}.json"
    spec.write_text(json.dumps(jobs))
    proc = _torchrun(["--nproc_per_node", str(nproc), str(HERE / "dist_worker.py"), str(spec)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def _run(run_dir: Path) -> dict:
    """Per-step losses, gradient norms and counted traffic (dist.count_comm) from metrics.jsonl, and
    the last checkpoint's weights."""
    recs = [r for r in read_metrics(run_dir) if r["kind"] == "train"]
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return {"loss": {r["step"]: r["loss"] for r in recs}, "norm": {r["step"]: r["grad_norm"] for r in recs},
            "comm": {r["step"]: r["comm"] for r in recs if "comm" in r},
            "weights": load_file(str(last / "model.safetensors")), "step": int(last.name.split("_")[1])}


# name -> (arch, n_layer, dist[, optim]); the 4-rank launch, then the 2-rank one. Every job but Muon's
# also counts its last step's collectives (dist.count_comm) for test_counted_traffic_equals_the_planner.
# The 1-process references train the same global batch (4 sequences) in 2 micro-batches
FOUR = {
    "g_tp2pp2": ("gpt2", 2, dict(tp=2, pp=2)),  # 1F1B; its step-5 checkpoint starts the cross-mesh chain
    "l_tp2pp2": ("llama", 2, dict(tp=2, pp=2, pp_schedule="gpipe")),  # with block recomputation
    "g1_fsdp_tp2": ("gpt2", 1, dict(tp=2, shard="fsdp")),  # one layer, with MLP recomputation
    "l_fsdp_tp2": ("llama", 2, dict(tp=2, shard="fsdp")),
    "g_hsdp": ("gpt2", 2, dict(dp_replicate=2, shard="fsdp")),  # B 1
    "l_hsdp": ("llama", 2, dict(dp_replicate=2, shard="fsdp")),  # B 1
    "g_pp2_fsdp2": ("gpt2", 2, dict(pp=2, shard="fsdp")),  # stages x FSDP, the tied head on both ends, B 1
    "g4_ipp2_fsdp2": ("gpt2", 4, dict(pp=2, shard="fsdp", pp_schedule="interleaved1f1b")),  # B 1
    "f_tp2pp2": ("family", 2, dict(tp=2, pp=2)),  # the family fields on sequence-sharded stages, recomputed
}
TWO = {
    "g_tp2": ("gpt2", 2, dict(tp=2)),
    "l_tp2": ("llama", 2, dict(tp=2)),
    "l_tp2_muon": ("llama", 2, dict(tp=2), "muon"),  # Muon gathers each TP-sharded matrix
    "g_pp2": ("gpt2", 2, dict(pp=2, pp_schedule="gpipe")),  # under a batch-size ramp: 2, 3, 3, then 4 micro-batches
    "l_pp2": ("llama", 2, dict(pp=2, pp_schedule="1f1b")),  # stopped at step 5, resumed (same mesh)
    "g4_ipp2": ("gpt2", 4, dict(pp=2, pp_schedule="interleaved1f1b")),  # 2 stages per rank
    "g6_ipp2v3": ("gpt2", 6, dict(pp=2, pp_schedule="interleaved1f1b", pp_virtual=3)),  # 3 stages per rank
    "f_tp2": ("family", 2, dict(tp=2)),  # the family fields split by heads, their norms on sequence shards
    "f_pp2": ("family", 2, dict(pp=2)),  # ... and by layers: each stage's window and rope by the global index
    "o_tp2": ("olmo", 2, dict(tp=2)),  # no input norms: the attention and MLP gather the residual's shards
    "o_pp2": ("olmo_full", 2, dict(pp=2)),  # QK-norm over every head: pipeline parallelism only
}
MUON_STEPS = 3
CHAIN = 5  # TP2 x PP2 for steps 1-5, one process for 6-7, TP2 for 8-10


def _ramp(cfg: Config) -> Config:
    """A batch-size ramp over the first 4 steps from half the batch, in micro-batches of one sequence."""
    cfg.train.micro_batch, cfg.train.batch_warmup_steps, cfg.train.batch_warmup_start = 1, 4, 0.5
    return cfg


def _layout_cfg(data: Path, tmp: Path, name: str) -> Config:
    arch, n_layer, d, *opt = {**FOUR, **TWO}[name]
    cfg = _cfg(data, tmp / name, arch, n_layer, *opt, **d)
    cfg.model.recompute = {"l_tp2pp2": "block", "f_tp2pp2": "block", "g1_fsdp_tp2": "mlp"}.get(name, "none")  # same math
    cfg.dist.count_comm = 0 if opt else STEPS  # the last step (the first also sends pipeline shapes)
    if name == "g_pp2":
        _ramp(cfg)
    if name in ("g_pp2_fsdp2", "g4_ipp2_fsdp2", "g_hsdp", "l_hsdp"):  # 2 micro-batches per pipeline (one per stage) on 2 data ranks;
        cfg.train.micro_batch = 1  # HSDP: one sequence on each of 4 data ranks
    return cfg


@pytest.fixture(scope="module")
def mp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mp")
    data = make_shards(tmp / "data", vocab=VOCAB)
    jobs = []
    for name in FOUR:
        cfg = _layout_cfg(data, tmp, name)
        if name == "g_tp2pp2":
            cfg.train.ckpt_every = CHAIN
        jobs.append(_job(cfg, name, tmp))
    _launch(jobs, tmp, 4, "four")

    # the 1-process references, and the middle of the cross-mesh chain: the TP2 x PP2 checkpoint of
    # step 5 (DCP, four ranks' shards) resumed on one process for steps 6-7 (a single-file checkpoint)
    refs = {key: _run(train(_cfg(data, tmp / f"ref_{'_'.join(map(str, key))}", *key)).run_dir)
            for key in (("gpt2", 1, "adamw"), ("gpt2", 2, "adamw"), ("llama", 2, "adamw"), ("gpt2", 4, "adamw"),
                        ("gpt2", 6, "adamw"), ("llama", 2, "muon"), ("family", 2, "adamw"), ("olmo", 2, "adamw"),
                        ("olmo_full", 2, "adamw"))}
    refs[("gpt2", 2, "ramp")] = _run(train(_ramp(_cfg(data, tmp / "ref_gpt2_2_ramp"))).run_dir)
    chain = tmp / "chain"
    shutil.copytree(tmp / "g_tp2pp2", chain)
    shutil.rmtree(chain / "checkpoints" / f"step_{STEPS:06d}")
    (chain / "metrics.jsonl").unlink()
    one = train(_cfg(data, chain), resume=chain / "checkpoints" / f"step_{CHAIN:06d}", stop_at_step=CHAIN + 2)
    assert one.steps_done == CHAIN + 2

    jobs = [_job(_layout_cfg(data, tmp, name), name, tmp) for name in TWO]
    # l_pp2 stops after step 5 and resumes under the same mesh for steps 6-10 (its own DCP checkpoint)
    i = list(TWO).index("l_pp2")
    jobs[i]["stop_at_step"] = CHAIN
    jobs.insert(i + 1, {**jobs[i], "stop_at_step": None, "resume": "latest"})
    whole = _layout_cfg(data, tmp, "l_pp2")  # the same mesh, not stopped: the resumed run's reference
    whole.train.out_dir = str(tmp / "l_pp2_whole")
    jobs.insert(i + 2, _job(whole, "l_pp2_whole", tmp))
    jobs.append(_job(_cfg(data, chain, tp=2), "chain", tmp, resume="latest"))  # steps 8-10 under TP2
    printed = _launch(jobs, tmp, 2, "two")
    runs = {name: _run(tmp / name) for name in [*FOUR, *TWO, "l_pp2_whole"]}
    return {"runs": runs, "refs": refs, "chain": _run(chain), "chain_one": one, "data": data, "tmp": tmp,
            "printed_two": printed}


def _same(run: dict, ref: dict, steps=range(1, STEPS + 1), rtol: float = 1e-5, muon: bool = False) -> None:
    for s in steps:
        assert run["loss"][s] == pytest.approx(ref["loss"][s], rel=rtol), ("loss", s)
        assert run["norm"][s] == pytest.approx(ref["norm"][s], rel=rtol), ("grad norm", s)
    assert set(run["weights"]) == set(ref["weights"])
    for k, w in ref["weights"].items():
        diff = (run["weights"][k] - w).abs()
        # Muon: the mean, as a rare embedding row's AdamW step (tiny v) may differ by more in one entry
        assert (diff.mean() if muon else diff.max()).item() <= (3e-4 if muon else 5e-4), k


@pytest.mark.parametrize("name", [*FOUR, *TWO])
def test_layout_matches_one_process(mp, name):
    arch, n_layer, _, *opt = {**FOUR, **TWO}[name]
    optim = "ramp" if name == "g_pp2" else opt[0] if opt else "adamw"
    if optim == "muon":
        # Muon orthogonalises in bfloat16: a last-bit difference in a summed gradient can round an element
        # of the update the other way (as under FSDP, test_muon_distributed), so losses and norms agree to
        # ~1e-5 relative (held to 1e-4), and weights on average to under a tenth of one Muon step (0.02 x
        # ~0.2). Over more steps these roundings compound: by steps 6-10 the gradient norm differs by up
        # to ~8e-4 relative while the loss stays within 1e-5 (measured), so Muon runs 3 steps
        _same(mp["runs"][name], mp["refs"][(arch, n_layer, optim)], steps=range(1, MUON_STEPS + 1), rtol=1e-4,
              muon=True)
    else:
        _same(mp["runs"][name], mp["refs"][(arch, n_layer, optim)])


def test_the_family_jobs_train_every_field_tensor_and_pipeline_parallelism_take():
    """What check_layout lets through under TP and under PP (parallel/mesh.py) is what the family jobs above
    train under TP and under PP: a field added there without a job here, or left out of FAMILIES, fails."""
    from gptforge.parallel.mesh import MODEL_PARALLEL_FEATURES, PIPELINE_ONLY

    trained = {"tp": set(), "pp": set()}
    for arch, _, d in (job[:3] for job in {**FOUR, **TWO}.values()):
        if arch in FAMILIES:
            fields = set(LlamaConfig(n_layer=2, n_head=4, n_embd=32, **FAMILIES[arch]).features())
            for dim in ("tp", "pp"):
                if d.get(dim, 1) > 1:
                    trained[dim] |= fields
    assert trained["tp"] == MODEL_PARALLEL_FEATURES
    assert trained["pp"] == MODEL_PARALLEL_FEATURES | set(PIPELINE_ONLY)


def test_resume_under_the_same_mesh_is_exact(mp):
    """PP2 (1F1B) stopped after step 5 and resumed: steps 6-10's losses, gradient norms and the final
    weights are bit for bit those of the same mesh run without stopping."""
    run, ref = mp["runs"]["l_pp2"], mp["runs"]["l_pp2_whole"]
    assert run["loss"] == ref["loss"] and run["norm"] == ref["norm"]
    for k, w in ref["weights"].items():
        assert torch.equal(run["weights"][k], w), k


@pytest.mark.parametrize("name", [n for n in [*FOUR, *TWO] if len({**FOUR, **TWO}[n]) == 3])
def test_counted_traffic_equals_the_planner(mp, name):
    """Rank 0's collectives in the last step (every call, counted by dist.count_comm in bytes by mesh
    dimension and kind) are exactly the planner's comm_volume for that layout and stage 0, float32."""
    cfg = _layout_cfg(mp["data"], mp["tmp"], name)
    world = 4 if name in FOUR else 2
    layout, batch = run_layout(cfg, world)
    predicted = comm_volume(cfg.model, layout, batch, cfg.train.seq_len, stage=0, precision="float32")
    predicted = {k: int(e["payload"]) for k, e in predicted.items() if k != "detail"}
    counted = dict(mp["runs"][name]["comm"][STEPS])
    assert counted.pop("scalars") <= 4  # the loss, the norm, the pipeline's loss: latency only
    assert counted == predicted, {k: (counted.get(k), predicted.get(k)) for k in {*counted, *predicted}
                                  if counted.get(k) != predicted.get(k)}
    assert any(k.startswith("tp.") or k.startswith("pp.") for k in counted) or layout.dp > 1


def test_tp_and_pp_runs_name_their_own_layout(mp):
    """Issue 34: a TP or PP run (FSDP off) does not say 'dist.shard fsdp', and torch's 'torch.distributed
    is disabled' warning (rank 0 reading a pipeline checkpoint back whole) does not leak on save."""
    out = mp["printed_two"]
    assert "dist.shard fsdp" not in out and "torch.distributed is disabled" not in out
    assert "no in-loop samples under tensor parallel (dist.tp 2)" in out
    assert "no in-loop samples under pipeline parallel (dist.pp 2)" in out


def test_checkpoint_crosses_meshes(mp):
    """TP2 x PP2 (steps 1-5) -> one process (6-7) -> TP2 (8-10) trains the reference's curve."""
    ref = mp["refs"][("gpt2", 2, "adamw")]
    for s in (CHAIN + 1, CHAIN + 2):
        assert mp["chain_one"].train_losses[s] == pytest.approx(ref["loss"][s], rel=1e-5)
    assert mp["chain"]["step"] == STEPS
    _same(mp["chain"], ref, steps=range(CHAIN + 3, STEPS + 1))


@pytest.mark.parametrize("dist, key", [
    (dict(tp=3), "dist.tp"),  # world 4 not divisible by 3
    (dict(tp=4), "dist.tp"),  # GPT-2 here has 2 heads: not divisible over 4 ranks
    (dict(pp=4), "dist.pp"),  # 2 layers over 4 stages
    (dict(dp_replicate=2), "dist.dp_replicate"),  # HSDP without dist.shard fsdp
    (dict(tp=2, shard="zero1"), "dist.shard"),
])
def test_impossible_layouts_are_refused_before_compute(tmp_path, dist, key):
    cfg = _cfg(tmp_path, tmp_path / "out", **dist)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_layout(cfg, 4, local_world=4)


def test_layout_checks_name_heads_micro_batches_and_nodes(tmp_path):
    cfg = _cfg(tmp_path, tmp_path / "out", "llama", tp=4)  # 2 KV heads over 4 ranks
    with pytest.raises(ConfigError, match="n_kv_head"):
        check_layout(cfg, 4, local_world=4)
    cfg = _cfg(tmp_path, tmp_path / "out", tp=2)
    with pytest.raises(ConfigError, match="processes per node"):  # TP across nodes
        check_layout(cfg, 4, local_world=1)
    # a family's own plan's constraint: GPT-2's position table is split by rows, Llama has none
    cfg = _cfg(tmp_path, tmp_path / "out", tp=2)
    cfg.model.block_size = 33
    with pytest.raises(ConfigError, match=r"model\.block_size = 33 .*position table"):
        check_layout(cfg, 2, local_world=2)
    cfg = _cfg(tmp_path, tmp_path / "out", "llama", tp=2)
    cfg.model.block_size = 33
    check_layout(cfg, 2, local_world=2)
    cfg = _cfg(tmp_path, tmp_path / "out", pp=2)
    cfg.train.total_batch_tokens = 32  # one micro-batch, two stages
    with pytest.raises(ConfigError, match="fewer than the 2 pipeline stages"):
        check_layout(cfg, 2, local_world=2)
    cfg = _ramp(_cfg(tmp_path, tmp_path / "out", pp=2))
    assert check_layout(cfg, 2, local_world=2) == 4  # the ramp starts at 2 micro-batches: enough
    cfg.train.batch_warmup_start = 0.25  # ... at 1: the pipeline would not fill
    with pytest.raises(ConfigError, match="ramp starts at 1 micro-batch"):
        check_layout(cfg, 2, local_world=2)
    cfg.train.batch_warmup_start, cfg.dist.pp_schedule = 0.5, "interleaved1f1b"
    cfg.model.n_layer = 4
    with pytest.raises(ConfigError, match=r"dist\.pp_schedule"):
        check_layout(cfg, 2, local_world=2)
    cfg = _cfg(tmp_path, tmp_path / "out", "llama", tp=2)
    cfg.train.compile = True  # per-block compile under DTensor TP: crashes in Llama's backward (torch 2.13)
    with pytest.raises(ConfigError, match=r"train\.compile"):
        check_layout(cfg, 2, local_world=2)
    cfg.dist.tp, cfg.dist.pp = 1, 2  # pipeline stages compile (checked: losses equal eager to 1e-7)
    check_layout(cfg, 2, local_world=2)
    assert check_layout(_cfg(tmp_path, tmp_path / "out", tp=2, pp=2), 4, local_world=4) == 2
    assert check_layout(_cfg(tmp_path, tmp_path / "out", tp=2, pp=2), 1) == 2  # one process: no effect


# --- the GPU lane: the same layouts on NCCL, one GPU per rank ----------------------------------------

@pytest.mark.gpu
def test_gpu_lane_layouts_match_one_gpu(tmp_path):
    """TP2, PP2 (1F1B) and, with 4 GPUs, TP2 x PP2 and FSDP2 x TP2, for both families and FAMILY's
    fields, on CUDA with NCCL, against one GPU in float32. cuBLAS may pick other kernels for the sharded
    shapes and NCCL sums in its own order, so losses and norms are held to relative 1e-4, weights to 1e-3."""

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs at least 2 GPUs, found {n}")
    data = make_shards(tmp_path / "data", vocab=VOCAB)
    layouts = {"tp2": dict(tp=2), "pp2": dict(pp=2)}
    if n >= 4:
        layouts.update({"tp2pp2": dict(tp=2, pp=2), "fsdp_tp2": dict(tp=2, shard="fsdp")})
    world = 4 if n >= 4 else 2

    def gpu(cfg: Config) -> Config:
        cfg.train.device = "cuda"
        cfg.train.tf32 = False  # float32 matmuls, so the comparison is about sharding, not TF32 rounding
        return cfg

    jobs, names = [], []
    for arch in ("gpt2", "llama", "family"):
        for lname, d in layouts.items():
            if world == 4 and d.get("tp", 1) * d.get("pp", 1) * (2 if d.get("shard") else 1) != 4:
                continue  # at world 4 only the 4-rank layouts
            name = f"{arch}_{lname}"
            names.append((name, arch))
            jobs.append(_job(gpu(_cfg(data, tmp_path / name, arch, **d)), name, tmp_path))
    spec = tmp_path / "gpu.json"
    spec.write_text(json.dumps(jobs))
    proc = _torchrun(["--nproc_per_node", str(world), str(HERE / "dist_worker.py"), str(spec)],
                     env_extra={"GPTFORGE_TEST_BACKEND": "nccl"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for arch in ("gpt2", "llama", "family"):
        ref = _run(train(gpu(_cfg(data, tmp_path / f"ref_{arch}", arch))).run_dir)
        for name, a in names:
            if a != arch:
                continue
            run = _run(tmp_path / name)
            for s in range(1, STEPS + 1):
                assert run["loss"][s] == pytest.approx(ref["loss"][s], rel=1e-4), (name, s)
                assert run["norm"][s] == pytest.approx(ref["norm"][s], rel=1e-4), (name, s)
            for k, w in ref["weights"].items():
                assert (run["weights"][k] - w).abs().max().item() <= 1e-3, (name, k)


def test_compile_is_off_by_default_under_tensor_parallelism(monkeypatch):
    """train.compile auto (on for CUDA) leaves it off under dist.tp > 1, where asking for it is refused."""
    from gptforge.runtime import set_precision

    cfg = _cfg(Path("data"), Path("out"), tp=2)
    cfg.train.compile, cfg.train.dtype, cfg.train.tf32 = None, "float32", False
    cuda = torch.device("cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # set for a CUDA device
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert set_precision(cfg, cuda)[2] is False
        cfg.dist.tp, cfg.dist.pp = 1, 2
        assert set_precision(cfg, cuda)[2] is True
        monkeypatch.setenv("WORLD_SIZE", "1")  # one process: dist.tp has no effect
        cfg.dist.tp, cfg.dist.pp = 2, 1
        assert set_precision(cfg, cuda)[2] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_cli_refuses_an_impossible_mesh_with_exit_2(tmp_path):
    """Under torchrun (WORLD_SIZE 4, 2 processes per node) a TP degree wider than a node exits 2
    naming the key, before any data or model, with no traceback."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gptforge", "train", "--preset", "tiny", "--dist.tp", "4",
                           "--train.total_batch_tokens", "1024", "--train.out_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "dist.tp" in proc.stderr and "processes per node" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
