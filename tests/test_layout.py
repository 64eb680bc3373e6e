"""The layout DESIGN.md promises: packaging lists every package; imports point one way."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocols", "scenarios", "agents", "arena")
# protocols <- scenarios <- agents <- arena: a package may import only those left of it.
ALLOWED = {
    "protocols": {"protocols"},
    "scenarios": {"protocols", "scenarios"},
    "agents": {"protocols", "scenarios", "agents"},
    "arena": {"protocols", "scenarios", "agents", "arena"},
}
HEAVY = ("torch", "transformers", "vllm", "aiohttp", "ray")


def _python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        "parley." + ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no __init__.py"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _python_files(package)
        for name in _imports(path)
        if name.startswith("parley.") and name.split(".")[1] not in ALLOWED[package]
    ]
    assert wrong == []


@pytest.mark.parametrize("package", ["protocols", "scenarios"])
def test_light_packages_import_no_heavy_dependency(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _python_files(package)
        for name in _imports(path)
        if name.split(".")[0] in HEAVY
    ]
    assert wrong == []
