"""The preference recipes' math equals TRL's, computed by TRL itself on the same weights and batch.

Pinned: ``trl==1.12.0`` (the last release with PPO, in ``trl.experimental.ppo``; 1.13 removed it), with
transformers 5. A gptforge GPT and transformers' GPT-2 hold the same weights (``interop.hf``'s key
map); TRL's trainers are built minimally (a word-level tokenizer, two dummy rows) and their own
``compute_loss`` / ``_compute_loss`` / data collators run on the batch gptforge's PairLoader makes:

- DPO, sigmoid and IPO: loss, TRL's metrics and every parameter's gradient, within 1e-5;
- the reward model: RewardTrainer's loss (with margins), accuracy and margin, and the gradient;
- GRPO: ``rl.grpo.grpo_loss`` equals GRPOTrainer's loss with ``loss_type="grpo"`` (each reply's
  token mean, then the mean over replies), k3 KL with ``beta``, clip ``epsilon`` on both sides, and
  ``use_bias_correction_kl=False`` (TRL 1.12's default True weights the KL by the ratio).

PPO (TRL computes it inside ``PPOTrainer.train``) is in test_trl_ppo.py.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from gptforge.data.chat import ChatTemplate
from gptforge.data.preference import PreferencePair, collate, render_pairs
from gptforge.eval.tasks.preferences import preference_rows
from gptforge.eval.tasks.verifiable import compare_problems
from gptforge.interop.hf import gptforge_to_hf, hf_config
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.training.dpo import dpo_batch_loss, reference_logps
from gptforge.training.grpo import grpo_loss
from gptforge.training.rm import RewardModel, rm_loss

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

T = ChatTemplate.gpt2()
PAD = 50256


def _tok():
    """A word-level tokenizer: TRL's trainers want one; the batches here are already token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"<|endoftext|>": PAD, "a": 0, "b": 1, "c": 2}, unk_token="<|endoftext|>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<|endoftext|>", eos_token="<|endoftext|>")


def _dummy_rows():
    return datasets.Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}] * 2)


def _args(cls, tmp_path, **kw):
    # bf16=False: TRL's configs default to bf16, and accelerate then runs the reference under autocast
    return cls(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
               **kw)


def _hf_config(cfg, **kw):
    from transformers import GPT2Config

    c = {k: v for k, v in hf_config(cfg).items() if k not in ("architectures", "model_type", "torch_dtype")}
    return GPT2Config(**c, **kw)


def _load(hf, sd):
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf


def _hf_lm(model):
    from transformers import GPT2LMHeadModel

    return _load(GPT2LMHeadModel(_hf_config(model.config)), gptforge_to_hf(model.state_dict(), model.config))


def _grads_hf_names(model, cfg, prefix=""):
    return gptforge_to_hf({prefix + n: p.grad for n, p in model.named_parameters()}, cfg)


def _assert_same_grads(ours, hf, tol=1e-5):
    checked = 0
    for name, p in hf.named_parameters():
        diff = (ours[name] - p.grad).abs().max().item()
        assert diff <= tol, f"{name}: gradients differ by {diff}"
        checked += 1
    assert checked == len(ours)


@pytest.fixture(scope="module")
def pairs(tokenizer):
    rows = preference_rows(compare_problems(3, seed=1), seed=0)
    return render_pairs([(str(i), PreferencePair(r["prompt"], r["chosen"], r["rejected"], 0.5 * i))
                         for i, r in enumerate(rows)], T, 65, tokenizer)


def _models(seed):
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=T.vocab_size)
    return GPT(cfg), GPT(cfg)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "sigmoid+sft"])
def test_dpo_loss_metrics_and_gradient_equal_trls(pairs, tmp_path, loss_type):
    """"sigmoid+sft": DPO plus 0.5 x the chosen replies' NLL (RPO), TRL's loss_type ["sigmoid", "sft"]
    with loss_weights [1, 0.5]."""
    from trl import DPOConfig, DPOTrainer

    policy, ref = _models(0)
    hf_policy, hf_ref = _hf_lm(policy), _hf_lm(ref)
    sft_coef = 0.5 if loss_type.endswith("+sft") else 0.0
    trl_kw = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, sft_coef]} if sft_coef else {"loss_type": [loss_type]}
    loss_type = loss_type.split("+")[0]
    trainer = DPOTrainer(model=hf_policy, ref_model=hf_ref, args=_args(DPOConfig, tmp_path, beta=0.1, **trl_kw),
                         train_dataset=_dummy_rows(), processing_class=_tok())
    batch = collate(pairs, range(len(pairs)), PAD)
    # TRL's own collator, given each side split into prompt and completion, lays the batch out as ours
    first = [int(p.chosen.mask.argmax()) for p in pairs]
    inputs = trainer.data_collator([{"prompt_ids": p.chosen.ids[:k].tolist(), "chosen_ids": p.chosen.ids[k:].tolist(),
                                     "rejected_ids": p.rejected.ids[k:].tolist()} for p, k in zip(pairs, first, strict=True)])
    assert torch.equal(inputs["input_ids"], batch.ids) and torch.equal(inputs["completion_mask"].bool(), batch.mask)

    hf_policy.train()
    want = trainer.compute_loss(hf_policy, inputs)
    want.backward()
    got, metrics = dpo_batch_loss(policy, batch, beta=0.1, loss_type=loss_type, ref=ref, sft_coef=sft_coef)
    got.backward()
    assert abs(got.item() - want.item()) <= 1e-5, (got.item(), want.item())
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5), name
    for name in ("logps/chosen", "logps/rejected"):  # sums of ~20 float32 log-probs near -130
        assert metrics[name] == pytest.approx(trl_metrics[name], rel=1e-6), name
    _assert_same_grads(_grads_hf_names(policy, policy.config), hf_policy)
    # reference log-probs computed once give the same loss as the frozen reference model
    table = reference_logps(ref, pairs, batch_size=2)
    again, _ = dpo_batch_loss(policy, batch, beta=0.1, loss_type=loss_type, ref_table=table, sft_coef=sft_coef)
    assert again.item() == pytest.approx(got.item(), abs=1e-6)


