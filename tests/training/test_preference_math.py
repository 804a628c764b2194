"""The preference recipes' math beyond what the TRL comparisons cover: sequence log-probs on Llama
against a float64 full-vocabulary recomputation, DPO's and the reward model's edge cases and
refusals, whitening, and the Bradley–Terry loss by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gptforge.data.preference import PairBatch
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.training.dpo import dpo_batch_loss, dpo_loss, sequence_logps
from gptforge.training.ppo import masked_mean, masked_whiten
from gptforge.training.rm import bradley_terry_loss, pair_metrics


def _llama():
    torch.manual_seed(0)
    return Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=97)).eval()


def test_sequence_logps_sum_the_reply_tokens_only():
    model = _llama()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 12), generator=g)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[0, 5:12], mask[1, 3:6], mask[2, 9:11] = True, True, True
    with torch.no_grad():
        got, n = sequence_logps(model, ids, mask)
        logits = model(ids)[0].double()  # every position, float64
    lp = torch.log_softmax(logits[:, :-1], -1).gather(2, ids[:, 1:, None]).squeeze(2)
    want = [lp[i, mask[i, 1:]].sum().item() for i in range(3)]
    assert got.tolist() == pytest.approx(want, abs=1e-4) and n.tolist() == [7, 3, 2]
    with pytest.raises(ValueError, match="no reply tokens"):
        sequence_logps(model, ids, torch.zeros_like(mask))


def test_dpo_loss_by_hand_and_refusals():
    c, r = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -4.0])
    rc, rr = torch.tensor([-3.5, -5.0]), torch.tensor([-3.5, -4.5])
    loss, m = dpo_loss(c, r, rc, rr, beta=0.5)
    h = [(0.5) - (-0.5), 0.0 - 0.5]  # h_c - h_r per pair
    assert loss.item() == pytest.approx(sum(-math.log(1 / (1 + math.exp(-0.5 * x))) for x in h) / 2, abs=1e-6)
    assert m["rewards/accuracies"] == 0.5 and m["rewards/margins"] == pytest.approx(0.5 * sum(h) / 2)
    ipo, _ = dpo_loss(c, r, rc, rr, beta=0.5, loss_type="ipo", chosen_len=torch.tensor([2.0, 1.0]),
                      rejected_len=torch.tensor([1.0, 4.0]))
    want = ((0.5 / 2 + 0.5 / 1 - 1.0) ** 2 + (0.0 - 0.5 / 4 - 1.0) ** 2) / 2
    assert ipo.item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="loss_type 'hinge'"):
        dpo_loss(c, r, rc, rr, 0.1, "hinge")
    with pytest.raises(ValueError, match="beta 0"):
        dpo_loss(c, r, rc, rr, 0)
    with pytest.raises(ValueError, match="pass chosen_len and rejected_len"):
        dpo_loss(c, r, rc, rr, 0.1, "ipo")
    batch = PairBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool),
                      torch.tensor([0]), None)
    with pytest.raises(ValueError, match="not both"):
        dpo_batch_loss(_llama(), batch, 0.1)


def test_a_policy_equal_to_its_reference_has_loss_log2():
    model = _llama()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 97, (4, 10), generator=g)
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[:, 6:] = True
    batch = PairBatch(ids, mask, torch.arange(2), None)
    loss, m = dpo_batch_loss(model, batch, beta=0.1, ref=model)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6) and m["rewards/margins"] == 0.0


def test_bradley_terry_and_pair_metrics_by_hand():
    c, r = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 3.0])
    want = -sum(math.log(1 / (1 + math.exp(-d))) for d in (1.0, 0.0, -2.0)) / 3
    assert bradley_terry_loss(c, r).item() == pytest.approx(want, abs=1e-6)
    with_margin = -sum(math.log(1 / (1 + math.exp(-(d - 1)))) for d in (1.0, 0.0, -2.0)) / 3
    assert bradley_terry_loss(c, r, torch.ones(3)).item() == pytest.approx(with_margin, abs=1e-6)
    centred = bradley_terry_loss(c, r, center_coef=0.01).item()
    assert centred == pytest.approx(want + 0.01 * (9 + 0 + 16) / 3, abs=1e-6)
    m = pair_metrics(c, r)
    assert m["accuracy"] == pytest.approx(1 / 3) and m["margin"] == pytest.approx(-1 / 3)  # a tie is not a win


def test_whitening_over_the_mask():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    w = masked_whiten(x, mask)
    want = ((vals - vals.mean()) / vals.std()).float()  # std: unbiased
    torch.testing.assert_close(w[mask], want, atol=1e-5, rtol=0)
    assert (w[~mask] == 0).all() and masked_mean(x, mask).item() == pytest.approx(3.0)
    kept = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(kept[mask], want + 3.0, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="at least two"):
        masked_whiten(x, torch.zeros_like(mask).index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(True)))


def test_the_pieces_learn_a_generated_preference_set(tokenizer):
    """PairLoader -> RewardModel -> AdamW, a few steps on generated `compare` pairs: the reward model
    separates the training pairs (the pieces compose; DPO's gradient equals TRL's in test_trl_fidelity)."""
    from gptforge.data.chat import ChatTemplate
    from gptforge.data.preference import PairLoader, PreferencePair, render_pairs
    from gptforge.eval.tasks.preferences import preference_rows
    from gptforge.eval.tasks.verifiable import compare_problems
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.training.rm import RewardModel, rm_loss

    t = ChatTemplate.gpt2()
    rows = preference_rows(compare_problems(16, seed=3), seed=0)
    pairs = render_pairs([(str(i), PreferencePair(r["prompt"], r["chosen"], r["rejected"]))
                          for i, r in enumerate(rows)], t, 65, tokenizer)
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    rm = RewardModel(GPT(cfg))
    opt = torch.optim.AdamW(rm.parameters(), lr=3e-3)
    loader = PairLoader(pairs, B=8, seed=0)
    for _ in range(20):
        b = loader.next_batch()
        loss, _ = rm_loss(rm, b.ids, b.mask)
        loss.backward()
        opt.step()
        opt.zero_grad()
    everything = PairLoader(pairs, B=16, shuffle=False).next_batch()
    with torch.no_grad():
        _, m = rm_loss(rm, everything.ids, everything.mask)
    assert m["accuracy"] == 1.0 and m["margin"] > 1.0, m

