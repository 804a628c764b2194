"""Memory plan and the bigger presets: parameter counts against the model itself, the estimate
against measured peak memory, proposals that fit, llm.c's hyperparameters."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.cli import main
from gptforge.models.gpt2 import GPT
from gptforge.plan import GIB, LiveTensorBytes, count_params, estimate, measure_peak, propose
from gptforge.plan.memory import head_path
from gptforge.presets import get_preset


@pytest.mark.parametrize("name", ["tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"])
def test_param_count_matches_the_model(name):
    cfg = get_preset(name)
    with torch.device("meta"):  # no memory: shapes only
        model = GPT(cfg.model)
    assert count_params(cfg) == model.num_parameters()


def test_tracker_sees_allocations_and_frees():
    tr = LiveTensorBytes()
    with tr:
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(1 << 20, dtype=torch.uint8)
        del a, b
        c = torch.zeros(1 << 19, dtype=torch.uint8)
    assert tr.peak == 2 << 20 and tr.live == 1 << 19
    del c


@pytest.mark.parametrize("recompute", ["none", "mlp"])
def test_estimate_is_close_to_measured_peak(recompute):
    """A body-heavy tiny model (small vocabulary) so activations, not logits, dominate."""
    cfg = get_preset("shakespeare-cpu")
    cfg.model.vocab_size, cfg.model.pad_vocab, cfg.model.recompute = 512, False, recompute
    cfg.train.micro_batch, cfg.train.total_batch_tokens, cfg.train.device, cfg.train.dtype = 16, 2048, "cpu", "float32"
    measured, kind = measure_peak(cfg, steps=2)
    # the steps ran here, on the CPU: the plain loss, as training (and `plan --measure`) decides it here
    est = estimate(cfg, 1, dtype="float32", fused=True, fused_ce=head_path(cfg, torch.device("cpu"))[0])
    assert kind == "cpu_live_tensor_peak"
    assert 0.95 < est.peak / measured < 1.2, (est, measured)


def test_recompute_and_sharding_shrink_the_estimate():
    cfg = get_preset("gpt2-1.5b")
    base = estimate(cfg, 8, micro_batch=16)
    assert estimate(cfg, 8, micro_batch=16, recompute="mlp").activations < base.activations
    assert estimate(cfg, 8, micro_batch=16, recompute="block").activations < base.activations / 3
    zero = estimate(cfg, 8, micro_batch=16, sharding="zero1")
    assert zero.optimizer == pytest.approx(base.optimizer / 8) and zero.weights == base.weights
    fsdp = estimate(cfg, 8, micro_batch=16, sharding="fsdp")
    assert fsdp.grads == pytest.approx(base.grads / 8) and fsdp.weights < base.weights / 4


def test_proposal_fits_and_divides_the_batch():
    cfg = get_preset("gpt2-1.5b")
    rows, best = propose(cfg, 80, 8)
    assert best is not None and best.peak <= 78 * GIB
    assert cfg.train.total_batch_tokens % (best.micro_batch * 1024 * 8) == 0
    assert propose(cfg, 16, 1)[1] is None  # 1.5B with AdamW needs ~23 GiB before any activation


def test_plan_recommends_a_micro_batch_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--preset", "gpt2-350m", "--gpu-mem", "40", "--world", "8", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended: --train.micro_batch" in text
    plan = json.loads(out.read_text())
    assert plan["recommended"]["peak"] <= 38 * GIB and plan["params"] == count_params(get_preset("gpt2-350m"))
    assert main(["plan", "--preset", "gpt2-1.5b", "--gpu-mem", "16", "--world", "1"]) == 1
    assert "nothing fits" in capsys.readouterr().out
    assert main(["plan", "--preset", "gpt2-124m", "--world", "0"]) == 2
    assert main(["plan", "--preset", "gpt2-124m", "--train.seq_len", "4096"]) == 2  # exceeds block_size


def test_bigger_presets_use_llmc_hyperparameters():
    p350, p774, p15 = get_preset("gpt2-350m"), get_preset("gpt2-774m"), get_preset("gpt2-1.5b")
    assert (p350.model.n_layer, p350.model.n_embd, p350.optim.lr, p350.train.max_steps) == (24, 1024, 3e-4, 60_000)
    assert (p774.model.n_layer, p774.model.n_embd, p774.optim.lr, p774.train.micro_batch) == (36, 1280, 2.5e-4, 32)
    assert (p15.model.n_layer, p15.model.n_embd, p15.optim.lr, p15.optim.min_lr_frac) == (48, 1600, 6e-4, 0.1)
    assert p15.train.total_batch_tokens == 1_048_576 and p15.train.max_steps == 32_000
    for p in (p350, p774, p15):
        assert p.dist.shard == "zero1" and p.optim.warmup_steps == 700 and p.optim.weight_decay == 0.1
        assert p.validate(8) >= 1  # the total batch divides on 8 GPUs, as in llm.c


def test_an_indivisible_world_is_named_as_divisibility_not_size():
    """Issue 34: 100 ranks x 2048 tokens fit inside 3,145,728 but do not divide it; 'smaller than' was false."""
    from gptforge.config import ConfigError

    cfg = get_preset("gpt3-175b")
    with pytest.raises(ConfigError, match="not a multiple") as e:
        propose(cfg, 80, 100)
    assert "smaller" not in str(e.value)
    cfg.train.total_batch_tokens = cfg.train.seq_len * 4
    with pytest.raises(ConfigError, match="smaller than one sequence per rank"):
        propose(cfg, 80, 8)
