"""Qwen3, Mistral, Phi-3, Gemma 2 and Gemma 3 as gptforge's one Llama with fields set, against
transformers (independent: its own modeling files) in float32.

Tiny random models are built from transformers' config classes with a fixed seed, their weights
(norms included) perturbed so nothing is the identity, and saved with ``save_pretrained``; gptforge
loads the directory through ``load_hf_llama`` (the path every command uses). Sequences are 40 tokens
over a sliding window of 8, so the window, per-layer kinds and local rope bases decide the logits.
Then: each feature switched off moves the logits (the feature is what makes them agree), a
left-padded batch equals transformers' with its attention mask, greedy generation with the KV cache
equals transformers' ``generate`` (its sliding-window cache included), and ``export hf`` reloads in
transformers as the same class with the same logits.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.generation import SamplingParams, _left_pad, _positions_and_mask, stream_tokens  # noqa: E402
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, load_hf_llama  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
from tests.models.hf_reference import assert_close, logits, random_hf_model, saved_and_loaded  # noqa: E402

VOCAB = 268
T = 40  # five windows of 8
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
KINDS = ["sliding_attention", "full_attention", "sliding_attention"]
FAMILIES = {  # name -> (transformers class prefix, config extras, the gptforge fields it must become)
    "qwen3": ("Qwen3", dict(head_dim=24, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
              dict(qk_norm=True, head_size=24, sliding_window=WINDOW, layer_types="fss", family="qwen3")),
    "mistral": ("Mistral", dict(sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
                dict(sliding_window=WINDOW, layer_types="", family="mistral")),
    "phi3": ("Phi3", dict(sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
             dict(sliding_window=WINDOW, family="phi3")),
    "gemma2": ("Gemma2", dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=KINDS,
                              attn_logit_softcapping=0.5, final_logit_softcapping=1.0,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
               dict(head_size=32, query_pre_attn_scalar=24.0, attn_softcap=0.5, logit_softcap=1.0, mlp="geglu",
                    norm_plus_one=True, post_norms=True, embed_scale=8.0, layer_types="sfs", family="gemma2")),
    "gemma3": ("Gemma3Text", dict(head_dim=32, query_pre_attn_scalar=20, sliding_window=WINDOW, layer_types=KINDS,
                                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                                                   "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 500.0}}),
               dict(qk_norm=True, head_size=32, rope_local_theta=50.0, rope_theta=500.0, rope_type="linear",
                    post_norms=True, norm_plus_one=True, mlp="geglu", family="gemma3")),
    "granite": ("Granite", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.5,
                                logits_scaling=8.0, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
                dict(embed_scale=12.0, residual_scale=0.22, attn_scale=0.5, logits_scaling=8.0, family="granite")),
    "olmo2": ("Olmo2", dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
              dict(post_norms=True, pre_norms=False, qk_norm=True, qk_norm_full=True, family="olmo2")),
}
# the fields whose default, put back, must move the logits: each is part of why they agree
FEATURE_OFF = {
    "qwen3": dict(qk_norm=False, sliding_window=0, layer_types=""),
    "mistral": dict(sliding_window=0),
    "phi3": dict(sliding_window=0),
    "gemma2": dict(query_pre_attn_scalar=0.0, attn_softcap=0.0, logit_softcap=0.0, mlp="swiglu", post_norms=False,
                   embed_scale=1.0, layer_types="", sliding_window=0, norm_plus_one=False),
    "gemma3": dict(qk_norm=False, rope_local_theta=0.0, layer_types="", query_pre_attn_scalar=0.0),
    "granite": dict(embed_scale=1.0, residual_scale=1.0, attn_scale=0.0, logits_scaling=1.0),
    "olmo2": dict(pre_norms=True, qk_norm=False),  # qk_norm_full's per-head norm has other shapes: not loadable
}
NO_WINDOW = ("granite", "olmo2")  # transformers' models have none: their configs' windows are refused
IDX = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(7))
# Tolerance, derived: every logit is a chain of float32 dot products no longer than max(C, H, T) = 96
# terms, over 3 layers and the head; two implementations that order those sums differently differ by
# at most ~(terms x layers) x eps32 x the magnitudes involved (|logit| up to ~10 here). 96 * 4 * 1.2e-7
# * 10 ~ 4.6e-4 is the bound; the measured differences are ~1e-6 (printed with -s).
ATOL = 96 * 4 * 1.2e-7 * 10
MAX_DIFF: dict[str, float] = {}


def _hf_model(name: str):
    kind, extra, _ = FAMILIES[name]
    return random_hf_model(kind, **{**COMMON, **extra})


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model, its save_pretrained directory, gptforge's load of it, reference logits)."""
    return saved_and_loaded(request.param, _hf_model(request.param), tmp_path_factory, IDX)


