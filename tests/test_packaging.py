"""The installed package is what the repository holds: one ``treewise`` namespace over the folders as they are,
the shipped data inside it, and dependency ranges that never downgrade a user's numeric stack.

The slow test builds the wheel, installs it into a fresh venv outside the repository and decodes from there, so
a missing package, a missing data file or a path that only resolves in a checkout fails here, not for a user.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# Folders that are not packages: tests and docs are not installed, data/ ships as package data, build/ and
# dist/ are build output, runs/ holds run outputs.
NOT_PACKAGES = {"tests", "docs", "data", "build", "dist", "runs", "__pycache__"}
UNCAPPED = ("torch", "numpy", "numba", "llvmlite")
UPPER_BOUNDS = ("<", "<=", "~=", "==", "===")


def _source_folders() -> list[Path]:
    """Every folder under the repository root that could hold installable code (root included)."""
    found = []
    for folder, dirs, _ in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not (d in NOT_PACKAGES or d.startswith(".") or d.endswith(".egg-info")
                                                 or (here / d / "pyvenv.cfg").exists()))  # a venv of any name
        found.append(here)
    return found


def _package_name(folder: Path) -> str:
    return ".".join(("treewise", *folder.relative_to(ROOT).parts))


def test_the_packages_list_is_every_folder_with_an_init() -> None:
    setup = PYPROJECT["tool"]["setuptools"]
    assert setup["package-dir"] == {"treewise": "."}  # the repository root is the package treewise
    folders = _source_folders()
    with_init = {_package_name(f) for f in folders if (f / "__init__.py").exists()}
    assert sorted(setup["packages"]) == sorted(with_init), "pyproject's [tool.setuptools] packages list"
    # A folder of modules without __init__.py would be left out of the wheel without a word.
    orphans = [str(f.relative_to(ROOT)) for f in folders if any(f.glob("*.py")) and not (f / "__init__.py").exists()]
    assert orphans == []


def _requirement_lists() -> dict[str, list[str]]:
    project = PYPROJECT["project"]
    lists = {"build-system.requires": PYPROJECT["build-system"]["requires"], "dependencies": project["dependencies"]}
    lists |= {f"optional-dependencies.{k}": v for k, v in project.get("optional-dependencies", {}).items()}
    lists |= {f"dependency-groups.{k}": [r for r in v if isinstance(r, str)]
              for k, v in PYPROJECT.get("dependency-groups", {}).items()}
    return lists


def test_no_upper_bound_on_the_numeric_stack() -> None:
    """Installing treewise must never downgrade a user's torch, numpy, numba or llvmlite."""
    capped = []
    seen = set()
    for where, reqs in _requirement_lists().items():
        for text in reqs:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name not in UNCAPPED:
                continue
            seen.add(name)
            capped += [f"{where}: {text}" for spec in req.specifier if spec.operator in UPPER_BOUNDS]
    assert capped == []
    assert {"torch", "numpy", "numba"} <= seen  # the lists were read (numba: the native extra)


# ---------------------------------------------------------------------------------------------------------------
# The wheel, installed outside the repository.

# What a decode outside the checkout needs; the test also requires every file under data/ to ship (hidden ones,
# such as an old compiled-forest cache, are not data).
REQUIRED = [
    "treewise/__init__.py", "treewise/py.typed", "treewise/decoder/__init__.py", "treewise/decoder/paths.py",
    "treewise/decoder/loop/engine.py", "treewise/predictor/__init__.py", "treewise/predictor/forest.py",
    "treewise/controller/__init__.py", "treewise/controller/learned.py", "treewise/studies/cli.py",
    *(f"treewise/data/models/{m}/{f}" for m in ("target", "draft")
      for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")),
    *(f"treewise/data/predictor/{f}" for f in ("model.txt", "feature_schema.json", "config.json",
                                               "calibration.json")),
    "treewise/data/budgets.json", "treewise/data/latency.json", "treewise/data/domain_classifier.npz",
    "treewise/data/prompts/code.jsonl",
]

# Runs with the fresh venv's python, cwd outside the repository.
DECODE = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import treewise
    from treewise import LearnedTree, TreeDecoder, data_dir
    from treewise.decoder.paths import default_pair

    here = Path(sys.prefix).resolve()
    assert Path(treewise.__file__).resolve().is_relative_to(here), (treewise.__file__, sys.prefix)
    assert data_dir().resolve().is_relative_to(here), data_dir()
    dec = TreeDecoder.from_pretrained(*default_pair())
    policy = LearnedTree.default()
    prompt = "def fib(n):"
    tree = dec.generate(prompt, max_new_tokens=24, tree=policy, temperature=0.0)
    plain = dec.generate_plain(prompt, max_new_tokens=24)
    print(json.dumps({"file": treewise.__file__, "tree": tree.token_ids, "plain": plain.token_ids,
                      "steps": len(tree.stats.steps), "native": bool(policy.native_level)}))
""")


def _copy_source(dst: Path) -> Path:
    """The checkout without build output, caches or venvs: a stale build/ must not reach the wheel under test."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in {"build", "dist", "runs", "__pycache__"} or n.startswith(".")
                or n.endswith(".egg-info") or (Path(folder) / n / "pyvenv.cfg").exists()}

    shutil.copytree(ROOT, dst, ignore=ignore)
    return dst


