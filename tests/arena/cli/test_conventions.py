"""The ``parley`` command follows the conventions a user expects (issue 14): ``--version``,
defaults in ``--help``, a fast start (``--help`` and ``list`` import no numpy, pettingzoo,
ZeroMQ or torch; measured with ``-X importtime``), ``help(env)`` shows the scenario's page,
and tables and error lines read whole in a log (not a terminal)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import pydoc
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parley.arena.cli import COMMANDS, SUMMARIES, command_module, main

PARLEY = str(Path(sys.executable).with_name("parley"))
HEAVY = ("numpy", "pettingzoo", "gymnasium", "zmq", "torch", "transformers", "aiohttp", "msgspec")
IMPORT_BUDGET_S = 0.3  # parley's own imports for --help and list, as -X importtime counts them
WALL_BUDGET_S = 1.5  # a whole process start, generous for a loaded 2-core machine


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PARLEY_DEBUG")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1"}


def test_summaries_match_the_commands_own_help() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for name in COMMANDS:
        importlib.import_module(command_module(name)).add_parser(sub)
    helps = {action.dest: action.help for action in sub._choices_actions}
    assert helps == SUMMARIES


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import parley
    import parley.arena

    assert parley.__version__ == importlib.metadata.version("parley")
    assert parley.arena.__version__ == parley.__version__  # the older spelling still works
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"parley {parley.__version__}\n"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: scripted)" in text
    assert "(default: 60.0)" in text
    with pytest.raises(SystemExit):
        main(["run", "--help"])  # options left None take RunConfig's defaults: shown
    text = " ".join(capsys.readouterr().out.split())
    assert "to play (default: 10)" in text
    assert "episodes played at once (default: 8)" in text


@pytest.mark.parametrize("argv", [["--help"], ["list"]], ids=["help", "list"])
def test_fast_start(argv: list[str]) -> None:
    cmd = [sys.executable, "-X", "importtime", "-m", "parley.arena.cli", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = {row[2].strip() for row in rows[1:]}
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert loaded == [], f"`parley {' '.join(argv)}` imports {loaded}"
    ours = sum(int(row[1]) for row in rows[1:] if row[2].startswith(" parley"))  # top level
    assert ours / 1e6 <= IMPORT_BUDGET_S, f"parley's imports took {ours / 1e6:.3f} s"
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([PARLEY, *argv], capture_output=True, env=_env(), timeout=60, check=True)
        walls.append(time.perf_counter() - started)
    assert min(walls) <= WALL_BUDGET_S, walls


def test_help_env_shows_the_scenario_page() -> None:
    from parley.scenarios import make, registry

    built_in = {
        i: s for i, s in registry().items() if s.entry_point.startswith("parley.scenarios.")
    }
    for scenario_id, found in built_in.items():
        env = make(scenario_id)
        try:
            page = pydoc.render_doc(env, renderer=pydoc.plaintext)
        finally:
            env.close()
        module_doc = sys.modules[found.entry_point.split(":")[0]].__doc__ or ""
        assert type(env).__doc__ == module_doc, scenario_id
        assert module_doc.splitlines()[0] in page, scenario_id
        assert "Arguments" in page, scenario_id


def test_tables_and_errors_read_whole_in_a_log(tmp_path: Path) -> None:
    """Piped (no terminal, no COLUMNS): the run's table title is on one line, unwrapped."""
    cmd = [PARLEY, "run", "negotiation/deal-or-no-deal-v1", "--episodes", "2", "--no-progress"]
    cmd += ["--agents", "player_0=scripted,player_1=scripted", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    title = "negotiation/deal-or-no-deal-v1 — player_0=scripted, player_1=scripted"
    assert any(line.strip() == title for line in done.stdout.splitlines()), done.stdout
    assert re.search(r"│ invalid-move rate\s+│", done.stdout)
    (wrote,) = done.stderr.strip().splitlines()
    assert wrote.startswith("wrote ")
    assert wrote.endswith("summary.json")
