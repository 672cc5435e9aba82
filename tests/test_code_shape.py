"""The house's size rules (docs/architecture.md): in the four packages no file over 400 lines and no function
over 60, so a stage reads a screen at a time. A CLI body that grows past it splits into named helpers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controller", "predictor", "decoder", "studies")
MAX_FILE, MAX_FUNCTION = 400, 60


def _breaches(path: Path, text: str) -> list[str]:
    name = path.relative_to(ROOT)
    found = [f"{name}: {text.count(chr(10))} lines"] if text.count("\n") > MAX_FILE else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION:
                found.append(f"{name}:{node.lineno}: {node.name} is {length} lines")
    return found


def test_no_file_over_400_lines_and_no_function_over_60() -> None:
    files = [f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 50
    assert [b for f in files for b in _breaches(f, f.read_text())] == []


def test_the_check_sees_a_long_function_and_a_long_file() -> None:
    long_function = "def f() -> None:\n" + "    x = 1\n" * 60
    assert len(_breaches(ROOT / "decoder" / "x.py", long_function)) == 1
    assert len(_breaches(ROOT / "decoder" / "x.py", "x = 1\n" * 401)) == 1
