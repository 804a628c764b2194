"""LoRA on the real SmolLM2-135M-Instruct (slow, smollm lane): rank 8 trains under 2% of the parameters
with AdamW state under 2% of full fine-tuning's, and its adapters exported in peft's format load with
``peft.PeftModel.from_pretrained`` on the exported base to gptforge's logits within 1e-5."""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.config import Config, LoRAConfig  # noqa: E402
from gptforge.load import ModelSource, load_model  # noqa: E402
from gptforge.models.lora import add_lora, lora_layers, weights_fingerprint  # noqa: E402
from gptforge.run import checkpoint as ckpt  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.smollm]


def test_smollm2_lora_rank8_is_small_and_peft_loads_its_adapters(tmp_path):
    from transformers import AutoModelForCausalLM

    from gptforge.interop.smollm2 import fetch_smollm2

    path = str(fetch_smollm2())
    base = load_model(ModelSource(gguf=path))
    model = copy.deepcopy(base)
    add_lora(model, "llama", rank=8, alpha=16.0, dropout=0.0, targets=[])  # peft's default: q_proj, v_proj
    total = sum(p.numel() for p in model.parameters())
    adapters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert adapters / total < 0.02 and 2 * adapters / (2 * sum(p.numel() for p in base.parameters())) < 0.02
    torch.manual_seed(0)
    for _, m in lora_layers(model):
        torch.nn.init.normal_(m.lora_B.weight, std=0.02)
    # a LoRA run's checkpoint as the loop writes it: the adapters, the config, the base's path and sha256
    cfg = Config(model=base.config, lora=LoRAConfig(rank=8, alpha=16.0, base=path))
    model.lora_state_keys = sorted(n for n, _ in model.named_parameters() if ".lora_" in n)
    run = ckpt.save_checkpoint(tmp_path / "run", 1, model, None,
                               {"config": cfg.to_dict(), "lora": {"base": path, "base_sha256": weights_fingerprint(base)}})
    assert main(["export", "hf", "--gguf", path, "--out", str(tmp_path / "base")]) == 0
    assert main(["export", "hf", "--ckpt", str(run), "--adapters-only", "--out", str(tmp_path / "adapters")]) == 0
    theirs = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                            tmp_path / "adapters").eval()
    x = torch.randint(0, base.config.vocab_size, (2, 24))
    with torch.no_grad():
        want, got = theirs(x).logits, model.eval()(x)[0]
        assert (got - base(x)[0]).abs().max() > 1e-3
    assert (got - want).abs().max().item() < 1e-5
