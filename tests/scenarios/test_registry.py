"""The registry: ids, make, entry points, and lazy imports."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import warnings
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


def test_an_id_without_version_plays_the_latest_with_a_one_line_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reg, "_noted", set())
    latest = reg.versions("negotiation/deal-or-no-deal")[-1]
    assert latest.kwargs == {}
    assert latest.version >= 3
    with pytest.warns(reg.LatestVersionNote, match=f"latest version {latest.id}") as caught:
        env = make("negotiation/deal-or-no-deal")
    assert len(caught) == 1
    assert "\n" not in str(caught[0].message)
    assert caught[0].filename == __file__  # the note points at the caller's line
    assert type(env).__name__ == type(make(latest.id)).__name__
    assert env.quote_messages  # the safest rules: a message cannot forge a line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per id and process, and never for a pinned id
        assert spec("negotiation/deal-or-no-deal") is latest
        assert reg.resolve_id("negotiation/deal-or-no-deal-v1") == "negotiation/deal-or-no-deal-v1"
    with pytest.raises(ConfigError, match="no scenario registered"):
        spec("negotiation/no-such-game")


def test_run_and_train_configs_record_the_resolved_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from parley.arena.run.config import RunConfig

    monkeypatch.setattr(reg, "_noted", set())
    with pytest.warns(reg.LatestVersionNote):
        config = RunConfig(scenario="negotiation/simple-trade")
    assert config.scenario == reg.versions("negotiation/simple-trade")[-1].id


def test_parley_list_groups_versions_under_one_game_latest_marked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from parley.arena.cli import main

    assert main(["list", "--json", "--family", "negotiation"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    dond = [row for row in rows if row["game"] == "negotiation/deal-or-no-deal"]
    assert [row["latest"] for row in dond] == [True] + [False] * (len(dond) - 1)
    assert dond[0]["id"] == reg.versions("negotiation/deal-or-no-deal")[-1].id
    assert main(["list"]) == 0
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if "negotiation/deal-or-no-deal " in line)
    assert f"v{len(dond) - 1}* " in line
    assert " v0 " in line
    assert sum(row.startswith("│ negotiation/deal-or-no-deal") for row in table.splitlines()) == 1
