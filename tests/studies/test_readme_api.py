"""README's Python API snippet runs as pasted: every name it uses is imported or assigned before its use
(it once ended in placeholders that raised NameError). Checked statically, so no model is loaded."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _api_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_python_api_snippet_defines_every_name_it_uses() -> None:
    tree = ast.parse(_api_block())
    defined = set(dir(builtins))
    undefined = []
    for stmt in tree.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in defined:
                undefined.append(node.id)
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
    assert undefined == [], f"README's API snippet uses undefined names: {undefined}"
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "treewise"
                for a in n.names}
    import treewise

    assert imported  # the snippet imports from the documented namespace
    assert imported <= set(treewise.__all__)


def test_the_snippets_opening_lines_run_on_the_micro_pair(capsys) -> None:  # type: ignore[no-untyped-def]
    """Its first paragraph (load, generate, print) runs as written, with the micro pair for the fetched one."""
    opening = _api_block().split("\n\n")[0]
    assert "treewise.load()" in opening
    exec(opening.replace("treewise.load()", 'treewise.load(pair="micro", device="cpu")'), {})
    printed = capsys.readouterr().out.split()
    assert printed[-1] == "static:width=2,depth=3" and float(printed[-2]) >= 1.0  # the policy that ran, its tau
