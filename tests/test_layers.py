"""Floors import downward only, at every level, and no floor imports itself in a circle.

Every import counts: module-level, function-local and ``TYPE_CHECKING`` ones, absolute and
relative. A module's floor is the longest prefix of its name in :data:`FLOORS`; it may
import modules of its own floor or of lower ones, and the imports inside one floor form no
cycle. ``ARCHITECTURE.md`` draws the same floors.
"""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "weightplan"

# lowest first; a module belongs to the floor of the longest prefix that names it
FLOORS = (
    ("ground", ("weightplan.errors", "weightplan.units", "weightplan.meta", "weightplan.limits",
                "weightplan.terminal")),
    ("planner.core", ("weightplan.planner", "weightplan.planner.core")),
    ("planner.inputs", ("weightplan.planner.inputs",)),
    ("planner.keys", ("weightplan.planner.keys",)),
    ("planner.tensors.ir", ("weightplan.planner.tensors", "weightplan.planner.tensors.ir")),
    ("planner.tensors.lower", ("weightplan.planner.tensors.lower",)),
    ("planner.tensors.schedule", ("weightplan.planner.tensors.schedule",)),
    ("planner.tensors.verify", ("weightplan.planner.tensors.verify",)),
    ("planner.write", ("weightplan.planner.write",)),
    ("planner.pipelines", ("weightplan.planner.pipelines",)),
    ("executor", ("weightplan.executor",)),
    ("viz", ("weightplan.viz",)),
    ("bridge", ("weightplan.bridge",)),
    ("api", ("weightplan.api",)),
    ("top", ("weightplan",)),  # the package, cli, demo, the public re-export modules
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> int:
    best, level = -1, None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"{module} is on no floor: add it to FLOORS"
    return level


def imported(module: str, path: Path) -> set[str]:
    """The weightplan modules ``module`` imports, anywhere in its file."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names = submodules or [base]  # `from pkg import sub` imports sub; else pkg's names
        else:
            continue
        for name in names:
            while name and name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != module:
                found.add(name)
    return found


GRAPH = {module: imported(module, path) for module, path in MODULES.items()}


def test_every_module_imports_only_its_floor_and_below():
    upward = [f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})"
              for m, targets in GRAPH.items() for t in sorted(targets)
              if floor_of(t) > floor_of(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = nx.DiGraph([(m, t) for m, targets in GRAPH.items() for t in targets])
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, cycles


def test_the_checker_sees_hidden_and_relative_imports(tmp_path):
    """A function-local, a ``TYPE_CHECKING`` and a relative import are all found."""
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from weightplan.viz import text\n"
                    "def f():\n    from . import units\n    import weightplan.errors\n")
    assert imported("weightplan.probe", path) == {"weightplan.viz.text", "weightplan.units",
                                                  "weightplan.errors"}
    path.write_text("def f():\n    from .planner.core.spec import TensorSpec\n")
    assert imported("weightplan.probe", path) == {"weightplan.planner.core.spec"}


def test_the_package_ships_its_type_information():
    assert (PACKAGE / "py.typed").is_file()
    config = (ROOT / "pyproject.toml").read_text()
    assert '[tool.setuptools.package-data]\nweightplan = ["py.typed"]' in config
