"""The layers import downward only, even inside functions (no hidden cycles)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "weightplan"
BASE = {"weightplan.errors", "weightplan.units"}
# layer → the weightplan modules it may import (besides itself and BASE)
ALLOWED = {
    "planner": {"weightplan.planner"},
    "executor": {"weightplan.planner", "weightplan.executor"},
    "viz": {"weightplan.planner", "weightplan.viz"},
    "bridge": {"weightplan.planner", "weightplan.bridge", "weightplan.meta"},
}


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "weightplan"]


def test_each_layer_imports_only_below_itself():
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for line, module in imports(path):
                ok = module in BASE or any(module == a or module.startswith(a + ".")
                                           for a in allowed)
                if not ok:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, wrong


def test_the_package_ships_its_type_information():
    assert (PACKAGE / "py.typed").is_file()
    config = (ROOT / "pyproject.toml").read_text()
    assert '[tool.setuptools.package-data]\nweightplan = ["py.typed"]' in config
