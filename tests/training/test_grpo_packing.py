"""GRPO's packed scoring (a group's prompt once a row, each reply attending to the prompt and itself)
against one sequence per reply computed in float64: log-probs and gradients of a tiny GPT-2 and a tiny
Llama with grouped-query attention, over ragged groups, one-token replies and a row limit that splits a
group; a bf16 model scores in float32 (as ``token_logprobs``); tensors land on the requested device; a
GRPO step runs its model on the packed rows.

Planted bugs these catch: a reply's positions off by one (or counted from the row, not the prompt); a
mask letting a reply see an earlier reply of its row; the first reply token read from the wrong logit;
the gather reading one column off; each reply's last token dropped twice; a row over the limit; the
logits left in bf16.
"""

from __future__ import annotations

import copy

import pytest
import torch

from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.training.packing import pack_replies, packed_logprobs

V = 64
T_SAMPLE = 0.7  # a temperature other than 1: softmax(logits / T), the sampling distribution


def _sharpen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights large enough that logits differ a lot between positions (a wrong position shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0))
    return model.eval()


def gpt2() -> torch.nn.Module:
    return _sharpen(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=V, pad_vocab=False)), 1)


def llama() -> torch.nn.Module:
    cfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=48, vocab_size=V, pad_vocab=False)
    return _sharpen(Llama(cfg), 2)


FAMILIES = [pytest.param(gpt2, id="gpt2"), pytest.param(llama, id="llama-gqa")]


def rollouts(seed: int = 0):
    """Three groups (sizes 3, 1, 4) of prompts of different lengths; replies ragged, one of one token."""
    g = torch.Generator().manual_seed(seed)

    def toks(n):
        return torch.randint(1, V, (n,), generator=g).tolist()

    prompts, replies = [], []
    for n_p, lens in ((5, (4, 1, 6)), (3, (2,)), (7, (3, 5, 2, 4))):
        p = toks(n_p)
        for n in lens:
            prompts.append(p)
            replies.append(toks(n))
    return prompts, replies


def one_per_reply(model, prompt, reply, temperature=T_SAMPLE) -> torch.Tensor:
    """log softmax(logits / T) of each reply token, the reply's own sequence, in the model's dtype (float64)."""
    logits, _ = model(torch.tensor([list(prompt) + list(reply)[:-1]]))
    lp = torch.log_softmax(logits[0].double() / temperature, -1)
    return torch.stack([lp[len(prompt) - 1 + j, t] for j, t in enumerate(reply)])


def rows_of(x, mask):
    return [x[i][mask[i].bool()] for i in range(x.size(0))]


def weights(replies, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(len(r), generator=g, dtype=torch.float64) for r in replies]


@pytest.mark.parametrize("make", FAMILIES)
@pytest.mark.parametrize("limit", [48, 12], ids=["one-row-a-group", "rows-of-12"])
def test_packed_logprobs_and_gradients_match_one_sequence_per_reply(make, limit):
    model = make()
    prompts, replies = rollouts()
    packed = pack_replies(prompts, replies, block_size=limit, pad=0)
    assert packed.ids.size(1) <= limit
    if limit == 12:  # rows of prompt 5 + 3 + 0 | 5 + 5; 3 + 1; 7 + 2 | 7 + 4 + 1 | 7 + 3 tokens
        assert packed.ids.size(0) == 6 and (packed.ids[:, 0] == prompts[-1][0]).sum() == 3
    else:
        assert packed.ids.size(0) == 3  # one row a group
    got = packed_logprobs(model, packed, T_SAMPLE)
    assert got.dtype == torch.float32 and got.shape == packed.mask.shape
    assert (got[packed.mask == 0] == 0).all()
    w = weights(replies)
    (sum((r.double() * wi).sum() for r, wi in zip(rows_of(got, packed.mask), w, strict=True))).backward()

    ref = copy.deepcopy(model).double()
    want = [one_per_reply(ref, p, r) for p, r in zip(prompts, replies, strict=True)]
    for i, (a, b) in enumerate(zip(rows_of(got, packed.mask), want, strict=True)):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-5, msg=f"reply {i}")
    sum((b * wi).sum() for b, wi in zip(want, w, strict=True)).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), q.grad, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("make", FAMILIES)
