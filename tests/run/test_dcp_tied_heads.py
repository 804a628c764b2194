"""A sharded (DCP) save decides which output head is its embedding from the live model, before the gather:
an untied head that still equals its embedding by value is saved (and loads back), a tied one is stored once.
One process in a 1-rank gloo group, FSDP2 over it: the same save path as a torchrun run's."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from gptforge.config import Config, DistConfig
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.parallel.distributed import DistInfo, wrap_model
from gptforge.run import checkpoint as ckpt
from gptforge.run import dcp
from gptforge.run.restore import load_model_weights


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield DistInfo(rank=0, local_rank=0, world=1, device=torch.device("cpu"), fsdp=True)
    finally:
        dist.destroy_process_group()


def _save_sharded(model, info, run):
    wrapped = wrap_model(model, info, False, DistConfig(shard="fsdp"))
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    return dcp.save_sharded(run, 1, wrapped, opt, {"config": Config(model=model.config).to_dict()}, 0, True)


def test_an_untied_head_equal_to_its_embedding_is_saved_and_loads(one_rank, tmp_path):
    """A Llama with tie_embeddings=false whose head was initialised as a copy of its embedding (an untied
    head not trained apart yet): two parameters with equal values. Deciding ties by value after the gather
    dropped the head from model.safetensors, and loading the checkpoint failed naming it missing."""
    torch.manual_seed(0)
    mcfg = LlamaConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, tie_embeddings=False)
    model = Llama(mcfg)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    where = _save_sharded(model, one_rank, tmp_path / "untied")
    assert "lm_head.weight" in load_file(str(where / "model.safetensors"))
    back = Llama(mcfg)
    load_model_weights(back, where)
    assert back.lm_head.weight is not back.model.embed_tokens.weight
    assert all(torch.equal(back.state_dict()[k], v) for k, v in want.items())


def test_a_tied_head_is_stored_once(one_rank, tmp_path):
    torch.manual_seed(0)
    mcfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    model = GPT(mcfg)
    want = model.transformer.wte.weight.detach().clone()
    where = _save_sharded(model, one_rank, tmp_path / "tied")
    assert "lm_head.weight" not in load_file(str(where / "model.safetensors"))
    back = GPT(mcfg)
    load_model_weights(back, where)
    assert torch.equal(back.lm_head.weight, want) and back.lm_head.weight is back.transformer.wte.weight
    assert ckpt.read_meta(where)["format"] == "dcp"
