"""``hidden_states`` (the seam for reward and value heads) is what transformers' base models return
(``GPT2Model`` / ``LlamaModel``: after the final norm), on both families, and what ``forward`` feeds
the LM head; a reward model and a value head read it on either family."""

from __future__ import annotations

import pytest
import torch

from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.training.ppo import ValueModel
from gptforge.training.rm import RewardModel, last_index, score_sequences

transformers = pytest.importorskip("transformers")
IDX = torch.randint(0, 101, (3, 13), generator=torch.Generator().manual_seed(0))


def _gpt2():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=101)).eval()


def _llama():
    torch.manual_seed(0)
    return Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=101)).eval()


def test_gpt2_hidden_states_equal_transformers_gpt2model():
    from gptforge.interop.hf import gptforge_to_hf, hf_config

    model = _gpt2()
    c = {k: v for k, v in hf_config(model.config).items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf = transformers.GPT2Model(transformers.GPT2Config(**c)).eval()
    sd = {k.removeprefix("transformer."): v for k, v in gptforge_to_hf(model.state_dict(), model.config).items()
          if k.startswith("transformer.")}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not missing and not unexpected
    with torch.no_grad():
        ours = model.hidden_states(IDX)
        torch.testing.assert_close(ours, hf(IDX).last_hidden_state, atol=2e-5, rtol=0)
        torch.testing.assert_close(model.lm_head(ours)[..., :101], model(IDX)[0])


def test_llama_hidden_states_equal_transformers_llamamodel():
    from gptforge.interop.hf_llama import to_transformers

    model = _llama()
    hf = to_transformers(model)  # LlamaForCausalLM; .model is LlamaModel
    with torch.no_grad():
        ours = model.hidden_states(IDX)
        torch.testing.assert_close(ours, hf.model(IDX).last_hidden_state, atol=2e-5, rtol=0)
        torch.testing.assert_close(model.lm_head(ours)[..., :101], model(IDX)[0])


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_reward_and_value_heads_read_either_family(make):
    body = make()
    rm, vm = RewardModel(body), ValueModel.from_reward_model(RewardModel(make()))
    mask = torch.zeros_like(IDX, dtype=torch.bool)
    mask[0, 4:9], mask[1, 2:13], mask[2, 6:7] = True, True, True
    at = last_index(mask)
    assert at.tolist() == [8, 12, 6]
    with torch.no_grad():
        r = rm(IDX, at)
        h = body.hidden_states(IDX)
        torch.testing.assert_close(r, h[torch.arange(3), at] @ rm.score.weight[0])
        v = vm(IDX)
    assert r.shape == (3,) and v.shape == IDX.shape
    # a reward read at the last reply token does not see what comes after it (causal)
    changed = IDX.clone()
    changed[2, 7:] = (changed[2, 7:] + 1) % 101
    with torch.no_grad():
        assert rm(changed, at)[2] == pytest.approx(r[2].item(), abs=1e-6)
    with pytest.raises(ValueError, match="no reply token"):
        last_index(torch.zeros(2, 3, dtype=torch.bool))


def test_scoring_rollouts_ignores_batching_and_padding():
    rm = RewardModel(_gpt2())
    seqs = [IDX[0, :5].tolist(), IDX[1].tolist(), IDX[2, :9].tolist()]
    together = score_sequences(rm, seqs, pad=7, batch_size=3)
    alone = torch.cat([score_sequences(rm, [s], pad=7) for s in seqs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert together[1].item() == pytest.approx(rm(IDX[1:2], torch.tensor([12])).item(), abs=1e-6)
    with pytest.raises(ValueError, match="empty sequence"):
        score_sequences(rm, [[]], pad=7)


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_a_reward_model_scores_the_same_in_transformers(make):
    from gptforge.interop.hf_reward import reward_model_to_transformers

    rm = RewardModel(make()).eval()
    pad = 100  # right padding; no sequence ends with it
    ids = IDX.clone()
    ids[ids == pad] = 3
    lengths = torch.tensor([13, 6, 9])
    for k, n in enumerate(lengths.tolist()):
        ids[k, n:] = pad
    hf = reward_model_to_transformers(rm, pad)
    assert type(hf).__name__ == ("GPT2" if make is _gpt2 else "Llama") + "ForSequenceClassification"
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits[:, 0], rm(ids, lengths - 1), atol=2e-5, rtol=0)
