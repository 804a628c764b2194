"""A model's own Jinja chat template, rendered as transformers' ``apply_chat_template`` renders it.

:class:`JinjaChatTemplate` has the surface of :class:`gptforge.data.chat.ChatTemplate` (``render``,
``render_for_generation``, ``decode``, ``end``, ``bos``, ``names``, ``vocab_size``, ``to_dict`` /
``from_dict``, ``check_model``, ``jinja``), so sft, rl, chat and serve take either.

Semantics (what ``render_text`` equals): transformers' sandbox, an
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with ``loopcontrols`` and a
``{% generation %}`` tag, its ``tojson`` filter (no HTML escaping), the globals ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace``, and the variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools=None``, ``documents=None`` plus
any extra keyword (plain JSON data only). Messages reach the template as ``{"role", "content"}``
(string content, a role name of letters, digits, ``_`` and ``-``); other keys are not passed.

Ids (``render``): the template's own special-token text becomes control ids; special-token text
typed inside a message stays text. Before rendering, every special-token occurrence inside a
message's content is wrapped in two Unicode noncharacters (U+FDD0 ... U+FDD1); after rendering, a
special-token match that starts at U+FDD0, ends at U+FDD1 or straddles any marker is text, every
other match is a control id, and the stretches between control ids are encoded whole with
``encode_ordinary`` (so ids equal the reference encoding of the rendered text whenever no message
types special text). Content the template transforms (``| trim``, ``split``) keeps its markers, so
no sentinel matching is needed. U+FDD0..U+FDD3 are removed from message content (Unicode reserves
noncharacters for internal use). Stretches are encoded on their own, a stretch after a control id
with ``encode_ordinary_continued``: a SentencePiece Metaspace pre-tokenizer with prepend_scheme
'first' prepends '▁' at the start of the whole input only, as transformers encodes it.

Loss mask (``render``): 1 on the assistant's tokens, every token overlapping an assistant span
(transformers' rule: a token across the header's end and the reply's start, such as ByteLevel's
``"\\n\\n"``, is trained). With ``{% generation %}`` markers in the template the spans are the
generation blocks (as transformers' ``return_assistant_tokens_mask``). Otherwise they come from
prefixes: for each assistant message k, the text between ``render(messages[:k],
add_generation_prompt=True)`` and ``render(messages[:k+1])``, cut after the first stop token the
template writes there: the content and its end-of-turn token are trained, the role header
(``<|im_start|>assistant\\n``) and what follows the end token (ChatML's newline) are not. A
template whose renders are not prefixes of each other is refused (add ``{% generation %}`` markers
to it). Prefixes cost two renders per assistant turn (quadratic in the conversation's length).

Bounds (the issue's "Bad input"): a template is at most 256 KiB and must compile; reaching for
Python internals is refused when it loads (attribute names ``__...``, ``mro``, frame and code
attributes) and at the access itself in a render (the sandbox's SecurityError, raised where Jinja
would hand back an Undefined); every render has a 2 s wall-clock deadline, checked at every call,
attribute, item, operator, filter, loop iteration and output piece; values made by ``*``, ``+``,
``**``, ``%``, ``~``, filters and string methods are bounded (16 Mi characters each, 64 Mi in all,
widths 64 Ki), before they are allocated where the size can be foreseen (a template could still
keep several bounded values alive within the deadline); the output is at most 16 Mi characters.
Each is a one-line :class:`ChatFormatError` naming the template.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

from jinja2.exceptions import SecurityError, TemplateError

from gptforge.data.jinja_sandbox import (
    CLOSE,
    CURRENT_RENDER,
    END_NAMES,
    GEN_OPEN,
    GENERATION_TAG,
    MARKERS,
    MAX_OUTPUT,
    OPEN,
    ROLE,
    Refused,
    Render,
    compile_template,
    one_line,
    plain_value,
)
from gptforge.errors import ChatFormatError


class JinjaChatTemplate:
    """A Jinja chat template plus the tokenizer it renders for; the same surface as ChatTemplate.

    ``end``: the stop token (its text; default the first of ``END_NAMES`` the tokenizer has, else
    its eos). ``where`` names the template's origin (a file, ``meta.json``) in every refusal."""

    kind = "jinja"

    def __init__(self, source: str, tok: Any, name: str = "jinja", end: str | None = None,
                 where: str | None = None):
        if where is None:  # a tokenizer's own template names the file it came with
            own = source == getattr(tok, "chat_template", None)
            where = (getattr(tok, "chat_template_where", None) if own else None) or "chat_template"
        self.source, self.tok, self.name, self.where = source, tok, name, where
        specials: dict[str, int] = dict(tok.special_tokens)
        if end is not None:
            if not isinstance(end, str) or end not in specials:
                raise ChatFormatError(f"{where}: end={end!r:.60} is not a special token of the {tok.describe()} "
                                      f"({', '.join(sorted(specials)) or 'none'})")
            self.end = specials[end]
        else:
            found = next((specials[n] for n in END_NAMES if n in specials), tok.eos_token_id)
            if found is None:
                raise ChatFormatError(f"{where}: end: the {tok.describe()} has no end-of-turn token "
                                      f"({', '.join(END_NAMES)}) and no eos token; name one with end=")
            self.end = found
        eos = tok.eos_token_id
        self.stop_tokens = (self.end,) if eos is None or eos == self.end else (self.end, eos)
        self.bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eot_token
        self.names = {i: s for s, i in specials.items()}
        self.vocab_size = tok.n_vocab
        self._template = compile_template(source, where)
        self._has_generation = bool(GENERATION_TAG.search(source))
        longest_first = sorted(specials, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, longest_first))) if specials else None
        self._specials = specials

    # --- identity and serialisation -------------------------------------------------------------
    def jinja(self) -> str:
        return self.source

    def __reduce__(self) -> tuple:
        """Pickles (a data loader's worker processes) as its source, recompiled on arrival."""
        return (type(self), (self.source, self.tok, self.name, self.names[self.end], self.where))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, JinjaChatTemplate) and (self.source, self.end) == (other.source, other.end)
                and self.tok.fingerprint == other.tok.fingerprint)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking; compare, do not hash

    def __repr__(self) -> str:
        return (f"JinjaChatTemplate(name={self.name!r}, end={self.names[self.end]!r}, "
                f"{len(self.source):,} characters, {self.tok.describe()})")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "jinja", "name": self.name, "template": self.source, "end": self.names[self.end]}

    @classmethod
    def from_dict(cls, d: Any, tok: Any, where: str = "chat_template", vocab_size: int | None = None) -> JinjaChatTemplate:
        """The one reader of a stored Jinja template (a checkpoint's meta.json, a tokenizer bundle):
        bounded, compiled in the sandbox, its ``end`` a special token of ``tok``, and ``tok``'s ids
        within ``vocab_size`` when the model's vocabulary is known."""
        if not isinstance(d, dict):
            raise ChatFormatError(f"{where}: expected an object with keys kind, name, template, end, found {d!r:.120}")
        if d.get("kind", "jinja") != "jinja":
            raise ChatFormatError(f"{where}: chat_template.kind={d.get('kind')!r:.40}: expected 'jinja'")
        source = d.get("template")
        if not isinstance(source, str):
            raise ChatFormatError(f"{where}: chat_template.template: expected Jinja text, found "
                                  f"{type(source).__name__ if source is not None else 'nothing'}")
        end = d.get("end")
        if end is not None and (not isinstance(end, str) or end not in tok.special_tokens):
            raise ChatFormatError(f"{where}: chat_template.end={end!r:.60}: not a special token of the {tok.describe()}")
        if vocab_size is not None and tok.n_vocab > vocab_size:
            raise ChatFormatError(f"{where}: the {tok.describe()} produces ids up to {tok.n_vocab - 1}, beyond "
                                  f"model.vocab_size={vocab_size}; the template's tokenizer does not fit the model")
        name = d.get("name")
        return cls(source, tok, name=name if isinstance(name, str) else "jinja", end=end, where=where)

    def check_model(self, model_cfg: Any) -> None:
        """Refuse a model whose embedding has no row for some id of the tokenizer."""
        rows = model_cfg.padded_vocab_size
        if rows < self.tok.n_vocab:
            raise ChatFormatError(f"the model has {rows} embedding rows but the {self.tok.describe()} produces ids "
                                  f"up to {self.tok.n_vocab - 1}; build the model with --model.vocab_size "
                                  f"{self.tok.n_vocab} or more")

    def decode(self, ids: Sequence[int], enc: Any = None) -> str:
        return self.tok.decode(ids)

    # --- rendering ------------------------------------------------------------------------------
    def render_text(self, messages: Sequence[Any], add_generation_prompt: bool = False, **extra: Any) -> str:
        """The rendered conversation, as transformers' ``apply_chat_template(tokenize=False)``."""
        msgs = self._messages(messages)
        return self._render(msgs, add_generation_prompt, extra, track=False)

    def render(self, messages: Sequence[Any], enc: Any = None) -> tuple[list[int], list[int]]:
        """``messages`` -> (ids, mask): mask[i] = 1 on the assistant's tokens (module docstring).
        ``enc`` is accepted for ChatTemplate's signature; the template's own tokenizer is used."""
        msgs = self._messages(messages)
        if not any(m["role"] == "assistant" for m in msgs):
            raise ChatFormatError("conversation has no assistant turn (nothing to train on)")
        marked = [self._mark(m) for m in msgs]
        text = self._render(marked, False, {}, track=self._has_generation)
        clean, index, opens, closes, breaks, gen = _unmark(text)
        ids, ranges, control = self._encode(clean, opens, closes, breaks)
        spans = gen if self._has_generation else self._reply_spans(marked, text, index, control)
        ends = [e for _, e in ranges]  # ascending: tokens tile the text in order
        mask = [0] * len(ids)
        for a, b in spans:  # every token overlapping a span (transformers' rule)
            i = bisect.bisect_right(ends, a)
            while i < len(ids) and ranges[i][0] < b:
                mask[i] = 1
                i += 1
        if not any(mask):
            raise ChatFormatError(f"{self.where}: template {self.name!r} renders no assistant text for this "
                                  "conversation (nothing to train on)")
        return ids, mask

    def _reply_spans(self, marked: list[dict[str, str]], text: str, index: _Index,
                     control: list[tuple[tuple[int, int], int]]) -> list[tuple[int, int]]:
        """Without generation markers: each assistant reply is what rendering message k adds to the
        prompt for it (``messages[:k]`` plus the generation prompt), up to and including the first
        stop token the template writes there (so ChatML's newline after <|im_end|> is not trained)."""
        spans = []
        for k, m in enumerate(marked):
            if m["role"] != "assistant":
                continue
            p = self._render(marked[:k], True, {}, track=False)
            q = self._render(marked[: k + 1], False, {}, track=False)
            if not (q.startswith(p) and text.startswith(q)):
                raise ChatFormatError(
                    f"{self.where}: template {self.name!r}: the render of messages[:{k}] with the generation "
                    f"prompt is not a prefix of the render of messages[:{k + 1}], nor that of the whole "
                    "conversation, so the assistant's tokens cannot be found; put {% generation %} ... "
                    "{% endgeneration %} around the assistant's text in the template")
            a, b = index[len(p)], index[len(q)]
            stop = next((e for (s, e), t in control if s >= a and e <= b and t in self.stop_tokens), None)
            spans.append((a, stop if stop is not None else b))
        return spans

    def render_for_generation(self, messages: Sequence[Any], enc: Any = None) -> list[int]:
        """The prompt for the assistant's next reply (``add_generation_prompt=True``), content-safe."""
        marked = [self._mark(m) for m in self._messages(messages)]
        clean, _, opens, closes, breaks, _ = _unmark(self._render(marked, True, {}, track=False))
        ids = self._encode(clean, opens, closes, breaks)[0]
        if not ids:  # a model cannot continue nothing; generation would fail later, far from the cause
            raise ChatFormatError(f"{self.where}: template {self.name!r} renders an empty prompt for this "
                                  "conversation; the template is damaged")
        return ids

    # --- pieces ---------------------------------------------------------------------------------
    @staticmethod
    def _messages(messages: Any) -> list[dict[str, str]]:
        if not isinstance(messages, (list, tuple)):
            raise ChatFormatError(f"messages: expected a list of {{'role', 'content'}} objects, got {type(messages).__name__}")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ChatFormatError(f"message {i}: expected an object with 'role' and 'content', got {m!r:.80}")
            role, content = m["role"], m["content"]
            if not isinstance(role, str) or not ROLE.fullmatch(role):
                raise ChatFormatError(f"message {i}: role {role!r:.40} is not a role name (letters, digits, _ and -)")
            if not isinstance(content, str):
                raise ChatFormatError(f"message {i}: content must be a string, got {type(content).__name__}")
            out.append({"role": role, "content": content})
        return out

    def _mark(self, m: dict[str, str]) -> dict[str, str]:
        content = MARKERS.sub("", m["content"])
        if self._special_re is not None:
            content = self._special_re.sub(lambda t: f"{OPEN}{t.group(0)}{CLOSE}", content)
        return {"role": m["role"], "content": content}

    def _render(self, msgs: list[dict[str, str]], add_generation_prompt: bool, extra: dict, track: bool) -> str:
        names = self.names
        ctx: dict[str, Any] = {k: v for k, v in (("bos_token", names.get(self.tok.bos_token_id)),
                                                 ("eos_token", names.get(self.tok.eos_token_id))) if v is not None}
        ctx.update(tools=None, documents=None)  # transformers always passes both
        ctx.update(plain_value(extra, f"{self.where}: render keyword"))
        ctx.update(messages=msgs, add_generation_prompt=bool(add_generation_prompt))
        state = Render(track)
        token = CURRENT_RENDER.set(state)
        pieces, size = [], 0
        try:
            for piece in self._template.generate(**ctx):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise Refused(f"the output is larger than {MAX_OUTPUT:,} characters")
                state.tick()
                pieces.append(piece)
        except Refused as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} refused: {e}") from None
        except SecurityError as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} is unsafe (reaches for Python internals): "
                                  f"{one_line(e)}") from None
        except TemplateError as e:  # raise_exception, undefined names used wrongly
            raise ChatFormatError(f"{self.where}: template {self.name!r} refuses the conversation: {one_line(e)}") from None
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} failed: {type(e).__name__}: "
                                  f"{one_line(e)}") from None
        finally:
            CURRENT_RENDER.reset(token)
        return "".join(pieces)

    def _encode(self, clean: str, opens: set[int], closes: set[int], breaks: list[int]
                ) -> tuple[list[int], list[tuple[int, int]], list[tuple[tuple[int, int], int]]]:
        """The rendered text to ids, each id's character range, and the control tokens with theirs.
        A special-token match is a control id unless the markers say it came from a message."""
        ids: list[int] = []
        ranges: list[tuple[int, int]] = []
        control: list[tuple[tuple[int, int], int]] = []
        pos = 0

        def typed(s: int, e: int) -> bool:  # typed in a message: text
            return s in opens or e in closes or any(s < p < e for p in breaks)

        # each control token with the whitespace its lstrip/rstrip flags take (Phi-3's), as the library takes it
        spans = self.tok.special_spans(clean, self._special_re, typed) if self._special_re is not None else ()
        for a, b, _s, _e, name in spans:
            self._encode_stretch(clean, pos, a, ids, ranges)
            tid = self._specials[name]
            ids.append(tid)
            ranges.append((a, b))
            control.append(((a, b), tid))
            pos = b
        self._encode_stretch(clean, pos, len(clean), ids, ranges)
        return ids, ranges, control

    def _encode_stretch(self, text: str, a: int, b: int, ids: list[int], ranges: list[tuple[int, int]]) -> None:
        if a >= b:
            return
        stretch = text[a:b]  # the input's start, or text after a control id (a Metaspace tokenizer's '▁' differs)
        got = self.tok.encode_ordinary(stretch) if a == 0 else self.tok.encode_ordinary_continued(stretch)
        ids += got
        ranges += [(a + s, a + e) for s, e in _char_ranges(self.tok, stretch, got, continued=a > 0)]


