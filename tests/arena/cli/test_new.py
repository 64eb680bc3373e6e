"""``parley new scenario|agent``: the packages it writes pass their own tests as generated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parley.arena.cli import main
from parley.arena.cli.new import KINDS, files_for
from parley.protocols.errors import ConfigError


def _pytest_in(root: Path) -> subprocess.CompletedProcess[str]:
    """The generated package's own tests, run as its user would (``cd root && pytest``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _generate(tmp_path: Path, *argv: str) -> Path:
    assert main(["new", *argv, "--dir", str(tmp_path)]) == 0
    return tmp_path / argv[1]


@pytest.mark.timeout(150)
def test_a_generated_tool_use_scenario_passes_the_conformance_suite(tmp_path: Path) -> None:
    root = _generate(tmp_path, "scenario", "calc-duel", "--kind", "tool-use", "--family", "mine")
    assert (
        (root / "calc_duel" / "scenario.py").read_text().startswith('"""mine/calc-duel-v0 — ')
    )  # the module docstring is the doc page
    assert '"parley.scenarios"' in (root / "pyproject.toml").read_text()
    done = _pytest_in(root)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "10 passed" in done.stdout  # 10 conformance checks + the baseline episode, 1 n/a


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "tool-use"])
def test_every_kind_of_scenario_passes_as_generated(tmp_path: Path, kind: str) -> None:
    done = _pytest_in(_generate(tmp_path, "scenario", "game", "--kind", kind))
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.timeout(150)
def test_a_generated_agent_plays_a_built_in_scenario(tmp_path: Path) -> None:
    root = _generate(tmp_path, "agent", "my-bot")
    done = _pytest_in(root)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout


@pytest.mark.timeout(60)
def test_a_generated_scenario_runs_from_its_file_without_installing(tmp_path: Path) -> None:
    root = _generate(tmp_path, "scenario", "race")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "parley.arena.cli", "run", "race/scenario.py:RaceV0",
         "--episodes", "2", "--no-progress", "--json"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["episodes"] == {"failed": 0, "ok": 2, "total": 2}
    assert summary["agents"] == {"first": "scripted", "second": "scripted"}  # its baselines


@pytest.mark.parametrize("name", ["My-Game", "2fast", "a b", "../up", "x-", ""])
def test_bad_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(ConfigError, match="lower case"):
        files_for("scenario", name, "turn-based", "custom")


def test_an_existing_folder_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").mkdir()
    assert main(["new", "agent", "taken", "--dir", str(tmp_path)]) != 0
    assert "exists" in capsys.readouterr().err
    assert list((tmp_path / "taken").iterdir()) == []
