"""The reward model's and DPO's small pieces, each against a hand computation (issue 36: the `training`
lane's fast tests for rm.py and dpo.py beyond the losses): where a reward is read (the reply's last
token), the score head's N(0, 1/(C+1)) start (OpenAI's lm-human-preferences), an ensemble's mean and
minimum, which LM head is frozen, the cached reference table's checks, reward-model checkpoints told
from others by meta.json, and the refusals' words. Stub bodies and 1-layer models: milliseconds."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from gptforge.config import Config
from gptforge.data.preference import PairBatch
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run import checkpoint as ckpt
from gptforge.training import dpo as dpo_mod
from gptforge.training import rm as rm_mod


class Body(nn.Module):
    """hidden_states(ids) = H[ids] (a fixed (V, C) table per token): readable by hand."""

    def __init__(self, C=3, V=10, seed=0, n_params=(100, 60)):
        super().__init__()
        self.config = SimpleNamespace(n_embd=C)
        self.H = nn.Parameter(torch.randn(V, C, generator=torch.Generator().manual_seed(seed)))
        self.n_params = n_params

    def hidden_states(self, ids):
        return self.H[ids]

    def num_parameters(self, exclude_embeddings=False):
        return self.n_params[bool(exclude_embeddings)]


def test_last_index_is_each_rows_last_reply_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert rm_mod.last_index(mask).tolist() == [2, 0, 3, 3]
    with pytest.raises(ValueError, match=r"^a row has no reply token to read a reward at$"):
        rm_mod.last_index(torch.tensor([[0, 1], [0, 0]], dtype=torch.bool))


@pytest.mark.parametrize("C", [1, 3])
def test_score_head_starts_at_n_0_1_over_c_plus_1(C):
    torch.manual_seed(7)
    rm = rm_mod.RewardModel(Body(C))
    torch.manual_seed(7)
    nn.Linear(C, 1, bias=False)  # the head's own default init draws first
    z = torch.randn(1, C)
    torch.testing.assert_close(rm.score.weight.detach(), z / math.sqrt(C + 1), rtol=1e-6, atol=0)
    torch.manual_seed(7)
    rm = rm_mod.RewardModel(Body(C), init_std=0.25)
    torch.testing.assert_close(rm.score.weight.detach(), z * 0.25, rtol=1e-6, atol=0)
    assert rm.score.bias is None and rm.num_parameters() == 100 + C and rm.num_parameters(True) == 60 + C
    assert rm.config is rm.body.config  # what PPO's value model and export read the shape from


def _rm(seed, w):
    rm = rm_mod.RewardModel(Body(seed=seed))
    with torch.no_grad():
        rm.score.weight.copy_(torch.tensor([w]))
    return rm


def test_rewards_are_read_at_the_given_positions_and_pairs_split_chosen_first():
    rm = _rm(0, [1.0, -2.0, 0.5])
    ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 1, 2]])
    mask = torch.tensor([[0, 1, 0], [0, 1, 1], [1, 0, 0], [0, 0, 1]], dtype=torch.bool)
    H, w = rm.body.H.detach().double(), torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    want = [H[2] @ w, H[6] @ w, H[7] @ w, H[2] @ w]  # rows' last reply tokens: 2, 6, 7, 2
    got = rm(ids, torch.tensor([1, 2, 0, 2]))
    assert got.dtype == torch.float32 and got.shape == (4,)
    torch.testing.assert_close(got.double(), torch.stack(want), rtol=1e-6, atol=1e-6)
    c, r = rm.pair_rewards(ids, mask)
    torch.testing.assert_close(torch.cat([c, r]).double(), torch.stack(want), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rm.member_scores(ids, torch.tensor([1, 2, 0, 2])), got[None])
    loss, m = rm_mod.rm_loss(rm, ids, mask, torch.tensor([0.5, -1.0]), center_coef=0.1)
    d = torch.stack(want[:2]) - torch.stack(want[2:]) - torch.tensor([0.5, -1.0], dtype=torch.float64)
    ref = -torch.nn.functional.logsigmoid(d).mean() + 0.1 * ((torch.stack(want[:2]) + torch.stack(want[2:])) ** 2).mean()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6) and m["loss"] == loss.item()
    assert m["reward_chosen"] == pytest.approx((want[0] + want[1]).item() / 2, rel=1e-6)
    assert m["reward_rejected"] == pytest.approx((want[2] + want[3]).item() / 2, rel=1e-6)


def test_an_ensemble_is_its_members_mean_or_min():
    a, b, c = _rm(0, [1.0, 0.0, 0.0]), _rm(1, [0.0, 1.0, 0.0]), _rm(2, [0.0, 0.0, 1.0])
    ids, at = torch.tensor([[1, 2], [3, 4]]), torch.tensor([1, 0])
    each = torch.stack([a(ids, at), b(ids, at), c(ids, at)])
    ens = rm_mod.RewardEnsemble([a, b, c])
    assert ens.reduce == "mean" and ens.body is a.body and ens.score is a.score and ens.config is a.config
    torch.testing.assert_close(ens.member_scores(ids, at), each)
    torch.testing.assert_close(ens(ids, at), (each[0] + each[1] + each[2]) / 3)
    ens.reduce = "min"
    torch.testing.assert_close(ens(ids, at), torch.minimum(torch.minimum(each[0], each[1]), each[2]))
    assert rm_mod.RewardEnsemble([a, b], reduce="min").reduce == "min"
    torch.testing.assert_close(rm_mod.reduce_member_scores(torch.tensor([[1.0, 5.0], [3.0, -1.0]])),
                               torch.tensor([2.0, 2.0]))
    torch.testing.assert_close(rm_mod.reduce_member_scores(torch.tensor([[1.0, 5.0], [3.0, -1.0]]), "min"),
                               torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"^a reward-model ensemble needs at least two members$"):
        rm_mod.RewardEnsemble([a])
    with pytest.raises(ValueError, match=r"^reward-model ensemble reduce 'max'; allowed: mean, min$"):
        ens.reduce = "max"


def test_only_an_untied_lm_head_is_frozen():
    from gptforge.models.llama import Llama, LlamaConfig

    shape = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 32}
    untied = rm_mod.freeze_unused_head(Llama(LlamaConfig(**shape)))
    assert [n for n, p in untied.named_parameters() if not p.requires_grad] == ["lm_head.weight"]
    tied = rm_mod.freeze_unused_head(Llama(LlamaConfig(**shape, tie_embeddings=True)))
    assert all(p.requires_grad for p in tied.parameters())
    gpt = rm_mod.freeze_unused_head(GPT(GPTConfig(**shape)))
    assert all(p.requires_grad for p in gpt.parameters())
    body = Body()
    assert rm_mod.freeze_unused_head(body) is body and body.H.requires_grad


def test_body_init_runs_on_the_body_and_keeps_the_source():
    assert rm_mod.body_init(None) is None
    seen = []

    def init(m):
        seen.append(m)

    init.source = "runs/base"
    wrapped = rm_mod.body_init(init)
    holder = SimpleNamespace(body="the body")
    wrapped(holder)
    assert seen == ["the body"] and wrapped.source == "runs/base"
    assert rm_mod.body_init(lambda m: None).source == ""


def _save(tmp, name, model, recipe=None, **meta):
    cfg = Config(model=GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    extra = {"recipe": recipe} if recipe else {}
    return ckpt.save_checkpoint(tmp / name, 1, model, None, {"config": cfg.to_dict(), **extra, **meta})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rms")
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    out = {}
    for name, seed in (("rm1", 0), ("rm2", 1)):
        torch.manual_seed(seed)
        out[name] = (rm_mod.RewardModel(GPT(mcfg)), _save(tmp, name, rm_mod.RewardModel(GPT(mcfg)), "rm"))
    torch.manual_seed(0)
    out["pre"] = (None, _save(tmp, "pre", GPT(mcfg)))
    out["sft"] = (None, _save(tmp, "sft", GPT(mcfg), "sft"))
    return tmp, out


def test_reward_model_checkpoints_load_and_others_are_refused(saved):
    tmp, out = saved
    assert rm_mod.checkpoint_is_reward_model(str(out["rm1"][1])) and rm_mod.checkpoint_is_reward_model(str(tmp / "rm1"))
    for path in (None, "", str(out["pre"][1]), str(out["sft"][1]), str(tmp / "nothing")):
        assert rm_mod.checkpoint_is_reward_model(path) is False, path
    rm, template = rm_mod.load_reward_model(str(tmp / "rm1"))
    assert isinstance(rm, rm_mod.RewardModel) and not rm.training and template is None
    saved_sd = ckpt.read_meta(out["rm1"][1])["files"]["model.safetensors"]
    from safetensors.torch import load_file

    want = load_file(str(out["rm1"][1] / "model.safetensors"))
    assert saved_sd and all(torch.equal(rm.state_dict()[k], v) for k, v in want.items())
    ens, _ = rm_mod.load_reward_model(f"{tmp / 'rm1'}, {tmp / 'rm2'}")
    assert isinstance(ens, rm_mod.RewardEnsemble) and not ens.training and len(ens.members) == 2
    assert torch.equal(ens.members[1].score.weight, load_file(str(out["rm2"][1] / "model.safetensors"))["score.weight"])
    for name, article in (("pre", "a pretrain"), ("sft", "an sft")):
        with pytest.raises(ValueError) as e:
            rm_mod.load_reward_model(str(tmp / name))
        assert str(e.value) == (f"{tmp / name} is {article} checkpoint, not a reward model: train one with "
                                "`gptforge rm --init-from SFT --data PREFS.jsonl --out runs/rm`")
    with pytest.raises(ValueError, match=r"an empty name in the comma-separated list of reward models$"):
        rm_mod.load_reward_model(f"{tmp / 'rm1'},,{tmp / 'rm2'}")
    with pytest.raises(ValueError, match=r"a reward model named twice; an ensemble's members are different runs$"):
        rm_mod.load_reward_model(f"{tmp / 'rm1'},{tmp / 'rm1'}")


def test_an_ensembles_members_must_share_the_chat_template(saved, tmp_path):
    from gptforge.data.chat import ChatTemplate

    tmp, out = saved
    torch.manual_seed(0)
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=ChatTemplate.gpt2().vocab_size)
    cfg = Config(model=mcfg).to_dict()
    for name in ("t1", "t2"):
        ckpt.save_checkpoint(tmp_path / name, 1, rm_mod.RewardModel(GPT(mcfg)), None,
                             {"config": cfg, "recipe": "rm", "chat_template": ChatTemplate.gpt2().to_dict()})
    ckpt.save_checkpoint(tmp_path / "t3", 1, rm_mod.RewardModel(GPT(mcfg)), None, {"config": cfg, "recipe": "rm"})
    ens, template = rm_mod.load_reward_model(f"{tmp_path / 't1'},{tmp_path / 't2'}")
    assert template.to_dict() == ChatTemplate.gpt2().to_dict()
    with pytest.raises(ValueError) as e:
        rm_mod.load_reward_model(f"{tmp_path / 't1'},{tmp_path / 't3'}")
    assert str(e.value) == (f"{tmp_path / 't3'}: its chat template differs from {tmp_path / 't1'}'s; an ensemble's "
                            "members must read replies rendered alike (train them from the same SFT checkpoint)")


def test_log_lines():
    s = {"accuracy": 0.75, "margin": 1.23456, "loss": 0.5, "rewards/accuracies": 0.5, "rewards/margins": -0.1,
         "rewards/chosen": 0.2, "rewards/rejected": 0.3}
    assert rm_mod.RM.log_line(None, s) == "acc 0.750 | margin 1.235 | loss 0.5000"
    assert dpo_mod.DPO.log_line(None, s) == "acc 0.500 | margin -0.100 | chosen 0.200 | rejected 0.300 | loss 0.5000"


# --- DPO -----------------------------------------------------------------------------------------------


def test_a_cached_reference_table_is_checked_before_use():
    good = -torch.rand(3, 2)
    assert dpo_mod._table_fits(good, 3) and dpo_mod._table_fits(torch.zeros(3, 2), 3)  # log p = 0 is allowed
    assert dpo_mod._table_fits(good.double(), 3)
    for bad, n in ((good, 4), (good[:, :1], 3), (good.T, 3), (-torch.ones(3, 2, dtype=torch.long), 3),
                   (good.numpy(), 3), (torch.tensor([[0.1, -1.0]] + [[-1.0, -1.0]] * 2), 3),
                   (torch.tensor([[float("nan"), -1.0]] + [[-1.0, -1.0]] * 2), 3),
                   (torch.tensor([[float("-inf"), -1.0]] + [[-1.0, -1.0]] * 2), 3), (None, 3)):
        assert not dpo_mod._table_fits(bad, n), (bad, n)


def test_sequence_logps_refuses_a_batch_without_reply_tokens_and_nll_only_with_sft_coef():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)).eval()
    ids = torch.randint(0, 16, (2, 6))
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 0] = True  # the first token is never a target
    with pytest.raises(ValueError, match=r"^no reply tokens to score$"):
        dpo_mod.sequence_logps(model, ids, mask)
    mask[0, 3:], mask[1, 5] = True, True
    batch = PairBatch(ids, mask, torch.tensor([1]), None)
    table = torch.tensor([[-9.0, -9.0], [-20.0, -21.0]])
    loss, m = dpo_mod.dpo_batch_loss(model, batch, 0.1, ref_table=table)
    assert "nll_loss" not in m
    with torch.no_grad():
        lp = torch.log_softmax(model(ids[:, :-1])[0].double(), -1)
    pc = sum(lp[0, t - 1, ids[0, t]].item() for t in (3, 4, 5))
    pr = lp[1, 4, ids[1, 5]].item()
    dpo = -torch.nn.functional.logsigmoid(torch.tensor(0.1 * ((pc + 20.0) - (pr + 21.0)))).item()
    assert loss.item() == pytest.approx(dpo, rel=1e-5)
    loss, m = dpo_mod.dpo_batch_loss(model, batch, 0.1, ref_table=table, sft_coef=0.5)
    assert m["nll_loss"] == pytest.approx(-pc / 3, rel=1e-5) and loss.item() == pytest.approx(dpo - 0.5 * pc / 3, rel=1e-5)
    assert m["loss"] == loss.item()
    with pytest.raises(ValueError, match="not both"):
        dpo_mod.dpo_batch_loss(model, batch, 0.1, ref=model, ref_table=table)


def test_a_missing_path_is_refused_as_one_checkpoint_and_a_comma_in_a_real_name_is_kept(saved, tmp_path):
    from gptforge.run.checkpoint import CheckpointError

    tmp, out = saved
    with pytest.raises(CheckpointError, match=r"nothing-here does not exist"):  # not read as a list of one
        rm_mod.load_reward_model(str(tmp_path / "nothing-here"))
    (tmp_path / "a,b").symlink_to(tmp / "rm2")  # a run directory whose name holds a comma: one model
    rm, _ = rm_mod.load_reward_model(str(tmp_path / "a,b"))
    assert isinstance(rm, rm_mod.RewardModel)
    assert torch.equal(rm.score.weight, rm_mod.load_reward_model(str(tmp / "rm2"))[0].score.weight)


def test_a_lora_reward_model_loads_merged_onto_its_recorded_base(tmp_path):
    """A LoRA reward model's checkpoint holds the adapters and the head only: loading it puts them on the
    base that meta.json records, merged; it scores as the unmerged model it was saved from (float64)."""
    from gptforge.models.lora import add_lora, weights_fingerprint

    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)  # _save's config
    torch.manual_seed(3)
    base = GPT(mcfg)
    base_dir = _save(tmp_path, "base", base)
    body = GPT(mcfg)
    body.load_state_dict(base.state_dict())
    add_lora(body, "gpt2", 2, 4.0, 0.0, ["c_attn"])
    rm = rm_mod.RewardModel(body)
    with torch.no_grad():  # B starts at 0: give the adapters an effect to lose
        for n, p in rm.named_parameters():
            if ".lora_" in n:
                p.normal_(0.0, 0.5)
    rm.lora_state_keys = sorted(n for n, _ in rm.named_parameters() if ".lora_" in n or n == "score.weight")
    cfg = Config(model=mcfg)
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.targets, cfg.lora.base = 2, 4.0, "c_attn", str(base_dir)
    ckpt.save_checkpoint(tmp_path / "lrm", 1, rm, None, {"config": cfg.to_dict(), "recipe": "rm",
                                                         "lora": {"base": str(base_dir), "base_sha256": weights_fingerprint(base)}})
    assert sorted(ckpt.read_meta(tmp_path / "lrm" / "checkpoints" / "step_000001")["files"]) == ["model.safetensors"]
    loaded, template = rm_mod.load_reward_model(str(tmp_path / "lrm"))
    assert isinstance(loaded, rm_mod.RewardModel) and template is None and not loaded.training
    assert not any(".lora_" in n for n, _ in loaded.named_parameters())
    ids, at = torch.tensor([[1, 5, 7, 2, 9], [3, 3, 0, 15, 4]]), torch.tensor([4, 2])
    with torch.no_grad():
        want = copy.deepcopy(rm).double().eval()(ids, at)
        base_only = rm_mod.RewardModel(copy.deepcopy(base)).double()
        base_only.score.weight.copy_(rm.score.weight)
        assert (base_only(ids, at) - want).abs().max() > 1e-2  # the adapters matter here
        torch.testing.assert_close(loaded(ids, at), want, rtol=1e-5, atol=1e-5)  # the head returns float32


def test_a_reward_models_damaged_template_or_tokenizer_entry_is_named_by_its_meta_json(tmp_path):
    from gptforge.data.chat import ChatFormatError, ChatTemplate
    from gptforge.data.tokenizer import TokenizerError

    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=ChatTemplate.gpt2().vocab_size)
    torch.manual_seed(0)
    cfg = Config(model=mcfg).to_dict()
    bad = {**ChatTemplate.gpt2().to_dict(), "end": -1}
    where = ckpt.save_checkpoint(tmp_path / "t", 1, rm_mod.RewardModel(GPT(mcfg)), None,
                                 {"config": cfg, "recipe": "rm", "chat_template": bad})
    with pytest.raises(ChatFormatError) as e:
        rm_mod.load_reward_model(str(tmp_path / "t"))
    assert str(e.value).startswith(f"{where / 'meta.json'}: chat_template.end=-1: expected a token id"), str(e.value)
    where = ckpt.save_checkpoint(tmp_path / "k", 1, rm_mod.RewardModel(GPT(mcfg)), None,
                                 {"config": cfg, "recipe": "rm", "tokenizer": {"format": "nope"}})
    with pytest.raises(TokenizerError) as e:  # the tokenizer it reads replies with is its own, checked
        rm_mod.load_reward_model(str(tmp_path / "k"))
    assert str(e.value).startswith(f"{where / 'meta.json'}: tokenizer.format/kind:"), str(e.value)


# --- DPO's cached reference table (RUN/ref_logps.pt) ------------------------------------------------------


def _pairs(seed, n, V=16):
    from gptforge.data.preference import RenderedPair, RenderedSide

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        sides = []
        for L, first in ((6, 3), (5, 2)):
            ids = torch.randint(0, V, (L,), generator=g).numpy()
            mask = (torch.arange(L) >= first).numpy()
            sides.append(RenderedSide(ids, mask))
        out.append(RenderedPair(*sides))
    return out


@torch.no_grad()
def _hand_table(model, pairs):
    """(n, 2) float64: each side's sum of log p(token | everything before it) over its reply tokens."""
    m = copy.deepcopy(model).double().eval()
    rows = []
    for p in pairs:
        row = []
        for s in (p.chosen, p.rejected):
            ids = torch.from_numpy(s.ids)
            lp = torch.log_softmax(m(ids[None, :-1])[0][0].double(), -1)
            row.append(sum(lp[t - 1, ids[t]].item() for t in range(1, len(ids)) if s.mask[t]))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