def _logits(model: torch.nn.Module, idx: torch.Tensor = IDX) -> torch.Tensor:
    return logits(model, idx)


def _assert_close(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert_close(name, got, ref, ATOL, MAX_DIFF)


def test_hf_load_equals_transformers_longer_than_the_window(family):
    name, hf, d, model, ref = family
    for key, want in FAMILIES[name][2].items():
        assert getattr(model.config, key) == want, key
    assert model.num_parameters() == sum(p.numel() for p in hf.parameters()) + (
        model.config.padded_vocab_size - VOCAB) * 64 * (1 if model.config.tie_embeddings else 2)
    _assert_close(f"{name} hf load", _logits(model), ref)
    sd, c = model.state_dict(), model.config.to_dict()
    for key, off in FEATURE_OFF[name].items():  # each feature, put back to its default, moves the logits
        changed = {key: off, **({"layer_types": ""} if key == "sliding_window" else {}),
                   **({"qk_norm_full": False} if key == "qk_norm" else {})}
        plain = Llama(LlamaConfig(**{**c, **changed})).eval()
        plain.load_state_dict(sd, strict=False)  # without post_norms, two norms per layer fewer
        # measured before Granite's logits divisor (8 here), which shrinks every change with the logits
        assert (_logits(plain) - ref).abs().max() * model.config.logits_scaling > 1e-2, key


def test_left_padded_batch_equals_transformers(family):
    """Rows of 40 and 23 tokens, the short one left-padded: gptforge with per-row positions and the
    generation mask (pad keys hidden, the window over cache slots) against transformers with its
    attention mask; the real positions' logits agree."""
    name, hf, d, model, ref = family
    prompts = [IDX[0].tolist(), IDX[1, :23].tolist()]
    ids, pads = _left_pad(prompts, torch.device("cpu"))
    pos, mask = _positions_and_mask(pads, 0, ids.size(1))
    with torch.no_grad():
        got = model(ids, pos=pos, attn_mask=mask)[0]
        am = (torch.arange(ids.size(1))[None] >= pads[:, None]).long()
        want = hf(ids, attention_mask=am, position_ids=pos).logits
    real = am.bool()
    _assert_close(f"{name} padded", got[real], want[real])


def test_greedy_generation_with_cache_equals_transformers(family):
    name, hf, d, model, ref = family
    prompts = [IDX[0, :14].tolist(), IDX[1, :5].tolist()]  # 24 new tokens: past the window, rows padded
    p = SamplingParams(max_new_tokens=24, temperature=0.0)
    cached = torch.stack(list(stream_tokens(model, prompts, p, use_cache=True)), 1)
    full = torch.stack(list(stream_tokens(model, prompts, p, use_cache=False)), 1)
    assert torch.equal(cached, full)
    ids, pads = _left_pad(prompts, torch.device("cpu"))
    am = (torch.arange(ids.size(1))[None] >= pads[:, None]).long()
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=am, max_new_tokens=24, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
    assert torch.equal(cached, want[:, ids.size(1):])


def test_export_hf_reloads_in_transformers(family, tmp_path):
    name, hf, d, model, ref = family
    export_hf_llama(model, tmp_path / "out", tokenizer=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == hf.config.model_type
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == type(hf).__name__
    with torch.no_grad():
        _assert_close(f"{name} hf export", back(IDX).logits, ref)
    assert load_hf_llama(str(tmp_path / "out")).config == model.config  # and the config round-trips


# ----------------------------------------------------------------------------- refusals, by name


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("model_type, extra, key", [
    ("gemma2", dict(hidden_activation="gelu"), "hidden_activation"),  # exact GELU: not Gemma's tanh one
    ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("qwen3", dict(attention_bias=True), "attention_bias"),  # a bias on o_proj too
    ("mistral", dict(layer_types=["chunked_attention"] * 3, sliding_window=8), "layer_types"),
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                                   "long_factor": [1.0] * 8}), "rope_type"),
    ("phi3", dict(partial_rotary_factor=0.75), "partial_rotary_factor"),
])
def test_what_the_families_ask_beyond_the_fields_is_refused(tmp_path, model_type, extra, key):
    config = {**COMMON, "model_type": model_type, "head_dim": 16, **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConfigError, match=key) as e:
        load_hf_llama(str(tmp_path))  # from config.json, before any weight is looked for
    _one_line(e)


