"""The ``treewise`` front door: fast to build, every documented command and flag still there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from treewise.studies.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HEAVY = ("torch", "transformers", "optuna", "lightgbm", "matplotlib", "pyarrow", "numpy", "treewise.decoder",
         "treewise.predictor", "treewise.controller")
_INVOCATION = re.compile(r"treewise ((?:study|pair) [a-z][a-z-]*|[a-z][a-z-]*)([^`|\n]*)")  # groups: two words


def _commands() -> dict[str, Any]:
    """'demo', 'study acceptance', ... -> the click command (typer may bundle its own click: duck-typed)."""
    group: Any = typer.main.get_command(app)
    out: dict[str, Any] = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out |= {f"{name} {sub}": c for sub, c in cmd.commands.items()}
        else:
            out[name] = cmd
    return out


def test_building_the_command_imports_no_heavy_library() -> None:
    code = ("import sys, json, treewise.studies.cli; "
            "top = {'.'.join(m.split('.')[:2]) if m.startswith('treewise.') else m.split('.')[0] "
            "for m in sys.modules}; "
            f"print(json.dumps(sorted(top & set({list(HEAVY)!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


def test_every_command_in_the_readme_table_is_registered() -> None:
    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `treewise ")]
    documented = {m.group(1) for line in table for m in _INVOCATION.finditer(line)}
    assert len(documented) >= 12  # the table itself was found
    assert documented <= set(_commands())


def test_every_documented_flag_exists() -> None:
    commands = _commands()
    checked = 0
    for doc in DOCS:
        for m in _INVOCATION.finditer(doc.read_text()):
            cmd = commands.get(m.group(1))
            if cmd is None:  # prose such as "treewise logs every drafted node"
                continue
            known = {opt for p in cmd.params for opt in p.opts + p.secondary_opts}
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(2)):
                assert flag in known, f"{doc.name}: `treewise {m.group(1)} {flag}` is not an option"
                checked += 1
    assert checked > 30


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_of_every_command(name: str) -> None:
    result = CliRunner().invoke(app, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_studies_data_dir_matches_the_decoder(monkeypatch, tmp_path) -> None:
    from treewise.decoder import paths as decoder_paths
    from treewise.studies.shared import paths as studies_paths

    monkeypatch.delenv("TREEWISE_DATA", raising=False)
    assert studies_paths.data_dir() == decoder_paths.data_dir() == ROOT / "data"
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    assert studies_paths.default_pair() == decoder_paths.default_pair() == (tmp_path / "models" / "target",
                                                                              tmp_path / "models" / "draft")


def _diagram(doc: Path) -> str:
    text = doc.read_text()
    start = text.index("```\n studies/")
    return text[start:text.index("```\n", start + 4)]


def test_the_architecture_picture_names_every_package_and_job() -> None:
    """README's "How it is built" and docs/architecture.md show one picture, and it names every subpackage."""
    readme, doc = _diagram(ROOT / "README.md"), _diagram(ROOT / "docs" / "architecture.md")
    assert readme == doc
    jobs = sorted(p.parent.name for p in (ROOT / "studies").glob("*/__init__.py"))
    assert len(jobs) >= 7
    for name in [*(f"{job}/" for job in jobs), "cli.py"]:
        assert f"\n │ {name}" in doc, f"studies/{name} is missing from the architecture picture"
    for package in ("studies/", "controller/", "predictor/", "decoder/"):
        assert f"\n {package}" in doc