class _Run:
    """What DPO._cached_tables reads of the run: its output folder, loader, model and rank."""

    def __init__(self, out, model, train, main=True):
        from gptforge.data.preference import PairLoader

        ref = out / "reference.gguf"  # the reference model's file: its bytes are part of the cache's key
        if not ref.exists():
            ref.write_bytes(b"GGUF reference")
        self.cfg = SimpleNamespace(train=SimpleNamespace(out_dir=str(out), micro_batch=2, dtype="float32"),
                                   dpo=SimpleNamespace(init_from=str(ref)))
        self.state = SimpleNamespace(loader=PairLoader(train, B=2, shuffle=False, pad=0), step=0)
        self.model, self.device, self.logs = model, "cpu", []
        self.info = SimpleNamespace(is_main=main, enabled=False)

    def log(self, msg):
        self.logs.append(msg)

    def autocast(self):
        import contextlib

        return contextlib.nullcontext()


def test_dpo_reference_table_is_cached_by_the_pairs_fingerprints_and_recomputed_otherwise(tmp_path, monkeypatch):
    from gptforge.data.preference import fingerprint

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    train, val, other = _pairs(1, 3), _pairs(2, 2), _pairs(3, 2)
    want = {"train": _hand_table(model, train), "val": _hand_table(model, val)}
    dpo = object.__new__(dpo_mod.DPO)
    dpo.template, dpo.val = SimpleNamespace(bos=0), val
    path = tmp_path / "ref_logps.pt"

    def tables(main=True, pairs=train):
        run = _Run(tmp_path, model, pairs, main)
        got = dpo._cached_tables(run)
        assert set(got) == {"train", "val"} and got["train"].shape == (len(pairs), 2) and got["val"].shape == (2, 2)
        return got, run.logs

    got, logs = tables()  # nothing cached: computed and written
    for k in ("train", "val"):
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-5, atol=1e-5)
    assert logs == [f"reference log-probs of 3 + 2 pairs -> {path}"]
    saved = torch.load(path, weights_only=True)
    ref = dpo_mod.reference_identity(_Run(tmp_path, model, train).cfg)
    assert saved["fingerprints"] == {"train": fingerprint(train), "val": fingerprint(val), **ref}
    assert torch.equal(saved["train"], got["train"]) and torch.equal(saved["val"], got["val"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref_logps.pt", "reference.gguf"]  # whole, no temporary left

    marked = {**saved, "train": saved["train"] - 1.0, "val": saved["val"] - 2.0}  # still fits: read, not recomputed
    torch.save(marked, path)
    got, logs = tables()
    assert torch.equal(got["train"], marked["train"]) and torch.equal(got["val"], marked["val"])
    assert logs == [f"reference log-probs from {path}"]

    seen = "other pairs, another reference model or dtype"
    for changed in (("val", fingerprint(other)), ("train", "0" * 16), ("reference", ref["reference"] + "x"),
                    ("dtype", "bfloat16")):
        torch.save({**marked, "fingerprints": {**marked["fingerprints"], changed[0]: changed[1]}}, path)
        got, logs = tables()
        torch.testing.assert_close(got["train"].double(), want["train"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["val"].double(), want["val"], rtol=1e-5, atol=1e-5)
        assert logs == [f"{path} was computed for {seen}; recomputing", f"reference log-probs of 3 + 2 pairs -> {path}"]
    for bad in ({**marked, "train": marked["train"][:2]}, {**marked, "val": marked["val"].abs()}):
        torch.save(bad, path)
        got, logs = tables()
        torch.testing.assert_close(got["val"].double(), want["val"], rtol=1e-5, atol=1e-5)
        assert logs[0] == f"{path} holds tables of the wrong shape, type or non-finite values; recomputing"
    torch.save({**marked, "note": SimpleNamespace(a=1)}, path)  # a pickled object: read with weights_only, so refused
    got, logs = tables()
    torch.testing.assert_close(got["train"].double(), want["train"], rtol=1e-5, atol=1e-5)
    assert logs[0].startswith(f"{path} is unreadable (") and "weights_only" in logs[0], logs[0]
    path.write_bytes(b"not a torch file")
    got, logs = tables()
    torch.testing.assert_close(got["train"].double(), want["train"], rtol=1e-5, atol=1e-5)
    assert logs[0].startswith(f"{path} is unreadable (") and logs[0].endswith("); recomputing") and len(logs) == 2
    path.unlink()
    # another rank is sent rank 0's reference identity (a broadcast: here rank 0's value handed over, never read
    # from the file on this rank), computes its own tables and writes nothing
    from gptforge.parallel import distributed

    monkeypatch.setattr(distributed, "from_main", lambda obj, info: obj if info.is_main else ref)
    got, logs = tables(main=False)
    torch.testing.assert_close(got["val"].double(), want["val"], rtol=1e-5, atol=1e-5)
    assert not path.exists()
    got, logs = tables(pairs=_pairs(4, 5))  # a different training set: its own table
    torch.testing.assert_close(got["train"].double(), _hand_table(model, _pairs(4, 5)), rtol=1e-5, atol=1e-5)
    assert logs == [f"reference log-probs of 5 + 2 pairs -> {path}"]


def test_dpo_reference_is_the_starting_model_also_after_a_resume(tmp_path):
    mcfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)  # _save's config
    torch.manual_seed(0)
    start = GPT(mcfg)
    _save(tmp_path, "sft", start)
    torch.manual_seed(1)
    trained = GPT(mcfg).train()  # the run's weights (at step 0 the start; later, moved)
    dpo = object.__new__(dpo_mod.DPO)
    dpo.ref = None
    run = SimpleNamespace(state=SimpleNamespace(step=0), model=trained, device="cpu",
                          cfg=SimpleNamespace(dpo=SimpleNamespace(init_from=str(tmp_path / "sft"), precompute_ref=False)))

    def same(a, b):
        return a.state_dict().keys() == b.state_dict().keys() and all(
            torch.equal(x, b.state_dict()[k]) for k, x in a.state_dict().items())

    ref = dpo._reference(run)  # a fresh run: a frozen copy of its own starting weights
    assert ref is not trained and same(ref, trained) and not same(ref, start)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert trained.training and all(p.requires_grad for p in trained.parameters())  # the policy still trains
    run.state.step = 3
    ref = dpo._reference(run)  # resumed: the starting model again (dpo.init_from), not the run's weights
    assert same(ref, start) and not ref.training and not any(p.requires_grad for p in ref.parameters())
    dpo.prepare_model(run)  # dpo.precompute_ref false: the live reference is kept beside the policy
    assert same(dpo.ref, start)
    dpo.ref = None
    run.cfg.dpo.precompute_ref = True
    dpo.prepare_model(run)  # the cached table instead: no model kept
    assert dpo.ref is None


def test_dpo_max_new_tokens_caps_the_task_evals_replies(tmp_path, monkeypatch):
    """dpo.max_new_tokens 3: the held-out task eval of a DPO run (``--dpo.task``) asks for replies of at most 3
    tokens, at the start and at the end, for the eval_n problems given."""
    import gptforge.training.rollouts as rollouts
    from gptforge.cli import main
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from tests.conftest import tiny_chat_checkpoint

    asked = []
    real = rollouts.held_out_correct

    def spy(model, enc, template, problems, max_new, desc=None):
        asked.append((len(problems), max_new))
        return real(model, enc, template, problems, max_new, desc=desc)

    monkeypatch.setattr(rollouts, "held_out_correct", spy)
    chat = tiny_chat_checkpoint(tmp_path / "chat")
    prefs = write_preferences(preference_set("compare", 16, seed=1), tmp_path / "p.jsonl")
    assert main(["dpo", "--init-from", str(chat), "--data", str(prefs), "--out", str(tmp_path / "d"), "--steps", "1",
                 "--micro-batch", "2", "--val-count", "4", "--device", "cpu", "--task", "compare", "--eval-n", "5",
                 "--dpo.max_new_tokens", "3"]) == 0
    assert asked == [(5, 3), (5, 3)]


def test_dpo_task_eval_problems_and_the_unknown_task_refusal(tmp_path):
    from gptforge.config import ConfigError
    from gptforge.data.chat import ChatTemplate
    from gptforge.eval.generative import GENERATED
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from gptforge.eval.tasks.verifiable import compare_problems
    from gptforge.training.pairs import pair_config

    t = ChatTemplate.gpt2()
    cfg = pair_config(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, vocab_size=t.vocab_size), str(tmp_path))
    cfg.dpo.data = str(write_preferences(preference_set("compare", 8, seed=1), tmp_path / "p.jsonl"))
    cfg.dpo.val_count, cfg.train.micro_batch = 2, 2
    assert dpo_mod.DPO(cfg, t).problems == []  # no task: no task eval
    cfg.dpo.task, cfg.dpo.eval_n = "compare", 5
    d = dpo_mod.DPO(cfg, t)
    # the compare eval set: the first distinct problems of seed 2024 (generative.ARITHMETIC_EVAL_SEED)
    first = []
    for p in compare_problems(110, seed=2024):
        if p.question not in [q.question for q in first]:
            first.append(p)
    assert [p.question for p in d.problems] == [p.question for p in first[:5]]
    assert d.ref is None and d.tables is None
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models

    from gptforge.data.tokenizer import HFTokenizer

    hf = HFTok(models.WordLevel({"a": 0, "b": 1, "<|endoftext|>": 2}, unk_token="<|endoftext|>"))
    hf.add_special_tokens(["<|endoftext|>"])
    own = HFTokenizer(hf.to_str(), name="tiny", where="test", eos="<|endoftext|>")
    d = dpo_mod.DPO(cfg, t, enc=own)  # the starting model's own tokenizer: the one its task eval decodes with
    assert d.tokenizer is own and d.enc.enc is own and d.enc.template is t
    cfg.dpo.eval_n = 0
    assert dpo_mod.DPO(cfg, t).problems == []  # eval_n 0: none (not the set's default 500)
    cfg.dpo.task = "gsm8k"
    with pytest.raises(ConfigError) as e:
        dpo_mod.DPO(cfg, t)
    assert str(e.value) == f"dpo.task 'gsm8k': generated tasks are {', '.join(GENERATED)}"


def test_dpo_task_accuracy_is_this_ranks_share_summed_over_ranks(monkeypatch):
    """score_held_out's task part on rank 1 of 2: it scores problems 1, 3, 5 (of 7) and adds the other
    rank's counts (a stand-in all-reduce: 1 right of 4); the model's answers are a stand-in too."""
    from gptforge.eval.generative import GENERATED
    from gptforge.parallel import distributed
    from gptforge.training import rollouts

    dpo = object.__new__(dpo_mod.DPO)
    dpo.val, dpo.template, dpo.enc, dpo.ref, dpo.tables = [], SimpleNamespace(bos=0), "the chat tokenizer", None, None
    dpo.problems = GENERATED["compare"][1](7)
    seen = []

    def held_out_correct(model, enc, template, problems, max_new, desc=None):
        seen.append((model, enc, template, [p.question for p in problems], max_new, desc))
        return 2

    monkeypatch.setattr(rollouts, "held_out_correct", held_out_correct)
    info = SimpleNamespace(rank=1, world=2, is_main=False)

    def all_reduce_sum(t, over):
        assert over is info
        return t + torch.tensor([1.0, 4.0], dtype=t.dtype) if t.numel() == 2 else t

    monkeypatch.setattr(distributed, "all_reduce_sum", all_reduce_sum)
    run = SimpleNamespace(info=info, device="cpu", model="the model",
                          cfg=SimpleNamespace(dpo=SimpleNamespace(beta=0.1, loss_type="sigmoid", sft_coef=0.0,
                                                                  task="compare", max_new_tokens=9),
                                              train=SimpleNamespace(micro_batch=2)))
    out = dpo.score_held_out(run)
    qs = [dpo.problems[i].question for i in (1, 3, 5)]
    assert seen == [("the model", "the chat tokenizer", dpo.template, qs, 9, None)]  # rank 1: no progress bar
    assert out == {"compare_acc": 3 / 7, "task_n": 7} and isinstance(out["task_n"], int)


def test_dpo_loss_refusals_word_for_word():
    c, r = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -4.0])
    with pytest.raises(ValueError) as e:
        dpo_mod.dpo_loss(c, r, c, r, 0.1, "hinge")
    assert str(e.value) == "dpo loss_type 'hinge': expected one of sigmoid, ipo"
    for lens in ({"chosen_len": torch.tensor([2.0, 1.0])}, {"rejected_len": torch.tensor([2.0, 1.0])}, {}):
        with pytest.raises(ValueError) as e:  # either length missing: refused, not a crash on None
            dpo_mod.dpo_loss(c, r, c, r, 0.1, "ipo", **lens)
        assert str(e.value) == "the ipo loss is length-normalised: pass chosen_len and rejected_len"


