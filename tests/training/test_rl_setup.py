"""The RL recipes' setup, logging and held-out evaluation in one process (issue 36, lane ``training``):
what the CLI runs of test_grpo.py and test_ppo.py exercise in subprocesses, where mutmut cannot see them.

- ``GRPO.__init__``: the chat template checked against the model, the tokenizer wrapped once, the
  problems' default stream, the pad id;
- ``prepare_model``: the reference is the starting weights (a frozen copy on a fresh run, the
  ``rl.init_from`` checkpoint on a resume, the LoRA base), the reward model frozen on the run's device, and
  ``rl.reward_norm``'s three refusals;
- ``evaluate`` / ``begin``: which steps score the held-out set, each rank's share, the counts summed over
  ranks, the metrics record and the log line; ``held_out_correct`` counted by hand;
- ``log_line``, ``meta``, ``loaders``, ``rl_config``'s preset word for word;
- PPO's ``PolicyValue`` and ``ValueModel``: what the value model starts from, its forward against a
  hand computation, the parameter count.

Spies stand in for other ranks and for generation where the test is about the plumbing; every count and
value is computed here independently."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

from gptforge.config import RLConfig
from gptforge.data.chat import ChatTokenizer
from gptforge.eval.tasks.verifiable import Problem
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.parallel.distributed import DistInfo
from gptforge.training import grpo
from gptforge.training.grpo import GRPO, rl_config
from gptforge.training.ppo import PPO, PolicyValue, ValueModel
from gptforge.training.rl_state import RLError, RLState
from gptforge.training.rollouts import held_out_correct
from tests.training.test_recipe_quantities import _small, graded


def _cfg(tmp_path, **rl):
    mcfg, t = _small()
    cfg = rl_config(mcfg, str(tmp_path / "rl"), str(tmp_path / "sft"))
    cfg.rl = RLConfig(**{"prompts": 2, "group": 2, "max_new_tokens": 4, "eval_n": 0, **rl})
    cfg.train.device = "cpu"
    return cfg, t


def _recipe(tmp_path, tokenizer, cls=GRPO, held_out=(), reward_model=None, **rl):
    cfg, t = _cfg(tmp_path, **rl)
    r = cls(cfg, t, tokenizer, graded, problems_at=lambda step, round=0: [Problem("!", ""), Problem("?", "")],
            held_out=list(held_out), reward_model=reward_model)
    return r, cfg, t


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(x, sb[k]) for k, x in sa.items())


# ------------------------------------------------------------------------------------------------ setup

def test_rl_config_is_the_documented_preset(tmp_path):
    """``gptforge rl``'s defaults, as its docstring and --help state them."""
    mcfg, _ = _small()
    cfg = rl_config(mcfg, "out/x", "runs/sft")
    o, t = cfg.optim, cfg.train
    assert (o.lr, o.warmup_steps, o.weight_decay, o.grad_clip, o.schedule, o.cooldown_frac, o.min_lr_frac) == (
        1e-5, 0, 0.0, 1.0, "wsd", 0.0, 1.0)
    assert (t.micro_batch, t.seq_len, t.total_batch_tokens, t.max_steps, t.val_every, t.sample_every, t.ckpt_every,
            t.keep_ckpts, t.seed, t.compile, t.out_dir) == (16, 1, 16, 100, 0, 0, 50, 2, 0, False, "out/x")
    assert cfg.rl.init_from == "runs/sft" and cfg.model is mcfg
    assert rl_config(None, "o", "i").model == type(cfg)().model  # no model: the config's default one


def test_grpo_init_wraps_the_tokenizer_once_and_pads_with_bos(tmp_path, tokenizer):
    r, cfg, t = _recipe(tmp_path, tokenizer)
    assert isinstance(r.enc, ChatTokenizer) and r.enc.enc is tokenizer and r.enc.template is t
    assert r.tokenizer is tokenizer and r.pad == t.bos == 59 and r.template is t and r.reward_fn is graded
    wrapped = r.enc
    r2 = GRPO(cfg, t, wrapped, graded, problems_at=r.problems_at, held_out=[])
    assert r2.enc is wrapped and r2.tokenizer is tokenizer  # already a chat tokenizer: not wrapped twice
    plain = GRPO(cfg, None, tokenizer, graded, problems_at=r.problems_at, held_out=None)
    assert plain.enc is tokenizer and plain.pad == tokenizer.eot_token and plain.held_out == []
    assert r.meta()["chat_template"] == t.to_dict() and plain.meta()["chat_template"] is None
    assert r.meta()["recipe"] == "grpo"


