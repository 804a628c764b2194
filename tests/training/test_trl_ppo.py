"""PPO's math (training/ppo.py) equals TRL's PPOTrainer, pinned at ``trl==1.12.0`` (the last release
with PPO, in ``trl.experimental.ppo``).

TRL computes the KL-penalised rewards, GAE, whitening and both losses inline in ``PPOTrainer.train``,
so this runs one real PPO update of tiny transformers models (policy, reference, reward and value
models over an 8-token vocabulary, so some replies stop at EOS and some run to the length limit) and
records the trainer's own tensors at each ``accelerator.backward`` call (the caller's locals). From
TRL's inputs (scores, log-probs, values, masks) gptforge's functions must give TRL's outputs:
rewards, returns, whitened advantages, the clipped policy loss and the clipped value loss, with the
learning rate high enough that the second minibatch's ratios clip.

TRL puts the score one token past the reply's end (on the first padding position, where its value
head gets one more step: ``padding_mask_p1``); gptforge's default is the reply's last token, and the
``end`` argument reproduces TRL's placement.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from gptforge.training.ppo import gae, kl_penalized_rewards, masked_whiten, ppo_loss, ppo_policy_loss, ppo_value_loss

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

KEYS = ("rewards", "values", "advantages", "returns", "scores", "logprobs", "ref_logprobs", "padding_mask",
        "padding_mask_p1", "sequence_lengths", "new_logprobs", "mb_logprobs", "mb_advantage", "mb_return",
        "mb_values", "vpred", "pg_loss", "vf_loss", "loss", "micro_batch_inds", "vf_clipfrac")
# TRL logs these per micro-batch into tensors it creates once per batch, filled after the backward: the test
# keeps references (not copies) and reads them when train() is done
STATS = ("approxkl_stats", "pg_clipfrac_stats")


def _run_trl_ppo(tmp_path, kl_estimator):
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 8)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                  pad_token="<pad>", eos_token="<eos>", padding_side="left")
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=8, resid_pdrop=0, embd_pdrop=0,
                     attn_pdrop=0, pad_token_id=0, bos_token_id=1, eos_token_id=1, num_labels=1)
    policy, ref = GPT2LMHeadModel(cfg), GPT2LMHeadModel(cfg)
    reward_model, value_model = GPT2ForSequenceClassification(cfg), GPT2ForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(1)
    rows = datasets.Dataset.from_list([{"input_ids": torch.randint(2, 8, (n,), generator=g).tolist()}
                                       for n in (3, 5, 4, 5)])
    args = PPOConfig(output_dir=str(tmp_path / "ppo"), report_to="none", use_cpu=True, bf16=False,
                     per_device_train_batch_size=2, gradient_accumulation_steps=2, num_mini_batches=2,
                     total_episodes=4, num_ppo_epochs=1, response_length=8, local_rollout_forward_batch_size=4,
                     num_sample_generations=0, kl_coef=0.05, kl_estimator=kl_estimator, gamma=0.9, lam=0.8,
                     cliprange=0.02, cliprange_value=0.01, vf_coef=0.3, learning_rate=0.05, save_strategy="no",
                     missing_eos_penalty=None)
    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward_model,
                         train_dataset=rows, value_model=value_model)
    calls = []
    backward = trainer.accelerator.backward

    def record(loss, **kw):  # TRL's tensors at this micro-batch, read from train()'s frame
        f = sys._getframe(1).f_locals
        calls.append({k: (f[k].detach().clone() if torch.is_tensor(f[k]) else f[k]) for k in KEYS})
        calls[-1]["stats"] = {k: f[k] for k in STATS}
        calls[-1]["at"] = (f["ppo_epoch_idx"], f["minibatch_idx"], f["gradient_accumulation_idx"])
        return backward(loss, **kw)

    trainer.accelerator.backward = record
    torch.manual_seed(3)  # the sampled replies
    # TRL shuffles the rollouts into minibatches with numpy's global RNG (np.random.permutation), which
    # neither PPOTrainer nor this test seeded: the split (and whether the second minibatch's ratios
    # clip) came from OS entropy, so the test failed about 1 run in 2, load or not (the second minibatch
    # {0, 1} never clips). Seed 3 gives rows {3, 1} then {0, 2}; numpy's state is put back afterwards.
    state = np.random.get_state()
    np.random.seed(3)
    try:
        trainer.train()
    finally:
        np.random.set_state(state)
    return calls, args


@pytest.mark.parametrize("kl_estimator", ["k1", "k3"])
def test_ppo_rewards_gae_and_losses_equal_trls(tmp_path, kl_estimator):
    calls, args = _run_trl_ppo(tmp_path, kl_estimator)
    assert len(calls) == 2  # two minibatches of one micro-batch of 2
    assert [list(c["micro_batch_inds"]) for c in calls] == [[3, 1], [0, 2]]  # the seeded split (see above)
    c = calls[0]
    reply = ~c["padding_mask"]  # the reply's tokens, up to and including EOS
    value_mask = ~c["padding_mask_p1"]  # one more: where TRL's value head and the score sit
    lengths = reply.sum(1)
    assert (lengths < reply.size(1)).any() and (lengths == reply.size(1)).any(), lengths  # EOS and cut-off replies

    # the per-token rewards: -kl_coef * KL, plus the score where TRL puts it
    L = reply.size(1)
    end = torch.where(c["sequence_lengths"] + 1 < L, c["sequence_lengths"] + 1, c["sequence_lengths"])
    rewards, _ = kl_penalized_rewards(c["scores"], c["logprobs"], c["ref_logprobs"], reply, args.kl_coef,
                                      kl_estimator, end=end)
    torch.testing.assert_close(rewards, c["rewards"], atol=1e-6, rtol=0)

    # GAE: returns (= advantages + values) and the whitened advantages over the reply's tokens
    adv, returns = gae(c["rewards"], c["values"], args.gamma, args.lam)
    torch.testing.assert_close(returns, c["returns"], atol=1e-6, rtol=0)
    torch.testing.assert_close(masked_whiten(adv, reply), c["advantages"], atol=1e-5, rtol=0)
    from trl.experimental.ppo.ppo_trainer import masked_whiten as trl_whiten

    torch.testing.assert_close(masked_whiten(c["rewards"], value_mask, shift_mean=False),
                               trl_whiten(c["rewards"], value_mask, shift_mean=False) * value_mask, atol=1e-6, rtol=0)

    # the clipped losses, on every micro-batch (the second one's policy has moved: its ratios clip)
    clipfrac = []
    for c in calls:
        inds = torch.as_tensor(c["micro_batch_inds"])
        mask, vmask = ~calls[0]["padding_mask"][inds], ~calls[0]["padding_mask_p1"][inds]
        pl, ps = ppo_policy_loss(c["new_logprobs"], c["mb_logprobs"], c["mb_advantage"], mask, args.cliprange)
        vl, vs = ppo_value_loss(c["vpred"], c["mb_values"], c["mb_return"], vmask, args.cliprange_value)
        assert abs(pl.item() - c["pg_loss"].item()) <= 1e-6 and abs(vl.item() - c["vf_loss"].item()) <= 1e-6
        loss, _ = ppo_loss(c["new_logprobs"], c["mb_logprobs"], c["mb_advantage"], c["vpred"], c["mb_values"],
                           c["mb_return"], mask, args.cliprange, args.cliprange_value, args.vf_coef, value_mask=vmask)
        assert abs(loss.item() - c["loss"].item()) <= 1e-6
        clipfrac.append((ps["clipfrac"], vs["value_clipfrac"]))
        # the logged statistics equal TRL's: both clip fractions; TRL's approxkl is the plain mean of
        # ½ (log π − log π_old)² over the micro-batch's (N, L) entries, whose padding differs by 0 (both
        # log-probs are filled with the same constant there), gptforge's the mean over the reply's tokens
        assert ps["clipfrac"] == pytest.approx(c["stats"]["pg_clipfrac_stats"][c["at"]].item(), abs=1e-6)
        assert vs["value_clipfrac"] == pytest.approx(c["vf_clipfrac"].item(), abs=1e-6)
        trl_kl = c["stats"]["approxkl_stats"][c["at"]].item()
        assert ps["approx_kl"] * mask.sum().item() / mask.numel() == pytest.approx(trl_kl, rel=1e-5, abs=1e-9)
        if c is calls[1]:  # the second micro-batch's policy has moved: a KL to compare
            assert trl_kl > 1e-8
    assert clipfrac[1][0] > 0 and max(v for _, v in clipfrac) > 0, clipfrac


def test_gae_by_hand():
    """gamma=0.5, lam=1 on one 3-token reply: A_t = sum_k 0.5^k delta_{t+k}."""
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    adv, ret = gae(r, v, gamma=0.5, lam=1.0)
    d = [0.0 + 0.5 * 0.4 - 0.2, 0.0 + 0.5 * 0.6 - 0.4, 1.0 - 0.6]
    want = [d[0] + 0.5 * d[1] + 0.25 * d[2], d[1] + 0.5 * d[2], d[2]]
    torch.testing.assert_close(adv, torch.tensor([want]))
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0]]))  # lam=1: discounted returns
    rewards, kl = kl_penalized_rewards(torch.tensor([2.0]), torch.tensor([[-1.0, -2.0, -3.0, 0.0]]),
                                       torch.tensor([[-1.5, -2.0, -2.0, 0.0]]), torch.tensor([[1, 1, 1, 0]]).bool(),
                                       kl_coef=0.1)
    torch.testing.assert_close(kl, torch.tensor([[0.5, 0.0, -1.0, 0.0]]))  # k1 = logp - ref
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 0.1 + 2.0, 0.0]]))  # score on the last reply token
