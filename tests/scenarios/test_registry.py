"""The registry: ids, make, entry points, and lazy imports."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios import make, register, registry, spec

# The package re-exports the function `registry`, which shadows the module's name as an
# attribute of `parley.scenarios`; fetch the module itself.
reg = importlib.import_module("parley.scenarios.registry")


def test_importing_the_registry_imports_no_scenario_module() -> None:
    code = (
        "import sys, parley.scenarios\n"
        "parley.scenarios.registry()\n"
        "print([m for m in sys.modules if m.startswith(('parley.scenarios.negotiation',"
        " 'parley.scenarios.collaboration', 'parley.agents'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_builtin_scenarios_are_registered_with_baselines() -> None:
    ids = set(registry())
    expected = {
        "negotiation/deal-or-no-deal-v0",
        "negotiation/simple-trade-v0",
        "negotiation/split-the-pie-v0",
        "collaboration/referential-v0",
        "collaboration/hidden-profile-v0",
    }
    assert expected <= ids
    for scenario_id in expected:
        env = make(scenario_id)
        for seat in env.possible_agents:
            assert spec(scenario_id).baseline_for(seat)


def test_make_overrides_kwargs_and_star_baseline_covers_extra_seats() -> None:
    env = make("negotiation/split-the-pie-v0", n_players=6)
    assert env.possible_agents[-1] == "player_5"
    assert spec("negotiation/split-the-pie-v0").baseline_for("player_5").endswith(":PieBargainer")


def test_unknown_id_suggests_close_ones() -> None:
    with pytest.raises(ConfigError, match="did you mean negotiation/deal-or-no-deal-v"):
        make("negotiation/deal-or-no-deal-v9")


@pytest.mark.parametrize("bad", ["NoFamily", "a/b", "a/b-v", "A/b-v0"])
def test_ids_must_be_family_name_version(bad: str) -> None:
    with pytest.raises(ConfigError):
        reg.ScenarioSpec(bad, "m:C")


def test_reregistering_needs_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    register("test/thing-v0", "parley.scenarios.negotiation.simple_trade:SimpleTrade")
    with pytest.raises(ConfigError, match="already registered"):
        register("test/thing-v0", "parley.scenarios.negotiation.split_the_pie:SplitThePie")
    register("test/thing-v0", "parley.scenarios.base:Scenario", override=True)
    assert spec("test/thing-v0").entry_point == "parley.scenarios.base:Scenario"


def test_third_party_scenarios_come_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "thirdparty_game.py").write_text(
        textwrap.dedent(
            """
            from parley.scenarios import ScenarioSpec

            SPECS = [ScenarioSpec(
                "thirdparty/echo-v0",
                "parley.scenarios.negotiation.simple_trade:SimpleTrade",
                description="a third-party game",
            )]
            """
        )
    )
    dist = tmp_path / "thirdparty_game-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-game\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[parley.scenarios]\necho = thirdparty_game:SPECS\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    monkeypatch.setattr(reg, "_entry_points_loaded", False)
    assert "thirdparty/echo-v0" in registry()
    assert make("thirdparty/echo-v0").possible_agents == ["player_0", "player_1"]


def test_parley_list_prints_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    from parley.arena.cli import main

    assert main(["list", "--json"]) == 0
    out = capsys.readouterr().out
    assert all(scenario_id in out for scenario_id in registry())
    assert main(["list"]) == 0
    assert "parley scenarios" in capsys.readouterr().out
