"""The bounded Jinja sandbox that chat templates render in (data/chat_jinja.py): transformers'
environment and globals, with a wall-clock deadline and size bounds on every value, filter, loop
and output piece; Python internals refused at load and at access. Each refusal is a one-line
:class:`ChatFormatError` naming the template."""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Iterator
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
# The deadline is checked between operations (every loop step, call, attribute, filter, '~' and output
# piece), so it stops many short operations; it cannot stop one long one: a Python thread cannot interrupt a
# C-level call (str.replace, list.sort), SIGALRM reaches the main thread only (serve renders elsewhere), and a
# process per render would cost sft's data prep more than the render. So no single operation may be long:
# every one is bounded by its input before it runs. C-level operations over characters (str methods, json,
# markupsafe's escape) take 1-10 ns a character, 0.2 s at most on MAX_VALUE. Item by item in Python (sort
# with its key, map, select, unique, join, batch, lists made of a string, weighing a value) takes 1-6 us an
# item on a loaded machine, so such a filter takes at most MAX_ITEMS items and a weighed value at most
# MAX_WALK; the filters that walk characters in Python or by regex (wordwrap, urlize, title, striptags,
# indent, wordcount, urlencode: up to 6 us a character) at most MAX_SLOW_CHARS. The longest single operation
# is then ~0.4 s of CPU, and the deadline checked after it ends the render. (A filter that calls back into
# the template per item, map or select with a filter, ticks the deadline at each call.) Chat templates walk
# messages and tools, hundreds of items: the bounds are far above what they do.
MAX_ITEMS = 1 << 16  # items a filter walks one by one in Python, or a str method's list holds
MAX_SLOW_CHARS = 1 << 16  # characters a Python-level or regex filter walks
MAX_WALK = 1 << 16  # items (at any depth) of one value the sandbox weighs; a list made by '*' at most
# filters that run as one C-level call over their input, with a size estimated before (or no larger than it)
_C_FILTERS = frozenset({"abs", "capitalize", "center", "count", "d", "default", "e", "escape", "first", "float",
                        "forceescape", "format", "int", "last", "length", "lower", "replace", "reverse", "round",
                        "safe", "string", "tojson", "trim", "truncate", "upper", "attr", "filesizeformat", "random"})
_CHAR_FILTERS = frozenset({"wordwrap", "urlize", "title", "striptags", "indent", "wordcount", "urlencode"})
_ESCAPED = "&<>'\""  # markupsafe writes each as 4-5 characters
END_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")

# markers: U+FDD0/U+FDD1 around special text typed in content, U+FDD2/U+FDD3 around generation blocks
OPEN, CLOSE, GEN_OPEN, GEN_CLOSE = "\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3"
MARKERS = re.compile("[\ufdd0-\ufdd3]")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_DIGITS = re.compile(r"\d+")
_NESTED_SPEC = re.compile(r"\{[^{}]*:[^{}]*\{")  # a replacement field whose format spec holds another field
_INTERNALS = frozenset({"mro", "func_globals", "func_code", "gi_frame", "gi_code", "cr_frame", "f_globals",
                        "f_locals", "f_builtins", "tb_frame", "im_func", "im_self"})


class Refused(Exception):
    """A bound was hit inside a render; the renderer turns it into a ChatFormatError naming the template."""


class Render:
    """The state of one render: its deadline, what it has made so far, whether generation blocks are marked."""

    def __init__(self, track: bool):
        self.deadline = time.monotonic() + DEADLINE_S
        self.made = 0
        self.track = track

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise Refused(f"the render ran past its {DEADLINE_S:g} s deadline (a loop that runs for ever or very long)")

    def spend(self, n: int, what: str) -> None:
        if n > MAX_VALUE:
            raise Refused(f"{what} would make a value of {n:,} characters (at most {MAX_VALUE:,})")
        self.made += n
        if self.made > MAX_MADE:
            raise Refused(f"the render made more than {MAX_MADE:,} characters in all")


CURRENT_RENDER: contextvars.ContextVar[Render | None] = contextvars.ContextVar("gptforge_chat_render", default=None)


def _tick() -> Render | None:
    r = CURRENT_RENDER.get()
    if r is not None:
        r.tick()
    return r