def test_export_refuses_what_the_family_cannot_express(tmp_path):
    """A Mistral with Gemma's soft-cap has no MistralForCausalLM config: refused by the field's name."""
    model = Llama(LlamaConfig(n_layer=1, n_head=4, n_embd=64, vocab_size=VOCAB, sliding_window=8, family="mistral",
                              attn_softcap=5.0))
    with pytest.raises(ValueError, match="model.attn_softcap=5.0") as e:
        export_hf_llama(model, tmp_path / "out", tokenizer=False)
    _one_line(e)
    plain = Llama(LlamaConfig(n_layer=1, n_head=4, n_embd=64, vocab_size=VOCAB, sliding_window=8))
    with pytest.raises(ValueError, match="model.sliding_window") as e:  # no family: a Llama has no window
        export_hf_llama(plain, tmp_path / "out2", tokenizer=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("kw, key", [
    (dict(layer_types="sfx"), "layer_types"), (dict(layer_types="sf"), "layer_types"),
    (dict(layer_types="sfs", sliding_window=0), "sliding_window"), (dict(sliding_window=-1), "sliding_window"),
    (dict(rope_local_theta=10.0, sliding_window=0), "rope_local_theta"), (dict(embed_scale=0.0), "embed_scale"),
    (dict(attn_softcap=5.0, attn_backend="math"), "attn_backend"), (dict(family="gemma9"), "family"),
    (dict(head_size=7), "head size"), (dict(n_embd=66, head_size=16), None),
])
def test_config_validation_names_the_field(kw, key):
    base = dict(n_layer=3, n_head=4, n_embd=64, sliding_window=8)
    if key is None:  # a head size apart from n_embd / n_head needs no divisibility
        assert LlamaConfig(**{**base, **kw}).head_dim == 16
        return
    with pytest.raises(ValueError, match=key):
        LlamaConfig(**{**base, **kw})


def test_tensor_and_pipeline_parallelism_take_the_checked_family_fields_and_refuse_the_rest_by_name(
        tmp_path, monkeypatch):
    """Every field the newer families add runs under TP and PP (trained against one process in
    tests/training/test_model_parallel.py, FAMILIES), but OLMo 2's QK-norm over every head, which runs under PP
    alone; a field whose plan and stages are not checked (parallel/mesh.py's MODEL_PARALLEL_FEATURES leaves it
    out) is refused by name, and the planner proposes no layout the run refuses."""
    from gptforge.config import ConfigError, DistConfig
    from gptforge.models.llama import FEATURES
    from gptforge.parallel import mesh
    from gptforge.parallel.mesh import check_layout
    from gptforge.plan.cost import Layout, check
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path, tmp_path / "out", micro_batch=2, total_batch_tokens=64, val_every=0)
    small = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=512)
    layouts = ((DistConfig(tp=2), Layout(tp=2)), (DistConfig(pp=2), Layout(pp=2, micro_batch=1)))
    granite = dict(embed_scale=12.0, attn_scale=0.5, residual_scale=0.22, logits_scaling=8.0)
    olmo = dict(post_norms=True, pre_norms=False, qk_norm=True)
    for fields in (dict(sliding_window=8, post_norms=True), granite, olmo):
        cfg.model = LlamaConfig(**small, **fields)
        for dist, layout in layouts:
            cfg.dist = dist
            check_layout(cfg, 2, local_world=2)
            assert check(cfg.model, layout, 8) is None
    # OLMo 2's QK-norm over every head's channels: a pipeline stage runs it whole; a TP rank holds some heads
    cfg.model = LlamaConfig(**small, **olmo, qk_norm_full=True)
    (tp, tp_layout), (pp, pp_layout) = layouts
    cfg.dist = pp
    check_layout(cfg, 2, local_world=2)
    assert check(cfg.model, pp_layout, 8) is None
    cfg.dist = tp
    why = r"model\.qk_norm_full normalises q and k over every head's channels .* holds only its own heads"
    with pytest.raises(ConfigError, match=r"dist\.tp: " + why + ".*use pipeline or data parallelism"):
        check_layout(cfg, 2, local_world=2)
    assert re.match(why, check(cfg.model, tp_layout, 8))
    # no stale names: each checked field is one features() can report
    named = {f"model.{f}" for f in FEATURES} | {"model.mlp=geglu"}
    assert mesh.MODEL_PARALLEL_FEATURES | set(mesh.PIPELINE_ONLY) <= named
    cfg.model = LlamaConfig(**small, sliding_window=8, post_norms=True)
    monkeypatch.setattr(mesh, "MODEL_PARALLEL_FEATURES", mesh.MODEL_PARALLEL_FEATURES - {"model.post_norms"})
    for (dist, layout), key in zip(layouts, (r"dist\.tp", r"dist\.pp"), strict=True):
        cfg.dist = dist
        with pytest.raises(ConfigError, match=key + r": model\.post_norms do not run under tensor or pipeline"):
            check_layout(cfg, 2, local_world=2)
        assert check(cfg.model, layout, 8) == f"model.post_norms {mesh.UNCHECKED_WHY}; use data parallelism or FSDP"
    cfg.dist = DistConfig()
    check_layout(cfg, 2, local_world=2)  # data parallelism takes them
    assert check(cfg.model, Layout(dp=2), 8) is None
    # a field in neither list is refused under PP too, by its name (post_norms still left out above)
    monkeypatch.setattr(mesh, "PIPELINE_ONLY", {})
    cfg.model = LlamaConfig(**small, **olmo, qk_norm_full=True)
    cfg.dist = pp
    refused = r"dist\.pp: model\.post_norms, model\.qk_norm_full do not run under tensor or pipeline"
    with pytest.raises(ConfigError, match=refused):
        check_layout(cfg, 2, local_world=2)


