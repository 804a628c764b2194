"""The package's imports point only down, and no two modules import each other in a circle.

Every ``import gptforge...`` / ``from gptforge... import`` in ``src/gptforge`` (module level or
inside a function alike) is an edge; an edge may go to a lower layer or stay within its own, never
up. Lower layers know nothing of the ones above: models and data know no config, eval knows no
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
     "gptforge.storage"],
    ["gptforge.models", "gptforge.data", "gptforge.kernels"],  # kernels: torch/triton only, used by the models
    ["gptforge.config", "gptforge.config_help", "gptforge.presets", "gptforge.eval", "gptforge.generation", "gptforge.interop"],
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


def import_edges() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
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
    """The walk sees lazy imports inside functions too (a check that cannot fail proves nothing)."""
    tree = ast.parse("def f():\n    from gptforge.training.loop import train\n")
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert found == ["gptforge.training.loop"]
    assert layer_of("gptforge.training.loop") > layer_of("gptforge.models.gpt2")
