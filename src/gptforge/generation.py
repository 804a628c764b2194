"""Autoregressive generation with a KV cache: sampling knobs, batches of prompts, token streaming.

Two layers, both iterators, shared by ``gptforge sample``, ``gptforge serve`` and the training
loop's samples:

* :func:`stream_tokens` yields the next token of every row, one step at a time (KV cache, or full
  recomputation with ``use_cache=False`` as the reference the cache is tested against).
* :func:`stream_text` turns those into text deltas per row, with stop sequences, end-of-text and
  UTF-8 characters split across tokens handled, so a streamed page never shows half a character
  or the beginning of a stop sequence.

Prompts of different lengths share one batch by left padding: each row's first real token sits at
position 0 (the model's learned absolute positions), and an attention mask hides the pad slots.
Rows that repeat a prompt (GRPO's group of replies to one problem) share its prefill: each distinct
prompt runs through the model once, and its rows start decoding from copies of its KV cache.

    >>> tokens = generate(model, prompt_ids, max_new_tokens=32, temperature=1.0, top_k=50, seed=42)
    >>> for ev in stream_text(model, enc, ["ROMEO:", "JULIET:"], SamplingParams(seed=1, stop=("\\n\\n",))):
    ...     print(ev.row, ev.text, end="")
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gptforge.errors import UserError


@dataclass
class SamplingParams:
    """What to generate. ``temperature`` 0 means greedy; ``top_k`` 0/None and ``top_p`` 1/None
    switch those filters off; ``repetition_penalty`` 1 is off (CTRL/HF rule: seen tokens' logits are
    divided by it when positive, multiplied when negative)."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # text stop sequences (not included in the output)
    stop_token: int | None = None  # e.g. 50256 <|endoftext|>; ends that row
    # (offset, total): these rows are rows offset.. of a batch of ``total`` split over processes; each
    # row then draws the random number it would draw in the whole batch (RL across ranks = one rank)
    rows: tuple[int, int] | None = None

    def check(self) -> None:
        """Raise ValueError naming the field and the allowed range."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be a finite number >= 0 (0 = greedy)")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r}: must be >= 0 (0 = off)")
        if self.top_p is not None and not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1] (1 = off)")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r}: must be > 0 (1 = off)")
        if any(not s for s in self.stop):
            raise ValueError("stop: stop sequences must be non-empty strings")


class PromptError(UserError, ValueError):
    """A request that cannot run on this model (an id outside its vocabulary, no room in its context);
    the message says what to change. sample/chat print it (exit 2), serve answers 400; raised under any other
    command (eval's generative tasks, bench-generate, RL rollouts, training's samples) it is a UserError, so the
    command line's door prints it as one line, exit 2, instead of a traceback."""


def check_prompt_ids(prompts: Sequence[Sequence[int]], vocab: int) -> None:
    """PromptError naming the first prompt id outside ``vocab`` (a model with a small vocabulary, prompted with
    GPT-2's tokenizer or another larger one): checked where every generation starts (:func:`stream_tokens`), so
    eval's generative tasks, RL rollouts and training's samples say it too, not an IndexError from the
    repetition-penalty table or the embedding."""
    for i, row in enumerate(prompts):
        bad = next((t for t in row if not 0 <= t < vocab), None)
        if bad is not None:
            raise PromptError(f"prompt {i}: token id {bad} is outside this model's vocabulary of {vocab} ids (it was "
                              "not trained with GPT-2's tokenizer); prompt it with ids it knows")


