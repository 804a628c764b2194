"""Shared prefill: ``stream_tokens`` runs each distinct prompt through the model once and gives the
rows that repeat it copies of its KV cache. Checked against independent references, in float64 so no
batch-shape rounding can flip a token: each row generated alone without any cache (one prompt, full
recomputation, drawing the uniform it would draw in the whole batch via ``rows``), and the whole batch
with ``use_cache=False``; and the prefill's size against a hand count of distinct prompts."""

from __future__ import annotations

import pytest
import torch

from gptforge.generation import SamplingParams, stream_tokens
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.kv_cache import KVCache
from gptforge.models.llama import Llama, LlamaConfig


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "gpt2":
        m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=512))
    else:  # grouped-query attention: the cache holds 2 key/value heads for 4 query heads
        m = Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=64, vocab_size=512))
    with torch.no_grad():  # sharper distributions than the random init's near-uniform ones
        m.lm_head.weight.mul_(5)
    return m.double().eval()


A = [5, 17, 99, 3, 250, 7, 7, 1]
B1 = [42]
C = [300, 12, 0, 9]
C_PREFIX = [300, 12, 0]  # C less its last token
C_SAME_LEN = [9, 0, 12, 300]  # C's length and tokens, another order
A_TAIL = [7, 7, 1]  # A's last three tokens: left-padded, its slots hold what A's last slots hold

PROMPT_SETS = {
    "mixed": [A, B1, A, C, C_PREFIX, B1, A, A_TAIL, C_SAME_LEN],  # duplicates anywhere, lengths 1..8
    "groups": [p for p in (C, A, B1) for _ in range(3)],  # GRPO's layout: each problem's replies together
    "all_same": [A] * 5,
    "all_same_len": [C, C_SAME_LEN, C, C_SAME_LEN, C],  # duplicates, no padding (the unmasked path)
    "none_repeat": [A, B1, C, C_PREFIX, A_TAIL, C_SAME_LEN],
}
KNOBS = {
    "greedy": dict(temperature=0.0),
    "topk": dict(temperature=1.0, top_k=50, seed=3),
    "topp_penalty": dict(temperature=0.9, top_p=0.9, repetition_penalty=1.5, seed=7),
}


def _run(model, prompts, p, **kw) -> torch.Tensor:
    return torch.stack(list(stream_tokens(model, prompts, p, **kw)), 1)  # (B, steps)


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
@pytest.mark.parametrize("prompts", PROMPT_SETS.values(), ids=PROMPT_SETS.keys())
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_shared_prefill_gives_each_row_its_own_tokens(family, prompts, knobs):
    model = _model(family)
    p = SamplingParams(max_new_tokens=10, **knobs)
    got = _run(model, prompts, p)
    assert torch.equal(got, _run(model, prompts, p, use_cache=False))  # the whole batch recomputed each step
    n = len(prompts)
    for b, prompt in enumerate(prompts):  # alone: no batch, no padding, no cache, row b's random draws
        alone = _run(model, [prompt], SamplingParams(max_new_tokens=10, rows=(b, n), **knobs), use_cache=False)
        assert torch.equal(got[b], alone[0]), b
    if knobs["temperature"] > 0 and prompts.count(A) > 1:  # rows that share a prompt still draw their own replies
        rows = [got[b].tolist() for b, q in enumerate(prompts) if q == A]
        assert len({tuple(r) for r in rows}) > 1


def _forward_shapes(model, prompts, share: bool = True) -> list[tuple[int, int]]:
    shapes: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0].shape)))
    try:
        _run(model, prompts, SamplingParams(max_new_tokens=3, temperature=0.0), share_prefill=share)
    finally:
        hook.remove()
    return shapes


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_prefill_runs_each_distinct_prompt_once(family):
    """Hand count: 9 rows, 6 distinct prompts, the longest 8 tokens -> a 6 x 8 prefill, then 9 rows a step."""
    model = _model(family)
    assert _forward_shapes(model, PROMPT_SETS["mixed"]) == [(6, 8), (9, 1), (9, 1)]
    assert _forward_shapes(model, PROMPT_SETS["groups"]) == [(3, 8), (9, 1), (9, 1)]
    assert _forward_shapes(model, PROMPT_SETS["all_same"]) == [(1, 8), (5, 1), (5, 1)]
    assert _forward_shapes(model, PROMPT_SETS["all_same_len"]) == [(2, 4), (5, 1), (5, 1)]
    assert _forward_shapes(model, PROMPT_SETS["none_repeat"]) == [(6, 8), (6, 1), (6, 1)]
    assert _forward_shapes(model, PROMPT_SETS["mixed"], share=False) == [(9, 8), (9, 1), (9, 1)]


def test_take_rows_copies_each_named_row():
    """Against a hand-built cache: row i of the result is row rows[i], in every layer, keys and values,
    and each copy is its own (writing one row leaves the row it came from alone)."""
    c = KVCache(n_layer=2, batch=3, n_head=2, max_len=5, head_size=4, device="cpu", dtype=torch.float64)
    for r in range(3):
        c.k[:, r] = r + 1.0
        c.v[:, r] = -(r + 1.0)
    c.update(0, torch.zeros(3, 2, 2, 4), torch.zeros(3, 2, 2, 4))
    c.advance()
    c.take_rows(torch.tensor([2, 0, 0, 1]))
    assert c.k.shape == (2, 4, 2, 5, 4) and c.length == 2
    for i, r in enumerate([2, 0, 0, 1]):
        assert torch.equal(c.k[1, i], torch.full((2, 5, 4), r + 1.0, dtype=torch.float64)), i
        assert torch.equal(c.v[1, i], torch.full((2, 5, 4), -(r + 1.0), dtype=torch.float64)), i
    c.k[1, 1, 0, 0, 0] = 42.0  # rows 1 and 2 both came from row 0: each is its own copy
    assert c.k[1, 2, 0, 0, 0] == 1.0
