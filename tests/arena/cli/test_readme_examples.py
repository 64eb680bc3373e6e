"""The README's first commands work as written from a clone (issue 14): ``examples/run.yaml``,
a custom agent in the arena's process and from another process (``PYTHONPATH=examples``),
and ``llm:`` at the documented default path, built on first use."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from parley.arena.cli import main

ROOT = Path(__file__).parents[3]
PARLEY = str(Path(sys.executable).with_name("parley"))


def test_readme_names_only_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "mypkg.agents" not in readme
    for name in ("examples/run.yaml", "examples/custom_agent.py"):
        assert name in readme
        assert (ROOT / name).is_file()


def test_run_yaml_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--config", str(ROOT / "examples" / "run.yaml"), "--episodes", "3"]
    status = main([*argv, "--out", str(tmp_path), "--no-progress", "--json"])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["scenario"] == "negotiation/deal-or-no-deal-v3"
    assert summary["episodes"] == {"total": 3, "ok": 3, "failed": 0}
    assert summary["config"]["scenario_kwargs"] == {"max_turns": 10}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(120)
def test_custom_agent_in_process_and_remote(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples")}
    env.pop("PARLEY_DEBUG", None)
    local = subprocess.run(
        [
            PARLEY,
            "run",
            "negotiation/deal-or-no-deal-v3",
            "--episodes",
            "4",
            "--json",
            "--agents",
            "custom_agent:Accommodating,scripted",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["metrics"]["agreed"]["mean"] == 1.0

    address = f"tcp://127.0.0.1:{_free_port()}"
    arena = subprocess.Popen(
        [
            PARLEY,
            "run",
            "negotiation/deal-or-no-deal-v3",
            "--agents",
            "remote,scripted",
            "--listen",
            address,
            "--episodes",
            "4",
            "--json",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        agent = subprocess.run(
            [
                PARLEY,
                "agent",
                "--connect",
                address,
                "--seat",
                "player_0",
                "--agent",
                "custom_agent:Accommodating",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        out, err = arena.communicate(timeout=60)
    finally:
        if arena.poll() is None:
            arena.kill()
            arena.communicate()
    assert agent.returncode == 0, agent.stderr
    assert arena.returncode == 0, err
    assert json.loads(out)["metrics"]["agreed"]["mean"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_llm_default_path_is_built_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``llm:$PARLEY_CACHE/tiny-model`` (the README's ``~/.cache/parley/tiny-model``) with
    nothing there: the tiny model is built, and the untrained model's episodes end."""
    pytest.importorskip("torch")
    cache = tmp_path / "cache"
    env = {**os.environ, "PARLEY_CACHE": str(cache)}
    env.pop("PARLEY_DEBUG", None)
    done = subprocess.run(
        [
            PARLEY,
            "run",
            "negotiation/deal-or-no-deal-v3",
            "--episodes",
            "2",
            "--json",
            "--agents",
            f"llm:{cache}/tiny-model,scripted",
            "--no-progress",
            "-s",
            "max_turns=4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    assert (cache / "tiny-model" / "config.json").is_file()
    summary = json.loads(done.stdout)
    assert summary["episodes"]["ok"] == 2
    assert summary["metrics"]["turns"]["mean"] <= 5  # max_turns talk turns + the choice
    assert "invalid_move_rate" in summary
    assert "it/s]" not in done.stderr  # no Hugging Face progress bars


_COMMAND_ID = re.compile(
    r"(?:parley run |scenario: |PYTHONPATH=examples parley run )([a-z_]+/[a-z0-9-]+)"
)


def _pointed_to() -> dict[str, str]:
    """Every scenario id a user is told to run: the README's and docs' command lines, the
    examples' configs and docstrings, and ``parley demo``'s arena -> where it was found."""
    from parley.arena.cli.demo import DemoOptions

    found = {DemoOptions.scenario: "parley demo"}
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").iterdir()]:
        if path.suffix in (".md", ".yaml", ".py"):
            for scenario_id in _COMMAND_ID.findall(path.read_text()):
                found.setdefault(scenario_id, path.name)
    return found


def test_users_are_pointed_to_versions_where_a_message_cannot_forge_a_line() -> None:
    # deal-or-no-deal-v1/v2 let a seat forge its partner's "take everything" line (paid 10
    # against 0); the README, the examples and the demo ran them (issue 29 §4).
    from parley.scenarios.registry import spec, versions

    pointed = _pointed_to()
    assert "negotiation/deal-or-no-deal-v3" in pointed
    unsafe = {}
    for scenario_id, where in pointed.items():
        if "-v" not in scenario_id:
            continue  # an id without a version plays the latest
        game = versions(spec(scenario_id).game)
        quoting = [s.id for s in game if getattr(s.make(), "quote_messages", False)]
        if quoting and not spec(scenario_id).make().quote_messages:
            unsafe[scenario_id] = f"{where}; use {quoting[-1]}"
    assert not unsafe, unsafe


@pytest.mark.timeout(120)
def test_an_id_without_version_runs_the_latest_with_a_one_line_note(tmp_path: Path) -> None:
    from parley.scenarios.registry import versions

    latest = versions("negotiation/deal-or-no-deal")[-1].id
    argv = [PARLEY, "run", "negotiation/deal-or-no-deal", "--episodes", "1", "--no-progress"]
    done = subprocess.run(
        [*argv, "--json", "--out", str(tmp_path)], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if latest in line]
    assert notes == [
        f"note: negotiation/deal-or-no-deal resolved to its latest version {latest}; "
        "pin it for reproducible runs"
    ]
    assert json.loads(done.stdout)["scenario"] == latest  # the files say which version
    transcript = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[0])
    assert transcript["scenario"] == latest
