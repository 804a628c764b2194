"""GRPO: advantages and loss against hand-computed numbers, a reward that favours one token raises
its probability, reward errors name the prompt, and a tiny CLI run logs metrics and resumes exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config, RLConfig
from gptforge.data.chat import ChatTemplate
from gptforge.eval.tasks.verifiable import Problem
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.run import restore
from gptforge.training.grpo import GRPO, group_advantages, grpo_loss, rl_config
from gptforge.training.loop import train
from gptforge.training.rewards import RewardError, load_reward, score
from tests.conftest import tiny_chat_checkpoint


def test_group_advantages_by_hand():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]), eps=0.0 + 1e-4)
    s = math.sqrt(1 / 3)  # sample std of (1, 0, 0, 1)
    torch.testing.assert_close(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (s + 1e-4))
    assert torch.equal(adv[1], torch.zeros(4))  # a group that agrees teaches nothing


def test_scale_rewards_none_and_batch_by_hand(monkeypatch):
    """rl.scale_rewards (TRL's): ``none`` leaves each reward minus its group's mean; ``batch`` divides it
    by the sample std of every reward of the step, the other ranks' included (their count, sum and sum
    of squares come through the all-reduce, stood in for here by one other rank's rewards)."""
    import gptforge.training.grpo as grpo_mod
    from gptforge.parallel.distributed import DistInfo

    mine = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.75]])
    other = torch.tensor([[3.0, 0.0, 0.0, 0.0]])  # the other rank's share of the step
    centred = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.125, -0.125, -0.125, 0.375]])
    torch.testing.assert_close(group_advantages(mine, 1e-4, "none"), centred)
    one_rank = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.25, 0.25, 0.25, 0.75], dtype=torch.float64).std().item()
    torch.testing.assert_close(group_advantages(mine, 1e-4, "batch"), centred / (one_rank + 1e-4))

    def plus_other_rank(t, info):
        r = other.double().flatten()
        return t + torch.stack([torch.tensor(float(r.numel()), dtype=torch.float64), r.sum(), (r * r).sum()])

    monkeypatch.setattr(grpo_mod, "all_reduce_sum", plus_other_rank)
    both = torch.cat([mine.flatten(), other.flatten()]).double().std().item()  # 12 rewards, sample std
    got = group_advantages(mine, 1e-4, "batch", DistInfo(rank=0, world=2))
    torch.testing.assert_close(got, centred / (both + 1e-4))
    assert abs(both - one_rank) > 0.3  # the other rank's rewards change the answer
    with pytest.raises(ValueError, match="group, batch or none"):
        group_advantages(mine, 1e-4, "groups")


def test_flat_groups_are_the_groups_without_reward_variance():
    from gptforge.training.grpo import flat_groups

    rewards = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 0.999]])
    assert flat_groups(rewards) == 2
    assert torch.equal(group_advantages(rewards)[0], torch.zeros(3))  # why a flat group teaches nothing


