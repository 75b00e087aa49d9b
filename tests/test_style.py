"""Small files and small functions (STYLE §14), enforced."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "weightplan"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_modules_are_small():
    big = {str(p.relative_to(PACKAGE)): n for p in modules()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"split these modules: {big}"


def test_functions_are_small():
    long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({length})")
    assert not long, f"split these functions: {long}"


def test_no_debug_prints_outside_the_command_line():
    allowed = {"cli.py", "demo.py"}
    offenders = []
    for path in modules():
        if path.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders
