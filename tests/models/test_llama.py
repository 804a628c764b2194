"""The Llama family against transformers as the independent reference: logits of LlamaForCausalLM
(and Qwen3ForCausalLM for QK-norm) on odd shapes with grouped-query attention, weights moved both
ways, greedy decoding equal to transformers' generate; the KV cache against recomputation; every
refusal of a config gptforge cannot load or export faithfully."""

from __future__ import annotations

import json

import pytest
import torch

from gptforge.generation import SamplingParams, generate, stream_tokens
from gptforge.interop.hf_llama import HFConfigError, export_hf_llama, load_hf_llama, to_transformers
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.run.checkpoint import save_checkpoint
from gptforge.run.restore import load_model_weights

transformers = pytest.importorskip("transformers")

# odd on purpose: vocab not a multiple of 128 (padded rows), 6 query heads sharing 2 key/value heads,
# an intermediate size that is no multiple of the width, a non-default rope theta and eps
ODD = dict(n_layer=3, n_head=6, n_kv_head=2, n_embd=48, intermediate_size=72, block_size=64, vocab_size=101,
           rope_theta=500.0, norm_eps=1e-6)
IDX = torch.randint(0, 101, (3, 17), generator=torch.Generator().manual_seed(3))


def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial norm gains and larger weights, so a mix-up of any tensor shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
            else:
                p.mul_(3.0)
    return model.eval()


def _llama(seed: int = 0, **kw) -> Llama:
    torch.manual_seed(seed)
    return _perturb(Llama(LlamaConfig(**{**ODD, **kw})), seed)


def _hf_llama(**kw):
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    c = HFLlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                      rope_theta=500.0, **kw)
    return _perturb(LlamaForCausalLM(c), 1)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 2e-5) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()


# ----------------------------------------------------------------------------- parity with transformers


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("tied", [False, True])
def test_hf_save_pretrained_then_gptforge_load(tmp_path, flash, tied):
    hf = _hf_llama(tie_word_embeddings=tied)
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf_llama(str(tmp_path / "hf"), flash=flash)
    c = model.config
    assert (c.n_head, c.n_kv_head, c.intermediate_size, c.rope_theta, c.norm_eps, c.tie_embeddings) == (
        6, 2, 72, 500.0, 1e-6, tied)
    assert model.lm_head.weight.shape == (128, 48)  # padded rows
    with torch.no_grad():
        ref = hf(IDX).logits
        got, _ = model(IDX)
    assert ref.abs().max() > 1.0  # the weights are not near zero: a wrong map would show
    _close(got, ref)
    # the loss equals transformers' (its labels are shifted inside; ours are given shifted)
    with torch.no_grad():
        ref_loss = hf(IDX, labels=IDX).loss
        _, loss = model(IDX[:, :-1], IDX[:, 1:])
    assert abs(loss.item() - ref_loss.item()) < 1e-5