def _weight(x: Any, limit: int = MAX_VALUE) -> int:
    """About how many characters ``x`` holds: strings by length, containers by their items, all
    the way down; it stops counting past ``limit`` (the caller refuses then). Walking items is Python
    work (1-6 us each on a loaded machine), so a value of more than MAX_WALK items is refused: the walk
    itself must not be the one long operation (an 8 M-item list took 4.8 s to weigh)."""
    total, stack, walked = 0, [x], -1  # the value itself is not one of its items
    while stack:
        v = stack.pop()
        walked += 1
        if walked > MAX_WALK or (isinstance(v, (list, tuple, dict)) and len(v) > MAX_WALK):
            raise Refused(f"a value of more than {MAX_WALK:,} items (at most {MAX_WALK:,}: too many to weigh in "
                           "one step of a render)")
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
        elif isinstance(v, bool) or v is None:
            total += 1
        elif isinstance(v, int):  # printed: its decimal digits (a list of 4,000-digit integers is no small list)
            total += v.bit_length() * 3 // 10 + 1
        elif isinstance(v, float):
            total += 24
        if total > limit:
            break
    return total


def _check_int(v: Any, what: str) -> None:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_WIDTH:
        raise Refused(f"{what}: argument {v} is too large (at most {MAX_WIDTH:,})")


