"""What ``--help-config`` prints: every config key, its allowed values, its value and one line on what
it does, taken from the comment beside (or just above) the field in its dataclass.

    gptforge train --preset tiny --help-config

The descriptions live once, as comments next to the fields they describe (``config.py``, the model
families' config classes); this module reads them from the source with ``ast`` and ``tokenize``, so
a new field documents itself by being written the way every other field is. A field without a
comment shows as undocumented (tests/test_config_help.py keeps that list empty).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any, Literal

UNDOCUMENTED = "(undocumented)"


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """field name -> its comment: the one on the field's line(s), else the comment block right above."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen install): the keys still list, without text
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out = {}
    body = ast.parse(source).body[0].body  # the class's statements
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        if not text:  # a block of comment-only lines directly above
            n = node.lineno - 1
            while n >= 1 and n in comments and lines[n - 1].lstrip().startswith("#"):
                text.insert(0, comments[n])
                n -= 1
        if text:
            out[node.target.id] = " ".join(text)
    return out


def allowed(tp: Any) -> str:
    """A type as a user writes its values: ``off | shards | documents``, ``bool or auto``, ``int``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return f"{allowed(inner)} or auto"
    if origin is Literal:
        return " | ".join(map(str, args))
    if tp is bool:
        return "true | false"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def describe_keys(cfg: Any = None) -> str:
    """Every key with its allowed values, its value in ``cfg`` (the defaults when None) and one line
    of description (wrapped under it)."""
    from gptforge.config import Config, config_keys, section_types

    cfg = cfg or Config()
    lines = []
    for key, tp in config_keys(cfg).items():
        section, name = key.split(".", 1)
        sec = getattr(cfg, section)
        cls = type(sec) if section == "model" else section_types()[section]
        doc = field_descriptions(cls).get(name, UNDOCUMENTED)
        lines.append(f"  --{key:<28} {allowed(tp):<40} default {getattr(sec, name)!r}")
        lines += textwrap.wrap(doc, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def field_descriptions(cls: type) -> dict[str, str]:
    """Comments of ``cls`` and of the dataclasses it inherits from (a family's config may extend another)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(field_comments(base))
    return out