def test_grpo_init_refuses_a_model_without_the_chat_rows(tmp_path, tokenizer):
    from gptforge.data.chat import ChatFormatError

    cfg, t = _cfg(tmp_path)
    cfg.model = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=60, pad_vocab=True)  # 128 rows
    with pytest.raises(RLError) as e:
        GRPO(cfg, t, tokenizer, graded, problems_at=lambda s: [], held_out=[])
    assert str(e.value) == "the model's logits do not cover the chat tokens; RL needs a chat (SFT) checkpoint"
    cfg.model = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=60, pad_vocab=False)  # 60 rows
    with pytest.raises(ChatFormatError, match="the model has 60 embedding rows but the chat tokens need 64"):
        GRPO(cfg, t, tokenizer, graded, problems_at=lambda s: [], held_out=[])


def test_grpo_init_takes_the_problem_stream_of_its_config_and_seed(tmp_path, tokenizer, monkeypatch):
    seen = []

    def stream(rl, seed):
        seen.append((rl, seed))
        return (lambda step, round=0: ["p"]), ("h1", "h2")

    monkeypatch.setattr(grpo, "problem_stream", stream)
    cfg, t = _cfg(tmp_path)
    cfg.train.seed = 17
    r = GRPO(cfg, t, tokenizer, graded)
    assert seen == [(cfg.rl, 17)] and r.problems_at(0) == ["p"] and r.held_out == ["h1", "h2"]
    GRPO(cfg, t, tokenizer, graded, problems_at=lambda s: [], held_out=[])
    assert len(seen) == 1  # given problems: no stream drawn


def test_loaders_start_a_fresh_state(tmp_path, tokenizer):
    for target, adaptive in ((0.0, False), (0.5, True)):
        r, cfg, _ = _recipe(tmp_path, tokenizer, prompts=4, kl_target=target)
        state, val, accum = r.loaders(cfg, SimpleNamespace(rank=0, world=1))
        assert isinstance(state, RLState) and state is r.state and val is None and accum == 1
        assert (state.kl_coef, state.reward_norm) == (None, None)
        assert (r._prompts, r._adaptive) == (4, adaptive)


# ------------------------------------------------------------------------------------------------ log line

@pytest.mark.parametrize("adaptive", [False, True])
def test_log_line_word_for_word(tmp_path, tokenizer, adaptive):
    r, cfg, _ = _recipe(tmp_path, tokenizer, prompts=4, kl_target=0.5 if adaptive else 0.0)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    s = {"reward": 0.12345, "accuracy": 0.5, "kl": 0.001234, "reply_len": 3.25, "loss": -0.0123456, "kl_coef": 0.0123456}
    coef = " (coef 0.01235)" if adaptive else ""
    assert r.log_line(s) == f"reward 0.123 | acc 0.500 | kl 0.0012{coef} | len 3.2 | loss -0.0123"
    assert r.log_line({**s, "flat_groups": 0.0}) == r.log_line(s)  # none flat: not said
    assert r.log_line({**s, "flat_groups": 3.0}).endswith("| loss -0.0123 | flat groups 3/4")
    line = r.log_line({**s, "flat_groups": 1.0, "resample_rounds": 2.0, "flat_groups_drawn": 3.0})
    assert line.endswith("| loss -0.0123 | flat groups 1/4 | resampled x2 (3 flat before)")
    line = r.log_line({**s, "resample_rounds": 1.0, "flat_groups_drawn": 2.0})
    assert line.endswith("| loss -0.0123 | resampled x1 (2 flat before)")
    s.pop("kl_coef")
    assert r.log_line(s) == "reward 0.123 | acc 0.500 | kl 0.0012 | len 3.2 | loss -0.0123"  # no coefficient logged
    r.reward_model = torch.nn.Linear(1, 1)
    assert r.log_line(s).startswith("reward (rm score, logit) 0.123 | acc")


# ------------------------------------------------------------------------------------------------ evaluation

