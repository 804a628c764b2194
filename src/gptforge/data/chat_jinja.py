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
noncharacters for internal use). Stretches are encoded on their own, so a tokenizer whose
pre-tokenizer prepends a space to each piece (SentencePiece's Metaspace, Llama 2) differs from
transformers after every control id, as ``Tokenizer.encode(allowed_special=...)`` does.

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
import contextvars
import functools
import json
import re
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gptforge.errors import ChatFormatError

MAX_TEMPLATE_BYTES = 256 << 10
DEADLINE_S = 2.0  # per render
MAX_OUTPUT = 16 << 20  # characters of one render
MAX_VALUE = 16 << 20  # characters (or items) of one value the template makes
MAX_MADE = 64 << 20  # characters made by one render in all (values + output pieces, buffered ones too)
MAX_WIDTH = 64 << 10  # an integer argument of a filter or string method (a width, a count)
MAX_INT_BITS = 1 << 16  # an integer the template computes
END_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")

# markers: U+FDD0/U+FDD1 around special text typed in content, U+FDD2/U+FDD3 around generation blocks
OPEN, CLOSE, GEN_OPEN, GEN_CLOSE = "\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3"
_MARKERS = re.compile("[\ufdd0-\ufdd3]")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_DIGITS = re.compile(r"\d+")
_INTERNALS = frozenset({"mro", "func_globals", "func_code", "gi_frame", "gi_code", "cr_frame", "f_globals",
                        "f_locals", "f_builtins", "tb_frame", "im_func", "im_self"})


class _Refused(Exception):
    """A bound was hit inside a render; the renderer turns it into a ChatFormatError naming the template."""


class _Render:
    """The state of one render: its deadline, what it has made so far, whether generation blocks are marked."""

    def __init__(self, track: bool):
        self.deadline = time.monotonic() + DEADLINE_S
        self.made = 0
        self.track = track

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Refused(f"the render ran past its {DEADLINE_S:g} s deadline (a loop that runs for ever or very long)")

    def spend(self, n: int, what: str) -> None:
        if n > MAX_VALUE:
            raise _Refused(f"{what} would make a value of {n:,} characters (at most {MAX_VALUE:,})")
        self.made += n
        if self.made > MAX_MADE:
            raise _Refused(f"the render made more than {MAX_MADE:,} characters in all")


_CURRENT: contextvars.ContextVar[_Render | None] = contextvars.ContextVar("gptforge_chat_render", default=None)


def _tick() -> _Render | None:
    r = _CURRENT.get()
    if r is not None:
        r.tick()
    return r


def _weight(x: Any, limit: int = MAX_VALUE) -> int:
    """About how many characters ``x`` holds: strings by length, containers by their items, all
    the way down; it stops counting past ``limit`` (the caller refuses then)."""
    total, stack = 0, [x]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, (list, tuple)):
            total += len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += len(v)
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, range):
            total += len(v)
        if total > limit:
            break
    return total


def _check_int(v: Any, what: str) -> None:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_WIDTH:
        raise _Refused(f"{what}: argument {v} is too large (at most {MAX_WIDTH:,})")


def _check_format(fmt: str, what: str) -> None:
    for d in _DIGITS.findall(fmt):
        if len(d) > 6 or int(d) > MAX_WIDTH:
            raise _Refused(f"{what}: the format string asks for width {d[:12]} (at most {MAX_WIDTH:,})")


def _estimate_str_method(s: str, name: str, args: tuple, kwargs: dict) -> int:
    """An upper bound of the size of ``s.name(*args, **kwargs)``, before it is made."""
    vals = (*args, *kwargs.values())
    for v in vals:
        _check_int(v, f"str.{name}")
    if name == "join" and args:
        items = args[0] if isinstance(args[0], (list, tuple, str)) else ()
        return _weight(items) + len(s) * len(items)
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        n = s.count(args[0]) if args[0] else len(s) + 1
        return len(s) + n * max(0, len(args[1]) - len(args[0]))
    if name in ("format", "format_map"):
        _check_format(s, f"str.{name}")
        return len(s) + s.count("{") * sum(_weight(v) + len(str(v)) * (not _weight(v)) for v in vals)
    if name == "expandtabs":
        return len(s) * (int(vals[0]) if vals and isinstance(vals[0], int) else 8)
    return len(s) + sum(_weight(v) + (abs(v) if isinstance(v, int) and not isinstance(v, bool) else 0) for v in vals)