def fit_new_tokens(prompts: Sequence[Sequence[int]], model_cfg, requested: int | None, default: int,
                   flag: str = "max_new_tokens", shorten: str = "shorten it") -> int:
    """How many tokens to generate after ``prompts`` on a model of ``model_cfg``: the one rule for
    sample, chat and serve. A default (``requested`` None) is clamped to the room the context leaves;
    an explicit value that cannot fit is refused, as is a prompt id outside the model's vocabulary
    (an llm.c or custom model with a small vocabulary, prompted with GPT-2's tokenizer). Each refusal carries
    its one piece of advice; ``flag`` and ``shorten`` put it in the caller's words (a chat's prompt is its
    conversation: "start a new conversation"), which the caller passes rather than appending a second."""
    vocab, block = model_cfg.vocab_size, model_cfg.block_size
    check_prompt_ids(prompts, vocab)
    longest = max((len(r) for r in prompts), default=0)
    room = block - longest
    if room < 1:
        raise PromptError(f"the prompt is {longest} tokens; the model's context of {block} leaves no room to "
                          f"generate ({shorten})")
    if requested is None:
        return min(default, room)
    if requested > room:
        raise PromptError(f"prompt ({longest} tokens) + {flag} {requested} exceeds the model's context of {block} "
                          f"tokens; ask for at most {room}")
    return requested


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (B, V), seen (B, V) bool. Same rule as transformers' RepetitionPenaltyLogitsProcessor,
    kept finite: an extreme penalty (1e-300 or 1e300) saturates at the dtype's range instead of
    reaching inf, which would make the softmax NaN."""
    if penalty == 1.0:
        return logits
    big = torch.finfo(logits.dtype).max
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty).clamp(-big, big)
    return torch.where(seen, penalised, logits)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, numerically safe for any finite temperature > 0: relative to each row's
    maximum (so nothing overflows to +inf and the best token stays at 0) and in float64 where the
    temperature would underflow the logits' dtype. As temperature -> 0 this becomes greedy."""
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # <= 0 (the max is finite: logits are clamped)
    if temperature < torch.finfo(logits.dtype).tiny * 2**10:
        return (shifted.double() / temperature).to(logits.dtype)  # -inf for all but the row's maxima
    return shifted / temperature


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-k / the nucleus (smallest set with probability >= top_p) to -inf."""
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        probs = F.softmax(sorted_logits, dim=-1)
        remove = probs.cumsum(dim=-1) - probs >= top_p  # mass before this token already reaches top_p
        remove[..., 0] = False  # the most likely token always stays (a top_p that rounds to 0 in float32)
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits


def _pick(logits: torch.Tensor, p: SamplingParams, seen: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """logits (B, V) -> next tokens (B,)."""
    logits = apply_repetition_penalty(logits.float(), seen, p.repetition_penalty)
    if p.temperature == 0:
        return logits.argmax(dim=-1)
    probs = F.softmax(filter_logits(apply_temperature(logits, p.temperature), p.top_k, p.top_p), dim=-1)
    return sample_from(probs, gen, p.rows)


def sample_from(probs: torch.Tensor, gen: torch.Generator, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """probs (B, V) -> one index per row, drawn with probability probs[b, i] (inverse CDF: one uniform
    per row and a search in the running sum). ``torch.multinomial`` draws an exponential for every
    vocabulary entry instead: on CPU, 50k of them per row were 70% of sampling a batch of replies.
    A zero-probability entry is never drawn: its running sum equals its predecessor's. ``rows``
    (offset, total): draw the uniforms of a ``total``-row batch and use rows offset.. of them."""
    cdf = probs.cumsum(dim=-1)
    offset, total = rows or (0, probs.size(0))
    u = torch.rand(total, 1, generator=gen, device=probs.device, dtype=cdf.dtype)[offset : offset + probs.size(0)]
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.size(-1) - 1)


def _left_pad(prompts: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids (B, T0) and, per slot, the row's pad length (B,)."""
    T0 = max(len(r) for r in prompts)
    pads = torch.tensor([T0 - len(r) for r in prompts], dtype=torch.long, device=device)
    ids = torch.tensor([[0] * (T0 - len(r)) + list(r) for r in prompts], dtype=torch.long, device=device)
    return ids, pads


