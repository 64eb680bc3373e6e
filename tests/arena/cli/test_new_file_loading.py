"""``parley run path/to/file.py:Class`` and ``--agents file.py:Class``: a scenario and an agent
loaded from files that are not installed (issue 32 §4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.cli import main
from parley.protocols.errors import ConfigError
from parley.scenarios import make, spec
from parley.scenarios.from_file import load_file_attr

GAME = '''
from parley.scenarios.base import Scenario


class Echo(Scenario):
    """Two seats take turns saying something; four moves end it."""

    metadata = {"name": "demo/echo-v0", "render_modes": ["ansi"], "is_parallelizable": True}
    baselines = {"a": "{bot}:Hi", "b": "{bot}:Hi"}

    def __init__(self, **kwargs):
        super().__init__(["a", "b"], **kwargs)

    def new_episode(self, rng):
        self.s = {"turn": 0}
        self.tell("a", "You start.")

    def acting(self):
        return [("a", "b")[self.s["turn"] % 2]]

    def play(self, agent, action):
        if not action.strip():
            return "say something"
        self.say(agent, action)
        self.s["turn"] += 1
        if self.s["turn"] == 4:
            self.reward(agent, "task", 1.0)
            self.finish()
        return None

    def system_prompt(self, agent):
        return "Take turns saying something."
'''

BOT = """
from parley.agents.scripted.base import ScriptedAgent


class Hi(ScriptedAgent):
    def decide(self, observation):
        return "hi from a file"
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    bot = tmp_path / "bot.py"
    bot.write_text(BOT)
    game = tmp_path / "game.py"
    game.write_text(GAME.replace("{bot}", str(bot)))
    return f"{game}:Echo", f"{bot}:Hi"


@pytest.mark.timeout(60)
def test_parley_run_plays_a_scenario_and_agents_from_files(
    files: tuple[str, str], tmp_path: Path
) -> None:
    game, bot = files
    out = tmp_path / "out"
    argv = ["run", game, "--agents", f"{bot},{bot}", "--episodes", "2", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert "hi from a file" in json.dumps(rows)
    # The class's own baselines serve "scripted" seats.
    scripted = ["run", game, "--episodes", "1", "--no-progress", "--out", str(tmp_path / "b")]
    assert main(scripted) == 0


def test_a_file_is_imported_once_per_process(files: tuple[str, str]) -> None:
    game, _ = files
    assert load_file_attr(game) is load_file_attr(game)
    assert type(make(game)) is load_file_attr(game)
    assert spec(game).baseline_for("a").endswith("bot.py:Hi")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("missing.py:Game", "no Python file"),
        ("{dir}/game.py:Nope", "has no attribute 'Nope'"),
        ("{dir}/broken.py:Game", "importing .*broken.py failed: ZeroDivisionError"),
    ],
)
def test_file_references_that_fail_say_what_is_wrong(
    files: tuple[str, str], tmp_path: Path, ref: str, message: str
) -> None:
    (tmp_path / "broken.py").write_text("1 / 0\n")
    with pytest.raises(ConfigError, match=message):
        make(ref.replace("{dir}", str(tmp_path)))


def test_a_bad_agent_file_is_a_one_line_user_error(
    files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    game, _ = files
    assert main(["run", game, "--agents", "nowhere.py:Bot,nowhere.py:Bot", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "no Python file 'nowhere.py'" in err
    assert "Traceback" not in err
