"""Templates run in bounded time and memory (issue 56, class 2; ``gptforge.data.jinja_sandbox``).

Every operation that makes a string or a list in the sandbox is bounded by its input before it allocates
(the walk below: each member with a huge result is refused in one line naming the template's source, in
little CPU and memory), and no single operation can outlast the deadline, because the slowest ones are
bounded by input size (the deadline is checked between operations; a C-level call cannot be interrupted,
see the module's comment). The walk goes through two doors: a Hugging Face folder's
``tokenizer_config.json`` and a GGUF's ``tokenizer.chat_template``."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc

import pytest

from gptforge.data import jinja_sandbox as js
from gptforge.data.chat import template_from_tokenizer
from gptforge.data.tokenizer import load_tokenizer
from gptforge.errors import ChatFormatError
from tests.data.test_split_bounds import tokenizer_json

CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]

# member -> (template, what the refusal says). The inputs the templates build first are at most 16 M
# characters (MAX_VALUE) or 8 M list items, so a refusal before the result is made costs the input and
# a counting pass; the results refused here would be 20 M to 1.9 G characters, or lists of 4-16 M items.
WALK = {
    # repetition, '+' and '~' on strings and lists, in one step and grown in a loop
    "string times": ("{{ 'x' * 10**8 }}", "'*' would make"),
    "list times": ("{{ [0] * 10**8 }}", "'*' would make"),
    "string doubling in a loop": ("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(99) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~' would make"),
    "list doubling in a loop": ("{% set ns = namespace(l=[0] * 10000) %}{% for i in range(99) %}"
                                "{% set ns.l = ns.l + ns.l %}{% endfor %}", "'+' would make a list of 80,000 items"),
    # formats and '%'
    "format width": ("{{ '{:>999999999}'.format(1) }}", "width"),
    "format width argument": ("{{ '{0:{1}}'.format('x', '1000000000') }}", "width"),
    "percent width argument": ("{{ '%*s' % (1000000000, 'x') }}", "too large"),
    "format filter": ("{{ '%999999999s' | format('a') }}", "width"),
    # joins
    "str.join": ("{% set s = 'a' * 4000000 %}{{ s.join(s) }}", "str.join would make"),
    "join filter over characters": ("{{ ('x' * 4000000) | join('-') }}", "filter join on 4,000,000 items"),
    # growth of center / indent / wordwrap / replace / escape
    "center": ("{{ 'a' | center(10**9) }}", "too large"),
    "indent": ("{% set s = '\n' * 16000000 %}{{ s | indent(8) }}", "filter indent on a value of more than"),
    "wordwrap": ("{% set s = 'ab ' * 5000000 %}{{ s | wordwrap(5) }}", "filter wordwrap on a value of more than"),
    "replace": ("{% set s = 'a' * 4000000 %}{{ s.replace('a', s) }}", "str.replace would make"),
    "replace filter": ("{% set s = 'a' * 4000000 %}{{ s | replace('a', 'aaaaaa') }}", "would make"),
    "escape": ("{{ ('&' * 12000000) | escape }}", "filter escape would make a value of 60,000,000"),
    # lists made from strings, and item-by-item filters
    "split on whitespace": ("{% set s = 'x ' * 8000000 %}{{ s.split() | length }}", "str.split would make"),
    "splitlines": ("{% set s = '\n' * 16000000 %}{{ s.splitlines() | length }}", "str.splitlines would make"),
    "list of characters": ("{{ ('x' * 16000000) | list | length }}", "filter list on 16,000,000 items"),
    "sort characters": ("{{ ('ba' * 8000000) | sort | length }}", "filter sort on 16,000,000 items"),
    "map": ("{{ ('x' * 100000) | map('upper') | list | length }}", "filter map on 100,000 items"),
    "unique": ("{{ ('ab' * 50000) | unique | list | length }}", "filter unique on 100,000 items"),
    "many keys": ("{{ dict.fromkeys(range(100000), 'x') | length }}", "a value of more than 65,536 items"),
    "list plus list": ("{{ ([0] * 40000 + [1] * 40000) | length }}", "'+' would make a list of 80,000 items"),
    "range": ("{{ range(10**9) | list }}", "Range too big"),  # Jinja's own sandbox: at most 100,000
    # regex and Python-level character walks
    "urlize": ("{{ ('a.b ' * 4000000) | urlize }}", "filter urlize on a value of more than"),
    "title": ("{{ ('a ' * 8000000) | title }}", "filter title on a value of more than"),
    "striptags": ("{{ ('<a>' * 5000000) | striptags }}", "filter striptags on a value of more than"),
    "urlencode": ("{{ ('&' * 16000000) | urlencode }}", "filter urlencode on a value of more than"),
    # containers printed: their repr is estimated before it is made
    # (a list of one 10,000-character string 1,500 times weighs 15 M characters, its repr 90 M)
    "string of a list": ("{{ (['x' * 10000] * 1500) | string | length }}", "filter string would make"),
    "printed list": ("{{ ['x' * 10000] * 1500 }}", "output would make"),
    "printed big integers": ("{% set b = 10**3000 %}{{ ([b] * 5000) | string | length }}", "filter string would make"),
    "list times items": ("{{ ([0, 1] * 40000) | length }}", "'*' would make a list of 80,000 items"),
    # Jinja's lipsum global: a Python loop per word
    "lipsum": ("{{ lipsum(100000) }}", "lipsum: n=100000"),
    "lipsum words": ("{{ lipsum(1, max=10**7) }}", "lipsum: max=10000000"),
}


def render_measured(chat, trace_memory: bool = True) -> tuple[BaseException | None, float, int]:
    """Render ``chat`` on CONV in a thread (an unbounded render fails the test instead of hanging it): what it
    raised, the thread's CPU seconds, the peak of memory allocated meanwhile (0 without ``trace_memory``:
    tracemalloc hooks every allocation, which makes an item-by-item Python filter ~7x slower, sort 0.1 -> 0.64 s
    CPU here, so a CPU bound is measured without it)."""
    out: list = [None, 0.0]

    def run() -> None:
        t0 = time.thread_time()
        try:
            chat.render_text(CONV)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            out[0] = e
        out[1] = time.thread_time() - t0

    if trace_memory:
        tracemalloc.start()
    try:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(30)
        peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
    finally:
        if trace_memory:
            tracemalloc.stop()
    assert not worker.is_alive(), "still rendering after 30 s"
    return out[0], out[1], peak


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    (d / "tokenizer.json").write_text(tokenizer_json(r"\s+|\S+"))
    return d


def hf_door(hf_dir, source: str):
    """The template as a Hugging Face folder brings it: tokenizer_config.json's chat_template."""
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": source, "eos_token": "<|endoftext|>"}))
    return template_from_tokenizer(load_tokenizer(hf_dir)), f"{hf_dir / 'tokenizer_config.json'} (chat_template)"