def test_fused_ce_divides_granites_logits_before_the_fused_head(monkeypatch):
    """fused_ce computes the loss from x W^T inside its kernel; with logits_scaling it is given x / s, so its
    loss is the plain head's (logits / s). The kernel stood in for by its definition (it needs triton): what is
    checked is the head's wiring. Tolerance: the two paths round x/s and (xW^T)/s differently, 2 float32 ulps
    of a loss ~6."""
    import torch.nn.functional as F

    import gptforge.kernels.fused_ce as fused

    def reference(x, weight, targets, vocab_size):
        logits = (x @ weight.T)[..., :vocab_size]
        return F.cross_entropy(logits.float().reshape(-1, vocab_size), targets.reshape(-1), ignore_index=-1)

    monkeypatch.setattr(fused, "fused_linear_cross_entropy", reference)
    torch.manual_seed(0)
    kw = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=VOCAB, logits_scaling=8.0)
    plain = Llama(LlamaConfig(**kw)).train()
    fast = Llama(LlamaConfig(**kw, fused_ce=True)).train()
    fast.load_state_dict(plain.state_dict())
    idx, targets = IDX[:, :16], IDX[:, 1:17]
    want, got = plain(idx, targets)[1], fast(idx, targets)[1]
    assert fast(idx, targets)[0] is None  # the fused path ran
    assert abs(got.item() - want.item()) <= 2 * 6 * 1.2e-7


# ----------------------------------------------------------------------------- counts for plan and MFU


