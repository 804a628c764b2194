"""How many messages a chat request may hold before any is read (``limits.message_bound``): derived from the chat
template in use, never refusing a conversation that fits.

Both chat routes counted one position a message, where gptforge's template spends two (its role id and
``<|end|>``) and ChatML at least four: a 64-position model took 64 empty messages to validation and rendering that
could never fit 31. The bound is a lower bound on the rendered length, checked here against the real render of
every template on conversations drawn at random, and at its edge on both chat routes: the longest conversation that
fits (measured by rendering it) is answered; for gptforge's template, where the bound is exact, one message more
is refused by its count alone, before any message is validated.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.data.chat import plain_tokenizer, template_from_dict  # noqa: E402
from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from gptforge.serve.limits import MESSAGES_OVER_CONTEXT, message_bound  # noqa: E402
from tests.serve.answering import CHATML, T, answering_model, chatml_bpe  # noqa: E402

BLOCK = 64
EMPTY = {"role": "user", "content": ""}
ROLES = ("system", "user", "assistant")


def _chatml(body: str) -> dict:
    return {"kind": "jinja", "name": "probe", "end": "<|im_end|>", "template": body}


_TURN = "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
_GEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
JINJA = {
    "chatml": CHATML,
    # Qwen's way: a default system turn unless the first message is one (a first system message costs nothing more)
    "default-system": _chatml("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a bot.<|im_end|>"
                              "\\n' }}{% endif %}{% for m in messages %}" + _TURN + "{% endfor %}" + _GEN),
    # Gemma's and Mistral's way: the system text goes into the first user turn, roles must alternate after it; a user
    # turn (no role line) costs less than an assistant's, and comes after one only from the third message on
    "alternating": _chatml(
        "{% set ns = namespace(sys='') %}{% set turns = messages %}{% if messages[0]['role'] == 'system' %}"
        "{% set ns.sys = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}{% endif %}"
        "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{{ '<|im_start|>' + ('' if m['role'] == 'user' else m['role'] + '\\n') + (ns.sys if loop.first else '') + "
        "m['content'] + '<|im_end|>' }}"
        "{% endfor %}" + _GEN),
    # turns of control tokens alone, a user's cheaper than an assistant's, roles in turn from a user: a user message
    # costs two only from the third message on, and a render of empty messages is exactly its count
    "unequal-turns": _chatml(
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate from a user') }}{% endif %}{{ '<|im_start|>' + m['content'] + "
        "('<|im_end|>' if m['role'] == 'user' else '<|im_end|><|im_end|>') }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>' }}{% endif %}"),
    # control tokens alone, one a system message, two a user's, three an assistant's: the cheapest role is the system
    "cheap-system": _chatml("{% for m in messages %}{{ '<|im_start|>' + m['content'] + ({'system': '', 'user': "
                            "'<|im_end|>'}[m['role']] if m['role'] != 'assistant' else '<|im_end|><|im_end|>') }}"
                            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>' }}{% endif %}"),
    # a template whose text around a message has no newline, so a message's text meets the template's on both sides
    "seams": _chatml("{% for m in messages %}{{ '<|im_start|>' + m['role'] + ':' + m['content'] + ' end<|im_end|>' }}"
                     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant:' }}{% endif %}"),
}


@pytest.fixture(scope="module")
def bpe():
    return chatml_bpe()


def _templates(tokenizer, bpe):
    t, tok = bpe
    yield "gptforge", T, plain_tokenizer(tokenizer)
    for name, d in JINJA.items():
        yield name, template_from_dict(d, vocab_size=tok.n_vocab, tok=tok), tok


def _random_conversations(rng: random.Random, n: int):
    words = ["", "a", " ", "\n", "5", "2 + 3", " is", "user", "assistant\n", "<|im_end|>", "\n\n", "zebra", "é", ":"]
    for _ in range(n):
        k = rng.randint(1, 12)
        if rng.random() < 0.5:  # any order of roles
            roles = [rng.choice(ROLES) for _ in range(k)]
        else:  # a system message or not, then user and assistant in turn
            roles = ["system"] * rng.randint(0, 1) + [("user", "assistant")[i % 2] for i in range(k)]
        yield [{"role": r, "content": "".join(rng.choice(words) for _ in range(rng.randint(0, 3)))} for r in roles]


def test_the_bound_is_below_every_real_render(tokenizer, bpe):
    """first + cost * (n - 1) <= the rendered length, for every template and 400 conversations each (roles in any
    order, contents that merge with the template's text); and more than one a message where every role spends more."""
    from gptforge.errors import ChatFormatError

    rng = random.Random(0)
    for name, chat, enc in _templates(tokenizer, bpe):
        bound = message_bound(chat, enc, BLOCK)
        assert bound is not None and bound.cost >= (1 if name == "cheap-system" else 2), (name, bound)
        rendered = 0
        in_turn = [[{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(n)] for n in range(1, 13)]
        alone = [[{"role": r, "content": ""}] for r in ROLES]
        for conv in [*alone, *in_turn, *_random_conversations(rng, 400)]:
            try:
                n_ids = len(chat.render_for_generation(conv, enc))
            except ChatFormatError:  # the template refuses this order of roles
                continue
            rendered += 1
            assert bound.first + bound.cost * (len(conv) - 1) <= n_ids, (name, bound, conv, n_ids)
        assert rendered > 100, name


def test_gptforge_templates_bound_is_exact(tokenizer):
    """Its messages cost two ids each and two more around them: the bound is the real length of empty messages."""
    enc = plain_tokenizer(tokenizer)
    bound = message_bound(T, enc, BLOCK)
    assert (bound.first, bound.cost) == (4, 2)
    fits = [n for n in range(1, BLOCK + 2) if len(T.render_for_generation([EMPTY] * n, enc)) + 1 <= BLOCK]
    assert bound.most == max(fits) == (BLOCK - 3) // 2


def test_chatmls_bound_counts_its_control_tokens_and_each_stretch_of_text(bpe):
    """ChatML's message is <|im_start|>, the role's line with the message's text, <|im_end|> and a newline: four
    things no text shrinks (its real cost is five, "user" and "\\n" two tokens of this BPE); the generation prompt
    is two more (<|im_start|>, "assistant\\n")."""
    _, tok = bpe
    bound = message_bound(template_from_dict(CHATML, vocab_size=tok.n_vocab, tok=tok), tok, BLOCK)
    assert (bound.first, bound.cost, bound.most) == (6, 4, (BLOCK - 1 - 6) // 4 + 1)


def test_a_template_that_can_render_a_message_as_nothing_bounds_no_count(bpe):
    """Empty messages left out (some templates skip them): no count of messages can be refused."""
    _, tok = bpe
    skipping = template_from_dict(_chatml("{% for m in messages %}{% if m['content'] %}" + _TURN + "{% endif %}"
                                          "{% endfor %}" + _GEN), vocab_size=tok.n_vocab, tok=tok)
    assert message_bound(skipping, tok, BLOCK) is None
    assert message_bound(None, tok, BLOCK).most == BLOCK  # no template: one a position (the routes refuse it anyway)


def _post(c, path: str, messages: list) -> tuple[int, str]:
    knob = {"max_tokens": 1} if path.startswith("/v1") else {"max_new_tokens": 1}
    r = c.post(path, json={"messages": messages, "temperature": 0, **knob})
    if r.status_code == 200:
        return 200, ""
    err = r.json()["error"]
    return r.status_code, err["message"] if isinstance(err, dict) else err


def _longest_that_fits(chat, enc, roles_of) -> list:
    """The conversation of empty messages (roles from ``roles_of(i)``) with the most messages whose real render
    leaves the model a position to reply."""
    best = None
    for n in range(1, BLOCK + 1):
        conv = [{"role": roles_of(i), "content": ""} for i in range(n)]
        if len(chat.render_for_generation(conv, enc)) + 1 <= BLOCK:
            best = conv
    return best


@pytest.fixture(scope="module")
def clients(tokenizer, bpe):
    t, tok = bpe
    apps = {"gptforge": (create_app(answering_model(BLOCK), tokenizer, ServeSettings(max_new_tokens_cap=4),
                                    chat_template=T.to_dict()), T, plain_tokenizer(tokenizer)),
            "chatml": (create_app(answering_model(BLOCK, vocab=tok.n_vocab, answer=t.token_to_id("5")), tok,
                                  ServeSettings(max_new_tokens_cap=4), chat_template=CHATML),
                       template_from_dict(CHATML, vocab_size=tok.n_vocab, tok=tok), tok)}
    with TestClient(apps["gptforge"][0]) as a, TestClient(apps["chatml"][0]) as b:
        yield {"gptforge": (a, *apps["gptforge"][1:]), "chatml": (b, *apps["chatml"][1:])}


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("name", ["gptforge", "chatml"])
def test_the_longest_conversation_that_fits_is_answered(clients, name, path):
    c, chat, enc = clients[name]
    for roles_of in (lambda i: "user", lambda i: ("user", "assistant")[i % 2], lambda i: "system"):
        conv = _longest_that_fits(chat, enc, roles_of)
        assert _post(c, path, conv) == (200, ""), (name, len(conv))
        # one message more does not fit: refused (by its count, or by its rendered length)
        got, _ = _post(c, path, [*conv, {"role": roles_of(len(conv)), "content": ""}])
        assert got in (400, 422), (name, len(conv))


@pytest.mark.parametrize("path, status", [("/api/chat", 422), ("/v1/chat/completions", 400)])
def test_one_message_past_gptforge_templates_bound_is_refused_by_its_count(clients, path, status):
    """Messages past the first that no route would take: the refusal is the count alone, the messages unread."""
    c, chat, enc = clients["gptforge"]
    most = (BLOCK - 3) // 2
    assert len(chat.render_for_generation([EMPTY] * (most + 1), enc)) + 1 > BLOCK  # it cannot fit
    refusal = "messages: " + MESSAGES_OVER_CONTEXT.format(max_length=most, positions=BLOCK, cost=2)
    bad = [EMPTY] + [{"role": 5, "content": ""}] * most
    got, message = _post(c, path, bad)
    assert (got, message[:len(refusal)]) == (status, refusal) and "messages.1" not in message, message[:300]
    got, message = _post(c, path, bad[:most])
    assert "messages.1.role" in message, message[:300]  # within the bound, the messages' own errors
