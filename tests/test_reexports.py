"""A name is imported from the module that defines it, or from one that says it re-exports it.

``from gptforge.interop.hf import check_out_dir`` kept working after check_out_dir moved to hf_folder.py,
because hf.py still uses it: a stale name that ties a caller to the wrong module, and breaks it the day hf.py
stops using it. Every ``from gptforge.X import name`` in src/, tests/ and scripts/ must find ``name`` defined in
X (a def, class or assignment), as a submodule of X, in X's ``__all__``, or imported in X on a line that marks
it (``noqa: F401`` or ``re-export``), the way errors.py's errors are re-exported where callers catch them. A
package's ``__init__`` is its interface and re-exports by design.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import gptforge

SRC = Path(gptforge.__file__).parent
REPO = SRC.parent.parent


def _module_level(body: list[ast.stmt]):
    """The statements a module runs at import: its body, and inside its if / try / with blocks."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _module_level(getattr(node, field, []))


@cache
def _names(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(defined in ``path`` or listed in its ``__all__``, imported there on a line marked as a re-export)."""
    text = path.read_text()
    lines = text.splitlines()
    own: set[str] = set()
    marked: set[str] = set()
    for node in _module_level(ast.parse(text).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                own.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in getattr(node, "targets", [])):
                own.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            line = lines[node.lineno - 1]
            if "F401" in line or "re-export" in line:
                marked.update(a.asname or a.name for a in node.names)
    return frozenset(own), frozenset(marked)


def stale_imports(files: list[Path], root: Path = REPO) -> list[str]:
    """``file:line: name from module`` for each gptforge import of a name its module neither defines nor marks."""
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "gptforge"):
                continue
            base = SRC.parent / Path(*node.module.split("."))
            if (base / "__init__.py").exists() or not base.with_suffix(".py").exists():
                continue  # a package's interface, or not a gptforge module (the import itself would fail)
            own, marked = _names(base.with_suffix(".py"))
            for a in node.names:
                if a.name not in own and a.name not in marked and not (base / f"{a.name}.py").exists():
                    out.append(f"{f.relative_to(root)}:{node.lineno}: {a.name} from {node.module}")
    return out


def test_every_import_names_the_home_of_what_it_imports():
    files = [p for d in ("src", "tests", "scripts") for p in sorted((REPO / d).rglob("*.py"))]
    stale = stale_imports(files)
    assert not stale, "imported from a module that only uses it (import it from its home):\n" + "\n".join(stale)


def test_the_check_catches_a_stale_name(tmp_path):
    f = tmp_path / "caller.py"
    f.write_text("from gptforge.interop.hf import check_out_dir, export_hf\n"
                 "from gptforge.interop.hf_folder import check_out_dir as c\n"
                 "from gptforge.run.checkpoint import CheckpointError\n")  # marked: callers catch ckpt.CheckpointError
    assert stale_imports([f], root=tmp_path) == ["caller.py:1: check_out_dir from gptforge.interop.hf"]
