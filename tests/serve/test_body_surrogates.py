"""``loads_body`` finds lone surrogates on the body's text, not by re-serialising what it parsed: every body here
is judged against that older mechanism (json.loads, then json.dumps(ensure_ascii=False) encoded as UTF-8, which
fails exactly where a parsed string holds a surrogate with no partner), written out in the test.

The bodies are built from the pieces that decide it: escaped high and low surrogates in either hex case, in keys
and values, paired, reversed, doubled; escaped backslashes before them (``"\\\\ud800"`` is a backslash and the text
``ud800``; ``"\\\\\\ud800"`` a backslash and a lone surrogate); other escapes; raw surrogates in the bytes (CESU-8
style, as json.loads decodes them with surrogatepass); UTF-16 bodies.
"""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("fastapi")

from gptforge.serve.openai_schema import BodyError, loads_body  # noqa: E402

PIECES = ["a", "\\ud800", "\\uDBFF", "\\udc00", "\\uDFFF", "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\ude00\\ud83d",
          "\\\\", "\\\\ud800", "\\\\\\ud800", "\\\\\\\\ud800", "\\n", "\\\"", "\\/", "\\u00e9", "\\uD7FF", "\\uE000",
          "\u00e9", "\U0001F600", "ud800", "\\u0075d800"]
RAW_SURROGATE = "\ud800".encode("utf-8", "surrogatepass")  # ED A0 80: a surrogate typed raw


def _old_verdict(raw: bytes) -> int | None:
    """The code of the lone surrogate the re-serialising check refused, or None when it took the body."""
    data = json.loads(raw)
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return ord(e.object[e.start])
    return None


def _new_verdict(raw: bytes) -> int | None:
    try:
        loads_body(raw)
    except BodyError as e:
        assert e.msg.startswith("the body holds an unpaired surrogate (\\u"), e.msg
        return int(e.msg.split("\\u")[1][:4], 16)
    return None


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 4)))


def _bodies(n: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(n):
        key, value, other = _string(rng), _string(rng), _string(rng)
        yield f'{{"{key}x": "{value}", "list": ["{other}", 1]}}'.encode()


def test_the_text_scan_refuses_exactly_what_re_serialising_refused():
    cases = list(_bodies(3000))
    cases += [b'{"a": "\\\\ud800"}', b'{"a": "\\\\\\ud800"}', b'{"\\udc00": 1}', b'["\\ud800\\ud800\\udc00"]',
              b'["\\ud800\\udc00\\udc00"]', b'"\\uD800\\uDc00"', b'"\\ud800"', b"[1]", b"",
              b'{"a": "x' + RAW_SURROGATE + b'"}', b'{"' + RAW_SURROGATE + b'": 1}',
              b'["' + "\U0001F600".encode("utf-16-be").decode("latin-1").encode("latin-1") + b'"]',
              '{"a": "\\ud800 \u00e9"}'.encode("utf-16"), '{"a": "\\ud83d\\ude00 \u00e9"}'.encode("utf-16-le")]
    refused = 0
    for raw in cases:
        try:
            old = _old_verdict(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # malformed either way (the CESU-8-looking latin-1 case among them)
        assert _new_verdict(raw) == old, raw
        refused += old is not None
    assert 300 < refused < len(cases) - 300  # both verdicts well represented
