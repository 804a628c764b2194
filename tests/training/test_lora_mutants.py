"""LoRA's run-stack attach and its refusals, called directly (issue 36: the lora lane's survivors, each checked
by planting it): what trains after :func:`attach_lora` for sft, rm and PPO against hand counts, the log line
and meta.json's ``lora`` record word for word, each refusal's exact one line, the base fingerprint against a
hand sha256 (adapter keys left out, bare or nested), and ``adapter_params`` against a hand count."""

from __future__ import annotations

import copy
import hashlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from gptforge.config import Config, ConfigError
from gptforge.config_recipes import LoRAConfig
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.lora import (
    LoRAError,
    adapter_params,
    add_lora,
    is_adapter_key,
    resolve_targets,
    target_modules,
    weights_fingerprint,
)
from gptforge.parallel.distributed import DistInfo
from gptforge.run import checkpoint as ckpt
from gptforge.training.lora import _m, _under, attach_lora, check_lora_run, family_models, load_base
from gptforge.training.ppo import PolicyValue, ValueModel
from gptforge.training.rm import RewardModel

MCFG = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, pad_vocab=False)
# the tiny GPT's parameters by hand: wte 64*32, wpe 16*32, ln_1/ln_2/ln_f 3*64, c_attn 32*96+96, attn c_proj
# 32*32+32, c_fc 32*128+128, mlp c_proj 128*32+32
GPT_PARAMS = 64 * 32 + 16 * 32 + 3 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)
ADAPT_ATTN_FC = 4 * (32 + 96) + 4 * (32 + 128)  # rank 4 on c_attn (32 -> 96) and c_fc (32 -> 128)


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**MCFG))


def _cfg(**lora) -> Config:
    cfg = Config(model=GPTConfig(**MCFG))
    cfg.lora = LoRAConfig(**{"rank": 4, "alpha": 8.0, "targets": "c_attn,c_fc", **lora})
    return cfg