def _estimate_filter(name: str, args: tuple, kwargs: dict) -> int:
    """An upper bound of the size of a filter's result, where a filter can make much from little."""
    vals = (*args, *kwargs.values())
    for v in vals:
        _check_int(v, f"filter {name}")
    value = args[0] if args else None
    if name == "tojson":
        indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
        if isinstance(indent, int) and indent > 64:
            raise _Refused(f"filter tojson: indent {indent} is too large (at most 64)")
        return _weight(value) * (4 + (indent if isinstance(indent, int) and indent > 0 else 0))
    if name == "format" and isinstance(value, str):
        _check_format(value, "filter format")
        return len(value) + value.count("%") * sum(_weight(v) + 32 for v in args[1:])
    if name == "indent" and isinstance(value, str):
        width = vals[1] if len(vals) > 1 else 4
        return len(value) + (value.count("\n") + 1) * (width if isinstance(width, int) else len(str(width)))
    if name == "replace" and isinstance(value, str) and len(args) >= 3:
        return _estimate_str_method(value, "replace", tuple(args[1:3]), {})
    if name == "join" and isinstance(value, (list, tuple)):
        sep = args[1] if len(args) > 1 and isinstance(args[1], str) else kwargs.get("d", "")
        return _weight(value) + len(sep if isinstance(sep, str) else "") * len(value)
    if name in ("center", "batch", "slice", "wordcount", "truncate", "wordwrap"):
        return _weight(value) + sum(abs(v) for v in vals if isinstance(v, int) and not isinstance(v, bool))
    return 0


def _guard_filter(name: str, f: Any) -> Any:
    @functools.wraps(f)  # keeps jinja_pass_arg (pass_context, pass_eval_context filters)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        r = _tick()
        if r is None:  # Jinja folding a constant expression while compiling: leave it to the render
            raise nodes.Impossible()
        plain = args[1:] if getattr(f, "jinja_pass_arg", None) else args
        r.spend(_estimate_filter(name, plain, kwargs), f"filter {name}")
        out = f(*args, **kwargs)
        r.spend(_weight(out), f"filter {name}")
        return out

    return guarded


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: the assistant's text. It renders its body
    unchanged; while a render is tracking (``render`` of a template with these markers) the body
    comes wrapped in U+FDD2 ... U+FDD3, which survive buffering in macros and blocks."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark", []), [], [], body).set_lineno(lineno)

    def _mark(self, caller: Any) -> str:
        out = caller()
        r = _CURRENT.get()
        return f"{GEN_OPEN}{out}{GEN_CLOSE}" if r is not None and r.track else out


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore names (no reaching for internals through it)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for k in attrs:
            _Namespace._check(k)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with an underscore ({name!r})")


