"""Every option of every command says what it does in ``--help`` (issue 55: ``export --dtype`` had no
description, only the default that ``show_defaults`` appends), and help that names what a flag accepts
agrees with what the reader accepts (``--gguf`` said "Llama architecture" and read Qwen2 and GPT-2 too)."""

from __future__ import annotations

import argparse
import re

from gptforge.cli import build_parser


def _options() -> list[tuple[str, str, str | None]]:
    """(command path, option, help) for every command and sub-command of the parser."""
    out = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif path and not isinstance(a, argparse._HelpAction):
                out.append((" ".join(path), max(a.option_strings, key=len) if a.option_strings else f"<{a.dest}>",
                            a.help))

    walk(build_parser(), [])
    return out


def _description(help_: str | None) -> str:
    """The help less the default that show_defaults appends to every option."""
    if help_ in (None, argparse.SUPPRESS):
        return ""
    return re.sub(r"\s*\(?default %\(default\)s\)?$", "", help_).strip()


def test_every_option_has_a_description():
    options = _options()
    assert len(options) > 250 and any(o[:2] == ("export", "--dtype") for o in options)  # the walk reaches them all
    bare = sorted(f"{cmd} {opt}" for cmd, opt, h in options if len(_description(h).split()) < 2)
    assert not bare, f"options whose --help says nothing but a default: {bare}"


def test_the_gguf_help_names_every_architecture_the_reader_takes():
    from gptforge.interop.gguf_config import ARCHITECTURES

    helps = {(cmd, opt): h for cmd, opt, h in _options()}
    for key in [("sample", "--gguf"), ("chat", "--gguf"), ("serve", "--gguf"), ("export", "--gguf"),
                ("eval", "--gguf"), ("import", "<format>")]:
        said = helps[key]
        assert all(re.search(rf"\b{arch}\b", said) for arch in ARCHITECTURES), (key, said)
        assert "Llama architecture" not in said, (key, said)
