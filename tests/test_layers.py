"""The package's imports point only down, and no two modules import each other in a circle.

Every ``import gptforge...`` / ``from gptforge... import`` in ``src/gptforge`` (module level or
inside a function alike) is an edge, and so is every string in the code that names a gptforge module
(``importlib.import_module("gptforge.x")``, a registry's lazy module name): an edge may go to a lower
layer or stay within its own, never up. Lower layers know nothing of the ones above: models and data know no config, eval knows no
training, training knows no command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gptforge

ROOT = Path(gptforge.__file__).parent

# bottom -> top; a module belongs to the first (longest) prefix that names it
LAYERS: list[list[str]] = [
    ["gptforge", "gptforge.tokens", "gptforge.errors", "gptforge.extras", "gptforge.runtime", "gptforge.assets",
     "gptforge.storage", "gptforge.environment"],
    # kernels: torch/triton only, used by the models; sizecheck: what a model file claims against what it holds and
    # the memory free, before any reader builds anything (numbers: the one parser of a number from the command line; argparsing: the one parser class of every
    # command and python -m tool)
    ["gptforge.models", "gptforge.data", "gptforge.kernels", "gptforge.sizecheck", "gptforge.numbers",
     "gptforge.argparsing", "gptforge.progress"],
    ["gptforge.config", "gptforge.config_help", "gptforge.config_doc", "gptforge.config_recipes", "gptforge.config_inert", "gptforge.presets", "gptforge.eval", "gptforge.generation", "gptforge.interop"],
    ["gptforge.optim", "gptforge.parallel"],  # optimizers and schedules; process groups and wrapping
    ["gptforge.run"],  # the run directory contract: checkpoints, metrics, signals, resume
    ["gptforge.load", "gptforge.plot"],  # read runs through gptforge.run, never through training
    ["gptforge.training"],  # the one loop and its recipes (pretrain, sft, grpo)
    ["gptforge.bench", "gptforge.plan", "gptforge.serve"],
    ["gptforge.cli", "gptforge.__main__"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return layer


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (prose names modules without importing them)."""
    out = set()
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def import_edges(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the gptforge modules it imports (statements and module-name strings alike).
    ``sources``: module name -> code, instead of reading src/gptforge (the self-test)."""
    if sources is None:
        sources = {module_name(p): p.read_text() for p in ROOT.rglob("*.py")}
    modules = set(sources) | {module_name(p) for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in sources}
    for mod, code in sources.items():
        tree = ast.parse(code)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                names = [node.value.split(":")[0]]  # "gptforge.x" or "gptforge.x:function"
            for n in names:  # `from pkg import module` imports pkg.module
                if n.startswith("gptforge") and n in modules and n != mod:
                    edges[mod].add(n)
    return edges


def test_every_module_has_a_layer():
    for mod in import_edges():
        layer_of(mod)


def test_imports_point_down():
    up = [f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})"
          for a, targets in import_edges().items() for b in targets if layer_of(b) > layer_of(a)]
    assert not up, "upward imports:\n" + "\n".join(sorted(up))


def test_no_import_cycles():
    edges = import_edges()
    # a package's __init__ importing its own submodules is how packages are built, not a cycle
    graph = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in edges.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_check_catches_an_upward_import():
    """The walk sees lazy imports inside functions and module names in strings (importlib, registries)
    too, but not module names in docstrings (a check that cannot fail proves nothing)."""
    code = ('"""Mentions gptforge.cli in prose."""\n'
            "import importlib\n"
            "def f():\n    from gptforge.training.loop import train\n"
            "LAZY = 'gptforge.serve.app'\n"
            "def g():\n    return importlib.import_module('gptforge.interop.hf')\n")
    edges = import_edges({"gptforge.models.fake": code})["gptforge.models.fake"]
    assert edges == {"gptforge.training.loop", "gptforge.serve.app", "gptforge.interop.hf"}
    assert all(layer_of(e) > layer_of("gptforge.models.gpt2") for e in edges)
