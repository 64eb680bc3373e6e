"""``parley run --peer-timeout`` (issue 28 §2): the arena's grace for a silent peer whose
connection is open is set from the command line or the config file and reaches the arena's
endpoint; a value the bus cannot honour is a usage error (exit 2), not a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from parley.arena.cli import main
from parley.arena.cli.run import add_parser, build_config
from parley.arena.run.runner import Runner
from parley.arena.run.security import arena_endpoint_config

SCENARIO = "negotiation/deal-or-no-deal-v1"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_peer_timeout_option_reaches_the_arena_endpoint() -> None:
    config = build_config(_args(SCENARIO, "--peer-timeout", "7.5", "--no-progress"))
    assert config.peer_timeout == 7.5
    runner = Runner(config)
    assert runner.bus_config.peer_timeout == 7.5
    assert arena_endpoint_config(runner.bus_config).peer_timeout == 7.5
    # Unset, the bus's own default (60 s) holds.
    assert Runner(build_config(_args(SCENARIO))).bus_config.peer_timeout == 60.0


def test_peer_timeout_from_yaml_and_the_option_overrides_it(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"scenario: {SCENARIO}\npeer_timeout: 90\n")
    assert build_config(_args("--config", str(path))).peer_timeout == 90.0
    assert build_config(_args("--config", str(path), "--peer-timeout", "5")).peer_timeout == 5.0


@pytest.mark.parametrize("value", ["0.5", "0", "-3", "nan"])
def test_too_small_peer_timeout_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["run", SCENARIO, "--episodes", "1", "--no-progress", f"--peer-timeout={value}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("parley run:")]
    assert len(lines) == 1, err
    assert "peer-timeout" in lines[0], err