def test_grpo_loss_by_hand():
    L = math.log
    logp = torch.tensor([[L(0.5), L(0.25)], [L(0.5), L(0.1)]])
    old = torch.tensor([[L(0.4), L(0.25)], [L(0.5), L(0.2)]])
    ref = torch.tensor([[L(0.5), L(0.5)], [L(0.25), L(0.1)]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, kl = grpo_loss(logp, old, ref, torch.tensor([1.0, -1.0]), mask, clip_eps=0.2, kl_coef=0.1)
    # row 0 (A = +1): token 0 ratio 1.25 clips to 1.2, KL 0; token 1 ratio 1, KL = 2 - ln 2 - 1
    k01 = 1 - math.log(2)
    row0 = (-1.2 + -(1 - 0.1 * k01)) / 2
    # row 1 (A = -1): token 0 ratio 1, KL = 1/2 + ln 2 - 1; token 1 is masked out
    k10 = 0.5 + math.log(2) - 1
    row1 = -(-1 - 0.1 * k10)
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert kl.item() == pytest.approx((k01 / 2 + k10) / 2, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_token_logprobs_are_the_sampling_distribution(temperature):
    """The loss scores each reply token under the distribution the sampler drew it from: the KV-cache
    sampler's softmax of logits / temperature, not the T=1 softmax."""
    from gptforge.generation import apply_temperature
    from gptforge.training.grpo import token_logprobs

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64, pad_vocab=False)).eval()
    seq = torch.randint(0, 64, (2, 9))
    got = token_logprobs(model, seq, temperature)
    for t in range(1, 9):  # the sampler's next-token distribution after each prefix, one prefix at a time
        logits = model(seq[:, :t])[0][:, -1]
        want = torch.log_softmax(apply_temperature(logits, temperature), dim=-1).gather(1, seq[:, t, None])[:, 0]
        torch.testing.assert_close(got[:, t - 1], want, atol=1e-5, rtol=1e-5)
    if temperature != 1.0:
        assert not torch.allclose(got, token_logprobs(model, seq, 1.0), atol=1e-3)
    # from the first reply position on: the output head runs on those positions only, same numbers
    seen = []
    model.lm_head.register_forward_hook(lambda _m, args, out: seen.append(args[0].size(1)))
    torch.testing.assert_close(token_logprobs(model, seq, temperature, start=5), got[:, 5:])
    assert seen == [8 - 5]


def test_reward_loading_and_errors():
    assert load_reward("exact_match")(Problem("q", "5"), "2 + 3 = 5. The answer is 5.") == 1.0
    assert load_reward("math:sqrt") is math.sqrt
    close = load_reward("numeric_closeness")
    assert close(Problem("q", "40"), "The answer is 40.") == 1.0
    assert close(Problem("q", "40"), "The answer is 45.") == pytest.approx(0.5 * math.exp(-1))
    assert close(Problem("q", "40"), "no number") == 0.0
    with pytest.raises(RewardError, match="module:function"):
        load_reward("nope")
    with pytest.raises(RewardError, match="cannot import"):
        load_reward("no_such_module_xyz:f")

    def boom(p, r):
        raise KeyError("x")

    with pytest.raises(RewardError, match="raised on prompt 'What is 1 \\+ 1\\?'"):
        score(boom, [Problem("What is 1 + 1?", "2")], ["2"])
    with pytest.raises(RewardError, match="returned 'five'.*expected a number"):
        score(lambda p, r: "five", [Problem("q", "2")], ["2"])
    # a non-finite reward is passed on: the GRPO step refuses it and the run stops with exit 3
    # (tests/training/test_rl_guards.py)
    assert math.isnan(score(lambda p, r: float("nan"), [Problem("q", "2")], ["2"])[0])


def test_digit_match_credits_digits_in_their_places():
    """An independent count: digits equal position by position from the ones, over the longer number."""
    digits = load_reward("digit_match")
    say = "The answer is {}.".format
    assert digits(Problem("q", "999"), say(999)) == 1.0
    assert digits(Problem("q", "999"), say(899)) == pytest.approx(0.5 * 2 / 3)  # tens and ones right
    assert digits(Problem("q", "999"), say(990)) == pytest.approx(0.5 * 2 / 3)  # hundreds and tens right
    assert digits(Problem("q", "999"), say(919)) == pytest.approx(0.5 * 2 / 3)
    assert digits(Problem("q", "222"), say(193)) == 0.0
    assert digits(Problem("q", "1255"), say(255)) == pytest.approx(0.5 * 3 / 4)  # aligned from the ones
    assert digits(Problem("q", "255"), say(1255)) == pytest.approx(0.5 * 3 / 4)  # an extra digit costs
    assert digits(Problem("q", "-12"), say(-13)) == pytest.approx(0.5 * 1 / 2)
    assert digits(Problem("q", "-12"), say(12)) == 0.0  # the sign is wrong: nothing
    assert digits(Problem("q", "12"), say(-12)) == 0.0
    assert digits(Problem("q", "12"), "twelve") == 0.0
    assert digits(Problem("q", "larger"), say(12)) == 0.0  # a non-integer reference: no partial credit
    assert digits(Problem("q", "7"), say(3)) == 0.0
    # never reaches half an exact match's reward without being one: the best miss of 123 is 1123 (3 of 4)
    from gptforge.cli import build_parser
    from gptforge.training.rewards import BUILTIN

    rl = next(a for a in build_parser()._subparsers._group_actions[0].choices["rl"]._actions if "--reward" in a.option_strings)
    assert all(name in rl.help for name in BUILTIN), "rl --help names every built-in reward"
    best = max((digits(Problem("q", "123"), say(n)), n) for n in range(2000) if n != 123)
    assert best == (pytest.approx(0.5 * 3 / 4), 1123)


def _small_vocab_model() -> tuple[GPT, ChatTemplate]:
    # 64 tokens: GPT-2 ids 0..58 are single ASCII characters ('!' = 0, 'A' = 32); chat ids 59..63
    torch.manual_seed(0)
    t = ChatTemplate(bos=59, roles={"system": 60, "user": 61, "assistant": 62}, end=63, name="test")
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=64, pad_vocab=False)), t