def hand_fingerprint(model: nn.Module) -> str:
    """sha256 over the base's parameters by name: 'name|dtype|shape|' then the raw bytes, adapters left out."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if "lora_A" in name.split(".") or "lora_B" in name.split("."):
            continue
        h.update(f"{name}|{p.dtype}|{tuple(p.shape)}|".encode())
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _attach(model, cfg, recipe="sft", resume_meta=None, source="/runs/base", info=None):
    said: list[str] = []
    rec = attach_lora(model, cfg, info or DistInfo(), recipe, resume_meta, SimpleNamespace(source=source), said.append)
    return rec, said


def _trainable(model) -> list[str]:
    return sorted(n for n, p in model.named_parameters() if p.requires_grad)


# ------------------------------------------------------------------ what trains, what is said and recorded
def test_sft_trains_the_adapters_only_and_says_so():
    model = _gpt()
    base_sha = hand_fingerprint(model)
    rec, said = _attach(model, _cfg())
    adapters = sorted(f"transformer.h.0.{layer}.lora_{ab}.weight" for layer in ("attn.c_attn", "mlp.c_fc")
                      for ab in "AB")
    assert _trainable(model) == adapters and model.lora_state_keys == adapters
    total = GPT_PARAMS + ADAPT_ATTN_FC
    assert rec == {"base": "/runs/base", "base_sha256": base_sha, "layers": 2, "trainable": ADAPT_ATTN_FC,
                   "total": total}
    assert said == [f"LoRA rank 4 (alpha 8) on c_attn,c_fc (2 layers): 1,152 of 16,480 parameters train (6.99%); "
                    f"base /runs/base sha256 {base_sha[:12]}"]
    assert 100 * 1152 / total == pytest.approx(6.9903, abs=1e-4)


def test_a_given_base_equal_to_the_start_is_kept_and_the_default_targets_are_said(tmp_path):
    model = _gpt()
    cfg = _cfg(targets="", alpha=16.0, rank=2, base=str(tmp_path / "b"))
    rec, said = _attach(model, cfg, source=str(tmp_path / "b"))
    assert rec["base"] == str(tmp_path / "b") and rec["layers"] == 1 and rec["trainable"] == 2 * (32 + 96)
    assert said[0].startswith("LoRA rank 2 (alpha 16) on c_attn (1 layer): 256 of 15,584 parameters train (1.64%); "
                              f"base {tmp_path / 'b'} sha256 ")


def test_a_relative_base_naming_the_start_is_the_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec, _ = _attach(_gpt(), _cfg(base="b"), source=str(tmp_path / "b"))
    assert rec["base"] == "b"


def test_a_fresh_run_without_weights_or_base_is_refused():
    with pytest.raises(ConfigError, match=r"^lora.base is empty: a LoRA run needs its base model"):
        attach_lora(_gpt(), _cfg(), DistInfo(), "sft", None, None, print)


def test_no_source_and_no_base_is_said_as_given_weights():
    model = _gpt()
    said: list[str] = []
    rec = attach_lora(model, _cfg(), DistInfo(), "sft", None, SimpleNamespace(source=None), said.append)
    assert rec["base"] == "" and said[0].endswith(f"; base (given weights) sha256 {hand_fingerprint(_gpt())[:12]}")


def test_rm_trains_its_score_head_beside_the_adapters_and_keeps_an_unused_head_frozen():
    rm = RewardModel(_gpt())
    rec, said = _attach(rm, _cfg(targets="c_attn"), recipe="rm")
    want = ["body.transformer.h.0.attn.c_attn.lora_A.weight", "body.transformer.h.0.attn.c_attn.lora_B.weight",
            "score.weight"]
    assert _trainable(rm) == rm.lora_state_keys == want
    assert rec["trainable"] == 4 * (32 + 96) + 32 and rec["total"] == GPT_PARAMS + 4 * (32 + 96) + 32
    assert "544 of 15,872 parameters train (3.43%)" in said[0]
    frozen_head = RewardModel(_gpt())
    frozen_head.score.weight.requires_grad_(False)  # a head the recipe does not train stays frozen
    _attach(frozen_head, _cfg(targets="c_attn"), recipe="rm")
    assert _trainable(frozen_head) == want[:2]


def test_ppo_adapts_the_policy_and_trains_the_value_model_in_full():
    pv = PolicyValue(_gpt(), ValueModel(_gpt(1)))
    rec, said = _attach(pv, _cfg(targets="c_attn"), recipe="ppo")
    n_value = GPT_PARAMS + 32
    adapters = ["policy.transformer.h.0.attn.c_attn.lora_A.weight", "policy.transformer.h.0.attn.c_attn.lora_B.weight"]
    assert _trainable(pv) == sorted(adapters + [n for n, _ in pv.value.named_parameters(prefix="value")])
    assert rec["trainable"] == 512 + n_value and rec["total"] == GPT_PARAMS + 512 + n_value
    fam = GPT_PARAMS + 512
    assert said[0].startswith(
        f"LoRA rank 4 (alpha 8) on c_attn (1 layer): 512 of the {fam:,} policy parameters train "
        f"({100 * 512 / fam:.2f}%), and the value model trains in full ({n_value:,}, as TRL's PPO with peft): "
        f"{512 + n_value:,} of {GPT_PARAMS + 512 + n_value:,} in all; base /runs/base sha256 ")
    assert f"({100 * 512 / fam:.2f}%)" == "(3.23%)"


class _Two(nn.Module):
    """A run module with two family models that take adapters and two parts that train in full."""

    trains_whole = ("v", "w")

    def __init__(self):
        super().__init__()
        self.a, self.b, self.v, self.w = _gpt(), _gpt(), _gpt(1), _gpt(2)


def test_several_family_models_and_whole_parts_are_named_in_the_log():
    two = _Two()
    rec, said = _attach(two, _cfg(targets="c_attn"))
    assert rec["layers"] == 2 and rec["trainable"] == 2 * 512 + 2 * GPT_PARAMS
    assert [n for n, _ in family_models(two)] == ["a", "b"]
    fam = 2 * (GPT_PARAMS + 512)
    assert said[0].startswith(f"LoRA rank 4 (alpha 8) on c_attn (2 layers): 1,024 of the {fam:,} a and b parameters "
                              f"train ({100 * 1024 / fam:.2f}%), and the v and w model trains in full "
                              f"({2 * GPT_PARAMS:,}, as TRL's PPO with peft): ")


def test_family_models_and_under():
    gpt = _gpt()
    assert family_models(gpt) == [("", gpt)]
    rm = RewardModel(gpt)
    assert family_models(rm) == [("body", gpt)]
    pv = PolicyValue(gpt, ValueModel(_gpt(1)))
    assert family_models(pv) == [("policy", gpt)]
    assert _under("value", ["value"]) and _under("value.score.weight", ("value",))
    assert not _under("values.score", ("value",)) and not _under("policy.value", ("value",))


@pytest.mark.parametrize("n, words", [(0, "0"), (99_999, "99,999"), (100_000, "0.10M"), (123_456_789, "123.46M"),
                                      (999_999_999, "1000.00M"), (1_000_000_000, "1.00B"), (7_241_732_096, "7.24B"),
                                      (999_995_500, "1000.00M"), (1_005_000_001, "1.01B")])  # 1e6, 1e9 exactly
def test_parameter_counts_in_words(n, words):
    assert _m(n) == words


# ------------------------------------------------------------------ refusals, word for word
@pytest.mark.parametrize("world, fsdp, tp, pp", [(2, True, 1, 1), (2, False, 2, 1), (2, False, 1, 2)])
def test_sharded_layouts_are_refused(world, fsdp, tp, pp):
    cfg = _cfg()
    cfg.dist.tp, cfg.dist.pp = tp, pp
    with pytest.raises(ConfigError) as e:
        check_lora_run(cfg, DistInfo(world=world, fsdp=fsdp), "sft")
    assert str(e.value) == ("lora.rank=4 runs on one process or under DDP (dist.shard none, dist.tp 1, dist.pp 1); "
                            "FSDP, tensor and pipeline parallelism do not take adapters yet")


def test_attach_refuses_a_sharded_layout_before_anything():
    model = _gpt()
    with pytest.raises(ConfigError, match=r"^lora.rank=4 runs on one process or under DDP"):
        _attach(model, _cfg(), info=DistInfo(world=2, fsdp=True))
    assert all(p.requires_grad for p in model.parameters()) and not hasattr(model, "lora_state_keys")


@pytest.mark.parametrize("world, fsdp, tp, pp", [(1, True, 2, 2), (2, False, 1, 1)])
def test_one_process_or_ddp_is_allowed(world, fsdp, tp, pp):
    cfg = _cfg()
    cfg.dist.tp, cfg.dist.pp = tp, pp
    check_lora_run(cfg, DistInfo(world=world, fsdp=fsdp), "sft")


def test_a_base_that_is_not_the_start_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        _attach(_gpt(), _cfg(base="/runs/other"), source="/runs/base")
    assert str(e.value) == ("lora.base '/runs/other' and --init-from '/runs/base' name different models: the "
                            "adapters' base is the starting model (leave lora.base out)")


def test_a_model_without_a_family_model_is_refused():
    with pytest.raises(ConfigError) as e:
        _attach(nn.Sequential(nn.Linear(4, 4)), _cfg(), recipe="dpo")
    assert str(e.value) == "lora.rank=4: the dpo model holds no family model to adapt"


def test_a_lora_error_becomes_a_config_error_and_changes_nothing():
    model = _gpt()
    with pytest.raises(ConfigError) as e:
        _attach(model, _cfg(rank=33))
    assert str(e.value) == ("lora.rank=33 is larger than layer transformer.h.0.attn.c_attn (32 in, 96 out) allows: "
                            "at most 32")


@pytest.fixture()
def base_dir(tmp_path):
    return ckpt.save_checkpoint(tmp_path / "base", 0, _gpt(), None, {"config": Config(model=GPTConfig(**MCFG)).to_dict()})


def _resume_meta(base_dir, **old):
    return {"config": {"lora": {"rank": 4, "alpha": 8.0, "targets": "c_attn,c_fc", **old}},
            "lora": {"base": str(base_dir), "base_sha256": hand_fingerprint(_gpt())}}


def test_a_resume_loads_the_base_into_a_fresh_model(base_dir):
    model = _gpt(5)  # the resumed run builds a fresh model: its weights come from the base
    rec = attach_lora(model, _cfg(base=str(base_dir)), DistInfo(), "sft", _resume_meta(base_dir), None, print)
    assert rec["base_sha256"] == hand_fingerprint(_gpt())
    assert torch.equal(model.transformer.wte.weight, _gpt().transformer.wte.weight)


@pytest.mark.parametrize("key, old, new", [("rank", 2, "4"), ("alpha", 4.0, "8.0"), ("targets", "c_attn", "'c_attn,c_fc'")])
def test_a_resume_cannot_change_rank_alpha_or_targets(base_dir, key, old, new):
    with pytest.raises(ConfigError) as e:
        attach_lora(_gpt(), _cfg(base=str(base_dir)), DistInfo(), "sft", _resume_meta(base_dir, **{key: old}), None,
                    print)
    assert str(e.value) == (f"--lora.{key} {new}: this run was trained with {old!r}, and a resume cannot change it "
                            "(start a new run with --out elsewhere)")


def test_a_resume_whose_meta_has_no_lora_config_is_not_compared(base_dir):
    meta = _resume_meta(base_dir)
    for config in ({}, {"lora": None}, None):
        meta["config"] = config
        assert attach_lora(_gpt(), _cfg(base=str(base_dir)), DistInfo(), "sft", meta, None, print)["layers"] == 2
    meta["config"] = {"lora": {"rank": 4}}  # alpha and targets not recorded: only the rank is compared
    assert attach_lora(_gpt(), _cfg(base=str(base_dir), alpha=2.0), DistInfo(), "sft", meta, None, print)["layers"] == 2


def test_a_resume_on_another_base_is_refused(base_dir):
    meta = _resume_meta(base_dir)
    meta["lora"] = {"base": "/runs/first", "base_sha256": "ab" * 32}
    with pytest.raises(ConfigError) as e:
        attach_lora(_gpt(), _cfg(base=str(base_dir)), DistInfo(), "sft", meta, None, print)
    assert str(e.value) == (f"lora.base: this run was trained on '/runs/first' (weights sha256 abababababab), but "
                            f"{str(base_dir)!r} has weights sha256 {hand_fingerprint(_gpt())[:12]}: resume on the same "
                            "base model (--lora.base PATH), or start a new run")
    meta["lora"] = {}  # no record at all: refused too
    with pytest.raises(ConfigError, match=r"trained on None \(weights sha256 None\)"):
        attach_lora(_gpt(), _cfg(base=str(base_dir)), DistInfo(), "sft", meta, None, print)


def test_load_base_refusals(tmp_path, base_dir):
    fams = family_models(_gpt())
    with pytest.raises(ConfigError) as e:
        load_base(fams, "")
    assert str(e.value) == ("lora.base is empty: a LoRA run needs its base model (start it with --init-from, or give "
                            "--lora.base CKPT_OR_HF_DIR_OR_GGUF)")
    (tmp_path / "junk.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ConfigError) as e:
        load_base(fams, str(tmp_path / "junk.bin"))
    assert str(e.value).startswith(f"lora.base {str(tmp_path / 'junk.bin')!r} cannot be read: ")
    assert str(e.value).endswith("junk.bin: 8 bytes is shorter than the 1024-byte llm.c header")  # the file's reason
    wider = GPT(GPTConfig(**{**MCFG, "n_embd": 64}))
    longer = GPT(GPTConfig(**{**MCFG, "block_size": 32}))  # one tensor differs (wpe): a two-line torch error
    for fam, where in ((family_models(wider), ""), (family_models(RewardModel(wider)), " body"),
                       (family_models(longer), "")):
        with pytest.raises(ConfigError) as e:
            load_base(fam, str(base_dir))
        msg = str(e.value)
        assert msg.startswith(f"lora.base {str(base_dir)!r} does not fit this run's model{where}: size mismatch for ")
        assert "\n" not in msg and "copying a param" in msg


# ------------------------------------------------------------------ targets, keys, fingerprint, counts
def test_target_refusals_word_for_word():
    with pytest.raises(LoRAError) as e:
        resolve_targets("mamba", [])
    assert str(e.value) == "lora: model.arch='mamba' has no LoRA targets; LoRA supports gpt2, llama"
    with pytest.raises(LoRAError) as e:
        resolve_targets("llama", ["q_proj", "c_attn", "wq"])
    assert str(e.value) == ("lora.targets='q_proj,c_attn,wq': c_attn, wq is not a layer of a llama model; valid targets: "
                            "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj")
    assert resolve_targets("gpt2", []) == ("c_attn",) and resolve_targets("llama", ["v_proj"]) == ("v_proj",)
    holder = nn.Module()
    holder.o_proj = nn.Linear(4, 4)
    with pytest.raises(LoRAError) as e:
        add_lora(holder, "llama", 2, 4.0, 0.0, [])
    assert str(e.value) == "lora.targets='q_proj,v_proj': the model has no such layer"
    assert target_modules(holder, ("o_proj",)) == [("o_proj", holder.o_proj)]


@pytest.mark.parametrize("name, want", [
    ("lora_A.weight", True), ("lora_B.weight", True), ("q_proj.lora_A.weight", True),
    ("body.h.0.attn.c_attn.lora_B.weight", True), ("lora_Ax.weight", False), ("q_proj.weight", False),
    ("my_lora_A.weight", False), ("x.lora_A", False), ("lora_B", False), ("h.lora_C.weight", False),
])
def test_adapter_keys(name, want):
    assert is_adapter_key(name) is want


def test_the_fingerprint_is_the_base_s_with_adapter_keys_left_out():
    model = _gpt()
    want = hand_fingerprint(model)
    assert weights_fingerprint(model) == want
    add_lora(model, "gpt2", 4, 8.0, 0.0, ["c_attn", "c_fc"])
    torch.nn.init.normal_(model.transformer.h[0].attn.c_attn.lora_B.weight)
    assert weights_fingerprint(model) == want  # nested adapter keys left out
    layer = model.transformer.h[0].mlp.c_fc  # a LoRALinear on its own: bare lora_A.weight / lora_B.weight keys
    plain = nn.Linear(32, 128)
    plain.load_state_dict({"weight": layer.weight, "bias": layer.bias})
    assert weights_fingerprint(layer) == weights_fingerprint(plain) == hand_fingerprint(plain)
    other = copy.deepcopy(plain)
    with torch.no_grad():
        other.bias[0] = torch.nextafter(other.bias[0], torch.tensor(1.0))  # one bit of one base weight
    assert weights_fingerprint(other) != weights_fingerprint(plain)


def test_adapter_params_by_hand():
    cfg = GPTConfig(**{**MCFG, "n_layer": 3})
    assert adapter_params(cfg, 4, ["c_attn", "c_fc"]) == 3 * ADAPT_ATTN_FC
    assert adapter_params(cfg, 2, []) == 3 * 2 * (32 + 96)  # the default: c_attn
    assert adapter_params(cfg, 8, ["c_proj"]) == 3 * 8 * ((32 + 32) + (128 + 32))  # attn.c_proj and mlp.c_proj


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_lora_dropout_reaches_the_adapters_of_a_run(p):
    """``lora.dropout`` through ``attach_lora`` (the run path): in training mode each adapted layer is
    W x + b + (alpha / rank) B A dropout_p(x), written out here with the same random draw; dropout 0 leaves
    the input whole (the layer equals it with the mask of ones)."""
    import torch.nn.functional as F

    model = _gpt()
    _attach(model, _cfg(dropout=p))
    model.train()
    layer = model.transformer.h[0].attn.c_attn
    torch.manual_seed(3)
    with torch.no_grad():
        layer.lora_B.weight.normal_()
    x = torch.randn(2, 5, 32)
    torch.manual_seed(11)
    got = layer(x)
    torch.manual_seed(11)
    kept = F.dropout(x, p, training=True)
    want = F.linear(x, layer.weight, layer.bias) + kept @ layer.lora_A.weight.T @ layer.lora_B.weight.T * (8.0 / 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (kept == 0).any() == (p > 0)