def test_counts_match_the_model_and_transformers(family):
    """Parameters counted from the config equal the built model's and transformers' (its vocabulary
    rows unpadded); the attention FLOPs follow the window: a sliding layer's query meets
    min(T, window) keys, a full layer's T (hand count at T = 40, window 8)."""
    from gptforge.models.counting import flops_per_token
    from gptforge.models.registry import counts

    name, hf, d, model, ref = family
    cfg = model.config
    c = counts(cfg, T)
    pad_rows = (cfg.padded_vocab_size - VOCAB) * cfg.n_embd * (1 if cfg.tie_embeddings else 2)
    assert c.params == model.num_parameters() == sum(p.numel() for p in hf.parameters()) + pad_rows
    keys = [min(T, WINDOW) if k == "s" else T for k in cfg.sliding_pattern]
    width = cfg.n_head * cfg.head_dim
    assert c.layer_flops - 2.0 * (c.layer_params - c.layer_norms) == pytest.approx(4.0 * width * sum(keys) / cfg.n_layer)
    want = 6 * (c.params - c.lookup) + 6 * cfg.n_layer * width * sum(keys) / cfg.n_layer
    assert flops_per_token(c) == pytest.approx(want)


def test_post_norms_activation_bytes_against_autograd():
    """What autograd saves for Gemma's two extra norms per block (saved_tensors_hooks, float32), against
    layer_act_bytes' increment: 16 C bytes per token, plus each norm's (B, T, 1) rsqrt (4 bytes)."""
    from gptforge.models.llama import layer_act_bytes
    from gptforge.models.rope import rope_cos_sin

    def saved(**kw) -> tuple[float, float]:
        torch.manual_seed(0)
        cfg = LlamaConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96, block_size=64,
                          vocab_size=VOCAB, **kw)
        block = Llama(cfg).model.layers[0]
        params = {p.data_ptr() for p in block.parameters()}
        x = torch.randn(2, 16, 64, requires_grad=True)
        cos, sin = rope_cos_sin(torch.arange(16), cfg.head_dim, cfg.rope_theta)
        seen: dict[int, int] = {}

        def pack(t):
            if t.data_ptr() not in params:
                seen[t.data_ptr()] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x, cos, sin)
        return sum(seen.values()) / 32, layer_act_bytes(cfg, "float32", "none")

    (plain, plain_est), (post, post_est) = saved(), saved(post_norms=True)
    assert post_est - plain_est == 16 * 64
    assert 0 <= (post - plain) - (post_est - plain_est) <= 2 * 4


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_reward_model_on_each_family_scores_the_same_in_transformers(name):
    """rm's export path: a reward model on the family's body becomes the family's
    *ForSequenceClassification (Gemma 3's text one) with the same scores, 30 tokens over a window of 8."""
    from gptforge.interop.hf_reward import reward_model_to_transformers
    from gptforge.training.rm import RewardModel

    fields = {k: v for k, v in FAMILIES[name][2].items() if k not in ("rope_theta",)}
    if name not in NO_WINDOW:
        fields.setdefault("sliding_window", WINDOW)  # Gemma's (their rows above list what the load sets apart)
    torch.manual_seed(0)
    body = Llama(LlamaConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96, block_size=64,
                             vocab_size=VOCAB, rope_theta=500.0, **{"rope_factor": 2.0} if name == "gemma3" else {},
                             **{**fields, **({"embed_scale": 8.0} if name.startswith("gemma") else {}),
                                **({"query_pre_attn_scalar": 20.0} if name == "gemma3" else {})}))
    rm = RewardModel(body).eval()
    with torch.no_grad():
        for p in rm.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = IDX[:, :30]
    if name == "granite":  # transformers has no Granite sequence classifier: refused by name, not written as Llama's
        with pytest.raises(ValueError, match="no GraniteForSequenceClassification"):
            reward_model_to_transformers(rm, pad=0)
        return
    hf = reward_model_to_transformers(rm, pad=0)
    assert type(hf).__name__ == FAMILIES[name][0] + "ForSequenceClassification"
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits[:, 0], rm(ids, torch.tensor([29, 29])), atol=ATOL, rtol=0)
