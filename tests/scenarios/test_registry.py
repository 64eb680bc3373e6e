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
        " 'parley.scenarios.collaboration', 'parley.scenarios.tool_use', 'parley.scenarios.code',"
        " 'parley.agents'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_catalog_is_what_the_decorated_classes_declare() -> None:
    from parley.scenarios.catalog import render

    assert reg.CATALOG.read_text(encoding="utf-8") == render(), (
        "catalog.json is stale: run python -m parley.scenarios.catalog"
    )


def test_every_builtin_version_is_a_class_game_vn_registered_beside_it() -> None:
    """One convention (issue 34 s3): a class per version named <Game>V<n>, its id only in
    its metadata, registered by the decorator in its own module (none in registry.py)."""
    games: dict[str, set[str]] = {}
    for found in reg.builtin_specs():
        cls = reg.load_attr(found.entry_point)
        game, _, version = cls.__name__.rpartition("V")
        assert version == str(found.version), found.entry_point
        assert cls.metadata["name"] == found.id
        assert found.entry_point == f"{cls.__module__}:{cls.__name__}"
        games.setdefault(found.game, set()).add(game)
    assert all(len(names) == 1 for names in games.values()), games
    builtin = [s for s in registry().values() if s.entry_point.startswith("parley.scenarios.")]
    assert [s.id for s in reg.builtin_specs()] == [s.id for s in builtin]
    assert "register(" not in Path(reg.__file__).read_text().split("def load_attr")[1]


def test_a_class_registered_otherwise_than_it_declares_says_to_rewrite_the_catalog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from parley.scenarios.negotiation.split_the_pie import SplitThePieV0

    declared = reg.spec_of(SplitThePieV0)
    assert spec("negotiation/split-the-pie-v0") == declared
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    monkeypatch.setattr(reg, "_CLASSES", {})
    register(declared.id, declared.entry_point, description="a stale catalog's", override=True)
    with pytest.raises(ConfigError, match=r"python -m parley\.scenarios\.catalog"):
        make(declared.id)


def test_declaring_registers_nothing_and_a_base_class_declaration_is_not_inherited() -> None:
    from parley.scenarios.negotiation.split_the_pie import SplitThePieV0

    meta = {**SplitThePieV0.metadata, "name": "test/declared-v0"}
    cls = type("Declared", (SplitThePieV0,), {"__module__": __name__, "metadata": meta})
    with pytest.raises(ConfigError, match="declares no spec"):
        reg.spec_of(cls)
    cls = reg.registered(baselines={}, description="declared only")(cls)
    assert reg.spec_of(cls).entry_point == f"{__name__}:Declared"
    assert cls.__doc__ == sys.modules[__name__].__doc__
    assert "test/declared-v0" not in registry()


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
    register("test/thing-v0", "parley.scenarios.negotiation.simple_trade:SimpleTradeV0")
    with pytest.raises(ConfigError, match="already registered"):
        register("test/thing-v0", "parley.scenarios.negotiation.split_the_pie:SplitThePieV0")
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
                "parley.scenarios.negotiation.simple_trade:SimpleTradeV0",
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


def test_the_package_exports_what_authors_and_users_need_and_leaves_export_versions() -> None:
    """Issue 34 s6: parley.scenarios names the author's and user's entry points; a scenario
    module exports its version classes only (rule helpers are imported by module path)."""
    import parley.scenarios as package

    needed = {"Scenario", "make", "register", "registered", "check_scenario", "ConfigError"}
    assert needed <= set(package.__all__)
    assert package.ConfigError is ConfigError
    for found in reg.builtin_specs():
        module = sys.modules[found.entry_point.split(":")[0]]
        versions = {name for name in module.__all__ if name[-1].isdigit()}
        assert set(module.__all__) == versions, module.__name__
        assert found.entry_point.split(":")[1] in versions