# The bound of a refusal: the template first builds its input, at most MAX_VALUE characters (16 MiB as one
# byte each; lists hold at most 65,536 items), then counts over it; three times the largest input leaves
# room for a copy or two (a slice, a join's argument) and none for the refused result (20 M characters and
# up). CPU: a few C-level passes over 16 M characters take ~0.1 s; 1 s leaves 10x for a slower or loaded one.
MAX_REFUSAL_BYTES = 3 * js.MAX_VALUE
MAX_REFUSAL_CPU_S = 1.0


@pytest.mark.parametrize("member", sorted(WALK))
def test_each_member_with_a_huge_result_is_refused_before_it_is_made(hf_dir, member):
    source, needle = WALK[member]
    chat, where = hf_door(hf_dir, source)
    error, cpu, peak = render_measured(chat)
    assert isinstance(error, ChatFormatError), repr(error)
    msg = str(error)
    assert msg.startswith(where) and needle in msg and "\n" not in msg, msg
    assert cpu < MAX_REFUSAL_CPU_S, f"{cpu:.2f} s CPU"
    assert peak < MAX_REFUSAL_BYTES, f"{peak / 2**20:.0f} MiB"


# The largest input each operation that walks items or characters in Python accepts, with its worst text
# (measured here: urlize 0.6 us a character, title 0.2, wordwrap 0.3; sort and split C-level): each must take
# well inside the deadline on its own, since nothing can stop it midway. Its CPU time is the measure (the
# render's deadline is wall time, which a loaded machine may spend first: a refusal by the deadline after the
# operation ends is the bound working, not a failure).
AT_THE_BOUND = {
    "urlize": f"{{{{ ('a.b ' * {js.MAX_SLOW_CHARS // 4}) | urlize | length }}}}",
    "title": f"{{{{ ('a ' * {js.MAX_SLOW_CHARS // 2}) | title | length }}}}",
    "wordwrap": f"{{{{ ('ab ' * {js.MAX_SLOW_CHARS // 3}) | wordwrap(5) | length }}}}",
    "striptags": f"{{{{ ('<a>' * {js.MAX_SLOW_CHARS // 3}) | striptags | length }}}}",
    "sort": f"{{{{ ('ba' * {js.MAX_ITEMS // 2}) | sort | length }}}}",
    "split": f"{{{{ ('x ' * {js.MAX_ITEMS // 2}).split() | length }}}}",
    "weigh": f"{{{{ ([0] * {js.MAX_WALK}) | length }}}}",
}


