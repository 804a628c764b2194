"""Hardening round eight of the server.

``GET /api/info`` showed the served model's config as its config file wrote it: ``"fused_ce": null`` where the
config says auto, and a Llama's derived fields as their 0 = derived placeholder (``n_kv_head: 0``, ``head_size:
0``, ``intermediate_size: 0``, ``family: ""``). A client reading them was told a GQA model had 0 key/value heads.
Now each is what the model was built with, read back here from the weights' own shapes (an independent
reference), and ``auto`` lists which fields were resolved; the walk covers every field of every config
family so a field added later as None is caught.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.models.gpt2 import GPT, GPTConfig  # noqa: E402
from gptforge.models.llama import Llama, LlamaConfig  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402

SHAPE = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
CONFIGS = {
    "gpt2": lambda: GPTConfig(**SHAPE),
    "llama": lambda: LlamaConfig(**SHAPE),  # every derived field at 0 / ""
    "llama-gqa-set": lambda: LlamaConfig(**SHAPE, n_kv_head=2, head_size=16, intermediate_size=48,
                                         family="qwen3", qk_norm=True, fused_ce=False),
    "qwen2": lambda: LlamaConfig(**SHAPE, qkv_bias=True),
    "mistral": lambda: LlamaConfig(**SHAPE, n_kv_head=1, sliding_window=4),
    "gemma-window": lambda: LlamaConfig(**SHAPE, sliding_window=4, layer_types="sf"),
}


def _info(cfg, tokenizer) -> tuple[dict, torch.nn.Module]:
    torch.manual_seed(0)
    model = (GPT if isinstance(cfg, GPTConfig) else Llama)(cfg).eval()
    with TestClient(create_app(model, tokenizer, ServeSettings())) as c:
        return c.get("/api/info").json()["model"], model


def _from_weights(model: torch.nn.Module) -> dict:
    """n_kv_head, head_size and intermediate_size as the weights' shapes say (Llama's layout)."""
    sd = model.state_dict()
    n_head = model.config.n_head
    q = sd["model.layers.0.self_attn.q_proj.weight"].shape[0]
    head = q // n_head
    return {"head_size": head, "n_kv_head": sd["model.layers.0.self_attn.k_proj.weight"].shape[0] // head,
            "intermediate_size": sd["model.layers.0.mlp.up_proj.weight"].shape[0]}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_info_shows_what_the_model_was_built_with(name, tokenizer):
    cfg = CONFIGS[name]()
    info, model = _info(cfg, tokenizer)
    assert not [k for k, v in info.items() if v is None], info  # no field left as "decided later"
    # fused_ce decides the training loss; a served (eval, no-grad) forward computes plain logits
    assert info["fused_ce"] is False
    with torch.no_grad():
        logits, _ = model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    assert logits is not None
    if isinstance(cfg, LlamaConfig):
        assert {k: info[k] for k in ("head_size", "n_kv_head", "intermediate_size")} == _from_weights(model)
        assert len(info["layer_types"]) == cfg.n_layer and set(info["layer_types"]) <= {"s", "f"}
        # a window on every layer unless layer_types names them; none without a window (HF Mistral's meaning)
        want = cfg.layer_types or ("s" if cfg.sliding_window else "f") * cfg.n_layer
        assert info["layer_types"] == want
        assert info["family"] == (cfg.family or ("qwen2" if cfg.qkv_bias else "llama"))
    set_fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    auto = sorted(k for k in info if k in set_fields and info[k] != set_fields[k])
    assert info["auto"] == auto, (info["auto"], auto)  # resolved fields, and only those, are listed


def test_a_field_set_by_hand_is_shown_as_set(tokenizer):
    info, _ = _info(CONFIGS["llama-gqa-set"](), tokenizer)
    assert (info["n_kv_head"], info["head_size"], info["intermediate_size"], info["family"]) == (2, 16, 48, "qwen3")
    assert info["auto"] == ["layer_types"]


# /api/metrics on a hand-edited or foreign metrics.jsonl: a value json reads that is not a finite number (an
# integer past float's range was an OverflowError, a 500), or a step that is not a whole number, leaves its point
# off the curve, as `gptforge plot` does (one rule: run.metrics.finite_number)
BAD_VALUES = ["NaN", "Infinity", '"abc"', "[1, 2]", "true", "null", str(10**400)]


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize("where", ["value", "step"])
def test_the_pages_loss_curve_leaves_a_bad_point_off(bad, where, tmp_path, tokenizer):
    lines = ['{"kind": "train", "step": 1, "loss": 3.0}',
             '{"kind": "train", "step": 2, "loss": BAD}' if where == "value" else '{"kind": "train", "step": BAD, "loss": 2.5}',
             '{"kind": "train", "step": 3, "loss": 2.0}', '{"kind": "val", "step": 3, "val_loss": 2.2}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines).replace("BAD", bad) + "\n")
    model = GPT(GPTConfig(**SHAPE))
    with TestClient(create_app(model, tokenizer, ServeSettings(), metrics_path=tmp_path / "metrics.jsonl")) as c:
        r = c.get("/api/metrics")
    assert r.status_code == 200, r.text
    assert r.json()["train"] == [[1, 3.0], [3, 2.0]] and r.json()["val"] == [[3, 2.2]]


# --- a request body's JSON, read the same by every POST route ------------------------------------------------------
# {"prompt": "a", "prompt": "b"} generated from "b" (json.loads keeps the last key; the CLI refuses a flag given
# twice the same way now), and /api tokenized a lone surrogate ("\ud800") that /v1 refused. Every POST route reads
# its body through openai_schema.loads_body; the walk takes the routes from the app, so a new one needs a body here.
ONE = '{"role": "user", "content": "hi"}'
BODIES = {"/api/generate": ('"prompt"', '"a"', '"max_new_tokens": 1'),
          "/api/stream": ('"prompt"', '"a"', '"max_new_tokens": 1'),
          "/api/chat": ('"messages"', f"[{ONE}]", '"max_new_tokens": 1'),
          "/v1/completions": ('"prompt"', '"a"', '"max_tokens": 1'),
          "/v1/chat/completions": ('"messages"', f"[{ONE}]", '"max_tokens": 1')}


@pytest.fixture(scope="module")
def body_client(tokenizer):
    from gptforge.data.chat import ChatTemplate

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50261)).eval()
    app = create_app(model, tokenizer, ServeSettings(max_new_tokens_cap=4), chat_template=ChatTemplate.gpt2().to_dict())
    posts = sorted(r.path for r in app.routes if "POST" in getattr(r, "methods", ()))
    with TestClient(app) as c:
        yield c, posts


def test_every_post_route_has_a_body_here(body_client):
    _, posts = body_client
    assert posts == sorted(BODIES)


def _post(c, path: str, raw: str):
    return c.post(path, content=raw.encode(), headers={"content-type": "application/json"})


def _error(r) -> str:
    e = r.json()["error"]
    return e["message"] if isinstance(e, dict) else e


@pytest.mark.parametrize("path", list(BODIES))
def test_a_key_given_twice_with_two_values_is_refused_in_every_route(path, body_client):
    c, _ = body_client
    key, value, rest = BODIES[path]
    other = '"b"' if value == '"a"' else f"[{ONE}, {ONE}]"
    r = _post(c, path, f"{{{key}: {value}, {rest}, {key}: {other}}}")
    assert r.status_code == 400, r.text
    assert f"{key[1:-1]!r} is given twice in one object" in _error(r), r.text
    # nested objects too: a message's role
    if "messages" in key:
        r = _post(c, path, f'{{{key}: [{{"role": "user", "content": "hi", "role": "system"}}], {rest}}}')
        assert r.status_code == 400 and "'role' is given twice" in _error(r), r.text
    ok = _post(c, path, f"{{{key}: {value}, {rest}, {key}: {value}}}")  # the same value twice is taken
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", list(BODIES))
def test_a_lone_surrogate_is_refused_in_every_route(path, body_client):
    c, _ = body_client
    key, value, rest = BODIES[path]
    bad = '"a\\ud800b"' if value == '"a"' else '[{"role": "user", "content": "\\udc00"}]'
    r = _post(c, path, f"{{{key}: {bad}, {rest}}}")
    assert r.status_code == 400 and "unpaired surrogate" in _error(r), r.text
