"""One import style (docs/architecture.md, "Imports"): a module imports the modules of its own folder relatively
(``from .x import y``) and everything else absolutely (``from treewise.stage.x import y``); no ``from ..``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controller", "predictor", "decoder", "studies")


def _violations(path: Path, text: str) -> list[str]:
    own = "treewise." + ".".join(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level > 1:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{module} (use treewise.)")
        elif node.level == 0 and (module == own or module.rsplit(".", 1)[0] == own):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {module} (its own folder: import relatively)")
    return found


def test_own_folder_relative_everything_else_absolute() -> None:
    found = [v for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py")) for v in _violations(f, f.read_text())]
    assert found == []


def test_the_check_sees_both_kinds_of_breach() -> None:
    here = ROOT / "predictor" / "model.py"
    assert len(_violations(here, "from treewise.predictor.config import X\nfrom ..decoder import Y\n")) == 2
    assert _violations(here, "from .config import X\nfrom treewise.decoder import Y\n") == []
