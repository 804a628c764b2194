"""LoRA's edges against peft (issue 32), each on a tiny model in float64: dropout in training (on the adapters'
input only, the same mask as peft's) and none in eval; the outputs' gradients to A and B; a biased base
(GPT-2's c_attn, Qwen2's q/k/v) with its adapters off, bit for bit, also after an error and when nested;
:class:`BaseOf` as the frozen reference (eval, no autograd, the policy's mode and adapters restored); A's
init bound (peft's kaiming-uniform, a = sqrt(5)) and B at zero; adapters on the base's device and dtype;
which modules a target names (peft's matching rule) and the families' default targets (peft's table); the
widest rank a layer allows; a merge against a float64 hand computation W + (alpha / r) B A."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn

peft = pytest.importorskip("peft")

from peft.tuners.tuners_utils import check_target_module_exists  # noqa: E402
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS  # noqa: E402

from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.models.lora import (  # noqa: E402
    BaseOf,
    LoRAError,
    adapters_off,
    add_lora,
    lora_layers,
    merge_lora,
    target_modules,
)
from gptforge.models.registry import build_model, size_config  # noqa: E402


class Toy(nn.Module):
    """Two targets in a row, the first biased (as Qwen2's q_proj): y = v_proj(tanh(q_proj(x)))."""

    def __init__(self, d_in: int = 24, d_mid: int = 20, d_out: int = 16):
        super().__init__()
        self.q_proj = nn.Linear(d_in, d_mid, bias=True)
        self.v_proj = nn.Linear(d_mid, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.v_proj(torch.tanh(self.q_proj(x)))


def _pair(rank: int = 4, alpha: float = 12.0, dropout: float = 0.0, base: nn.Module | None = None):
    """gptforge's adapters and peft's on copies of one float64 base, with the same A and a nonzero B."""
    torch.manual_seed(0)
    base = (base if base is not None else Toy()).double()
    ours = copy.deepcopy(base)
    add_lora(ours, "llama", rank=rank, alpha=alpha, dropout=dropout, targets=["q_proj", "v_proj"])
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, m in lora_layers(ours):
            torch.nn.init.normal_(m.lora_B.weight, std=0.3)
            p = theirs.base_model.model.get_submodule(name)
            p.lora_A["default"].weight.copy_(m.lora_A.weight)
            p.lora_B["default"].weight.copy_(m.lora_B.weight)
    return base, ours, theirs


def _adapter_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            key = name.removeprefix("base_model.model.").replace(".default", "")
            out[key] = p.grad.clone()
    assert len(out) == 4, sorted(out)
    return out


def test_dropout_in_training_is_peft_s_on_the_adapter_input_with_its_gradients():
    """Training mode, dropout 0.4: the same random mask on the same tensor (the layer's input, not A's
    output nor the update) as peft's, so the outputs and the gradients of A and B agree."""
    _, ours, theirs = _pair(dropout=0.4)
    ours.train()
    theirs.train()
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    w = torch.randn(3, 5, 16, dtype=torch.float64)
    torch.manual_seed(7)
    got = ours(x)
    torch.manual_seed(7)
    want = theirs(x)
    assert (got - want).abs().max().item() < 1e-12
    (got * w).sum().backward()
    (want * w).sum().backward()
    g_ours, g_theirs = _adapter_grads(ours), _adapter_grads(theirs)
    assert sorted(g_ours) == sorted(g_theirs)
    for k in g_ours:
        assert (g_ours[k] - g_theirs[k]).abs().max().item() < 1e-12, k
    torch.manual_seed(8)
    assert (ours(x) - got).abs().max().item() > 1e-3  # dropout did draw a mask (another seed, another output)


def test_no_dropout_in_eval_mode():
    _, ours, theirs = _pair(dropout=0.5)
    ours.eval()
    theirs.eval()
    x = torch.randn(4, 24, dtype=torch.float64)
    with torch.no_grad():
        got, again, want = ours(x), ours(x), theirs(x)
    assert torch.equal(got, again) and (got - want).abs().max().item() < 1e-12


def test_a_forward_by_hand_in_float64():
    """Each adapted layer computes W x + b + (alpha / r) B A x (no dropout): scaling alpha / r, not alpha /
    sqrt(r) (rsLoRA) nor an integer division."""
    torch.manual_seed(0)
    layer = nn.Linear(10, 6, bias=True).double()
    holder = nn.Module()
    holder.q_proj = layer
    add_lora(holder, "llama", rank=4, alpha=6.0, dropout=0.0, targets=["q_proj"])
    torch.nn.init.normal_(layer.lora_B.weight, std=0.5)
    x = torch.randn(7, 10, dtype=torch.float64)
    W, b, A, B = (t.detach() for t in (layer.weight, layer.bias, layer.lora_A.weight, layer.lora_B.weight))
    want = x @ W.T + b + 1.5 * (x @ A.T @ B.T)
    assert layer.scaling == 1.5
    assert (layer(x) - want).abs().max().item() < 1e-12
    assert (layer.delta() - 1.5 * B @ A).abs().max().item() < 1e-12


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_adapters_off_is_the_biased_base_bit_for_bit(arch):
    """GPT-2's c_attn and Qwen2's q/k/v projections carry a bias: with the adapters off the model is its base,
    bit for bit (as peft's disable_adapter()), with them on again after the block, after an error inside it,
    and after an inner block ends inside an outer one."""
    torch.manual_seed(0)
    if arch == "gpt2":
        base, targets = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                                      pad_vocab=False)), ["c_attn"]
    else:
        base, targets = build_model(size_config("llama-tiny", block_size=16, vocab_size=64, qkv_bias=True)), \
            ["q_proj", "k_proj", "v_proj"]
    base = base.double().eval()
    with torch.no_grad():
        for m in base.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(std=0.5)  # zero-started biases would hide a dropped bias
    ours = copy.deepcopy(base)
    add_lora(ours, "gpt2" if arch == "gpt2" else "llama", rank=4, alpha=8.0, dropout=0.0, targets=targets)
    assert all(m.bias is not None for _, m in lora_layers(ours))
    for _, m in lora_layers(ours):
        torch.nn.init.normal_(m.lora_B.weight, std=0.3)
    x = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        want_base, adapted = base(x)[0], ours(x)[0]
        assert (adapted - want_base).abs().max().item() > 1e-3
        with adapters_off(ours):
            assert torch.equal(ours(x)[0], want_base)
            with adapters_off(ours):
                pass
            assert torch.equal(ours(x)[0], want_base)  # the inner block gave back the outer's state
        assert torch.equal(ours(x)[0], adapted)
        with pytest.raises(RuntimeError, match="boom"), adapters_off(ours):
            raise RuntimeError("boom")
        assert torch.equal(ours(x)[0], adapted)


