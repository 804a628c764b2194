"""gptforge's LoRA against peft's: the same base, the same A and B, the same logits (float64, 1e-6), merged
or not; and the adapters a LoRA run exports (`export hf --adapters-only`) load with
``peft.PeftModel.from_pretrained`` on the exported base to gptforge's logits (1e-5)."""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.config import Config  # noqa: E402
from gptforge.eval.tasks.synthetic import arithmetic_problems, write_conversations  # noqa: E402
from gptforge.interop import hf, hf_llama  # noqa: E402
from gptforge.load import ModelSource, load_model, lora_merged  # noqa: E402
from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.models.lora import add_lora, lora_layers, merge_lora  # noqa: E402
from gptforge.models.registry import build_model, size_config  # noqa: E402
from gptforge.run import checkpoint as ckpt  # noqa: E402
from gptforge.run.identity import resolve_checkpoint  # noqa: E402


def _base(arch: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=96, pad_vocab=False, **kw))
    return build_model(size_config("llama-tiny", block_size=32, vocab_size=96, **kw))


@pytest.mark.parametrize("arch, targets", [
    ("gpt2", ["c_attn", "c_proj", "c_fc"]),
    ("gpt2", ["attn.c_proj"]),
    ("llama", ["q_proj", "v_proj"]),
    ("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
])
def test_lora_equals_peft_on_the_same_weights(arch, targets):
    base = _base(arch).double().eval()
    ours = copy.deepcopy(base)
    names = add_lora(ours, arch, rank=4, alpha=12.0, dropout=0.0, targets=targets)
    torch.manual_seed(1)
    for _, m in lora_layers(ours):
        torch.nn.init.normal_(m.lora_B.weight, std=0.2)  # B starts at zero; make the update visible
    to_hf = hf.to_transformers if arch == "gpt2" else hf_llama.to_transformers
    theirs = peft.get_peft_model(to_hf(base).double(), peft.LoraConfig(
        r=4, lora_alpha=12.0, lora_dropout=0.0, target_modules=targets, fan_in_fan_out=arch == "gpt2")).eval()
    peft_names = {n.removeprefix("base_model.model.") for n, m in theirs.named_modules()
                  if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert peft_names == set(names)  # the same layers are adapted
    with torch.no_grad():
        for name, m in lora_layers(ours):
            p = theirs.base_model.model.get_submodule(name)
            p.lora_A["default"].weight.copy_(m.lora_A.weight)
            p.lora_B["default"].weight.copy_(m.lora_B.weight)
        x = torch.randint(0, 96, (2, 24))
        want, got = theirs(x).logits, ours(x)[0]
        assert (got - want).abs().max().item() < 1e-6
        assert (got - base(x)[0]).abs().max().item() > 1e-3  # the adapters do change the output
        merged, peft_merged = merge_lora(ours)(x)[0], theirs.merge_and_unload()(x).logits
    assert (merged - peft_merged).abs().max().item() < 1e-6
    assert (merged - want).abs().max().item() < 1e-6
    assert not lora_layers(ours) and set(ours.state_dict()) == set(base.state_dict())  # a plain family model again


def test_initial_adapters_leave_the_model_unchanged():
    base = _base("llama").eval()
    ours = copy.deepcopy(base)
    add_lora(ours, "llama", rank=8, alpha=16.0, dropout=0.1, targets=[])  # default: q_proj, v_proj
    x = torch.randint(0, 96, (1, 16))
    assert torch.equal(ours.eval()(x)[0], base(x)[0])
    assert all(m.lora_A.weight.abs().sum() > 0 and m.lora_B.weight.abs().sum() == 0 for _, m in lora_layers(ours))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_adapter_export_loads_in_peft_to_the_same_logits(arch, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = (GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64) if arch == "gpt2"
           else size_config("llama-tiny", block_size=64))
    base = ckpt.save_checkpoint(tmp_path / "base", 0, build_model(cfg), None, {"config": Config(model=cfg).to_dict()})
    data = write_conversations(arithmetic_problems(60, seed=2), tmp_path / "conv.jsonl")
    run = tmp_path / "lora"
    targets = "c_attn,c_fc" if arch == "gpt2" else "q_proj,v_proj,down_proj"
    assert main(["sft", "--init-from", str(base), "--data", str(data), "--out", str(run), "--val-count", "8",
                 "--train.seq_len", "64", "--train.micro_batch", "4", "--train.total_batch_tokens", "256",
                 "--train.max_steps", "3", "--train.val_every", "0", "--train.sample_every", "0",
                 "--optim.lr", "3e-2", "--optim.warmup_steps", "0", "--train.device", "cpu", "--train.dtype", "float32",
                 "--train.log_every", "100", "--lora.rank", "4", "--lora.alpha", "8", "--lora.targets", targets]) == 0
    assert main(["export", "hf", "--ckpt", str(base), "--out", str(tmp_path / "hf_base")]) == 0
    assert main(["export", "hf", "--ckpt", str(run), "--adapters-only", "--out", str(tmp_path / "adapters")]) == 0
    assert main(["export", "hf", "--ckpt", str(run), "--out", str(tmp_path / "hf_merged")]) == 0
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["adapter_config.json",
                                                                          "adapter_model.safetensors"]

    where = resolve_checkpoint(run)
    meta = ckpt.read_meta(where)
    ours = lora_merged(where, meta, Config.from_dict(meta["config"]), merge=False).eval()
    assert max(m.lora_B.weight.abs().max().item() for _, m in lora_layers(ours)) > 1e-3  # it trained
    theirs = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "hf_base"),
                                            tmp_path / "adapters").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_merged").eval()
    x = torch.randint(0, 50000, (2, 32))
    with torch.no_grad():
        got = ours(x)[0]
        want = theirs(x).logits
        V = want.shape[-1]  # the base's vocabulary (the chat tokens widen the run's logits)
        assert (got[..., :V] - want).abs().max().item() < 1e-5
        assert (merged(x).logits[..., :V] - want).abs().max().item() < 1e-5
        assert (load_model(ModelSource(ckpt=str(run)))(x)[0][..., :V] - want).abs().max().item() < 1e-5