def test_held_out_correct_counts_exact_answers_of_greedy_replies(tokenizer, monkeypatch):
    """The count of replies whose final answer is the problem's, over prompts rendered by ``prompt_ids``."""
    from gptforge.eval import generative

    problems = [Problem("1 + 1", "2"), Problem("2 + 2", "4"), Problem("3 + 3", "6"), Problem("9 + 9", "18")]
    replies = ["The answer is 2.", "The answer is 5.", "so 6. The answer is 6.", "The answer is 18.", "18"]
    calls = []

    def fake(model, enc, prompts, template, max_new, desc=None):
        calls.append((model, enc, prompts, template, max_new))
        return replies[: len(prompts)]

    monkeypatch.setattr(generative, "generate_replies", fake)
    _, t = _small()
    enc = ChatTokenizer(tokenizer, t)
    assert held_out_correct("m", enc, t, problems, 7) == 3  # 2, 6 and 18 right; 5 wrong
    assert held_out_correct("m", enc, t, problems + [Problem("9 + 9", "18")], 7) == 3  # "18" alone: no answer
    want = [generative.prompt_ids(p, enc, t) for p in problems]
    assert calls[0] == ("m", enc, want, t, 7)
    assert want[0][0] == t.bos  # a chat prompt, rendered by the template
    assert held_out_correct("m", tokenizer, None, problems[:2], 3) == 1
    assert calls[-1][2] == [tokenizer.encode_ordinary(f"Question: {p.question}\nAnswer:") for p in problems[:2]]
    calls.clear()
    assert held_out_correct("m", enc, t, [], 7) == 0 and calls == []  # no problems: no generation
    monkeypatch.setattr(generative, "generate_replies", lambda *a, **kw: replies[:2])  # a reply lost: an error, not a
    with pytest.raises(ValueError, match="zip"):  # score over fewer problems
        held_out_correct("m", enc, t, problems, 7)


class _Metrics:
    def __init__(self):
        self.rows = []

    def write(self, kind, step, **kw):
        self.rows.append((kind, step, kw))


def _eval_run(cfg, model, rank=0, world=1):
    logs = []
    run = SimpleNamespace(cfg=cfg, info=DistInfo(rank=rank, world=world), model=model, device="cpu",
                          metrics=_Metrics(), log=logs.append, state=SimpleNamespace(step=0))
    return run, logs


def test_evaluate_scores_this_ranks_share_and_sums_over_ranks(tmp_path, tokenizer, monkeypatch):
    """Rank 1 of 2 scores problems 1, 3, 5 of 7 with the policy; a stand-in all-reduce adds the other
    rank's counts (2 right of 4); the record and the line give 3 right of 7."""
    held = [Problem(f"q{i}", str(i)) for i in range(7)]
    r, cfg, _ = _recipe(tmp_path, tokenizer, held_out=held, task="compare", max_new_tokens=5, eval_every=3)
    seen, gathered_models = [], []

    def hoc(model, enc, template, problems, max_new, desc=None):
        seen.append((model, enc, template, [p.question for p in problems], max_new, desc))
        return 1

    @contextlib.contextmanager
    def gathered(model):
        gathered_models.append(model)
        yield

    run, logs = _eval_run(cfg, "the run model", rank=1, world=2)
    run.device = "meta"  # the counts go to the collective on the run's device (NCCL takes no CPU tensor)

    def all_reduce_sum(t, over):  # this rank's 1 of 3 plus the other rank's 2 of 4, by hand (meta holds no values)
        assert over is run.info and t.dtype == torch.float32 and t.device.type == "meta" and t.shape == (2,)
        return torch.tensor([1.0 + 2.0, 3.0 + 4.0])

    monkeypatch.setattr(grpo, "held_out_correct", hoc)
    monkeypatch.setattr(grpo, "gathered", gathered)
    monkeypatch.setattr(grpo, "all_reduce_sum", all_reduce_sum)
    assert r.evaluate(run, 6, last=False) is None
    assert seen == [("the run model", r.enc, r.template, ["q1", "q3", "q5"], 5, None)]  # rank 1: no bar
    assert gathered_models == ["the run model"]
    assert run.metrics.rows == [("eval", 6, {"task": "compare", "acc": 3 / 7, "n": 7})]
    assert isinstance(run.metrics.rows[0][2]["n"], int)
    assert logs == ["step     6 | held-out compare accuracy 0.4286 (7 problems)"]