def test_base_of_is_the_frozen_base_in_eval_without_autograd():
    """BaseOf(policy): the base model in eval mode (the family's own dropout off too), no graph, and the policy
    keeps its training mode and its adapters."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, pad_vocab=False, dropout=0.3)
    base = GPT(cfg).double()
    policy = copy.deepcopy(base)
    add_lora(policy, "gpt2", rank=4, alpha=8.0, dropout=0.5, targets=["c_attn", "c_fc"])
    for _, m in lora_layers(policy):
        torch.nn.init.normal_(m.lora_B.weight, std=0.3)
    policy.train()
    x = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        want = base.eval()(x)[0]
    got = BaseOf(policy)(x)[0]
    assert torch.equal(got, want) and got.grad_fn is None and not got.requires_grad
    assert policy.training and all(m.training for m in policy.modules())
    assert all(m.adapter_on for _, m in lora_layers(policy))
    policy.eval()
    BaseOf(policy)(x)
    assert not policy.training  # a policy in eval stays in eval
    assert list(BaseOf(policy).parameters()) == list(policy.parameters())


def test_initial_adapters_are_peft_s():
    """A drawn as peft draws it (kaiming-uniform with a = sqrt(5): bound 1 / sqrt(in)), B zero, and the
    adapters trainable."""
    torch.manual_seed(0)
    holder = nn.Module()
    holder.q_proj, holder.v_proj = nn.Linear(256, 64), nn.Linear(64, 256)
    theirs = peft.get_peft_model(copy.deepcopy(holder), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    add_lora(holder, "llama", rank=8, alpha=16.0, dropout=0.0, targets=["q_proj", "v_proj"])
    for name, m in lora_layers(holder):
        p = theirs.base_model.model.get_submodule(name)
        bound = 1 / math.sqrt(m.in_features)
        for a in (m.lora_A.weight, p.lora_A["default"].weight):  # ours and peft's: the same bound, reached
            assert a.abs().max().item() <= bound and a.abs().max().item() > 0.97 * bound
            assert abs(a.std().item() - bound / math.sqrt(3)) < 0.1 * bound
        assert torch.equal(m.lora_B.weight, torch.zeros_like(p.lora_B["default"].weight))
        assert m.lora_A.weight.requires_grad and m.lora_B.weight.requires_grad


@pytest.mark.parametrize("device, dtype", [("meta", torch.float32), ("cpu", torch.bfloat16), ("cpu", torch.float64)])
def test_adapters_are_made_on_the_base_s_device_and_dtype(device, dtype):
    with torch.device(device):
        holder = nn.Module()
        holder.q_proj = nn.Linear(16, 8).to(dtype)
    add_lora(holder, "llama", rank=2, alpha=4.0, dropout=0.0, targets=["q_proj"])
    for w in (holder.q_proj.lora_A.weight, holder.q_proj.lora_B.weight):
        assert w.device.type == device and w.dtype == dtype


NAMES = ["q_proj", "layers.0.q_proj", "layers.0.xq_proj", "layers.0.q_proj_x", "layers.10.attn.q_proj",
         "h.0.attn.c_proj", "h.0.mlp.c_proj", "h.0.mlp.my_c_proj", "c_attn", "h.1.attn.c_attn", "h.1.attn.c_attn2"]


@pytest.mark.parametrize("targets", [("q_proj",), ("c_proj",), ("attn.c_proj",), ("mlp.c_proj",), ("c_attn", "q_proj")])
def test_targets_name_modules_as_peft_matches_them(targets):
    """A target names a module whose name is it or ends in "." + it (peft's rule), not one that merely
    contains it."""
    root = nn.Module()
    for name in NAMES:
        parent = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, nn.Linear(4, 4))
    config = peft.LoraConfig(target_modules=list(targets))
    want = [n for n, m in root.named_modules() if isinstance(m, nn.Linear) and check_target_module_exists(config, n)]
    assert [n for n, _ in target_modules(root, targets)] == want and want


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_default_targets_are_peft_s(arch):
    """No targets given: the layers peft adapts by default on the same model in transformers."""
    from gptforge.interop import hf, hf_llama

    torch.manual_seed(0)
    model = (GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, pad_vocab=False))
             if arch == "gpt2" else build_model(size_config("llama-tiny", block_size=16, vocab_size=64)))
    to_hf = hf.to_transformers if arch == "gpt2" else hf_llama.to_transformers
    theirs = peft.get_peft_model(to_hf(model), peft.LoraConfig(r=2))
    want = sorted(n.removeprefix("base_model.model.") for n, m in theirs.named_modules()
                  if isinstance(m, peft.tuners.lora.LoraLayer))
    names = add_lora(model, arch, rank=2, alpha=4.0, dropout=0.0, targets=[])
    assert sorted(names) == want and len(names) == (2 if arch == "gpt2" else 4)
    assert {n.rsplit(".", 1)[-1] for n in names} == set(PEFT_DEFAULTS[arch])


def test_the_widest_rank_a_layer_allows():
    """A rank of min(in, out) of the narrowest targeted layer is allowed, one more is refused in one line
    naming the field, that layer (not the first), its shape and the bound."""
    holder = nn.Module()
    holder.q_proj, holder.v_proj = nn.Linear(32, 24), nn.Linear(12, 40)  # min(in, out): 24 and 12
    ok = copy.deepcopy(holder)
    assert add_lora(ok, "llama", rank=12, alpha=4.0, dropout=0.0, targets=["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    with pytest.raises(LoRAError) as e:
        add_lora(holder, "llama", rank=13, alpha=4.0, dropout=0.0, targets=["q_proj", "v_proj"])
    assert str(e.value) == "lora.rank=13 is larger than layer v_proj (12 in, 40 out) allows: at most 12"
    assert not lora_layers(holder)  # refused before any layer changed


def test_a_merge_by_hand_in_float64():
    """merge_lora: W <- W + (alpha / r) B A for each adapted layer (trainable base weights too), biases kept,
    and the layers plain nn.Linear again."""
    torch.manual_seed(0)
    base, ours, _ = _pair(rank=3, alpha=5.0)
    want = {n: (m.weight + (5.0 / 3) * m.lora_B.weight @ m.lora_A.weight).detach().clone() for n, m in lora_layers(ours)}
    assert all(m.weight.requires_grad for _, m in lora_layers(ours))
    merge_lora(ours)
    for n, w in want.items():
        m = ours.get_submodule(n)
        assert type(m) is nn.Linear and (m.weight - w).abs().max().item() < 1e-12
        assert not hasattr(m, "lora_A") and not hasattr(m, "scaling")
    assert torch.equal(ours.q_proj.bias, base.q_proj.bias)
    assert sorted(ours.state_dict()) == sorted(base.state_dict())