def _check_format(fmt: str, what: str) -> None:
    for d in _DIGITS.findall(fmt):
        if len(d) > 6 or int(d) > MAX_WIDTH:
            raise Refused(f"{what}: the format string asks for width {d[:12]} (at most {MAX_WIDTH:,})")


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
        if _NESTED_SPEC.search(s):  # a spec filled from an argument: '{0:{1}}'.format('x', '1000000000')
            for v in (*vals, *(x for d in vals if isinstance(d, dict) for x in d.values())):
                if isinstance(v, str):
                    _check_format(v, f"str.{name}")
                _check_int(v, f"str.{name}")
        return len(s) + s.count("{") * sum(_weight(v) + len(str(v)) * (not _weight(v)) for v in vals)
    if name in ("split", "rsplit", "splitlines") and len(s) > MAX_ITEMS:
        sep = args[0] if args and isinstance(args[0], str) else kwargs.get("sep")
        if name == "splitlines":
            items = sum(s.count(c) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029") + 1
        elif isinstance(sep, str) and sep:
            items = s.count(sep) + 1
        else:  # on whitespace: at most one item a character
            items = len(s)
        if items > MAX_ITEMS:
            raise Refused(f"str.{name} would make a list of up to {items:,} items (at most {MAX_ITEMS:,})")
    if name == "expandtabs":
        return len(s) * (int(vals[0]) if vals and isinstance(vals[0], int) else 8)
    return len(s) + sum(_weight(v) + (abs(v) if isinstance(v, int) and not isinstance(v, bool) else 0) for v in vals)


def _estimate_filter(name: str, args: tuple, kwargs: dict) -> int:
    """An upper bound of the size of a filter's result, where a filter can make much from little."""
    vals = (*args, *kwargs.values())
    for v in vals:
        _check_int(v, f"filter {name}")
    value = args[0] if args else None
    if name not in _C_FILTERS:
        if name in _CHAR_FILTERS:
            n = _weight(value, MAX_SLOW_CHARS + 1)
            if n > MAX_SLOW_CHARS:
                raise Refused(f"filter {name} on a value of more than {MAX_SLOW_CHARS:,} characters (it walks them "
                               "one by one, too long for one step of a render)")
        else:
            n = len(value) if isinstance(value, (str, list, tuple, dict, range)) else 0
            if n > MAX_ITEMS:
                raise Refused(f"filter {name} on {n:,} items (at most {MAX_ITEMS:,}: it walks them one by one, "
                               "too long for one step of a render)")
    if name in ("e", "escape", "forceescape") and isinstance(value, str):
        return len(value) + 4 * sum(value.count(c) for c in _ESCAPED)
    if name == "string" and not isinstance(value, str):  # a container's repr: quotes, commas, escapes
        return 6 * _weight(value) + 32
    if name == "tojson":
        indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
        if isinstance(indent, int) and indent > 64:
            raise Refused(f"filter tojson: indent {indent} is too large (at most 64)")
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
        r = CURRENT_RENDER.get()
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


def _lipsum(n: Any = 5, html: bool = True, min: Any = 20, max: Any = 100) -> str:  # noqa: A002 - Jinja's names
    """Jinja's ``lipsum`` global, bounded: a Python loop per word, which no deadline check reaches inside
    (lipsum(100000) took 5 s CPU and 45 MB before the size bound refused it)."""
    for what, v in (("n", n), ("min", min), ("max", max)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 1000:
            raise Refused(f"lipsum: {what}={v!r:.20} (an integer from 0 to 1,000)")
    return jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _strftime_now(fmt: Any) -> str:
    fmt = str(fmt)
    if len(fmt) > 256:
        raise Refused("strftime_now: format longer than 256 characters")
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
        r = CURRENT_RENDER.get()
        if r is not None:
            r.spend(sum(map(len, strs)), "'~'")
        return "".join(strs)

    def _gf_out(self, value: Any) -> Any:
        r = CURRENT_RENDER.get()
        if r is not None:  # a container prints as its repr: estimated before Jinja makes it
            r.spend(len(value) if isinstance(value, str) else 6 * _weight(value) + 32, "output")
        return value

    # --- the sandbox's hooks ---
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        r = _tick()
        if r is not None:
            for v in (*args, *kwargs.values()):
                if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
                    raise Refused(f"a call with a {v.bit_length():,}-bit integer argument")
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
            raise Refused(f"'**' would make an integer of about {right * left.bit_length():,} bits")
        return 0
    if op == "*":
        if is_int(left) and is_int(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise Refused("'*' would make a huge integer")
            return 0
        seq, n = (left, right) if is_int(right) else (right, left)
        if is_int(n) and isinstance(seq, (list, tuple)) and len(seq) * n > MAX_WALK:
            raise Refused(f"'*' would make a list of {len(seq) * n:,} items (at most {MAX_WALK:,})")
        if is_int(n) and isinstance(seq, (str, list, tuple)):
            return _weight(seq) * max(n, 0)
        return 0
    if op == "+":
        if is_int(left) and is_int(right):
            return 0
        if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and len(left) + len(right) > MAX_WALK:
            raise Refused(f"'+' would make a list of {len(left) + len(right):,} items (at most {MAX_WALK:,})")
        return _weight(left) + _weight(right)
    if op == "%" and isinstance(left, str):
        _check_format(left, "'%'")
        if "*" in left:  # '%*s' % (1000000000, 'x'): the width is an argument
            for v in right if isinstance(right, (tuple, list)) else (right,):
                _check_int(v, "'%'")
        return len(left) + left.count("%") * (_weight(right) + 32 * (len(right) if isinstance(right, (tuple, list)) else 1))
    return 0


def compile_template(source: str, where: str) -> jinja2.Template:
    """``source`` compiled in the bounded sandbox; a syntax error or a template too large is refused."""
    if not isinstance(source, str):
        raise ChatFormatError(f"{where}: template: expected Jinja text, found {type(source).__name__}")
    if len(source) > MAX_TEMPLATE_BYTES or len(source.encode("utf-8", "surrogatepass")) > MAX_TEMPLATE_BYTES:
        raise ChatFormatError(f"{where}: template: larger than {MAX_TEMPLATE_BYTES // 1024} KiB")
    if MARKERS.search(source):
        raise ChatFormatError(f"{where}: template: holds U+FDD0..U+FDD3, which gptforge reserves to mark message text")
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {k: _guard_filter(k, f) for k, f in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_Namespace, lipsum=_lipsum)
    try:
        tree = env.parse(source)
        for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
            attr = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
            if isinstance(attr, str) and (attr.startswith("__") or attr in _INTERNALS):
                raise ChatFormatError(f"{where}: template: line {node.lineno} reaches for Python internals "
                                      f"(.{attr[:40]}); refused")
        return env.from_string(source)
    except TemplateSyntaxError as e:
        raise ChatFormatError(f"{where}: template: Jinja syntax error on line {e.lineno}: {one_line(e.message)}") from None
    except (TemplateError, RecursionError, MemoryError) as e:
        raise ChatFormatError(f"{where}: template: does not compile: {one_line(str(e))}") from None


def one_line(s: Any, n: int = 200) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def plain_value(x: Any, where: str, depth: int = 0) -> Any:
    """Template data as plain JSON types only (nothing with methods the sandbox does not know)."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    if depth < 32 and isinstance(x, (list, tuple)):
        return [plain_value(v, where, depth + 1) for v in x]
    if depth < 32 and isinstance(x, dict):
        return {str(k): plain_value(v, where, depth + 1) for k, v in x.items()}
    raise ChatFormatError(f"{where}: a {type(x).__name__} is not template data (strings, numbers, lists, objects)")