def _build_wheel(tmp_path: Path) -> Path:
    for text in PYPROJECT["build-system"]["requires"]:  # --no-build-isolation builds with what is installed
        req = Requirement(text)
        have = metadata.version(req.name)
        assert req.specifier.contains(Version(have), prereleases=True), \
            f"{req.name} {have} is installed, the build needs {text}: pip install -e '.[dev]'"
    out = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(out), str(_copy_source(tmp_path / "src"))], check=True, timeout=600)
    (wheel,) = out.glob("treewise-*.whl")
    return wheel


def _check_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    version = PYPROJECT["project"]["version"]
    tops = {n.split("/")[0] for n in names}
    assert tops == {"treewise", f"treewise-{version}.dist-info"}  # no top-level decoder/, predictor/, ...
    missing = [n for n in REQUIRED if n not in names]
    data = ROOT / "data"
    missing += [f"treewise/data/{p.relative_to(data).as_posix()}" for p in sorted(data.rglob("*"))
                if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
                and f"treewise/data/{p.relative_to(data).as_posix()}" not in names]
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        folder = ROOT.joinpath(*package.split(".")[1:])
        prefix = "/".join(package.split("."))
        missing += [f"{prefix}/{m.name}" for m in sorted(folder.glob("*.py")) if f"{prefix}/{m.name}" not in names]
    assert missing == []
    assert not any(n.startswith(("treewise/tests/", "treewise/docs/", "treewise/build/")) for n in names)
    meta = zipfile.ZipFile(wheel)
    assert meta.read(f"treewise-{version}.dist-info/top_level.txt").decode().split() == ["treewise"]
    scripts = meta.read(f"treewise-{version}.dist-info/entry_points.txt").decode()
    assert "treewise = treewise.studies.cli:main" in scripts


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A venv outside the repository holding only the wheel; the current environment's site-packages are
    appended to its path by a .pth file, so the dependencies need no network. A path line in a .pth is not a
    site directory, so .pth files there (an editable treewise of the checkout, for one) stay unread."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, timeout=600)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    parents = [p for p in dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()]) if Path(p).is_dir()]
    (Path(purelib) / "_treewise_test_parent_env.pth").write_text("\n".join(parents) + "\n")
    return venv


@pytest.mark.slow
def test_the_wheel_installs_outside_the_repository_and_decodes(tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT), "--basetemp inside the checkout: the venv must be outside"
    wheel = _build_wheel(tmp_path)
    _check_contents(wheel)
    venv = _fresh_venv(tmp_path, wheel)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "TREEWISE_DATA", "VIRTUAL_ENV"}}
    env |= {"HF_HUB_OFFLINE": "1", "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    run = subprocess.run([str(venv / "bin" / "python"), "-c", DECODE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    installed = Path(got["file"]).resolve()
    assert installed.is_relative_to(venv.resolve()) and installed.parts[-2:] == ("treewise", "__init__.py")
    assert len(got["plain"]) > 0 and got["tree"] == got["plain"]  # lossless: the target's own greedy tokens
    cli = subprocess.run([str(venv / "bin" / "treewise"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-4000:]
    assert "demo" in cli.stdout