@pytest.mark.parametrize(("every", "step", "last", "force", "scored"), [
    (3, 6, False, False, True), (3, 7, False, False, False), (3, 0, False, False, True), (3, 7, True, False, True),
    (3, 7, False, True, True), (0, 6, False, False, False), (0, 6, True, False, True), (0, 5, False, True, True),
    (1, 5, False, False, True)])
def test_evaluate_runs_every_eval_every_steps_at_the_end_and_when_forced(tmp_path, tokenizer, monkeypatch, every,
                                                                         step, last, force, scored):
    r, cfg, _ = _recipe(tmp_path, tokenizer, held_out=[Problem("q", "1")], eval_every=every)
    monkeypatch.setattr(grpo, "held_out_correct", lambda *a, **kw: 1)
    run, logs = _eval_run(cfg, GPT(cfg.model))
    if force:
        r.evaluate(run, step, last=last, force=True)
    else:
        r.evaluate(run, step, last=last)  # not forced unless asked
    assert [row[:2] for row in run.metrics.rows] == ([("eval", step)] if scored else [])
    if scored:
        assert run.metrics.rows[0][2]["acc"] == 1.0 and logs[0].endswith("accuracy 1.0000 (1 problems)")


def test_no_held_out_set_no_evaluation_even_forced(tmp_path, tokenizer, monkeypatch):
    r, cfg, _ = _recipe(tmp_path, tokenizer, held_out=[], eval_every=1)
    monkeypatch.setattr(grpo, "held_out_correct", lambda *a, **kw: pytest.fail("nothing to score"))
    run, logs = _eval_run(cfg, "m")
    assert r.evaluate(run, 0, last=True, force=True) is None and run.metrics.rows == [] and logs == []


def test_begin_scores_the_start_of_a_fresh_run_only(tmp_path, tokenizer, monkeypatch):
    r, cfg, _ = _recipe(tmp_path, tokenizer)
    calls = []
    monkeypatch.setattr(r, "evaluate", lambda run, step, last, force=False: calls.append((run, step, last, force)))
    r.begin("run", 0)
    assert calls == [("run", 0, False, True)]
    r.begin("run", 1)  # a resume, even from step 1, does not score again
    r.begin("run", 5)
    assert calls == [("run", 0, False, True)]


def test_ppo_evaluates_its_policy_not_the_pair(tmp_path, tokenizer, monkeypatch):
    r, cfg, _ = _recipe(tmp_path, tokenizer, cls=PPO, held_out=[Problem("q", "1")])
    pv = r.build_model(cfg.model)
    seen = []
    monkeypatch.setattr(grpo, "held_out_correct", lambda model, *a, **kw: seen.append(model) or 0)
    run, logs = _eval_run(cfg, pv)
    r.evaluate(run, 0, last=True)
    assert seen == [pv.policy] and r.policy(run) is pv.policy and GRPO.policy(r, run) is pv


# ------------------------------------------------------------------------------------------------ prepare_model

def _prep_run(cfg, model, step=0):
    model.train()
    return SimpleNamespace(cfg=cfg, model=model, device="cpu", state=SimpleNamespace(step=step),
                           info=SimpleNamespace(rank=0, world=1))


def test_the_reference_is_a_frozen_copy_of_the_starting_weights(tmp_path, tokenizer):
    r, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=0.1)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    torch.manual_seed(0)
    model = GPT(cfg.model)
    run = _prep_run(cfg, model)
    r.prepare_model(run)
    assert r.ref is not model and _same(r.ref, model)
    assert not r.ref.training and not any(p.requires_grad for p in r.ref.parameters())
    assert not model.training and all(p.requires_grad for p in model.parameters())  # eval mode for sampling
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not _same(r.ref, model)  # a copy, not a view of the policy's weights
    cfg.rl.kl_coef = 0.0
    r.prepare_model(_prep_run(cfg, model))
    assert r.ref is None  # no KL term: no reference kept


def test_a_sharded_policys_reference_is_built_of_the_models_config(tmp_path, tokenizer, monkeypatch):
    """Under FSDP ``frozen_copy`` cannot deepcopy and calls ``build()`` for a fresh model of the same shape:
    the factory handed over must build the run's model config."""
    r, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=0.1)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    model = GPT(cfg.model)
    seen = []
    monkeypatch.setattr(grpo, "frozen_copy", lambda module, build: seen.append((module, build)) or copy.deepcopy(module))
    r.prepare_model(_prep_run(cfg, model))
    (module, build), = seen
    built = build()
    assert module is model and isinstance(built, GPT) and built.config == cfg.model and built is not model