def _p_token(model: GPT, t: ChatTemplate, tokenizer, tok: int) -> float:
    ids = torch.tensor([t.render_for_generation(Problem("!", "").messages(with_solution=False), tokenizer)])
    with torch.no_grad():
        return torch.softmax(model.eval()(ids)[0][0, -1], -1)[tok].item()


def test_reward_favouring_one_token_raises_its_probability(tmp_path, tokenizer):
    model, t = _small_vocab_model()
    before = _p_token(model, t, tokenizer, 32)

    def favours_a(problem, reply):
        return reply.count("A") / max(1, len(reply))

    cfg = rl_config(model.config, str(tmp_path / "rl"), "")
    cfg.rl = RLConfig(prompts=4, group=8, max_new_tokens=4, kl_coef=0.01, eval_n=0)
    cfg.optim.lr, cfg.train.max_steps, cfg.train.ckpt_every, cfg.train.device = 1e-2, 6, 0, "cpu"
    sd = model.state_dict()
    recipe = GRPO(cfg, t, tokenizer, favours_a, problems_at=lambda step: [Problem("!", "")] * 4, held_out=[])
    # the 64-id toy speaks the first 59 ids of GPT-2's BPE (its prompts and replies stay inside them), not the
    # whole tokenizer: the loop's "tokenizer fits the model" guard would refuse it, so no tokenizer is claimed
    recipe.words_unknown = True
    result = train(cfg, recipe, init_weights=lambda m: m.load_state_dict(sd))
    restore.load_model_weights(model, result.last_checkpoint)
    after = _p_token(model, t, tokenizer, 32)
    assert after > 3 * before, (before, after)
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["kind"] == "rl"]
    assert len(rl) == 6 and {"reward", "kl", "accuracy", "reply_len", "loss", "flat_groups"} <= set(rl[0])
    assert rl[-1]["reward"] > rl[0]["reward"]


