"""Chat format: role and turn tokens, rendering conversations to ids plus a loss mask.

GPT-2's tokenizer has 50,257 tokens; a model built with ``model.pad_vocab true`` has embedding rows
up to 50,304, and rows 50,257.. are never a target in pretraining. The chat template puts its role
and end-of-turn tokens there and raises ``model.vocab_size`` just enough to cover them, so the
weights of a pretrained checkpoint fit unchanged. A conversation renders as::

    <|endoftext|> <|system|> text <|end|> <|user|> text <|end|> <|assistant|> text <|end|> ...

and only the assistant's text and its ``<|end|>`` are trained on (the loss mask). The template is a
plain dict in the checkpoint's meta.json (``"chat_template"``), so sample, chat, serve and eval find
it by themselves, and ``export hf`` writes the equivalent Jinja ``chat_template``.

    >>> t = ChatTemplate.gpt2()
    >>> ids, mask = t.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    >>> t.decode(ids)
    '<|endoftext|><|user|>Hi<|end|><|assistant|>Hello<|end|>'
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gptforge.errors import ChatFormatError  # noqa: F401 (re-exported: callers import it from here)
from gptforge.tokens import EOT as GPT2_EOT  # the bos of every conversation

ROLES = ("system", "user", "assistant")




@dataclass(frozen=True)
class ChatTemplate:
    """Token ids of the roles and the end-of-turn marker, and their printable names."""

    bos: int = GPT2_EOT  # every conversation starts with it (llm.c's document separator)
    roles: dict[str, int] = field(default_factory=lambda: {"system": 50257, "user": 50258, "assistant": 50259})
    end: int = 50260
    name: str = "gptforge-gpt2-chat-v1"

    @classmethod
    def gpt2(cls) -> ChatTemplate:
        return cls()

    # --- identity and serialisation ---------------------------------------------------------------
    @property
    def names(self) -> dict[int, str]:
        """Special id -> the text it prints as."""
        out = {self.bos: "<|endoftext|>", self.end: "<|end|>"}
        out.update({i: f"<|{r}|>" for r, i in self.roles.items()})
        return out

    @property
    def vocab_size(self) -> int:
        """The smallest ``model.vocab_size`` whose logits cover every chat token."""
        return max(self.end, *self.roles.values()) + 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bos": self.bos, "roles": dict(self.roles), "end": self.end}

    @classmethod
    def from_dict(cls, d: Any, where: str = "chat_template", vocab_size: int | None = None) -> ChatTemplate:
        """The one reader of a stored template (a checkpoint's meta.json, the serve/chat page).
        Every id must be an integer in [0, ``vocab_size``) when the model's vocabulary is known, and
        the ids distinct; ``where`` names the file for the message."""
        if not isinstance(d, dict) or not isinstance(d.get("roles"), dict):
            raise ChatFormatError(f"{where}: expected an object with keys bos, roles, end, found {d!r:.120}")
        if set(d["roles"]) != set(ROLES):
            raise ChatFormatError(f"{where}: roles {sorted(map(str, d['roles']))}: expected {', '.join(ROLES)}")
        fields_ = {"bos": d.get("bos"), "end": d.get("end"), **{f"roles.{r}": d["roles"][r] for r in ROLES}}
        bound = f" and below model.vocab_size={vocab_size}" if vocab_size is not None else ""
        for key, v in fields_.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (vocab_size is not None and v >= vocab_size):
                raise ChatFormatError(f"{where}: chat_template.{key}={v!r}: expected a token id, an integer >= 0{bound}; "
                                      "the checkpoint's template is damaged (re-run sft to write a good one)")
        seen: dict[int, str] = {}
        for key, v in fields_.items():
            if v in seen:
                raise ChatFormatError(f"{where}: chat_template.{key}={v} is also chat_template.{seen[v]}; each role "
                                      "and the end marker need their own token")
            seen[v] = key
        name = d.get("name", "custom")
        return cls(bos=d["bos"], roles={r: d["roles"][r] for r in ROLES}, end=d["end"],
                   name=name if isinstance(name, str) else "custom")

    def check_model(self, model_cfg: Any) -> None:
        """Refuse a model whose embedding has no rows for the chat tokens."""
        rows = model_cfg.padded_vocab_size
        if rows < self.vocab_size:
            raise ChatFormatError(
                f"the model has {rows} embedding rows but the chat tokens need {self.vocab_size} "
                f"(ids up to {self.vocab_size - 1}); train the base model with --model.pad_vocab true"
            )

    # --- rendering --------------------------------------------------------------------------------
    def render(self, messages: Sequence[dict[str, Any]], enc: Any = None) -> tuple[list[int], list[int]]:
        """HF-style ``messages`` -> (ids, mask); mask[i] = 1 where ids[i] is a token to train on
        (assistant text and its end marker). Raises ChatFormatError on unknown roles, non-string
        content or a conversation without an assistant turn."""
        enc = enc or _tokenizer()
        ids, mask = [self.bos], [0]
        has_assistant = False
        for i, m in enumerate(messages):
            role, content = _role_content(m, i)
            text_ids = enc.encode_ordinary(content)
            train = 1 if role == "assistant" else 0
            has_assistant |= role == "assistant"
            ids += [self.roles[role], *text_ids, self.end]
            mask += [0, *([train] * len(text_ids)), train]
        if not has_assistant:
            raise ChatFormatError("conversation has no assistant turn (nothing to train on)")
        return ids, mask

    def render_for_generation(self, messages: Sequence[dict[str, Any]], enc: Any = None) -> list[int]:
        """The prompt for the assistant's next reply: the conversation so far, then ``<|assistant|>``."""
        enc = enc or _tokenizer()
        ids = [self.bos]
        for i, m in enumerate(messages):
            role, content = _role_content(m, i)
            ids += [self.roles[role], *enc.encode_ordinary(content), self.end]
        return ids + [self.roles["assistant"]]

    def decode(self, ids: Sequence[int], enc: Any = None) -> str:
        return ChatTokenizer(enc or _tokenizer(), self).decode(ids)

    def jinja(self, mark: str = "") -> str:
        """The same rendering as a Hugging Face ``chat_template`` (Jinja), for ``export hf``. ``mark``: a
        character the template puts inside every ``<|`` of message content, so text typed in a message
        never matches a control token; the exported tokenizer's normalizer deletes it again."""
        n = self.names
        content = f"message['content'] | replace('<|', '<{mark}|')" if mark else "message['content']"
        roles = "".join(
            f"{{% {'if' if k == 0 else 'elif'} message['role'] == '{r}' %}}{{{{ '{n[self.roles[r]]}' }}}}"
            for k, r in enumerate(ROLES)
        ) + "{% endif %}"
        return (
            f"{{{{ '{n[self.bos]}' }}}}{{% for message in messages %}}{roles}"
            f"{{{{ {content} }}}}{{{{ '{n[self.end]}' }}}}{{% endfor %}}"
            f"{{% if add_generation_prompt %}}{{{{ '{n[self.roles['assistant']]}' }}}}{{% endif %}}"
        )


def _role_content(m: Any, i: int) -> tuple[str, str]:
    if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ChatFormatError(f"message {i}: expected an object with 'role' and 'content', got {m!r:.80}")
    role, content = m["role"], m["content"]
    if role not in ROLES:
        raise ChatFormatError(f"message {i}: unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ChatFormatError(f"message {i}: content must be a string, got {type(content).__name__}")
    return role, content


def _tokenizer() -> Any:
    from gptforge.data.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


def plain_tokenizer(enc: Any) -> Any:
    """The tokenizer inside a :class:`ChatTokenizer` (or ``enc`` itself)."""
    return enc.enc if isinstance(enc, ChatTokenizer) else enc


class ChatTokenizer:
    """A tokenizer (:class:`gptforge.data.tokenizer.Tokenizer`) that also decodes the chat ids of
    gptforge's own template (they live on GPT-2's padded rows, not in its ranks). Duck-types what
    :func:`gptforge.generation.stream_text` uses; a Jinja template's tokens are the tokenizer's own
    special tokens, so it needs no wrapper."""

    def __init__(self, enc: Any, template: Any):
        self.enc, self.template = enc, template
        self._names = {i: s.encode() for i, s in template.names.items()}
        self.eot_token = enc.eot_token
        self.n_vocab = enc.n_vocab
        self.special_tokens = getattr(enc, "special_tokens", {})

    def __getattr__(self, name: str) -> Any:  # fingerprint, describe, encode_batch_numpy, ...
        return getattr(self.enc, name)

    def encode(self, text: str, **kw: Any) -> list[int]:
        return self.enc.encode(text, **kw)

    def encode_ordinary(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def token_bytes(self, tok: int) -> bytes:
        """What one id prints as, for every int (the Tokenizer protocol's ``token_bytes``): the template's
        chat tokens by name, the rest as the inner tokenizer prints them (an unused row as ``<|id|>``).
        Defined here, not left to ``__getattr__``, which would hand out the inner one and lose the names."""
        tok = int(tok)
        return self._names[tok] if tok in self._names else self.enc.token_bytes(tok)

    decode_single_token_bytes = token_bytes  # tiktoken's name for it

    def decode(self, ids: Sequence[int]) -> str:
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        return "".join(dec.decode(self.token_bytes(t)) for t in ids) + dec.decode(b"", final=True)


def template_from_meta(meta: dict[str, Any], where: str = "meta.json", tok: Any = None):
    """The chat template a checkpoint's meta.json carries, or None for a base model; its ids are
    checked against the checkpoint's own ``model.vocab_size``. Two kinds: gptforge's own (role ids)
    and a model's Jinja template (``"kind": "jinja"``, rendered with ``tok``, the checkpoint's
    tokenizer)."""
    d = meta.get("chat_template")
    if not d:
        return None
    model = (meta.get("config") or {}).get("model") if isinstance(meta.get("config"), dict) else None
    vocab = model.get("vocab_size") if isinstance(model, dict) else None
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None
    return template_from_dict(d, where=where, vocab_size=vocab, tok=tok)


def template_from_dict(d: Any, where: str = "chat_template", vocab_size: int | None = None, tok: Any = None):
    """The one reader of a stored chat template of either kind."""
    if isinstance(d, dict) and d.get("kind") == "jinja":
        from gptforge.data.chat_jinja import JinjaChatTemplate

        if tok is None:
            from gptforge.data.tokenizer import gpt2_tokenizer

            tok = gpt2_tokenizer()
        return JinjaChatTemplate.from_dict(d, tok, where=where, vocab_size=vocab_size)
    return ChatTemplate.from_dict(d, where=where, vocab_size=vocab_size)


def template_from_tokenizer(tok: Any):
    """The Jinja chat template that came with a tokenizer (a Hugging Face model's, a trained
    tokenizer's ChatML), or None."""
    source = getattr(tok, "chat_template", None)
    if not source:
        return None
    from gptforge.data.chat_jinja import JinjaChatTemplate

    return JinjaChatTemplate(source, tok, name=f"{tok.name}-chat")


def default_template(tok: Any):
    """The template a recipe tunes a base model with when nothing names one: the tokenizer's own,
    else gptforge's for GPT-2's BPE. Another tokenizer without a template is refused: gptforge's role
    ids live on GPT-2's padded rows and mean nothing in another vocabulary."""
    own = template_from_tokenizer(tok)
    if own is not None:
        return own
    if tok is None or getattr(tok, "is_gpt2", True):
        return ChatTemplate.gpt2()
    raise ChatFormatError(f"the model's {tok.describe()} has no chat template, and gptforge's own belongs to GPT-2's "
                          "vocabulary: train the tokenizer with `gptforge tokenizer train` (its ChatML special tokens "
                          "and template come with it) or use a model whose tokenizer_config.json has a chat_template")
