"""``model.bias``, ``model.dropout`` and ``model.mlp`` through to what they change (issue 36; named by the
config-key walk, tests/cli/test_every_config_key_has_an_effect.py), against hand counts and formulas: GPT-2
without biases has none of its 11 C + C per-layer and final bias entries; dropout p draws masks in training
and is the identity in evaluation; Llama's ReLU² MLP is down(relu(up x)²), SwiGLU's down(silu(gate x) up x).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.llama import Llama, LlamaConfig

C, L = 32, 2


def test_bias_false_drops_every_bias_of_linear_layers_and_layer_norms():
    """GPT-2's biases per layer: ln_1 C, c_attn 3C, attn c_proj C, ln_2 C, c_fc 4C, mlp c_proj C (11 C), and
    ln_f's C; the head has none either way. bias=False removes exactly those and nothing else."""
    torch.manual_seed(0)
    shape = dict(n_layer=L, n_head=2, n_embd=C, block_size=16, vocab_size=64)
    with_b, without = GPT(GPTConfig(**shape)), GPT(GPTConfig(**shape, bias=False))
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(with_b) - n(without) == L * 11 * C + C
    assert not [k for k, _ in without.named_parameters() if k.endswith(".bias")]
    assert len([k for k, _ in with_b.named_parameters() if k.endswith(".bias")]) == L * 6 + 1


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_dropout_draws_masks_in_training_and_is_the_identity_in_evaluation(family):
    """model.dropout 0.3: two training forwards under different seeds differ, and evaluation equals the
    same weights built with dropout 0 in training (nothing dropped); model.dropout 0: training is
    deterministic and equals evaluation. Every ``nn.Dropout`` of the model has p 0.3."""
    def build(p: float) -> torch.nn.Module:
        torch.manual_seed(0)
        if family == "gpt2":
            return GPT(GPTConfig(n_layer=L, n_head=2, n_embd=C, block_size=16, vocab_size=64, dropout=p))
        return Llama(LlamaConfig(n_layer=L, n_head=2, n_embd=C, block_size=16, vocab_size=64, dropout=p))

    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    drop, plain = build(0.3), build(0.0)
    sites = [m.p for m in drop.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(sites) >= 2 * L and set(sites) == {0.3}  # every dropout layer (attention's own p is checked below)
    with torch.no_grad():
        torch.manual_seed(5)
        a = drop.train()(idx)[0]
        torch.manual_seed(6)
        b = drop(idx)[0]
        assert (a - b).abs().max() > 1e-3
        ref = plain.train()(idx)[0]
        torch.testing.assert_close(drop.eval()(idx)[0], ref)
        torch.manual_seed(6)
        torch.testing.assert_close(plain(idx)[0], ref)


@pytest.mark.parametrize("mlp", ["relu2", "swiglu"])
def test_llama_mlp_is_the_named_activation(mlp):
    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=1, n_head=2, n_embd=C, block_size=16, vocab_size=64, mlp=mlp))
    m = model.model.layers[0].mlp
    x = torch.randn(3, 5, C)
    up, down = m.up_proj.weight, m.down_proj.weight
    if mlp == "relu2":
        assert not hasattr(m, "gate_proj") and up.shape == (4 * C, C)  # ReLU²: 4C wide, no gate
        want = (F.relu(x @ up.T) ** 2) @ down.T
    else:
        want = (F.silu(x @ m.gate_proj.weight.T) * (x @ up.T)) @ down.T
    with torch.no_grad():
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-6)
