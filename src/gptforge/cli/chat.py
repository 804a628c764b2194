"""``gptforge chat``: talk to a chat (SFT/RL) checkpoint in the terminal.

    gptforge chat --ckpt runs/sft --system "Be brief."
"""

from __future__ import annotations

import argparse

from gptforge.cli.common import (
    DEVICE_HELP,
    CliError,
    add_model_source,
    command_device,
    load,
    model_source,
    text_encoder,
    words,
)

# --- chat ----------------------------------------------------------------------------------------

CHAT_NEW_TOKENS = 128  # default reply cap (clamped to a small model's context)
LINE_MAX = 1 << 20  # characters one message may have: far past any model's context, and stdin is read no further


def read_message(stdin) -> str:
    """One line of ``stdin`` ('' at its end), read no further than LINE_MAX characters: a stdin with no newline
    in sight (/dev/zero, a binary file) held all of itself in memory before the first message was sent."""
    line = stdin.readline(LINE_MAX + 1)
    if len(line) > LINE_MAX and not line.endswith("\n"):
        raise CliError(f"stdin: a line longer than {LINE_MAX:,} characters (no newline in sight: a binary file or a "
                       "device such as /dev/zero?); chat reads one message a line")
    return line

def cmd_chat(args: argparse.Namespace) -> int:
    """Multi-turn chat in the terminal: type a message, watch the reply stream; /reset, /quit."""
    import sys

    from gptforge.data.tokenizer import TokenizerError, check_fits
    from gptforge.errors import ChatFormatError
    from gptforge.generation import PromptError, SamplingParams, fit_new_tokens, stream_text

    source = model_source(args)
    tok, template = words(source)
    if template is None:
        raise CliError(f"{source.describe()[source.given()[0]]} has no chat template: fine-tune it with `gptforge "
                       "sft` (or use `gptforge sample` for a base model)")
    explicit = args.max_new_tokens  # None: the default, shrunk to what a small model's context leaves
    params = SamplingParams(max_new_tokens=CHAT_NEW_TOKENS if explicit is None else explicit, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                            stop_token=template.end)  # a reply ends at <|end|>
    try:
        params.check()
    except ValueError as e:
        raise CliError(f"--{str(e).replace('_', '-')}") from e
    model = load(source).to(command_device(args.device)).eval()
    try:  # the tokenizer read above fits the model's logits
        check_fits(tok, model.config.vocab_size, where=f"the model's vocab_size ({source.given()[0]})")
    except TokenizerError as e:
        raise CliError(str(e)) from None
    enc = text_encoder(tok, template)
    system = [{"role": "system", "content": args.system}] if args.system else []
    try:  # a template (or tokenizer) that cannot render a plain first message is broken: refused before any
        template.render_for_generation([*system, {"role": "user", "content": "Hello"}], enc)  # typing starts
    except (ChatFormatError, TokenizerError) as e:
        raise CliError(str(e)) from None
    history: list[dict[str, str]] = []
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat: type a message; /reset clears the history, /quit (or Ctrl-D) leaves", flush=True)
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = read_message(sys.stdin)
        if not line or line.strip() == "/quit":
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            history = []
            print("(history cleared)", flush=True)
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        block = model.config.block_size
        need = explicit if explicit is not None else min(CHAT_NEW_TOKENS, max(1, block // 4))  # room to keep
        try:  # a message the template refuses (roles, content) or the tokenizer cannot take: said, not fatal
            ids = template.render_for_generation(system + history, enc)
            dropped = 0
            while len(ids) + need > block and len(history) > 1:
                cut = 2 if len(history) > 2 else 1
                history, dropped = history[cut:], dropped + cut  # drop the oldest exchange
                ids = template.render_for_generation(system + history, enc)
            if dropped:
                print(f"(the context of {block} tokens is full: the oldest {dropped} message{'s' * (dropped > 1)} "
                      "left the conversation)", flush=True)
            params.max_new_tokens = fit_new_tokens([ids], model.config, explicit, CHAT_NEW_TOKENS, "--max-new-tokens")
        except (PromptError, ChatFormatError, TokenizerError) as e:
            print(f"(message not sent: {e})", flush=True)
            history.pop()
            continue
        print("assistant> ", end="", flush=True)
        reply = ""
        for ev in stream_text(model, enc, [ids], params):
            reply += ev.text
            print(ev.text, end="", flush=True)
        print(flush=True)
        history.append({"role": "assistant", "content": reply.strip()})


def args_chat(c: argparse.ArgumentParser) -> None:
    c.description = ("Multi-turn chat with streaming replies. Reads messages line by line from stdin (so it can be "
                     "scripted); /reset clears the history, /quit leaves.")
    # a chat checkpoint, or a GGUF / Hugging Face model that brings its chat template; an llm.c file and random
    # weights never carry one, so chat could only refuse them: it does not offer --llmc or --random
    add_model_source(c, without=("--llmc", "--random"))
    c.add_argument("--system", help="system prompt")
    c.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"reply length cap (default {CHAT_NEW_TOKENS}, less where the context is short)")
    c.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    c.add_argument("--top-k", type=int, default=50, help="0 = off")
    c.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]; default off")
    c.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
    c.add_argument("--seed", type=int, default=None, help="sampling seed: the same replies again; default a new one each run")
    c.add_argument("--device", default="auto", help=DEVICE_HELP)
