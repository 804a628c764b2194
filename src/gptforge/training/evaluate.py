"""What the training loop evaluates besides the loss: tasks every ``eval.every`` steps, and samples.

The glue between a run (its config, metrics log and ranks) and :mod:`gptforge.eval`, which knows
nothing of either.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gptforge.config import Config, ConfigError
from gptforge.eval.run import PreparedTask, check_model_vocab, evaluate, prepare_tasks
from gptforge.eval.tasks import TASKS
from gptforge.eval.tasks.base import EvalDataError
from gptforge.parallel.distributed import DistInfo
from gptforge.run.metrics import MetricsLog
from gptforge.tokens import EOT


def check_tasks(cfg: Config) -> None:
    """``eval.tasks`` names only known tasks (checked when a run starts, before any compute)."""
    unknown = [t for t in cfg.eval.task_names() if t not in TASKS]
    if unknown:
        raise ConfigError(f"eval.tasks={cfg.eval.tasks!r}: unknown task(s) {', '.join(unknown)}; "
                          f"expected comma-separated names from {', '.join(TASKS)}")


def prepare_for_training(cfg, model: torch.nn.Module, log: Callable[[str], None]) -> list[PreparedTask] | None:
    """At start-up of a run with ``eval.every > 0``: check the model can be scored and load the
    tasks, so bad settings or missing data stop the run before any compute. None when off."""
    if not cfg.eval.every:
        return None
    check_tasks(cfg)
    try:
        check_model_vocab(model)
    except EvalDataError as e:
        raise ConfigError(f"eval.every={cfg.eval.every}: {e} (or set --eval.every 0)") from None
    return prepare_tasks(cfg.eval.tasks, cfg.eval.limit or None, log)


def evaluate_during_training(model: torch.nn.Module, prepared: list[PreparedTask], cfg, info, autocast,
                             step: int, tokens: int, metrics, log: Callable[[str], None]) -> dict:
    """Score the raw (uncompiled, unwrapped) model on every rank; rank 0 writes one ``kind: "eval"``
    record per task to metrics.jsonl and a log line."""
    results = evaluate(model, prepared, info.device, autocast, cfg.eval.batch_tokens or None, info.rank, info.world)
    for name, r in results.items():
        metrics.write("eval", step, task=name, tokens=tokens, **r)
    log(f"step {step:>6} | eval " + " | ".join(
        f"{name} acc {r['acc']:.4f}" + (f" acc_norm {r['acc_norm']:.4f}" if "acc_norm" in r else f" ppl {r['ppl']:.1f}")
        + f" (n {r['n']})" for name, r in results.items()))
    return results


# (temperature, top-k) of the in-loop samples: a base model's raw text as `gptforge sample` draws it, a chat
# model's replies as `gptforge chat` does. Each sample line says them: a sampled reply can be wrong ("The larger
# number is 13") where the greedy eval scores 95%, and the reader must know it was sampled.
BASE_SAMPLING = (1.0, 50)
CHAT_SAMPLING = (0.7, 50)


def sampling_words(step: int, temperature: float, top_k: int) -> str:
    """``step 15; sampled at temperature 0.7, top-k 50`` (a greedy reply is `gptforge eval`'s)."""
    return f"step {step}; sampled at temperature {temperature:g}, top-k {top_k}"


def print_samples(model: torch.nn.Module, cfg: Config, info: DistInfo, step: int, metrics: MetricsLog, log,
                  enc=None) -> None:
    """Two samples from the document separator, decoded with the run's tokenizer ``enc``."""
    from gptforge.data.tokenizer import TokenizerUnavailable, gpt2_tokenizer
    from gptforge.generation import generate

    if enc is None:
        if cfg.model.vocab_size < EOT + 1:
            log(f"(no samples: model.vocab_size={cfg.model.vocab_size} is not the GPT-2 vocabulary)")
            return
        try:
            enc = gpt2_tokenizer()
        except TokenizerUnavailable as e:
            log(f"(no samples: {str(e).splitlines()[0]})")
            return
    was_training = model.training
    n = min(cfg.train.sample_tokens, cfg.model.block_size - 1)
    idx = torch.full((2, 1), enc.eot_token, dtype=torch.long, device=info.device)
    t, k = BASE_SAMPLING
    out = generate(model, idx, max_new_tokens=n, temperature=t, top_k=k, seed=cfg.train.seed + step)
    model.train(was_training)
    for i, row in enumerate(out.tolist()):
        text = enc.decode([t for t in row[1:] if t < enc.n_vocab])  # chat tokens (SFT) are not tiktoken's
        log(f"--- sample {i} ({sampling_words(step, *BASE_SAMPLING)})\n{text}")  # raw text, as `gptforge sample`
        metrics.write("sample", step, index=i, text=text, temperature=t, top_k=k)


def print_chat_samples(model: torch.nn.Module, cfg: Config, info: DistInfo, step: int, metrics: MetricsLog, log,
                       template, prompts: list[list[int]], enc=None) -> None:
    """SFT's samples are chat turns: each prompt (a held-out conversation up to its first
    ``<|assistant|>``) rendered as ``user>`` lines, then the reply the model writes, cut at ``<|end|>``."""
    from gptforge.data.chat import ChatTokenizer
    from gptforge.data.tokenizer import TokenizerUnavailable, gpt2_tokenizer
    from gptforge.generation import SamplingParams, complete

    try:
        enc = ChatTokenizer(enc or gpt2_tokenizer(), template)
    except TokenizerUnavailable as e:
        log(f"(no samples: {str(e).splitlines()[0]})")
        return
    was_training = model.training
    for i, ids in enumerate(prompts):
        n = min(cfg.train.sample_tokens, cfg.model.block_size - len(ids))
        if n < 1:
            continue
        t, k = CHAT_SAMPLING
        params = SamplingParams(max_new_tokens=n, temperature=t, top_k=k, seed=cfg.train.seed + step,
                                stop_token=template.end)
        reply = complete(model, enc, [ids], params)[0]["text"].strip()
        turns = "\n".join(f"{role}> {text}" for role, text in chat_turns(ids, template, enc))
        log(f"--- sample {i} ({sampling_words(step, *CHAT_SAMPLING)})\n{turns}\nassistant> {reply}")
        metrics.write("sample", step, index=i, prompt=turns, text=reply, temperature=t, top_k=k)
    model.train(was_training)


def chat_turns(ids: list[int], template, enc) -> list[tuple[str, str]]:
    """(role, text) of each finished turn in rendered chat token ids."""
    if not hasattr(template, "roles"):  # a Jinja template: the prompt as rendered text
        return [("prompt", enc.decode(ids))]
    role_of = {i: r for r, i in template.roles.items()}
    turns, role, body = [], None, []
    for t in ids:
        if t in role_of:
            role, body = role_of[t], []
        elif t == template.end and role is not None:
            turns.append((role, enc.decode(body)))
            role = None
        elif role is not None:
            body.append(t)
    return turns