class _Index:
    """Marked position -> clean position (the markers removed before it)."""

    def __init__(self, markers: list[int]):
        self.markers = markers

    def __getitem__(self, i: int) -> int:
        return i - bisect.bisect_left(self.markers, i)


def _unmark(text: str) -> tuple[str, _Index, set[int], set[int], list[int], list[tuple[int, int]]]:
    """Remove the markers: the clean text, the index from marked to clean positions, the clean
    positions of content opens, closes and every content marker, and the generation spans."""
    clean: list[str] = []
    where: list[int] = []  # marked positions of the markers
    opens: set[int] = set()
    closes: set[int] = set()
    breaks: list[int] = []
    gen: list[tuple[int, int]] = []
    gen_start: int | None = None
    last = 0
    for m in MARKERS.finditer(text):
        clean.append(text[last:m.start()])
        pos = m.start() - len(where)  # its clean position
        where.append(m.start())
        c = m.group(0)
        if c == OPEN:
            opens.add(pos)
            breaks.append(pos)
        elif c == CLOSE:
            closes.add(pos)
            breaks.append(pos)
        elif c == GEN_OPEN:
            gen_start = pos
        elif gen_start is not None:
            gen.append((gen_start, pos))
            gen_start = None
        last = m.end()
    clean.append(text[last:])
    return "".join(clean), _Index(where), opens, closes, breaks, gen


