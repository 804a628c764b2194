"""``gptforge plan`` counts the output head as training will run it (issue 58): the fused classifier
(``model.fused_ce``, default auto) decided by training's own resolver for the plan's target, a CUDA GPU
with triton, not for the machine planning; its head memory is one (B·T, padded vocabulary) buffer that
holds the logits and then their gradient (``kernels/fused_ce.py``), against the plain loss's logits,
log-softmax and their gradients. Every figure here is counted by hand from those two code paths."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.models.registry import size_config
from gptforge.plan.memory import GPU_TARGET, estimate, head_path, propose
from gptforge.presets import get_preset

CUDA, CPU = torch.device("cuda"), torch.device("cpu")  # a device object only: no GPU is touched
B, T, V, VP = 4, 32, 300, 384  # 300 padded to the next multiple of 128 (models: padded_vocab)


def _cfg(*overrides: str, preset: str | None = None) -> Config:
    if preset:
        cfg = get_preset(preset)
    else:
        cfg = Config(model=dataclasses.replace(size_config("d2"), vocab_size=V, block_size=T))
        cfg.train.seq_len, cfg.train.micro_batch, cfg.train.total_batch_tokens = T, B, B * T * 4
    apply_overrides(cfg, list(overrides))
    return cfg


def test_the_padded_vocabulary_is_the_hand_one():
    assert _cfg().model.padded_vocab_size == VP  # so V and Vp differ below: a V/Vp mix-up shows


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_and_plain_heads_differ_by_the_hand_count(dtype):
    """Per token, the plain loss (models/head.py: ``F.cross_entropy(logits.float())``) holds the logits
    (Vp wide, in the compute dtype: 2 bytes under bf16 autocast, 4 in float32), the float32 log-softmax
    (4V) and as much again for their gradients: under bf16 the gradient of the log-softmax (4V), of its
    float32 input (4V) and of the bf16 logits (2Vp), so 2Vp + 4V + 8V + 2Vp; in float32 (4Vp + 4V) * 2.
    The fused classifier holds one buffer, Vp wide in the compute dtype, that is first the logits and
    then, overwritten in place, their gradient: 2Vp (bf16) or 4Vp (float32). The difference per token is
    bf16: 2Vp + 12V = 768 + 3600 = 4368 bytes; float32: 4Vp + 8V = 1536 + 2400 = 3936 bytes."""
    per_token = {"bfloat16": 2 * 384 + 12 * 300, "float32": 4 * 384 + 8 * 300}[dtype]
    assert per_token == {"bfloat16": 4368, "float32": 3936}[dtype]
    cfg = _cfg()
    on, off = (estimate(cfg, 1, dtype=dtype, fused_ce=f) for f in (True, False))
    assert off.activations - on.activations == B * T * per_token
    assert off.peak - on.peak == B * T * per_token  # the head is held at the backward peak
    assert (on.weights, on.grads, on.optimizer) == (off.weights, off.grads, off.optimizer)


def test_fused_activations_are_the_hand_count():
    """Absolute, not only the difference: per token, 38·C per GPT-2 block under bf16 autocast (the
    planner's docstring hand count, pinned per layout in test_plan_memory_layouts), the final LayerNorm's
    float32 input and the bf16 copy the head's matmul keeps (6·C), and the fused buffer (2·Vp)."""
    cfg = _cfg()
    C, L = 64, 2
    assert (cfg.model.n_embd, cfg.model.n_layer) == (C, L)
    e = estimate(cfg, 1, dtype="bfloat16", fused_ce=True)
    assert e.activations == B * T * (L * 38 * C + 6 * C + 2 * VP)


def test_auto_on_a_cuda_target_with_triton_plans_the_fused_head():
    cfg = _cfg()
    assert cfg.model.fused_ce is None  # auto, the default
    assert head_path(cfg, CUDA, triton=True) == (True, "model.fused_ce=auto on a CUDA GPU with triton")
    assert GPU_TARGET == (CUDA, True)
    assert estimate(cfg, 1).peak == estimate(cfg, 1, fused_ce=True).peak < estimate(cfg, 1, fused_ce=False).peak


def test_the_table_plans_for_its_gpu_not_for_this_machine(monkeypatch):
    """A planning machine without triton (or without a GPU) still plans the GPU run with the fused head;
    the target's own triton decides (a CUDA target without triton: off, naming triton)."""
    import gptforge.kernels.fused_ce as fce

    monkeypatch.setattr(fce, "triton_available", lambda: False)
    cfg = _cfg()
    assert head_path(cfg, *GPU_TARGET)[0] is True
    assert estimate(cfg, 1).peak == estimate(cfg, 1, fused_ce=True).peak
    on, why = head_path(cfg, CUDA, triton=False)
    assert not on and why.startswith("model.fused_ce=auto: ") and "triton" in why


def test_auto_on_a_cpu_target_plans_the_plain_head(monkeypatch):
    """On a CPU auto is off, even with triton and under TRITON_INTERPRET (as training decides it)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = _cfg()
    assert head_path(cfg, CPU, triton=True) == (False, "model.fused_ce=auto: off on cpu")


@pytest.mark.parametrize("overrides,key", [
    (("--dist.tp", "2"), "dist.tp=2"),
    (("--dist.pp", "2"), "dist.pp=2"),
    (("--model.lm_head_fp8", "true"), "model.lm_head_fp8"),
])
def test_auto_on_a_cuda_target_plans_plain_where_fused_cannot_run(overrides, key):
    cfg = _cfg(*overrides)
    on, why = head_path(cfg, CUDA, triton=True)
    assert not on and why.startswith("model.fused_ce=auto: ") and key in why, why
    assert estimate(cfg, 1).peak == estimate(cfg, 1, fused_ce=False).peak != estimate(cfg, 1, fused_ce=True).peak


def test_a_logit_softcap_plans_plain_on_a_cuda_target():
    cfg = _cfg("--model.logit_softcap", "30", preset="llama-tiny")
    on, why = head_path(cfg, CUDA, triton=True)
    assert not on and "model.logit_softcap=30" in why, why
    plain = _cfg(preset="llama-tiny")
    assert head_path(plain, CUDA, triton=True)[0] is True  # the same model without the cap: on
    assert estimate(cfg, 1).peak == estimate(cfg, 1, fused_ce=False).peak != estimate(cfg, 1, fused_ce=True).peak


def test_an_explicit_setting_is_planned_as_given():
    assert head_path(_cfg("--model.fused_ce", "false"), CUDA, triton=True) == (False, "model.fused_ce=false")
    assert head_path(_cfg("--model.fused_ce", "true"), CUDA, triton=True) == (True, "model.fused_ce=true")
    with pytest.raises(ConfigError, match=r"^model.fused_ce=true: dist.pp=2: .*use --model.fused_ce auto or false"):
        head_path(_cfg("--model.fused_ce", "true", "--dist.pp", "2"), CUDA, triton=True)


def test_propose_estimates_every_row_with_the_resolved_head():
    for overrides, fused in (((), True), (("--dist.pp", "2"), False)):
        cfg = _cfg(*overrides)
        rows, _ = propose(cfg, 80, 2)
        for r in rows:
            again = estimate(cfg, 2, micro_batch=r.micro_batch, sharding=r.sharding, recompute=r.recompute,
                             fused_ce=fused)
            assert r.peak == again.peak, (overrides, r, again)


def test_plan_says_which_head_it_assumed(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--preset", "gpt2-124m", "--world", "1", "--json", str(out)]) == 0
    assert "fused classifier on (model.fused_ce=auto on a CUDA GPU with triton)" in capsys.readouterr().out
    assert json.loads(out.read_text())["fused_ce"] == {"on": True, "why": "model.fused_ce=auto on a CUDA GPU with triton"}
    assert main(["plan", "--preset", "gpt2-124m", "--world", "1", "--model.fused_ce", "false"]) == 0
    assert "fused classifier off (model.fused_ce=false)" in capsys.readouterr().out
    assert main(["plan", "--preset", "gpt2-124m", "--world", "1", "--model.fused_ce", "true", "--dist.pp", "2"]) == 2
    assert "model.fused_ce=true: dist.pp=2" in capsys.readouterr().err


# --- the layout search (plan --gpu): plan.cost decides the head per layout ---------------------------------


def test_each_layout_plans_the_head_training_would_run():
    """Auto: fused without TP and PP (on a CUDA GPU with triton), plain under either, the reason naming the
    degree; the head bytes of one micro-batch differ by (16 - 2) per token and padded row (plan.cost's
    docstring: logits, log-softmax and their gradients at 16, the fused bf16 buffer at 2)."""
    from gptforge.plan.cluster import get_cluster
    from gptforge.plan.cost import Layout, head_path, memory

    m = _cfg().model
    assert head_path(m, Layout(dp=2)) == (True, "model.fused_ce=auto on a CUDA GPU with triton")
    for lay, key in ((Layout(tp=2), "dist.tp=2"), (Layout(pp=2), "dist.pp=2"), (Layout(tp=2, pp=2), "dist.tp=2")):
        on, why = head_path(m, lay)
        assert not on and key in why, (lay, why)
    assert head_path(m, Layout(engine="megatron"))[0] is False  # the paper's system keeps its own head
    lay, cluster = Layout(dp=2, micro_batch=B), get_cluster("h100-80")
    on = memory(m, lay, cluster, 8, T)
    off = memory(dataclasses.replace(m, fused_ce=False), lay, cluster, 8, T)
    assert off["activations"] - on["activations"] == B * T * (16 - 2) * VP


def test_fused_ce_true_refuses_split_layouts_as_training_does():
    from gptforge.plan.cluster import get_cluster
    from gptforge.plan.cost import Layout, check
    from gptforge.plan.search import search

    m = dataclasses.replace(_cfg().model, fused_ce=True)
    assert check(m, Layout(dp=2), 8) is None
    why = check(m, Layout(tp=2), 8)
    assert why is not None and why.startswith("model.fused_ce=true: dist.tp=2 "), why
    assert check(m, Layout(pp=2), 8).startswith("model.fused_ce=true: dist.pp=2")
    best, _ = search(m, 8, get_cluster("h100-80"), 64, T)
    assert best and all(c.layout.tp == c.layout.pp == 1 for c in best)
    auto, _ = search(_cfg().model, 8, get_cluster("h100-80"), 64, T, keep=1000)
    assert any(c.layout.tp > 1 or c.layout.pp > 1 for c in auto)  # so the refusal is what removed them


def test_plan_gpu_says_which_head_the_chosen_layout_runs(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--preset", "gpt3-175b", "--gpus", "1024", "--gpu", "h100-80", "--json", str(out)]) == 0
    layout = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("layout:"))
    assert "TP 4" in layout and "fused classifier off (model.fused_ce=auto: dist.tp=4 " in layout, layout
    best = json.loads(out.read_text())["best"][0]
    assert best["fused_ce"]["on"] is False and best["fused_ce"]["why"].startswith("model.fused_ce=auto: dist.tp=4 ")
    assert main(["plan", "--preset", "gpt2-124m", "--gpus", "1", "--gpu", "h100-80"]) == 0
    layout = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("layout:"))
    assert layout.endswith("; fused classifier on (model.fused_ce=auto on a CUDA GPU with triton)"), layout
