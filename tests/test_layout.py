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
    found = {"parley"} | {
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


# Inside arena/, one folder per concern; a folder may import only itself and those before it.
ARENA_FOLDERS = ("run", "inference", "training", "view", "bench", "integrations", "cli")
MAX_LINES = 600


def test_arena_has_one_folder_per_concern() -> None:
    loose = sorted(p.name for p in (ROOT / "arena").glob("*.py") if p.name != "__init__.py")
    assert loose == [], "modules of arena/ belong in one of its folders: " + ", ".join(
        ARENA_FOLDERS
    )
    folders = {p.name for p in (ROOT / "arena").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(ARENA_FOLDERS)
    for folder in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "arena" / folder / "__init__.py").read_text()))
        assert doc, f"arena/{folder}/__init__.py needs a docstring"
        assert "May import" in doc, f"arena/{folder}/__init__.py must say what it may import"


@pytest.mark.parametrize("folder", ARENA_FOLDERS)
def test_arena_folders_import_one_way(folder: str) -> None:
    allowed = set(ARENA_FOLDERS[: ARENA_FOLDERS.index(folder) + 1])
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "arena" / folder).rglob("*.py"))
        for name in _imports(path)
        if name.startswith("parley.arena.") and name.split(".")[2] not in allowed
    ]
    assert wrong == []


def test_no_file_is_too_long() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for package in PACKAGES
        for path in _python_files(package)
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert long == [], f"split files over {MAX_LINES} lines by role"


def test_bus_parts_share_no_private_names() -> None:
    """The bus is a package of parts that Endpoint holds (composition, not a chain of base
    classes): a module uses another's public names only, never an underscore one."""
    assert not (ROOT / "protocols" / "bus.py").exists()
    parts = sorted((ROOT / "protocols" / "bus").glob("*.py"))
    assert {p.stem for p in parts} >= {"endpoint", "send", "receive", "links", "auth"}
    private = [
        f"{p.relative_to(ROOT)} imports {alias.name} from {node.module}"
        for p in parts
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("parley.protocols")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("parley", *parts))


def _module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """parley modules ``path`` imports when it is imported (not inside functions, not under
    ``TYPE_CHECKING``); ``from pkg import sub`` counts as importing ``pkg.sub``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_at_module_level() -> None:
    paths = [path for package in PACKAGES for path in _python_files(package)]
    modules = {_module_name(path) for path in paths}
    graph = {_module_name(path): _module_level_imports(path, modules) for path in paths}
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def dfs(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                dfs(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            dfs(module, [module])
    assert cycles == []


# Issue 34 §6: an arena module exports what a user or an integration author imports (the
# documented entry points, what another module, the CLI, examples or docs use); helpers used
# only inside their module or only by tests stay out of ``__all__`` and are imported by their
# module path. The ceiling keeps the surface from growing back silently: lower it when names
# leave; raise it only for a name that something outside its module imports.
# +4 run/ray_slots.py, +1 inference/backends/cpu_attention.py: split for the 600-line rule.
# +3 integrations/verl_tool.py: what verl's tool config and reward path name, and the rows.
# +5 integrations/skyrl_env.py: SkyRL's entry point, register, the rows, its failure, shutdown.
# +1 integrations/held.py: the episode table the verl and SkyRL integrations share.
ARENA_EXPORTS_CEILING = 444


def _exports(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert isinstance(node.value, ast.List | ast.Tuple), f"{path}: __all__ literal"
                return [ast.literal_eval(e) for e in node.value.elts]
    return []


def test_arena_public_surface_stays_small() -> None:
    exports = {str(p.relative_to(ROOT)): _exports(p) for p in _python_files("arena")}
    total = sum(len(names) for names in exports.values())
    assert total <= ARENA_EXPORTS_CEILING, (
        f"parley.arena exports {total} names (ceiling {ARENA_EXPORTS_CEILING}): keep helpers "
        "out of __all__ (import them by module path)"
    )
    wide = {path: len(names) for path, names in exports.items() if len(names) > 25}
    assert wide == {}, "a module's __all__ is 25 names at most (STYLE: a short public API)"