def test_ipo_divides_by_the_reply_length_one_token_replies_and_empty_ones_included():
    # TRL's IPO: (h_c / n_c - h_r / n_r - 1 / (2 beta))^2; a one-token reply is divided by 1, an empty one
    # (h = 0) is 0, not 0 / 0
    c, r = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-4.0, -5.0, -6.0])
    rc, rr = torch.tensor([-1.5, -2.0, -3.25]), torch.tensor([-3.75, -5.0, -6.5])  # h_c, h_r = (.5, 0, .25), (-.25, 0, .5)
    loss, _ = dpo_mod.dpo_loss(c, r, rc, rr, 0.5, "ipo", chosen_len=torch.tensor([1.0, 0.0, 1.0]),
                               rejected_len=torch.tensor([1.0, 0.0, 2.0]))
    want = ((0.5 + 0.25 - 1.0) ** 2 + (0.0 - 0.0 - 1.0) ** 2 + (0.25 - 0.25 - 1.0) ** 2) / 3
    assert loss.item() == pytest.approx(want, abs=1e-7)


def test_sequence_logps_with_leading_rows_without_replies_and_a_temperature():
    """Rows 0-2 have no reply token (they sum to 0 over 0 tokens) and row 3's reply starts at position 1:
    the output head must start at the batch's first reply position, not at the first row that has one;
    ``temperature`` divides the logits (float64 full-vocabulary recomputation)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)).eval()
    ids = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[3, 2:] = True  # targets 2..5 (predicted from positions 1..4)
    with torch.no_grad():
        logits = model(ids[:, :-1])[0].double()
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            got, n = dpo_mod.sequence_logps(model, ids, mask, temperature=temperature)
        lp = torch.log_softmax(logits / temperature, -1)
        want = sum(lp[3, t - 1, ids[3, t]].item() for t in range(2, 6))
        assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, want], abs=1e-5) and n.tolist() == [0, 0, 0, 4]


def test_dpo_batch_loss_refuses_both_or_neither_reference_word_for_word():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    batch = PairBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), torch.tensor([0]), None)
    for kw in ({}, {"ref": model, "ref_table": torch.zeros(1, 2)}):
        with pytest.raises(ValueError) as e:
            dpo_mod.dpo_batch_loss(model, batch, 0.1, **kw)
        assert str(e.value) == "give the reference as a model (ref) or as precomputed log-probs (ref_table), not both"


@pytest.mark.parametrize("cmd", ["rm", "dpo"])
def test_pair_recipes_refuse_tensor_and_pipeline_parallel_ranks(cmd, tmp_path, monkeypatch, capsys):
    """rm and dpo split their pair batches and held-out scores by rank; under dist.tp 2 at world 2 the two
    tensor-parallel ranks scored different pairs and one aborted (seen: SIGABRT in begin). Refused before
    any process group, naming the keys; on one process the keys only say they do nothing."""
    from gptforge.cli import main
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from tests.conftest import tiny_chat_checkpoint

    src = tiny_chat_checkpoint(tmp_path / "sft")
    prefs = write_preferences(preference_set("compare", 16, seed=1), tmp_path / "prefs.jsonl")
    argv = [cmd, "--init-from", str(src), "--out", str(tmp_path / cmd), "--data", str(prefs), "--val-count", "4",
            "--device", "cpu", "--steps", "1"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    for flags in (["--dist.tp", "2"], ["--dist.pp", "2"]):
        assert main([*argv, *flags]) == 2
        assert f"{cmd} runs data-parallel only" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([*argv, "--dist.tp", "2"]) == 0