@pytest.mark.parametrize("tied", [False, True])
def test_export_then_hf_from_pretrained(tmp_path, tied):
    from transformers import LlamaForCausalLM

    model = _llama(tie_embeddings=tied)
    files = export_hf_llama(model, tmp_path / "hf", tokenizer=False)
    assert sorted(f.name for f in files) == ["config.json", "model.safetensors"]
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.num_key_value_heads == 2 and hf.config.tie_word_embeddings == tied
    assert hf.model.embed_tokens.weight.shape == (101, 48)  # padding sliced off
    with torch.no_grad():
        _close(model(IDX)[0], hf(IDX).logits)
    back = load_hf_llama(str(tmp_path / "hf"))
    with torch.no_grad():
        _close(back(IDX)[0], model(IDX)[0], atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_to_transformers_in_memory(tied):
    model = _llama(tie_embeddings=tied)
    hf = to_transformers(model)
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == tied
    with torch.no_grad():
        _close(model(IDX)[0], hf(IDX).logits)


def test_export_with_tokenizer_gpt2_vocab(tmp_path, tokenizer):
    from transformers import AutoTokenizer

    model = Llama(LlamaConfig.from_size("llama-tiny"))
    export_hf_llama(model, tmp_path / "hf")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "ROMEO:\nBut soft! what light"
    assert hf_tok(text)["input_ids"] == tokenizer.encode(text)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 50256


def test_qk_norm_matches_qwen3():
    """QK-norm has no LlamaForCausalLM equivalent; Qwen3 is Llama plus the same per-head q/k RMSNorm."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    hf = _perturb(Qwen3ForCausalLM(Qwen3Config(
        vocab_size=101, hidden_size=48, intermediate_size=72, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=500.0,
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False)), 2)
    model = Llama(LlamaConfig(**ODD, qk_norm=True)).eval()
    sd = {k: v for k, v in hf.state_dict().items() if not k.endswith("inv_freq")}
    from gptforge.interop.hf_llama import load_hf_llama_state_dict

    load_hf_llama_state_dict(model, sd)
    with torch.no_grad():
        _close(model(IDX)[0], hf(IDX).logits)


def test_num_parameters_match_transformers():
    hf = _hf_llama()
    model = Llama(LlamaConfig(**ODD, pad_vocab=False))
    assert model.num_parameters() == hf.num_parameters()
    assert model.num_parameters(exclude_embeddings=True) == hf.num_parameters() - 101 * 48


# ----------------------------------------------------------------------------- generation and the KV cache


def test_greedy_matches_transformers_generate(tmp_path):
    hf = _hf_llama()
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf_llama(str(tmp_path / "hf"))
    prompt = IDX[:1, :6]
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                          pad_token_id=0)
    assert torch.equal(generate(model, prompt, 12, temperature=0.0), ref)


@pytest.mark.parametrize("flash", [True, False])
def test_kv_cache_equals_recompute(flash):
    model = _llama(flash=flash)
    prompts = [[5, 17, 99, 3, 50, 7, 7, 1], [42], [30, 12, 0, 9]]  # left-padded batch
    for knobs in (dict(temperature=0.0), dict(temperature=1.0, top_k=20, seed=3)):
        p = SamplingParams(max_new_tokens=20, **knobs)
        for batch in ([prompts[0], prompts[0]], prompts):
            cached = torch.stack(list(stream_tokens(model, batch, p, use_cache=True)), 1)
            full = torch.stack(list(stream_tokens(model, batch, p, use_cache=False)), 1)
            assert torch.equal(cached, full)
    # each row of the padded batch is what it would be alone (per-row rotary positions)
    p = SamplingParams(max_new_tokens=16, temperature=0.0)
    batch = torch.stack(list(stream_tokens(model, prompts, p)), 1)
    for b, prompt in enumerate(prompts):
        assert torch.equal(batch[b], torch.stack(list(stream_tokens(model, [prompt], p)), 1)[0]), b


def test_kv_cache_holds_kv_heads_and_multi_token_chunks():
    model = _llama()
    cache = model.new_kv_cache(2, max_len=20)
    assert cache.k.shape == (3, 2, 2, 20, 8)  # (layers, B, n_kv_head, T, hd): GQA's saving
    ids = IDX[:2, :15]
    with torch.no_grad():
        full, _ = model(ids)
        a, _ = model(ids[:, :9], kv_cache=cache)
        b, _ = model(ids[:, 9:], kv_cache=cache)  # several new tokens against a filled cache
    _close(torch.cat([a, b], 1), full, atol=1e-5)


# ----------------------------------------------------------------------------- options


def test_logit_softcap_bounds_and_matches_formula():
    plain = _llama()
    capped = _llama(logit_softcap=0.5)
    with torch.no_grad():
        raw, _ = plain(IDX)
        got, _ = capped(IDX)
    assert raw.abs().max() > 0.5 and got.abs().max() < 0.5
    _close(got, 0.5 * torch.tanh(raw / 0.5), atol=1e-6)


def test_recompute_gives_the_same_gradients():
    grads = {}
    for rc in ("none", "mlp", "block"):
        model = _llama(recompute=rc, mlp="relu2").train()
        _, loss = model(IDX[:, :-1], IDX[:, 1:])
        loss.backward()
        grads[rc] = torch.cat([p.grad.flatten() for p in model.parameters()])
    _close(grads["mlp"], grads["none"], atol=1e-6)
    _close(grads["block"], grads["none"], atol=1e-6)


def test_n_kv_head_zero_means_multi_head():
    model = Llama(LlamaConfig(**{**ODD, "n_kv_head": 0}))
    assert model.config.kv_heads == 6 and model.model.layers[0].self_attn.k_proj.weight.shape == (48, 48)
    assert model.new_kv_cache(1).k.shape[2] == 6


def test_attn_backend_math_gives_the_same_logits():
    with torch.no_grad():
        _close(_llama(attn_backend="math")(IDX)[0], _llama()(IDX)[0], atol=1e-5)


def test_fp8_lm_head_logits_close_to_plain():
    plain, fp8 = _llama(), _llama(lm_head_fp8=True)
    with torch.no_grad():
        a, b = plain(IDX)[0], fp8(IDX)[0]
    assert a.shape == b.shape and (a - b).abs().max() < 0.07 * a.abs().max()


FUSED_CHECK = """
import torch
from gptforge.models.llama import Llama, LlamaConfig
shape = dict(n_layer=2, n_head=6, n_kv_head=2, n_embd=48, block_size=32, vocab_size=101)
torch.manual_seed(0)
plain = Llama(LlamaConfig(**shape)).train()
fused = Llama(LlamaConfig(**shape, fused_ce=True)).train()
fused.load_state_dict(plain.state_dict())
idx = torch.randint(0, 101, (2, 17))
targets = idx.roll(-1, 1)
targets[0, :3] = -1
_, ref = plain(idx, targets)
ref.backward()
logits, got = fused(idx, targets)
got.backward()
assert logits is None and abs(got.item() - ref.item()) < 1e-5, (got, ref)
grads = dict(fused.named_parameters())
for name, p in plain.named_parameters():
    assert torch.allclose(grads[name].grad, p.grad, atol=1e-5), name
print("ok")
"""


@pytest.mark.slow  # a fresh interpreter with Triton's interpreter (TRITON_INTERPRET must precede its import)
def test_fused_ce_loss_and_grads_equal_the_plain_loss():
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", FUSED_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-4000:]


def test_zero_init_proj_starts_each_block_as_identity():
    model = Llama(LlamaConfig(**ODD, zero_init_proj=True))
    for block in model.model.layers:
        assert not block.self_attn.o_proj.weight.any() and not block.mlp.down_proj.weight.any()
    assert model.model.layers[0].self_attn.q_proj.weight.std() > 0.01


@pytest.mark.parametrize("opts", [dict(), dict(mlp="relu2", qk_norm=True, logit_softcap=15.0, zero_init_proj=True)])
def test_a_few_adamw_steps_learn(opts):
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**ODD, **opts}, dropout=0.1)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seq = torch.arange(33).remainder(7)[None].repeat(4, 1)  # a repeating pattern to memorise
    losses = []
    for _ in range(15):
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_round_trip(tmp_path, tied):
    """An untied head is stored (and required on load); a tied one once, and tied again after loading."""
    from safetensors import safe_open

    model = _llama(tie_embeddings=tied)
    ck = save_checkpoint(tmp_path / "run", 1, model, None, {"config": {}})
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tied)
    fresh = Llama(LlamaConfig(**ODD, tie_embeddings=tied))
    load_model_weights(fresh, ck)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert (fresh.lm_head.weight is fresh.model.embed_tokens.weight) == tied


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kw, key",
    [(dict(n_head=6, n_kv_head=4), "n_kv_head"), (dict(n_embd=50), "n_head"), (dict(mlp="gelu"), "mlp"),
     (dict(recompute="all"), "recompute"), (dict(arch="gpt2"), "arch"), (dict(logit_softcap=-1.0), "logit_softcap"),
     (dict(n_embd=42, n_head=6, n_kv_head=2), "head size"), (dict(attn_backend="xformers"), "attn_backend"),
     (dict(attn_backend="math", flash=False), "attn_backend"), (dict(fused_ce=True, logit_softcap=30.0), "logit_softcap"),
     (dict(fused_ce=True, lm_head_fp8=True), "cannot be combined")],
)
def test_config_validation_names_the_key(kw, key):
    with pytest.raises(ValueError, match=key):
        LlamaConfig(**{**ODD, **kw})


@pytest.mark.parametrize(
    "change, key",
    [({"rope_scaling": {"rope_type": "dynamic", "factor": 32.0}}, "rope_scaling.rope_type='dynamic'"),
     ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling.rope_type='longrope'"),
     ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type"),
     ({"sliding_window": 4096}, "sliding_window"), ({"attention_bias": True}, "attention_bias"),
     ({"mlp_bias": True}, "mlp_bias"), ({"model_type": "qwen2", "head_dim": 16}, "head_dim"),
     ({"hidden_act": "gelu"}, "hidden_act"),
     ({"model_type": "mixtral"}, "model_type"), ({"partial_rotary_factor": 0.5}, "partial_rotary_factor")],
)
def test_hf_configs_with_missing_features_are_refused(tmp_path, change, key):
    hf = _hf_llama()
    hf.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf" / "model.safetensors").unlink()  # refused from the config alone, before any weight is read
    with pytest.raises(HFConfigError, match=key) as e:
        load_hf_llama(str(tmp_path / "hf"))
    assert str(e.value).startswith(f"{tmp_path / 'hf' / 'config.json'}: "), "the refusal names the file"


def test_hf_directory_without_safetensors_or_with_misshapen_weights_is_refused(tmp_path):
    from safetensors.torch import load_file

    from gptforge.interop.hf_folder import HFModelError

    hf = _hf_llama()
    hf.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    del cfg["intermediate_size"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFConfigError, match="intermediate_size"):
        load_hf_llama(str(tmp_path / "hf"))
    cfg["intermediate_size"] = 64  # the weights say 72
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFModelError, match="gate_proj.weight"):  # from the header, before any allocation
        load_hf_llama(str(tmp_path / "hf"))
    sd = load_file(str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(sd, tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(HFModelError, match="safetensors only"):  # never unpickled
        load_hf_llama(str(tmp_path / "hf"))


@pytest.mark.parametrize("opt, key", [(dict(qk_norm=True), "qk_norm"), (dict(mlp="relu2"), "mlp"),
                                      (dict(logit_softcap=30.0), "logit_softcap")])
def test_export_refuses_what_hf_llama_cannot_express(tmp_path, opt, key):
    with pytest.raises(ValueError, match=key):
        export_hf_llama(_llama(**opt), tmp_path / "hf", tokenizer=False)
    assert not (tmp_path / "hf").exists()  # refused before anything was written


@pytest.mark.slow
def test_torch_compile_matches_eager():
    """The GPU default compiles the model: same loss and gradients as eager (about 25 s on a CPU). On CPU the
    compiled training forward returns its logits detached (issue 35: an output with a gradient path gets a
    zero-filled (B, T, V) gradient every backward), with the same values."""
    model = _llama(qk_norm=True, logit_softcap=15.0).train()
    x = IDX[:2]
    ref_logits, ref = model(x[:, :-1], x[:, 1:])
    ref.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits, loss = torch.compile(model)(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.allclose(loss, ref, atol=1e-6)
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    assert logits.requires_grad == (x.device.type != "cpu")
    for p, g in zip(model.parameters(), grads, strict=True):
        _close(p.grad, g, atol=1e-5)