def test_rl_cli_logs_metrics_and_resumes_exactly(tmp_path, tokenizer, capsys):
    src = tiny_chat_checkpoint(tmp_path / "sft")
    args = ["--task", "arithmetic", "--prompts", "2", "--group", "3", "--max-new-tokens", "4", "--eval-n", "4",
            "--lr", "1e-3", "--device", "cpu", "--ckpt-every", "0"]
    assert main(["rl", "--init-from", str(src), "--out", str(tmp_path / "full"), "--steps", "3", *args]) == 0
    out = capsys.readouterr().out
    # a random model answers nothing right: every group is flat, and RL says so (once) and logs it
    assert out.count("every group's 3 replies got the same reward") == 1 and "flat groups 2/2" in out
    assert "--- rl summary" in out and "held-out    arithmetic: accuracy (step" in out and "gptforge chat --ckpt" in out
    assert main(["rl", "--init-from", str(src), "--out", str(tmp_path / "part"), "--steps", "2", *args]) == 0
    assert main(["rl", "--out", str(tmp_path / "part"), "--resume", "--steps", "3"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "rl"] == [1, 2, 3]
    assert [r["flat_groups"] for r in rows if r["kind"] == "rl"] == [2, 2, 2]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 3]
    # the resumed run's steps: the same losses, rewards, KL and reply lengths (the same sampled replies)
    part = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    same = ("loss", "reward", "accuracy", "kl", "reply_len", "grad_norm", "lr")
    assert ([{k: r[k] for k in same} for r in rows if r["kind"] == "rl"]
            == [{k: r[k] for k in same} for r in part if r["kind"] == "rl" and not r.get("replayed")])
    a, b = (GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50261)) for _ in range(2))
    restore.load_model_weights(a, ckpt.latest_checkpoint(tmp_path / "full"))
    restore.load_model_weights(b, ckpt.latest_checkpoint(tmp_path / "part"))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    meta = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "part"))
    assert meta["chat_template"] == ChatTemplate.gpt2().to_dict() and meta["step"] == 3


def test_rl_refuses_base_model_without_template(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
    base = ckpt.save_checkpoint(tmp_path / "base", 0, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})
    assert main(["rl", "--init-from", str(base), "--out", str(tmp_path / "rl"), "--device", "cpu"]) == 2
    assert "no chat template" in capsys.readouterr().err
    # --raw: plain "Question: ...\nAnswer:" prompts, replies cut at a blank line
    assert main(["rl", "--init-from", str(base), "--out", str(tmp_path / "rl"), "--device", "cpu", "--raw",
                 "--steps", "2", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--eval-n", "2"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "rl"] == [1, 2]
    assert ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "rl"))["chat_template"] is None
    assert main(["rl", "--out", str(tmp_path / "rl"), "--resume", "--steps", "3"]) == 0


def test_training_problems_leave_the_eval_set_out():
    from gptforge.eval.generative import arithmetic_eval_problems
    from gptforge.eval.tasks.synthetic import training_problems
    from gptforge.training.rollouts import problem_stream

    ev = arithmetic_eval_problems(500)
    assert len({p.question for p in ev}) == 500
    eval_q = {p.question for p in ev}
    assert not eval_q & {p.question for p in training_problems(3000, seed=1)}
    at, held_out = problem_stream(RLConfig(prompts=50, eval_n=500), seed=0)
    assert {p.question for p in held_out} == eval_q
    assert not eval_q & {p.question for s in range(20) for p in at(s)}


def test_compare_task_is_verifiable_and_held_out():
    from gptforge.eval.generative import GENERATIVE, compare_eval_problems
    from gptforge.eval.tasks.synthetic import training_problems
    from gptforge.eval.tasks.verifiable import compare_problems

    for p in compare_problems(50, seed=3):
        a, b = (int(x) for x in p.question[len("Which is larger, "):-1].split(" or "))
        assert p.answer == str(max(a, b)) and GENERATIVE["compare"].follows_format(p.solution)
        assert load_reward("exact_match")(p, p.solution) == 1.0
    eval_q = {p.question for p in compare_eval_problems()}
    assert len(eval_q) == 500 and not eval_q & {p.question for p in training_problems(2000, 1, task="compare")}