def _char_ranges(tok: Any, text: str, ids: list[int], continued: bool = False) -> list[tuple[int, int]]:
    """Each id's character range in ``text`` (a token that splits a character covers all of it).
    From the ids' bytes where they spell ``text`` (byte-level BPE, tiktoken); else from the
    tokenizer's own offsets (``Tokenizer.offsets``: an HFTokenizer's normalizers, SentencePiece prefixes)."""
    raw = text.encode("utf-8", "surrogatepass")
    pieces = [tok.token_bytes(t) for t in ids]
    if b"".join(pieces) == raw:
        char_of = []  # byte offset -> index of the character the byte belongs to
        c = -1
        for byte in raw:
            if byte & 0xC0 != 0x80:
                c += 1
            char_of.append(c)
        char_of.append(c + 1)
        out, b = [], 0
        for n in map(len, pieces):
            s = char_of[b] if b < len(raw) else len(text)
            e_byte = b + n
            e = char_of[e_byte - 1] + 1 if n else s
            out.append((s, e))
            b = e_byte
        return out
    found = tok.offsets(text, ids, continued)  # an HFTokenizer's library knows them
    if found is not None:
        return found
    raise ChatFormatError(f"cannot place the tokens of {text[:40]!r} in the rendered text with the {tok.describe()}")