def _positions_and_mask(pads: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For query slots start..end-1 over key slots 0..end-1: per-row positions (B, T) and the mask
    (B, 1, T, end). A pad query attends only to itself so its softmax is never empty; real queries
    never see pad keys, so each row computes exactly what it would alone."""
    q = torch.arange(start, end, device=pads.device)  # (T,)
    k = torch.arange(end, device=pads.device)  # (Tk,)
    pos = (q[None, :] - pads[:, None]).clamp(min=0)  # (B, T)
    causal = k[None, :] <= q[:, None]  # (T, Tk)
    key_real = k[None, :] >= pads[:, None]  # (B, Tk)
    mask = (causal[None] & key_real[:, None, :]) | (k[None, None, :] == q[None, :, None])
    return pos, mask[:, None]  # (B, T), (B, 1, T, Tk)


def _distinct_rows(prompts: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first, copy): the rows that hold each distinct prompt first, and per row the index into
    ``first`` of its prompt, so ``first[copy]`` names, for every row, a row with the same prompt.
    None when no prompt repeats (nothing to share)."""
    where: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    copy: list[int] = []
    for b, row in enumerate(prompts):
        key = tuple(row)
        if key not in where:
            where[key] = len(first)
            first.append(b)
        copy.append(where[key])
    if len(first) == len(prompts):
        return None
    return (torch.tensor(first, dtype=torch.long, device=device), torch.tensor(copy, dtype=torch.long, device=device))


@torch.no_grad()
def stream_tokens(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, use_cache: bool = True,
    share_prefill: bool = True,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,) on the model's device, ``max_new_tokens`` times.

    ``use_cache=False`` recomputes the whole sequence each step (the reference for the cache).
    With the cache, the prefill runs each distinct prompt once and copies its cache and last logits
    to the rows that repeat it (``share_prefill=False``: every row's own prefill, for benchmarks).
    A private generator seeded with ``params.seed`` keeps sampling reproducible and leaves the
    global RNG alone (so sampling during training never perturbs it).
    """
    params.check()
    if not prompts or any(len(r) == 0 for r in prompts):
        raise ValueError("every prompt needs at least one token (for an empty prompt, use the tokenizer's "
                         "document separator: its eot_token, GPT-2's <|endoftext|> = 50256)")
    check_prompt_ids(prompts, model.config.vocab_size)
    block = model.config.block_size
    longest = max(len(r) for r in prompts)
    if longest + params.max_new_tokens > block:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the model's context of "
            f"{block} tokens"
        )
    model.eval()
    device = model.lm_head.weight.device
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else torch.seed())
    ids, pads = _left_pad(prompts, device)
    B, T0 = ids.shape
    padded = bool(pads.any())
    seen = torch.zeros(B, model.config.vocab_size, dtype=torch.bool, device=device)
    for b, row in enumerate(prompts):  # the prompt counts as seen for the repetition penalty
        seen[b, torch.tensor(list(row), dtype=torch.long, device=device)] = True
    shared = _distinct_rows(prompts, device) if use_cache and share_prefill else None
    cache = None
    if use_cache:  # a shared prefill fills one cache row per distinct prompt, copied to B rows after it
        cache = model.new_kv_cache(B if shared is None else shared[0].numel(), max_len=T0 + params.max_new_tokens)
    out = ids
    step_in = ids
    for step in range(params.max_new_tokens):
        start = out.size(1) - step_in.size(1)
        x, row_pads = step_in, pads
        if step == 0 and shared is not None:
            x, row_pads = ids.index_select(0, shared[0]), pads.index_select(0, shared[0])
        if padded:
            pos, mask = _positions_and_mask(row_pads, start, out.size(1))
            logits, _ = model(x, kv_cache=cache, pos=pos, attn_mask=mask, logits_to_keep=1)
        else:
            logits, _ = model(x, kv_cache=cache, logits_to_keep=1)  # the prefill needs only its last row
        if step == 0 and shared is not None:  # every row takes its prompt's logits and its own copy of the cache
            logits = logits.index_select(0, shared[1])
            cache.take_rows(shared[1])
        nxt = _pick(logits[:, -1, :], params, seen, gen)  # (B,)
        seen[torch.arange(B, device=device), nxt] = True
        out = torch.cat([out, nxt[:, None]], dim=1)
        step_in = nxt[:, None] if use_cache else out
        yield nxt


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    repetition_penalty: float = 1.0,
) -> torch.Tensor:
    """idx (B, T) -> (B, T + max_new_tokens). temperature 0 means greedy."""
    p = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       repetition_penalty=repetition_penalty, seed=seed)
    steps = list(stream_tokens(model, idx.tolist(), p, use_cache=use_cache))
    return torch.cat([idx, torch.stack(steps, dim=1).to(idx.device)], dim=1)


@dataclass
class TextEvent:
    """A piece of one row's output. ``finished`` rows carry ``reason``: stop | eot | length.
    ``tokens``: the ids the row generated since its previous event (the end token included), for
    usage counts and log-probabilities (``serve/openai_api.py``)."""

    row: int
    text: str
    finished: bool = False
    reason: str | None = None
    tokens: tuple[int, ...] = field(default=(), compare=False)


@dataclass
class _RowText:
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    held: str = ""  # decoded text not yet emitted: it might be the start of a stop sequence
    done: bool = False
    n_tokens: int = 0
    pending: list[int] = field(default_factory=list)  # ids since the row's last event

    def take(self) -> tuple[int, ...]:
        out, self.pending = tuple(self.pending), []
        return out


def _emit_safe(held: str, stops: Sequence[str]) -> tuple[str, str]:
    """Split ``held`` into (text safe to emit now, tail that may begin a stop sequence)."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(held)), 0, -1):
            if held.endswith(s[:n]):
                keep = max(keep, n)
                break
    return (held[: len(held) - keep], held[len(held) - keep :]) if keep else (held, "")


def stream_text(
    model: torch.nn.Module, enc, prompts: Sequence[str | Sequence[int]], params: SamplingParams, use_cache: bool = True
) -> Iterator[TextEvent]:
    """Yield text deltas per row as tokens arrive; ends when every row has finished.

    ``enc``: a gptforge tokenizer (:class:`gptforge.data.tokenizer.Tokenizer` or ChatTokenizer), whose
    ``token_bytes`` prints every id the model can emit: one past the vocabulary (an unused padded row, e.g.
    50,304 rows over GPT-2's 50,257) as ``<|id|>``, where tiktoken's bytes lookup raised KeyError. String
    prompts are encoded with <|endoftext|> allowed; an empty prompt becomes [<|endoftext|>].
    """
    eot = enc.eot_token
    piece = enc.token_bytes
    ids = [(enc.encode(p, allowed_special={"<|endoftext|>"}) or [eot]) if isinstance(p, str) else list(p)
           for p in prompts]
    rows = [_RowText() for _ in ids]
    stops = params.stop
    for step, nxt in enumerate(stream_tokens(model, ids, params, use_cache=use_cache)):
        last = step == params.max_new_tokens - 1
        for b, tok in enumerate(nxt.tolist()):
            r = rows[b]
            if r.done:
                continue
            r.n_tokens += 1
            r.pending.append(tok)
            if params.stop_token is not None and tok == params.stop_token:
                r.done = True
                yield TextEvent(b, r.held + r.decoder.decode(b"", final=True), True, "eot", r.take())
                continue
            r.held += r.decoder.decode(piece(tok), final=last)
            hits = [i for i in (r.held.find(s) for s in stops) if i >= 0]
            if hits:
                r.done = True
                yield TextEvent(b, r.held[: min(hits)], True, "stop", r.take())
                continue
            if last:
                r.done = True
                yield TextEvent(b, r.held, True, "length", r.take())
                continue
            now, r.held = _emit_safe(r.held, stops)
            if now:
                yield TextEvent(b, now, tokens=r.take())
        if all(r.done for r in rows):
            return


def complete(model: torch.nn.Module, enc, prompts: Sequence[str | Sequence[int]], params: SamplingParams) -> list[dict]:
    """Whole completions: [{"text", "finish_reason"}] per prompt (non-streaming API and CLI)."""
    texts = [""] * len(prompts)
    reasons: list[str | None] = [None] * len(prompts)
    for ev in stream_text(model, enc, prompts, params):
        texts[ev.row] += ev.text
        if ev.finished:
            reasons[ev.row] = ev.reason
    return [{"text": t, "finish_reason": r} for t, r in zip(texts, reasons, strict=True)]
