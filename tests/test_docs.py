"""Docs that cannot drift, tested like code: every ``gptforge ...`` command shown in the README's and the
guides' (docs/*.md) code blocks and in the package's module docstrings parses with the real command-line
parser (flags, subcommands, choices, and ``--section.key`` override keys); every relative link and anchor
resolves; the pages stay short (README 300 lines, a guide 700, benchmarks 1,500); no two guides write the
same output path, each writes only into git-ignored folders, and a ``.jsonl`` a guide trains on is one it
writes itself; docs/config.md is what ``python -m gptforge.config_doc`` writes from the code; the
development guide's layout names every module.

A placeholder value (RUN, CKPT, N) parses like any value; what fails is a flag, a subcommand, a choice or
a config key that does not exist (a doc that names a removed or renamed option).
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
from pathlib import Path

import pytest

import gptforge

ROOT = Path(gptforge.__file__).parent
REPO = ROOT.parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
GUIDES = sorted(DOCS.glob("*.md"))
PAGES = [README, *GUIDES]
DEVELOPMENT = DOCS / "development.md"
MAX_LINES = {"README.md": 300, "benchmarks.md": 1500}  # every other page: GUIDE_LINES
GUIDE_LINES = 700
# a line that runs gptforge: optional prompt and VAR=value pairs, then gptforge (any path), or `-m gptforge`
CMD = re.compile(r"^(?:\$\s*)?(?:\w+=\S*\s+)*(?:\S*/)?gptforge\s+([a-z][\w-]*.*)$|\s-m\s+gptforge\s+([a-z][\w-]*.*)$")
FENCE = re.compile(r"^[ \t]*```([\w-]*)\n(.*?)^[ \t]*```", flags=re.S | re.M)  # fences inside list items too


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


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


def _page_blocks(path: Path) -> list[str]:
    """The code a page shows to be run: its ```bash / ```sh blocks whole, and from its ```text blocks
    (what commands print) only the lines that show a command being typed (``$ gptforge ...``)."""
    out = []
    for lang, body in FENCE.findall(path.read_text()):
        if lang in ("bash", "sh", "shell", ""):
            out.append(body)
        elif lang in ("text", "console"):
            out.append("\n".join(ln for ln in body.splitlines() if ln.startswith("$ ")))
    return out


def _page_commands(path: Path) -> list[str]:
    return [c for b in _page_blocks(path) for c in _command_lines(b)]


def _readme_commands() -> list[tuple[str, str]]:
    return [(_rel(p), c) for p in PAGES for c in _page_commands(p)]


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


JOURNEYS = ["pretraining", "tokenizers", "chat", "preferences", "own-model", "serving", "scale-out", "fast-recipe",
            "evaluation"]


def test_docs_show_commands():
    """The extraction finds the commands (a test that parses nothing proves nothing): the README's tour, and
    every journey guide's."""
    found = {w for w, _ in COMMANDS}
    assert "README.md" in found and any(c.startswith("sample ") for w, c in COMMANDS if w == "README.md")
    missing = [g for g in JOURNEYS if f"docs/{g}.md" not in found]
    assert not missing, f"guides with no gptforge command found: {missing}"
    assert len([c for w, c in COMMANDS if w.startswith("docs/")]) > 100
    assert any(c.startswith("rl ") for w, c in COMMANDS if w.endswith(".py"))


@functools.cache
def _keys() -> frozenset[str]:
    """Every --section.key of every model family."""
    from gptforge.config import Config, config_keys
    from gptforge.models.registry import FAMILIES

    return frozenset(k for fam in FAMILIES.values() for k in config_keys(Config(model=fam.config_cls())))


def _exact_flags(parser: argparse.ArgumentParser) -> None:
    """argparse takes an abbreviation of a long flag (``--seed`` for ``--seeds``), so a guide's truncated or
    stale flag would parse as another: the docs' parse checks take every flag as spelled, here and in every
    sub-command's parser."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _exact_flags(sub)


@pytest.mark.parametrize("where,line", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_parses(where, line):
    from gptforge.cli import COMMANDS as TABLE
    from gptforge.cli import build_parser

    try:
        argv = shlex.split(line)
    except ValueError as e:
        pytest.fail(f"{where}: cannot split {line!r}: {e}")
    parser = build_parser()
    _exact_flags(parser)
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


def test_layout_names_every_module():
    text = DEVELOPMENT.read_text()
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
    assert not missing, "docs/development.md's layout section does not name: " + ", ".join(missing)


def test_mutation_lanes_point_at_real_files_and_the_docs_name_every_lane():
    """scripts/mutation.sh's lanes (pyproject's [tool.gptforge-mutation.*]): every file a lane mutates or
    runs exists (a renamed test file would silently drop from the lane: mutmut runs what it finds), and the
    development guide's and the script's lists of lanes are the lanes there are."""
    import tomllib

    repo = REPO
    lanes = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["gptforge-mutation"]
    for name, lane in lanes.items():
        for path in [*lane["mutate"], *(t for t in lane["tests"] if t.endswith(".py"))]:
            assert (repo / path).is_file(), f"pyproject.toml: mutation lane {name!r} names {path}, which does not exist"
    for doc in (DEVELOPMENT, repo / "scripts" / "mutation.sh"):
        (listed,) = re.findall(r"# one lane: ([\w -]+)$", doc.read_text(), flags=re.M)
        assert sorted(listed.split()) == sorted(lanes), f"{doc.name}: lanes listed {listed.split()}, there are {sorted(lanes)}"


# --- pages: length, links and anchors, the generated reference -----------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_page_is_short_enough(page):
    """A front page a newcomer reads to the end, guides that each hold one journey, benchmarks that hold
    what is true now (superseded runs live in git, not on the page)."""
    limit = MAX_LINES.get(page.name, GUIDE_LINES)
    n = len(page.read_text().splitlines())
    assert n <= limit, f"{_rel(page)} has {n} lines; at most {limit}: move material to the guide it belongs in"


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (a heading or a link shown as code is not one)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a page has: its headings (a repeated one as GitHub numbers it, ``-1``, ``-2``) and its
    ``<a id="...">`` tags."""
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text()))


def test_slug_is_githubs():
    """The anchors the link check expects are the ones GitHub makes (hand-written from its rendering)."""
    assert slug("Throughput on Hopper against llm.c") == "throughput-on-hopper-against-llmc"
    assert slug("Tokens to target: `gptforge race`") == "tokens-to-target-gptforge-race"
    assert slug("Model families: GPT-2 and Llama") == "model-families-gpt-2-and-llama"
    assert slug("OpenAI-compatible API (`/v1`)") == "openai-compatible-api-v1"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_and_anchor_resolves(page):
    links = _links(page)
    bad = []
    for link in links:
        if re.match(r"[a-z]+:", link):  # https:, mailto: - not checked offline
            continue
        target, _, anchor = link.partition("#")
        dest = (page.parent / target).resolve() if target else page
        if not dest.exists():
            bad.append(f"{link}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{link}: {_rel(dest)} has no heading or <a id> with anchor #{anchor}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


def test_links_are_found():
    """The link walk sees links (README -> every guide, guides -> each other and to anchors)."""
    readme = _links(README)
    assert {f"docs/{g.name}" for g in GUIDES} <= {x.partition("#")[0] for x in readme}
    assert any("#" in x and not x.startswith("http") for g in GUIDES for x in _links(g))


def test_config_reference_is_generated_from_the_code():
    """docs/config.md is what ``python -m gptforge.config_doc`` writes now: a new key, a changed default or
    a changed comment fails here until the page is regenerated."""
    from gptforge.config import config_keys
    from gptforge.config_doc import render, target

    assert target() == DOCS / "config.md"
    text = render()
    assert (DOCS / "config.md").read_text() == text, "docs/config.md is out of date: run python -m gptforge.config_doc"
    rows = re.findall(r"^\| `--([\w.]+)` \|", text, flags=re.M)
    assert set(config_keys()) <= set(rows), set(config_keys()) - set(rows)  # every key of the default family
    assert "model.n_kv_head" in rows and "(undocumented)" not in text  # the Llama family's keys too


def test_config_doc_check_mode(monkeypatch, tmp_path, capsys):
    """``python -m gptforge.config_doc --check`` exits 0 on the committed page and 1 on a stale one (what a
    pre-commit hook or CI step can run); any other argument is a usage error, exit 2."""
    from gptforge import config_doc

    assert config_doc.main(["--check"]) == 0
    stale = tmp_path / "config.md"
    stale.write_text((DOCS / "config.md").read_text().replace("transformer blocks", "blocks"))
    monkeypatch.setattr(config_doc, "target", lambda: stale)
    assert config_doc.main(["--check"]) == 1 and "out of date" in capsys.readouterr().err
    assert config_doc.main(["--bogus"]) == 2
    assert config_doc.main([]) == 0 and stale.read_text() == config_doc.render()  # rewrites it


# --- journeys: each writes its own files, into ignored folders ---------------------------------------------

WRITES = ("--out", "--json", "--image")  # flags whose value is a path the command writes
# the pages a reader follows; benchmarks.md records how each number was measured (runs in scratch folders)
JOURNEY_PAGES = [p for p in PAGES if p.name != "benchmarks.md"]


def _shell_writes(block: str) -> list[str]:
    """Paths a ```bash block writes with a shell redirection (``> FILE``)."""
    return re.findall(r"(?:^|\s)>\s*([\w./-]+)", re.sub(r"#.*", "", block), flags=re.M)


def _flag_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    out = []
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if name in flags:
            out.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
    return out


def _writes_and_reads(page: Path) -> tuple[set[str], set[str]]:
    """(paths the page's commands write, local ``.jsonl`` files they read with ``--data``)."""
    writes, reads = set(), set()
    for block in _page_blocks(page):
        writes |= set(_shell_writes(block))
        for cmd in _command_lines(block):
            argv = shlex.split(cmd)
            writes |= set(_flag_values(argv, WRITES))
            reads |= {v for v in _flag_values(argv, ("--data",)) if v.endswith(".jsonl")}
    return {str(Path(w)) for w in writes if w}, {str(Path(r)) for r in reads}


def _ignored_roots() -> set[str]:
    """Top-level folders .gitignore ignores whole (``/runs/``, ``data/``)."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    return {m.group(1) for ln in lines if (m := re.fullmatch(r"/?([\w.-]+)/", ln.strip()))}


def test_journeys_write_their_own_files_into_ignored_folders():
    """No two pages write the same path (or one inside another's): a chained ``sft`` once trained on the
    other journey's ``conv.jsonl``. Every written path is inside a git-ignored top-level folder, never the
    repository root. A ``.jsonl`` a page trains on is one it writes itself."""
    owner: dict[str, str] = {}
    ignored = _ignored_roots()
    problems = []
    for page in JOURNEY_PAGES:
        writes, reads = _writes_and_reads(page)
        for w in sorted(writes):
            parts = Path(w).parts
            if len(parts) < 2 or parts[0] not in ignored:
                problems.append(f"{_rel(page)} writes {w}: not inside a git-ignored folder ({sorted(ignored)})")
            for other, who in owner.items():
                if who != _rel(page) and (w == other or w.startswith(other + "/") or other.startswith(w + "/")):
                    problems.append(f"{_rel(page)} and {who} both write {w if len(w) > len(other) else other}")
        for w in writes:
            owner.setdefault(w, _rel(page))
        for r in sorted(reads - writes):
            problems.append(f"{_rel(page)} trains on {r}, which it does not write (another journey's file?)")
    assert not problems, "\n".join(problems)


def test_the_journey_walk_sees_the_writes():
    """The walk finds what the guides write (an empty walk would pass anything)."""
    chat_writes, chat_reads = _writes_and_reads(DOCS / "chat.md")
    assert {"runs/chat/conv.jsonl", "runs/chat/sft", "runs/chat/rl"} <= chat_writes
    assert chat_reads == {"runs/chat/conv.jsonl"}
    own_writes, _ = _writes_and_reads(DOCS / "own-model.md")
    assert "exports/smollm/dpo/Modelfile" in own_writes  # a shell redirection counts