def test_arithmetic3_is_three_digit_verifiable_and_held_out_everywhere(tmp_path, capsys):
    """arithmetic3 (issue 32's RL goal): 3-digit operands, answers checked by Python's own arithmetic, and its
    eval set left out of SFT files (``--digits 3`` or the task's name), preference files and RL's draws.
    Drawn at the eval set's own seed, so the problems would be the eval problems but for the ban."""
    import re

    from gptforge.cli.hints import GENERATED_TASKS
    from gptforge.eval.generative import ARITHMETIC_EVAL_SEED, GENERATED, GENERATIVE
    from gptforge.eval.tasks.preferences import preference_set
    from gptforge.eval.tasks.synthetic import training_problems
    from gptforge.training.rollouts import problem_stream

    assert GENERATED_TASKS == list(GENERATED)  # the CLI's choices name every generated task
    ev = GENERATIVE["arithmetic3"].problems(0)
    eval_q = {p.question for p in ev}
    assert len(eval_q) == 500
    for p in ev:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", p.question).groups()
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999
        assert p.answer == str(int(a) + int(b) if op == "+" else int(a) - int(b)) and int(p.answer) >= 0
        assert load_reward("exact_match")(p, p.solution) == 1.0 and GENERATIVE["arithmetic3"].follows_format(p.solution)
    two = {p.question for p in GENERATIVE["arithmetic"].problems(0)}
    assert not two & eval_q
    for digits, task in [(3, "arithmetic"), (2, "arithmetic3")]:  # both spellings draw 3-digit problems
        got = training_problems(600, seed=ARITHMETIC_EVAL_SEED, digits=digits, task=task)
        assert len(got) == 600 and not eval_q & {p.question for p in got}
        assert all(len(p.question.split()[2]) == 3 for p in got)
    assert not eval_q & {r["prompt"][0]["content"] for r in preference_set("arithmetic3", 600, seed=ARITHMETIC_EVAL_SEED)}
    at, held_out = problem_stream(RLConfig(task="arithmetic3", prompts=50, eval_n=100), seed=0)
    assert [p.question for p in held_out] == [p.question for p in ev[:100]]
    assert not eval_q & {p.question for s in range(10) for p in at(s)}
    out = tmp_path / "c.jsonl"
    assert main(["prepare", "conversations", "arithmetic3", "--n", "5", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(len(r["messages"][0]["content"].split()[2]) == 3 for r in rows)
    from gptforge.cli.hints import _pairs_task  # an SFT run's next commands name the task its file teaches

    assert _pairs_task(str(out)) == "arithmetic3"
    assert main(["prepare", "conversations", "arithmetic", "--n", "5", "--out", str(tmp_path / "c2.jsonl")]) == 0
    assert _pairs_task(str(tmp_path / "c2.jsonl")) == "arithmetic"
    for bad in (["compare", "--digits", "3"], ["arithmetic3", "--digits", "2"], ["arithmetic", "--digits", "0"]):
        assert main(["prepare", "conversations", bad[0], *bad[1:], "--n", "5", "--out", str(tmp_path / "x.jsonl")]) == 2
        assert "--digits" in capsys.readouterr().err


def test_checkpoints_from_before_the_run_stack_still_load_and_resume(tmp_path, tokenizer):
    """SFT and RL checkpoints written before ``sft`` and ``rl`` were config sections kept their settings
    beside the config in meta.json (RL: a flat RLConfig, one AdamW group over every parameter); they
    read into today's keys, and the old RL optimizer state is regrouped parameter by parameter."""
    from gptforge.run.resume import recipe_of, saved_config

    t = ChatTemplate.gpt2()
    mcfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=t.vocab_size)
    old_config = {k: v for k, v in Config(model=mcfg).to_dict().items() if k not in ("sft", "rl")}
    sft_meta = {"config": old_config, "sft": {"data": "conv.jsonl", "val_count": 16, "split": "train", "seed": 3,
                                              "skip_bad": True}}
    assert recipe_of(sft_meta) == "sft" and saved_config(sft_meta).sft.val_count == 16
    legacy_rl = {"task": "arithmetic", "reward": "exact_match", "init_from": str(tmp_path / "sft"), "steps": 4,
                 "prompts": 2, "group": 3, "max_new_tokens": 4, "temperature": 1.0, "top_k": 0, "lr": 1e-3,
                 "warmup_steps": 0, "weight_decay": 0.0, "grad_clip": 1.0, "kl_coef": 0.02, "clip_eps": 0.2,
                 "updates_per_batch": 1, "micro_batch": 16, "adv_eps": 1e-4, "eval_every": 0, "eval_n": 4,
                 "ckpt_every": 50, "keep_ckpts": 2, "seed": 0, "device": "cpu", "out_dir": "elsewhere"}
    cfg = saved_config({"config": old_config, "rl": legacy_rl})
    assert (cfg.train.max_steps, cfg.optim.lr, cfg.rl.group, cfg.train.device) == (4, 1e-3, 3, "cpu")
    # an RL checkpoint as the old train_rl wrote it: AdamW(model.parameters()) after two steps
    torch.manual_seed(0)
    sft = ckpt.save_checkpoint(tmp_path / "sft", 1, GPT(mcfg), None, {"config": old_config, "chat_template": t.to_dict()})
    model = GPT(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    for _ in range(2):
        model(torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8)))[1].backward()
        opt.step()
        opt.zero_grad()
    old = ckpt.save_checkpoint(tmp_path / "rl", 2, model, opt, {"config": old_config, "chat_template": t.to_dict(),
                                                                 "rl": {**legacy_rl, "init_from": str(sft)}})
    assert main(["rl", "--out", str(tmp_path / "rl"), "--resume", "--steps", "3"]) == 0
    new = ckpt.latest_checkpoint(tmp_path / "rl")
    assert new.name == "step_000003" and ckpt.read_meta(new)["recipe"] == "grpo"
    # the regrouped Adam moments are the old ones, each on its own parameter
    from gptforge.optim import build_optimizer

    fresh = GPT(mcfg)
    restore.load_model_weights(fresh, old)
    regrouped = build_optimizer(fresh, saved_config(ckpt.read_meta(old)).optim, "cpu")
    restore.load_optimizer(old, regrouped, fresh)
    by_param = {id(p): regrouped.state[p]["exp_avg"] for p in fresh.parameters()}
    for (name, _), before in zip(model.named_parameters(), opt.state.values(), strict=True):
        torch.testing.assert_close(by_param[id(dict(fresh.named_parameters())[name])], before["exp_avg"], msg=name)