def test_on_a_resume_the_reference_is_the_init_from_checkpoint(tmp_path, tokenizer, monkeypatch):
    from gptforge import load

    r, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=0.1)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    torch.manual_seed(1)
    start = GPT(cfg.model)
    asked = []

    def load_model(source):
        asked.append(source)
        return copy.deepcopy(start).train()

    monkeypatch.setattr(load, "load_model", load_model)
    torch.manual_seed(2)
    moved = GPT(cfg.model)
    r.prepare_model(_prep_run(cfg, moved, step=3))
    assert [s.ckpt for s in asked] == [cfg.rl.init_from]
    assert _same(r.ref, start) and not _same(r.ref, moved)
    assert not r.ref.training and not any(p.requires_grad for p in r.ref.parameters())
    run = _prep_run(cfg, moved, step=3)
    run.device = "meta"  # loaded onto the run's device (the meta device shows the move on a CPU)
    r.prepare_model(run)
    assert next(r.ref.parameters()).device.type == "meta"


def test_a_lora_runs_reference_is_its_base(tmp_path, tokenizer):
    from gptforge.models.lora import BaseOf

    r, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=0.1)
    cfg.lora.rank = 2
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    model = GPT(cfg.model)
    for step in (0, 4):  # fresh and resumed alike, no copy
        r.prepare_model(_prep_run(cfg, model, step=step))
        assert isinstance(r.ref, BaseOf) and r.ref.model is model
    cfg.rl.kl_coef = 0.0
    r.prepare_model(_prep_run(cfg, model))
    assert r.ref is None  # no KL term: no reference, with LoRA too


def test_the_reward_model_is_frozen_on_the_runs_device(tmp_path, tokenizer):
    rm = torch.nn.Linear(2, 1).train()
    r, cfg, _ = _recipe(tmp_path, tokenizer, reward_model=rm)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    run = _prep_run(cfg, GPT(cfg.model))
    run.device = "meta"  # "on the run's device": the meta device shows the move on a CPU
    r.prepare_model(run)
    assert rm.weight.device.type == "meta" and not rm.training and not rm.weight.requires_grad


def test_reward_norm_refusals(tmp_path, tokenizer):
    r, cfg, _ = _recipe(tmp_path, tokenizer, reward_norm=True)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    with pytest.raises(RLError) as e:
        r.prepare_model(_prep_run(cfg, GPT(cfg.model)))
    assert str(e.value) == "rl.reward_norm whitens a reward model's score: give --reward-model RUN[,RUN...]"

    ens = torch.nn.Linear(1, 1)
    ens.members = [1, 2, 3]
    r, cfg, _ = _recipe(tmp_path, tokenizer, reward_norm=True, reward_model=ens, kl_coef=0.0)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    r.prepare_model(_prep_run(cfg, GPT(cfg.model)))  # a fresh run: the whitening is fitted on its first step
    with pytest.raises(RLError) as e:  # a resume from step 1 on
        r.prepare_model(_prep_run(cfg, GPT(cfg.model), step=1))
    assert str(e.value) == ("rl.reward_norm: the checkpoint holds no whitening (meta.json loader.reward_norm), set on "
                            "the run's first step; resume from a checkpoint of this run")
    r.state.reward_norm = {"shift": [0.0, 0.0], "scale": [1.0, 1.0]}
    with pytest.raises(RLError) as e:
        r.prepare_model(_prep_run(cfg, GPT(cfg.model), step=2))
    assert str(e.value) == ("rl.reward_norm: the checkpoint whitens 2 reward model(s), rl.reward_model has 3; the "
                            "checkpoint is not this run's")
    r.state.reward_norm = {"shift": [0.0] * 3, "scale": [1.0] * 3}
    r.prepare_model(_prep_run(cfg, GPT(cfg.model), step=2))  # this run's: fine
    single = torch.nn.Linear(1, 1)  # one reward model (no members): one whitening
    r, cfg, _ = _recipe(tmp_path, tokenizer, reward_norm=True, reward_model=single, kl_coef=0.0)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    r.state.reward_norm = {"shift": [0.0], "scale": [1.0]}
    r.prepare_model(_prep_run(cfg, GPT(cfg.model), step=2))
    r.state.reward_norm = {"shift": [0.0, 1.0], "scale": [1.0, 1.0]}
    with pytest.raises(RLError, match="whitens 2 reward model\\(s\\), rl.reward_model has 1;"):
        r.prepare_model(_prep_run(cfg, GPT(cfg.model), step=2))