def test_one_token_replies_are_read_from_the_prompts_last_logit(make):
    model = make()
    g = torch.Generator().manual_seed(5)
    p = torch.randint(1, V, (6,), generator=g).tolist()
    replies = [[t] for t in torch.randint(1, V, (4,), generator=g).tolist()] + [[7, 9, 11]]
    prompts = [p] * len(replies)
    packed = pack_replies(prompts, replies, block_size=48, pad=0)
    assert packed.ids.tolist() == [p + [7, 9]]  # the one-token replies add nothing to the row
    only = pack_replies(prompts[:4], replies[:4], block_size=48, pad=0)  # one column a reply: the prompt's last logit
    assert only.ids.tolist() == [p] and only.mask.tolist() == [[1.0]] * 4 and only.col.tolist() == [[0]] * 4
    got = rows_of(packed_logprobs(model, packed, T_SAMPLE), packed.mask)
    ref = copy.deepcopy(model).double()
    at_1 = rows_of(packed_logprobs(model, packed), packed.mask)  # the default temperature is 1
    for a, b, r in zip(got, at_1, replies, strict=True):
        torch.testing.assert_close(a.double(), one_per_reply(ref, p, r), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(b.double(), one_per_reply(ref, p, r, 1.0), atol=2e-5, rtol=1e-5)


def test_the_layout_by_hand():
    """Prompt [1 2 3], replies [4 5 6], [7], [8 9]; then prompt [10 11] with reply [12 13]: by hand."""
    packed = pack_replies([[1, 2, 3]] * 3 + [[10, 11]], [[4, 5, 6], [7], [8, 9], [12, 13]], block_size=8, pad=0)
    assert packed.ids.tolist() == [[1, 2, 3, 4, 5, 8], [10, 11, 12, 0, 0, 0]]
    assert packed.pos.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 0, 0, 0]]
    see = packed.attn_mask[:, 0].int().tolist()
    assert see[0] == [[1, 0, 0, 0, 0, 0],
                      [1, 1, 0, 0, 0, 0],
                      [1, 1, 1, 0, 0, 0],
                      [1, 1, 1, 1, 0, 0],  # reply 1: the prompt and itself
                      [1, 1, 1, 1, 1, 0],
                      [1, 1, 1, 0, 0, 1]]  # reply 3: the prompt and itself, not reply 1
    assert see[1][:3] == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert all(any(r) for r in see[1])  # padding sees something (no all-masked softmax row)
    # the head runs from the earliest prompt end on (column 1): kept column c is row column c + 1
    assert packed.keep == 5
    assert packed.mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    m = packed.mask.bool()
    assert packed.row[m].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert (packed.col[m] + 1).tolist() == [2, 3, 4, 2, 2, 5, 1, 2]
    assert packed.target[m].tolist() == [4, 5, 6, 7, 8, 9, 12, 13]
    assert packed.tokens == 12


def test_a_group_over_the_limit_goes_on_in_a_new_row_starting_with_the_prompt():
    packed = pack_replies([[1, 2]] * 3, [[3, 4, 5], [6, 7, 8], [9, 10]], block_size=6, pad=0)
    assert packed.ids.tolist() == [[1, 2, 3, 4, 6, 7], [1, 2, 9, 0, 0, 0]]
    assert packed.pos.tolist() == [[0, 1, 2, 3, 2, 3], [0, 1, 2, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"^a prompt of 2 tokens and a reply of 6 need 7 positions; the model's "
                       r"context \(block_size\) is 6$"):  # one reply alone does not fit
        pack_replies([[1, 2]], [[3, 4, 5, 6, 7, 8]], block_size=6, pad=0)
    pack_replies([[1, 2]], [[3, 4, 5, 6, 7]], block_size=6, pad=0)  # exactly fits: 2 + 4 tokens
    with pytest.raises(ValueError, match="^every reply needs a prompt of at least one token$"):
        pack_replies([[]], [[3]], block_size=6, pad=0)
    with pytest.raises(ValueError, match="1 prompts for 2 replies"):
        pack_replies([[1, 2]], [[3], [4]], block_size=6, pad=0)
    with pytest.raises(ValueError, match="0 prompts for 0 replies"):
        pack_replies([], [], block_size=6, pad=0)


def test_a_bf16_model_scores_in_float32():
    model = gpt2().to(torch.bfloat16)
    prompts, replies = rollouts()
    got = packed_logprobs(model, pack_replies(prompts, replies, block_size=48, pad=0), T_SAMPLE)
    assert got.dtype == torch.float32  # as token_logprobs: softmax over float32 logits
    ref = copy.deepcopy(model).double()
    for a, p, r in zip(rows_of(got, pack_replies(prompts, replies, 48, 0).mask), prompts, replies, strict=True):
        torch.testing.assert_close(a.double(), one_per_reply(ref, p, r), atol=0.15, rtol=0.05)


def test_tensors_are_on_the_requested_device():
    prompts, replies = rollouts()
    packed = pack_replies(prompts, replies, block_size=48, pad=0, device="meta")
    for name in ("ids", "pos", "attn_mask", "row", "col", "target", "mask"):
        assert getattr(packed, name).device.type == "meta", name


def test_a_grpo_step_runs_its_model_on_one_row_a_group():
    """The step's reference, old and policy forwards each see 2 rows of the 2 groups' 8 replies."""
    from gptforge.config import RLConfig
    from gptforge.training.grpo import grpo_step, rl_config
    from gptforge.training.rollouts import Rollouts

    model = gpt2()
    ref = copy.deepcopy(model)
    seen: list[tuple[int, int]] = []
    for m in (model, ref):
        m.register_forward_pre_hook(lambda mod, args: seen.append(tuple(args[0].shape)))
    cfg = rl_config(model.config, "unused", "")
    cfg.rl = RLConfig(prompts=2, group=4, updates_per_batch=2, kl_coef=0.1)
    cfg.train.micro_batch = 8
    prompts, replies = [[1, 2, 3]] * 4 + [[4, 5]] * 4, [[6, 7], [8], [9, 10, 11], [12]] * 2
    ro = Rollouts([None] * 8, prompts, replies, [""] * 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = grpo_step(model, model, ref, opt, ro, torch.arange(8.0).view(2, 4), cfg, pad=0)
    assert seen == [(2, 6)] * 4  # reference, old, two updates: rows [1 2 3 6 9 10], [4 5 6 9 10 pad]
    assert torch.isfinite(torch.tensor(out["loss"]))