@pytest.mark.parametrize("op", sorted(AT_THE_BOUND))
def test_one_operation_at_its_bound_fits_in_the_deadline(hf_dir, op):
    chat, _ = hf_door(hf_dir, AT_THE_BOUND[op])
    error, cpu, _ = render_measured(chat, trace_memory=False)
    assert error is None or "deadline" in str(error), error
    assert cpu < js.DEADLINE_S / 2, f"{op} at its bound: {cpu:.2f} s CPU, deadline {js.DEADLINE_S} s"


def test_a_gguf_template_is_bounded_and_named(tmp_path):
    """The other door: a GGUF's tokenizer.chat_template, refused naming the file and the key."""
    pytest.importorskip("gguf")
    from gptforge.load import ModelSource, load_chat_template_of, load_tokenizer_of
    from tests.interop.test_gguf_read import rewrite_gguf, tiny_llama, write_gguf

    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    for member in ("sort characters", "printed list", "lipsum", "escape"):
        import gguf

        source, needle = WALK[member]
        path = rewrite_gguf(good, tmp_path / "m.gguf", "tokenizer.chat_template", source, gguf.GGUFValueType.STRING)
        src = ModelSource(gguf=str(path))
        chat = load_chat_template_of(src, load_tokenizer_of(src))
        error, cpu, peak = render_measured(chat)
        assert isinstance(error, ChatFormatError), repr(error)
        msg = str(error)
        assert msg.startswith(f"{path} (tokenizer.chat_template)") and needle in msg and "\n" not in msg, msg
        assert cpu < MAX_REFUSAL_CPU_S and peak < MAX_REFUSAL_BYTES, (member, cpu, peak)
        path.unlink()


def test_ordinary_uses_of_the_bounded_operations_still_render(hf_dir):
    """Each bound refuses only past it: the same operations on ordinary sizes give what Jinja gives."""
    source = ("{{ 'a,b'.split(',') | join('+') }}|{{ 'x\ny'.splitlines() | length }}|{{ ['b', 'a'] | sort | join }}|"
              "{{ [1, 2] | map('string') | join }}|{{ 'see a.b' | urlize | length > 0 }}|{{ 'a b' | title }}|"
              "{{ '<i>x</i>' | striptags }}|{{ 'a&b' | e }}|{{ [1, 'x'] | string }}|{{ [1, 2] }}|{{ lipsum(1, False, 3, 4) | length > 0 }}")
    chat, _ = hf_door(hf_dir, source)
    assert chat.render_text(CONV) == "a+b|2|ab|12|True|A B|x|a&amp;b|[1, 'x']|[1, 2]|True"