class _TemplateDict:
    """``dict(...)`` for templates: a plain dict out, nothing else of the type reachable."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' tojson: json.dumps, no HTML escaping."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: Any) -> None:
    raise TemplateError(str(message))


def _strftime_now(fmt: Any) -> str:
    fmt = str(fmt)
    if len(fmt) > 256:
        raise _Refused("strftime_now: format longer than 256 characters")
    _check_format(fmt, "strftime_now")
    return datetime.now().strftime(fmt)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox plus a deadline and size bounds. Loops, ``~`` and every output piece
    are routed through the hooks by rewriting the parsed template (``_parse``)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)

        def hook(attr: str, args: list) -> nodes.Call:
            return nodes.Call(nodes.EnvironmentAttribute(attr), args, [], None, None)

        for node in tree.find_all(nodes.For):
            node.iter = hook("_gf_loop", [node.iter]).set_lineno(node.lineno)
        for node in list(tree.find_all(nodes.Concat)):
            # a Concat becomes a Call whose args are the operands: rewrite it in place
            operands = node.nodes
            node.__class__ = nodes.Call
            node.node, node.args, node.kwargs, node.dyn_args, node.dyn_kwargs = (
                nodes.EnvironmentAttribute("_gf_concat"), operands, [], None, None)
        for node in tree.find_all(nodes.Output):
            node.nodes = [hook("_gf_out", [child]).set_lineno(child.lineno) for child in node.nodes]
        return tree

    # --- the rewritten constructs ---
    def _gf_loop(self, iterable: Any) -> Iterator[Any]:
        for item in iterable:
            _tick()
            yield item

    def _gf_concat(self, *parts: Any) -> str:
        strs = [str(p) for p in parts]
        r = _CURRENT.get()
        if r is not None:
            r.spend(sum(map(len, strs)), "'~'")
        return "".join(strs)

    def _gf_out(self, value: Any) -> Any:
        r = _CURRENT.get()
        if r is not None:
            r.spend(len(value) if isinstance(value, str) else 0, "output")
        return value

    # --- the sandbox's hooks ---
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        r = _tick()
        if r is not None:
            for v in (*args, *kwargs.values()):
                if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
                    raise _Refused(f"a call with a {v.bit_length():,}-bit integer argument")
        out = super().call(__context, __obj, *args, **kwargs)
        if r is not None:
            r.spend(_weight(out), "a call")
        return out

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        """Jinja returns an Undefined that fails only when used; refuse at the access itself."""
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is unsafe")

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        value = super().getattr(obj, attribute)
        if isinstance(obj, str) and callable(value) and isinstance(attribute, str):
            return self._str_method(obj, attribute, value)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        value = super().getitem(obj, argument)
        if isinstance(obj, str) and callable(value) and isinstance(argument, str):
            return self._str_method(obj, argument, value)
        return value

    @staticmethod
    def _str_method(s: str, name: str, method: Any) -> Any:
        def bounded(*args: Any, **kwargs: Any) -> Any:
            r = _tick()
            if r is not None:
                r.spend(_estimate_str_method(s, name, args, kwargs), f"str.{name}")
            return method(*args, **kwargs)

        return bounded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        r = _tick()
        if r is not None:
            r.spend(_binop_size(operator, left, right), f"{operator!r}")
        return super().call_binop(context, operator, left, right)


def _binop_size(op: str, left: Any, right: Any) -> int:
    """The size of ``left op right`` before it is computed; refuses an integer that would be huge."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if op == "**" and is_int(left) and is_int(right) and abs(left) > 1 and right > 0:
        if right * left.bit_length() > MAX_INT_BITS:
            raise _Refused(f"'**' would make an integer of about {right * left.bit_length():,} bits")
        return 0
    if op == "*":
        if is_int(left) and is_int(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise _Refused("'*' would make a huge integer")
            return 0
        seq, n = (left, right) if is_int(right) else (right, left)
        if is_int(n) and isinstance(seq, (str, list, tuple)):
            return _weight(seq) * max(n, 0)
        return 0
    if op == "+":
        if is_int(left) and is_int(right):
            return 0
        return _weight(left) + _weight(right)
    if op == "%" and isinstance(left, str):
        _check_format(left, "'%'")
        return len(left) + left.count("%") * (_weight(right) + 32 * (len(right) if isinstance(right, (tuple, list)) else 1))
    return 0


def _compile(source: str, where: str) -> jinja2.Template:
    """``source`` compiled in the bounded sandbox; a syntax error or a template too large is refused."""
    if not isinstance(source, str):
        raise ChatFormatError(f"{where}: template: expected Jinja text, found {type(source).__name__}")
    if len(source) > MAX_TEMPLATE_BYTES or len(source.encode("utf-8", "surrogatepass")) > MAX_TEMPLATE_BYTES:
        raise ChatFormatError(f"{where}: template: larger than {MAX_TEMPLATE_BYTES // 1024} KiB")
    if _MARKERS.search(source):
        raise ChatFormatError(f"{where}: template: holds U+FDD0..U+FDD3, which gptforge reserves to mark message text")
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {k: _guard_filter(k, f) for k, f in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_Namespace)
    try:
        tree = env.parse(source)
        for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
            attr = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
            if isinstance(attr, str) and (attr.startswith("__") or attr in _INTERNALS):
                raise ChatFormatError(f"{where}: template: line {node.lineno} reaches for Python internals "
                                      f"(.{attr[:40]}); refused")
        return env.from_string(source)
    except TemplateSyntaxError as e:
        raise ChatFormatError(f"{where}: template: Jinja syntax error on line {e.lineno}: {_one_line(e.message)}") from None
    except (TemplateError, RecursionError, MemoryError) as e:
        raise ChatFormatError(f"{where}: template: does not compile: {_one_line(str(e))}") from None


def _one_line(s: Any, n: int = 200) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _plain(x: Any, where: str, depth: int = 0) -> Any:
    """Template data as plain JSON types only (nothing with methods the sandbox does not know)."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    if depth < 32 and isinstance(x, (list, tuple)):
        return [_plain(v, where, depth + 1) for v in x]
    if depth < 32 and isinstance(x, dict):
        return {str(k): _plain(v, where, depth + 1) for k, v in x.items()}
    raise ChatFormatError(f"{where}: a {type(x).__name__} is not template data (strings, numbers, lists, objects)")


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
        self._template = _compile(source, where)
        self._has_generation = bool(_GENERATION_TAG.search(source))
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
            if not isinstance(role, str) or not _ROLE.fullmatch(role):
                raise ChatFormatError(f"message {i}: role {role!r:.40} is not a role name (letters, digits, _ and -)")
            if not isinstance(content, str):
                raise ChatFormatError(f"message {i}: content must be a string, got {type(content).__name__}")
            out.append({"role": role, "content": content})
        return out

    def _mark(self, m: dict[str, str]) -> dict[str, str]:
        content = _MARKERS.sub("", m["content"])
        if self._special_re is not None:
            content = self._special_re.sub(lambda t: f"{OPEN}{t.group(0)}{CLOSE}", content)
        return {"role": m["role"], "content": content}

    def _render(self, msgs: list[dict[str, str]], add_generation_prompt: bool, extra: dict, track: bool) -> str:
        names = self.names
        ctx: dict[str, Any] = {k: v for k, v in (("bos_token", names.get(self.tok.bos_token_id)),
                                                 ("eos_token", names.get(self.tok.eos_token_id))) if v is not None}
        ctx.update(tools=None, documents=None)  # transformers always passes both
        ctx.update(_plain(extra, f"{self.where}: render keyword"))
        ctx.update(messages=msgs, add_generation_prompt=bool(add_generation_prompt))
        state = _Render(track)
        token = _CURRENT.set(state)
        pieces, size = [], 0
        try:
            for piece in self._template.generate(**ctx):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise _Refused(f"the output is larger than {MAX_OUTPUT:,} characters")
                state.tick()
                pieces.append(piece)
        except _Refused as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} refused: {e}") from None
        except SecurityError as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} is unsafe (reaches for Python internals): "
                                  f"{_one_line(e)}") from None
        except TemplateError as e:  # raise_exception, undefined names used wrongly
            raise ChatFormatError(f"{self.where}: template {self.name!r} refuses the conversation: {_one_line(e)}") from None
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
            raise ChatFormatError(f"{self.where}: template {self.name!r} failed: {type(e).__name__}: "
                                  f"{_one_line(e)}") from None
        finally:
            _CURRENT.reset(token)
        return "".join(pieces)

    def _encode(self, clean: str, opens: set[int], closes: set[int], breaks: list[int]
                ) -> tuple[list[int], list[tuple[int, int]], list[tuple[tuple[int, int], int]]]:
        """The rendered text to ids, each id's character range, and the control tokens with theirs.
        A special-token match is a control id unless the markers say it came from a message."""
        ids: list[int] = []
        ranges: list[tuple[int, int]] = []
        control: list[tuple[tuple[int, int], int]] = []
        pos = 0
        matches = self._special_re.finditer(clean) if self._special_re is not None else ()
        for m in matches:
            s, e = m.span()
            if s in opens or e in closes or any(s < p < e for p in breaks):
                continue  # typed in a message: text
            self._encode_stretch(clean, pos, s, ids, ranges)
            tid = self._specials[m.group(0)]
            ids.append(tid)
            ranges.append((s, e))
            control.append(((s, e), tid))
            pos = e
        self._encode_stretch(clean, pos, len(clean), ids, ranges)
        return ids, ranges, control

    def _encode_stretch(self, text: str, a: int, b: int, ids: list[int], ranges: list[tuple[int, int]]) -> None:
        if a >= b:
            return
        stretch = text[a:b]
        got = self.tok.encode_ordinary(stretch)
        ids += got
        ranges += [(a + s, a + e) for s, e in _char_ranges(self.tok, stretch, got)]


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
    for m in _MARKERS.finditer(text):
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


def _char_ranges(tok: Any, text: str, ids: list[int]) -> list[tuple[int, int]]:
    """Each id's character range in ``text`` (a token that splits a character covers all of it).
    From the ids' bytes where they spell ``text`` (byte-level BPE, tiktoken); else from the
    ``tokenizers`` offsets of an HFTokenizer (normalizers, SentencePiece prefixes)."""
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
    plain = getattr(tok, "_plain", None)  # an HFTokenizer's ordinary-text tokenizer: it has offsets
    if plain is not None:
        enc = plain.encode(text, add_special_tokens=False)
        if list(enc.ids) == list(ids):
            return [tuple(o) for o in enc.offsets]
    raise ChatFormatError(f"cannot place the tokens of {text[:40]!r} in the rendered text with the {tok.describe()}")