# ------------------------------------------------------------------------------------------------ PPO's models

def test_ppo_builds_a_policy_and_a_value_model_of_the_same_shape(tmp_path, tokenizer):
    r, cfg, _ = _recipe(tmp_path, tokenizer, cls=PPO)
    torch.manual_seed(0)
    pv = r.build_model(cfg.model)
    assert isinstance(pv, PolicyValue) and isinstance(pv.value, ValueModel) and pv.config is pv.policy.config
    assert pv.value.body.config.n_embd == cfg.model.n_embd and pv.value.body is not pv.policy
    assert torch.equal(pv.value.score.weight, torch.zeros(1, cfg.model.n_embd))  # TRL's value head starts at 0
    assert pv.value.body.lm_head.weight is pv.value.body.transformer.wte.weight  # GPT's tied head: it trains
    assert list(pv.blocks) == [*pv.policy.blocks, *pv.value.body.blocks]
    # num_parameters counts each model's own (tied heads once) and the score head
    assert pv.num_parameters() == pv.policy.num_parameters() + pv.value.body.num_parameters() + cfg.model.n_embd
    assert pv.num_parameters(exclude_embeddings=True) == (pv.policy.num_parameters(True)
                                                          + pv.value.body.num_parameters(True) + cfg.model.n_embd)
    assert pv.num_parameters() == sum(p.numel() for p in pv.parameters())  # tied heads listed once by torch


def test_policy_value_forward_against_a_hand_computation():
    mcfg, _ = _small()
    torch.manual_seed(0)
    policy, body = GPT(mcfg), GPT(mcfg)
    value = ValueModel(body)
    with torch.no_grad():
        value.score.weight.normal_()
    pv = PolicyValue(policy, value)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    logp, v = pv(ids, 3, temperature=2.0)
    with torch.no_grad():
        logits = policy(ids)[0] if isinstance(policy(ids), tuple) else policy(ids)
        lp = torch.log_softmax(logits.double() / 2.0, dim=-1)
        want_lp = lp[:, 3:-1].gather(-1, ids[:, 4:, None]).squeeze(-1)
        h = body.hidden_states(ids).double()
        want_v = (h @ value.score.weight.double().T).squeeze(-1)[:, 3:-1]
    torch.testing.assert_close(logp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v.double(), want_v, rtol=1e-5, atol=1e-5)
    assert logp.shape == v.shape == (2, 5) and v.dtype == torch.float32
    with torch.no_grad():  # the temperature defaults to 1: the model's own distribution
        want_t1 = torch.log_softmax(logits.double(), dim=-1)[:, 3:-1].gather(-1, ids[:, 4:, None]).squeeze(-1)
    torch.testing.assert_close(pv(ids, 3)[0].double(), want_t1, rtol=1e-5, atol=1e-5)


def test_value_model_from_a_reward_model_takes_its_weights():
    from gptforge.training.rm import RewardModel

    mcfg, _ = _small()
    torch.manual_seed(0)
    rm = RewardModel(GPT(mcfg))
    with torch.no_grad():
        rm.score.weight.normal_()
    v = ValueModel.from_reward_model(rm)
    assert _same(v.body, rm.body) and v.body is not rm.body and torch.equal(v.score.weight, rm.score.weight)
    with torch.no_grad():
        v.score.weight.add_(1.0)
    assert not torch.equal(v.score.weight, rm.score.weight)  # copied, not shared
    with torch.no_grad():
        next(v.body.parameters()).add_(1.0)
    assert not _same(v.body, rm.body)  # the body too: training the value model leaves the reward model as it was
    torch.manual_seed(3)
    w = ValueModel(GPT(mcfg))
    w.start_from_reward_model(rm)
    assert _same(w.body, rm.body) and torch.equal(w.score.weight, rm.score.weight)
    other = RewardModel(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, pad_vocab=False)))
    with pytest.raises(RLError) as e:
        w.start_from_reward_model(other)
    msg = str(e.value)
    assert msg.startswith("rl.value_init reward_model: the reward model's shape differs from the policy's (") and \
        msg.endswith("); use rl.value_init policy, or a reward model trained from the same SFT model") and "\n" not in msg
