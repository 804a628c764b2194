"""issue 34, item 2: an exported chat model stops where gptforge stops. transformers' ``generate`` on
the export (generation_config.json, config.json's eos) ends a reply at the template's end-of-turn
token, as ``gptforge chat`` does; a base model's at its end-of-text token."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt

transformers = pytest.importorskip("transformers")


def _always_says(token: int, chat: bool, out) -> GPT:
    """A one-layer GPT-2 whose every next token is ``token``: ln_f's output is the constant
    wte[token] (gain 0, bias wte[token]), and wte[token] is the longest row, so the tied head's
    logits peak there whatever the input."""
    torch.manual_seed(0)
    t = ChatTemplate.gpt2()
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size if chat else 50257)
    model = GPT(cfg)
    with torch.no_grad():
        model.transformer.wte.weight[token] *= 20
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(model.transformer.wte.weight[token])
    meta = {"config": Config(model=cfg).to_dict(), **({"chat_template": t.to_dict()} if chat else {})}
    return ckpt.save_checkpoint(out, 1, model, None, meta)


@pytest.mark.parametrize("chat", [True, False])
def test_transformers_generate_stops_where_gptforge_stops(tmp_path, chat):
    t = ChatTemplate.gpt2()
    stop = t.end if chat else 50256
    ck = _always_says(stop, chat, tmp_path / "run")
    assert main(["export", "hf", "--ckpt", str(ck), "--out", str(tmp_path / "hf")]) == 0
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == stop and json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == stop
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = torch.tensor([t.render_for_generation([{"role": "user", "content": "Hi"}]) if chat else [50256, 15496]])
    out = hf.generate(prompt, max_new_tokens=8, do_sample=False)
    assert out[0, prompt.shape[1]:].tolist() == [stop]  # one token, the stop, and no further
