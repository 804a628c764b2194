"""Docs that cannot drift: every ``gptforge ...`` command shown in the README's code blocks and in the
package's module docstrings parses with the real command-line parser (flags, subcommands, choices,
and ``--section.key`` override keys), and the README's layout section names every module.

A placeholder value (RUN, CKPT, N) parses like any value; what fails is a flag, a subcommand, a
choice or a config key that does not exist (a doc that names a removed or renamed option).
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
from pathlib import Path

import pytest

import gptforge

ROOT = Path(gptforge.__file__).parent
README = ROOT.parent.parent / "README.md"
# a line that runs gptforge: optional prompt and VAR=value pairs, then gptforge (any path), or `-m gptforge`
CMD = re.compile(r"^(?:\$\s*)?(?:\w+=\S*\s+)*(?:\S*/)?gptforge\s+([a-z][\w-]*.*)$|\s-m\s+gptforge\s+([a-z][\w-]*.*)$")


def _command_lines(text: str) -> list[str]:
    """``gptforge ...`` invocations in ``text``: comments cut, continuations joined, ``[...]`` optional
    parts dropped, pipes and ``&&`` chains split."""
    out = []
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"\s(?:&&|\|\||\||;)\s", line):
            m = CMD.search(part.strip())
            if not m or "python -m gptforge." in part:
                continue
            cmd = re.sub(r"\[[^\]]*\]", " ", m.group(1) or m.group(2)).replace("...", " ")
            out.append(cmd.strip().rstrip("`"))
    return out


def _readme_commands() -> list[tuple[str, str]]:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.S)
    return [("README.md", c) for b in blocks for c in _command_lines(b)]


def _docstring_commands() -> list[tuple[str, str]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc:
                # only indented example lines (commands shown as examples), not prose mentioning a command
                found += [(str(path.relative_to(ROOT)), c) for c in _command_lines(
                    "\n".join(x for x in doc.splitlines() if x.startswith("    ")))]
    return found


COMMANDS = _readme_commands() + _docstring_commands()


def test_docs_show_commands():
    """The extraction finds the commands (a test that parses nothing proves nothing)."""
    readme = [c for w, c in COMMANDS if w == "README.md"]
    assert len(readme) > 40 and any(c.startswith("train ") for c in readme)
    assert any(c.startswith("rl ") for w, c in COMMANDS if w != "README.md")


@functools.cache
def _keys() -> frozenset[str]:
    """Every --section.key of every model family."""
    from gptforge.config import Config, config_keys
    from gptforge.models.registry import FAMILIES

    return frozenset(k for fam in FAMILIES.values() for k in config_keys(Config(model=fam.config_cls())))


@pytest.mark.parametrize("where,line", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_parses(where, line):
    from gptforge.cli import COMMANDS as TABLE
    from gptforge.cli import build_parser

    try:
        argv = shlex.split(line)
    except ValueError as e:
        pytest.fail(f"{where}: cannot split {line!r}: {e}")
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `gptforge {line}` does not parse")
    if not rest:
        return
    assert TABLE[args.command][1], f"{where}: `gptforge {line}`: {args.command} takes no {rest}"
    for tok in rest:
        if tok.startswith("--"):
            key = tok[2:].split("=", 1)[0]
            assert key in _keys(), f"{where}: `gptforge {line}`: no config key --{key}"


def test_readme_layout_names_every_module():
    text = README.read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[: layout.index("\n## ", 5)]
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" or path.name == "__main__.py":
            if path.parent != ROOT and f"{path.parent.name}/" not in layout:
                missing.append(str(rel.parent) + "/")
            continue
        if path.name not in layout and path.stem not in layout:
            missing.append(str(rel))
    assert not missing, "README's layout section does not name: " + ", ".join(missing)


def test_mutation_lanes_point_at_real_files_and_the_docs_name_every_lane():
    """scripts/mutation.sh's lanes (pyproject's [tool.gptforge-mutation.*]): every file a lane mutates or
    runs exists (a renamed test file would silently drop from the lane: mutmut runs what it finds), and the
    README's and the script's lists of lanes are the lanes there are."""
    import tomllib

    repo = README.parent
    lanes = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["gptforge-mutation"]
    for name, lane in lanes.items():
        for path in [*lane["mutate"], *(t for t in lane["tests"] if t.endswith(".py"))]:
            assert (repo / path).is_file(), f"pyproject.toml: mutation lane {name!r} names {path}, which does not exist"
    for doc in (README, repo / "scripts" / "mutation.sh"):
        (listed,) = re.findall(r"# one lane: ([\w -]+)$", doc.read_text(), flags=re.M)
        assert sorted(listed.split()) == sorted(lanes), f"{doc.name}: lanes listed {listed.split()}, there are {sorted(lanes)}"
