"""Issue 21 class 3: Hugging Face GPT-2 configs gptforge does not implement are refused by name, the
ones it does implement load with transformers' logits, and a directory whose weights disagree with
its config (or that holds only a pickle) is one line, exit 2. Reference: transformers' GPT2LMHeadModel."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.cli import main
from gptforge.interop.hf import load_hf
from gptforge.interop.hf_folder import HFModelError

transformers = pytest.importorskip("transformers")

VOCAB = 300


def _save(tmp_path, untie_equal: bool = False, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=VOCAB,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # visible LayerNorm parameters, so eps and the scales matter
        for n, p in hf.named_parameters():
            if "ln_" in n:
                p.add_(torch.randn_like(p) * 0.3)
        if untie_equal:
            hf.lm_head.weight.copy_(hf.transformer.wte.weight)
    path = tmp_path / "hf"
    hf.save_pretrained(path)
    return hf, path


# each of these computes GPT-2's function exactly: loads, and the logits match
IMPLEMENTED = [
    {},
    {"activation_function": "gelu_pytorch_tanh"},
    {"activation_function": "gelu_fast"},
    {"activation_function": "gelu_accurate"},
    {"reorder_and_upcast_attn": True},
    {"n_inner": 64},
    {"tie_word_embeddings": False, "untie_equal": True},
]

# each changes the function in a way gptforge does not compute: refused, naming the key
REFUSED = [
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"activation_function": "relu"}, "activation_function"),
    ({"activation_function": "gelu"}, "activation_function"),
    ({"activation_function": "silu"}, "activation_function"),
    ({"layer_norm_epsilon": 0.5}, "layer_norm_epsilon"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
    ({"scale_attn_weights": False}, "scale_attn_weights"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ({"n_inner": 40}, "n_inner"),
]


@pytest.mark.parametrize("overrides", IMPLEMENTED, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_implemented_configs_match_transformers(tmp_path, overrides):
    hf, path = _save(tmp_path, **overrides)
    ours = load_hf(str(path))
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = hf(idx).logits, ours(idx)[0]
    assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()


@pytest.mark.parametrize("overrides,key", REFUSED, ids=lambda o: str(o))
def test_unimplemented_configs_are_refused_by_name(tmp_path, overrides, key):
    hf, path = _save(tmp_path, **overrides)
    with pytest.raises(HFModelError, match=f"{key}=.*does not implement"):
        load_hf(str(path))
    if key == "tie_word_embeddings":  # sanity: the difference the refusal prevents is real
        assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)


def _one_line_exit_2(capsys, argv, *needles):
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def test_cli_refuses_an_unimplemented_config_in_one_line(tmp_path, capsys):
    _, path = _save(tmp_path, activation_function="relu")
    _one_line_exit_2(capsys, ["sample", "--hf", str(path), "--max-new-tokens", "2"],
                     "activation_function='relu'", "config.json")


@pytest.mark.parametrize("key,value", [("n_layer", 3), ("n_embd", 32), ("vocab_size", 400), ("n_positions", 16),
                                       ("vocab_size", -1), ("n_embd", "16")])
def test_sizes_that_disagree_with_the_weights_are_one_line(tmp_path, capsys, key, value):
    _, path = _save(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    _one_line_exit_2(capsys, ["sample", "--hf", str(path), "--max-new-tokens", "2"], str(path))


def test_weights_of_another_shape_from_a_truncated_safetensors_are_one_line(tmp_path, capsys):
    _, path = _save(tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:100])
    _one_line_exit_2(capsys, ["sample", "--hf", str(path), "--max-new-tokens", "2"], "model.safetensors")


def test_a_pickle_without_safetensors_is_refused_unread(tmp_path, capsys):
    hf, path = _save(tmp_path)
    (path / "model.safetensors").unlink()
    torch.save(hf.state_dict(), path / "pytorch_model.bin")
    _one_line_exit_2(capsys, ["sample", "--hf", str(path), "--max-new-tokens", "2"],
                     "pytorch_model.bin", "safetensors only")


def test_a_base_gpt2model_file_without_the_transformer_prefix_loads(tmp_path):
    """The hub's own gpt2 checkpoint stores 'h.0.attn...' without 'transformer.'."""
    from safetensors.torch import load_file, save_file

    hf, path = _save(tmp_path)
    sd = load_file(str(path / "model.safetensors"))
    save_file({k.removeprefix("transformer."): v for k, v in sd.items()}, str(path / "model.safetensors"))
    idx = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(load_hf(str(path))(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)


def test_sizes_are_bounded_before_anything_is_built():
    """A config of 10**9 layers is refused from config.json alone (a regression must not allocate)."""
    from gptforge.interop.hf import gpt2_config_from_hf

    good = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 32, "vocab_size": VOCAB}
    assert gpt2_config_from_hf(good)["n_layer"] == 2
    for key, value in [("n_layer", 10**9), ("vocab_size", 2**40), ("n_positions", True), ("n_head", 0)]:
        with pytest.raises(HFModelError, match=key):
            gpt2_config_from_hf({**good, key: value})


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 3), ("num_hidden_layers", 10**6),
                                       ("hidden_size", 64), ("vocab_size", 400)])
def test_llama_sizes_that_disagree_with_the_weights_are_one_line_before_any_allocation(tmp_path, capsys, key, value):
    """The Llama loader checks the header against a model on the meta device: 10**6 layers build nothing."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
                     ).save_pretrained(tmp_path / "llama")
    cfg = json.loads((tmp_path / "llama" / "config.json").read_text())
    cfg[key] = value
    if key == "hidden_size":
        cfg["head_dim"] = value // cfg["num_attention_heads"]  # consistent, so only the weights disagree
    (tmp_path / "llama" / "config.json").write_text(json.dumps(cfg))
    _one_line_exit_2(capsys, ["sample", "--hf", str(tmp_path / "llama"), "--max-new-tokens", "2"],
                     str(tmp_path / "llama"), "do not fit Llama")