def test_rl_resume_applies_the_flags_given_or_refuses_them_by_name(tmp_path, tokenizer, capsys):
    """On --resume every flag given applies on top of the run's settings (none silently dropped), and
    one that would make it another run (the task, the held-out set) is refused naming the key."""
    src = tiny_chat_checkpoint(tmp_path / "sft")
    args = ["--task", "arithmetic", "--prompts", "2", "--group", "2", "--max-new-tokens", "3", "--eval-n", "2",
            "--device", "cpu", "--ckpt-every", "0"]
    assert main(["rl", "--init-from", str(src), "--out", str(tmp_path / "r"), "--steps", "1", *args]) == 0
    assert main(["rl", "--out", str(tmp_path / "r"), "--resume", "--steps", "2", "--lr", "5e-4",
                 "--rl.kl_coef", "0.5"]) == 0
    meta = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "r"))
    assert (meta["step"], meta["config"]["optim"]["lr"], meta["config"]["rl"]["kl_coef"]) == (2, 5e-4, 0.5)
    capsys.readouterr()
    assert main(["rl", "--out", str(tmp_path / "r"), "--resume", "--steps", "3", "--task", "compare"]) == 2
    assert "--rl.task 'compare': this run was trained with 'arithmetic'" in capsys.readouterr().err
    assert main(["rl", "--out", str(tmp_path / "r"), "--resume", "--rl.no_such_key", "1"]) == 2
    assert "unknown config key --rl.no_such_key" in capsys.readouterr().err