def test_reward_model_loss_equals_trls_reward_trainer(pairs, tmp_path):
    from transformers import GPT2ForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    body, _ = _models(1)
    rm = RewardModel(body)
    hf = GPT2ForSequenceClassification(_hf_config(body.config, num_labels=1, pad_token_id=PAD))
    sd = gptforge_to_hf(body.state_dict(), body.config)
    _load(hf, {**{k: v for k, v in sd.items() if k.startswith("transformer.")}, "score.weight": rm.score.weight})
    trainer = RewardTrainer(model=hf, args=_args(RewardConfig, tmp_path), train_dataset=_dummy_rows(),
                            processing_class=_tok())
    batch = collate(pairs, range(len(pairs)), PAD)
    assert batch.margin is not None and batch.margin.abs().sum() > 0
    inputs = trainer.data_collator([{"chosen_ids": p.chosen.ids.tolist(), "rejected_ids": p.rejected.ids.tolist(),
                                     "margin": p.margin} for p in pairs])
    assert torch.equal(inputs["input_ids"], batch.ids)

    hf.train()
    want = trainer.compute_loss(hf, inputs)
    want.backward()
    got, metrics = rm_loss(rm, batch.ids, batch.mask, batch.margin)
    got.backward()
    assert abs(got.item() - want.item()) <= 1e-5, (got.item(), want.item())
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["accuracy"] == trl_metrics["accuracy"]
    assert metrics["margin"] == pytest.approx(trl_metrics["margin"], abs=1e-6)
    ours = _grads_hf_names(rm.body, body.config, prefix="")
    ours = {k: v for k, v in ours.items()} | {"score.weight": rm.score.weight.grad}
    _assert_same_grads(ours, hf)


def test_grpo_loss_equals_trls_grpo_loss_type_grpo(tmp_path, monkeypatch):
    """gptforge's GRPO normalisation is TRL's ``loss_type="grpo"``: mean over each reply's tokens,
    then over replies (not "bnpo"/"dapo", which average over all tokens of the batch)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(2)  # the log-probs are given, so any small model will do; TRL loads its reference from disk
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=PAD + 1)).save_pretrained(tmp_path / "m")
    clip_eps, kl_coef = 0.2, 0.04
    # use_bias_correction_kl=False: TRL 1.12 by default multiplies the KL term by the ratio; gptforge
    # (like DeepSeekMath and TRL before it) does not. The two agree whenever the ratio is 1 (one update per batch).
    args = _args(GRPOConfig, tmp_path, loss_type="grpo", beta=kl_coef, epsilon=clip_eps, num_generations=2,
                 max_completion_length=6, use_bias_correction_kl=False)
    trainer = GRPOTrainer(model=str(tmp_path / "m"), reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=datasets.Dataset.from_list([{"prompt": "a"}] * 2), processing_class=_tok())
    g = torch.Generator().manual_seed(0)
    N, L = 6, 7
    logp = (-torch.rand(N, L, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(N, L, generator=g)  # ratios away from 1: some clip
    ref = logp.detach() + 0.5 * torch.randn(N, L, generator=g)
    adv = torch.randn(N, generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(L)[None] < lengths[:, None]).float()
    clipped = ((logp.detach() - old).exp() - 1).abs() > clip_eps
    assert (clipped & mask.bool()).any()

    logp_trl = logp.detach().clone().requires_grad_()
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies",
                        lambda *a, **k: (logp_trl, torch.zeros_like(logp_trl), None))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); one micro-batch here
    hf = trainer.model.train()
    inputs = {"prompt_ids": torch.zeros(N, 2, dtype=torch.long), "prompt_mask": torch.ones(N, 2, dtype=torch.long),
              "completion_ids": torch.zeros(N, L, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref}
    want = trainer._compute_loss(hf, inputs)
    want.backward()
    got, _ = grpo_loss(logp, old, ref, adv, mask, clip_eps, kl_coef)
    got.backward()
    assert abs(got.item() - want.item()) <= 1e-6, (got.item(), want.item())
    assert (logp.grad - logp_trl.grad).abs().max().item() <= 1e-7
    # the copy TRL received is unchanged: both saw the same inputs
    assert copy.deepcopy(logp_trl.detach()).equal(logp.detach())
