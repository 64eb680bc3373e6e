"""The file templates of ``parley new`` (:mod:`parley.arena.cli.new`).

Placeholders are ``<<NAME>>`` (``my-game``), ``<<PACKAGE>>`` (``my_game``), ``<<CLASS>>``
(``MyGame``; a scenario's class is ``<<CLASS>>V0``, one class per version) and ``<<ID>>``
(``custom/my-game-v0``). The tool-use game is in
:mod:`parley.arena.cli.new_tool_use`. Every generated package passes its own
tests as generated; ``tests/arena/cli/test_new.py`` runs them.
"""

from __future__ import annotations

from parley.arena.cli.new_tool_use import TOOL_USE, TOOL_USE_AGENT, scenario_class

SCENARIO_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "<<NAME>>"
version = "0.1.0"
description = "<<ID>>: a parley scenario"
requires-python = ">=3.10"
dependencies = ["parley"]

# `pip install -e .` registers the scenario: `parley list` shows it, `parley run <<ID>>` plays it.
[project.entry-points."parley.scenarios"]
<<PACKAGE>> = "<<PACKAGE>>:specs"

[tool.setuptools]
packages = ["<<PACKAGE>>"]

[tool.pytest.ini_options]
pythonpath = ["."]  # the tests run before the package is installed
testpaths = ["tests"]
"""

SCENARIO_INIT = '''\
"""<<ID>> (made by `parley new scenario`): the specs parley registers through the
``parley.scenarios`` entry point. Any change of the rules is a new version: a subclass
``<<CLASS>>V1`` with its id in ``metadata["name"]`` and its own ``@registered``, added to
``VERSIONS``; keep the old version registered as it was."""

from parley.scenarios import ScenarioSpec, spec_of

from <<PACKAGE>>.scenario import <<CLASS>>V0

VERSIONS = [<<CLASS>>V0]


def specs() -> list[ScenarioSpec]:
    """The entry point: the spec each version declares beside its class."""
    return [spec_of(version) for version in VERSIONS]
'''

SCENARIO_TEST = '''\
"""parley's conformance suite over <<ID>>, and an episode of the baseline (run: pytest)."""

import json

import pytest

from parley.scenarios import register, registry
from parley.scenarios.conformance import CHECKS, NotApplicable, play_episode

from <<PACKAGE>> import specs

for _spec in specs():  # once installed, the entry point has registered them already
    if _spec.id not in registry():
        register(_spec.id, _spec.entry_point, baselines=dict(_spec.baselines),
                 description=_spec.description)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_conformance(check: str) -> None:
    try:
        CHECKS[check]("<<ID>>")
    except NotApplicable as why:
        pytest.skip(str(why))


def test_the_baseline_plays_an_episode_to_its_end() -> None:
    record = play_episode("<<ID>>", seed=0)
    assert record[-1][0] == "metrics"
    assert json.loads(record[-1][1])["invalid_moves"] == 0
'''

TURN_BASED = (
    '''\
"""<<ID>> — race to 21: two players take turns adding 1, 2 or 3 to a running total; the
player who brings the total to 21 or more wins.

Seats: ``first`` (moves first) and ``second``; they alternate.

Action: ``1``, ``2`` or ``3``. Anything else is an invalid move: it costs ``invalid_penalty``
and the turn passes (a move the action space refuses does too).

Observations: the rules, then each move as it is played ("first adds 3: the total is 7.").
``infos[seat]["view"]``: ``total``, ``turns_left``. ``infos[seat]["constraint"]``: a ``choice``
constraint (``1``, ``2``, ``3``).

Rewards: ``task`` 1 to the winner at the end; ``invalid`` -``invalid_penalty`` (0.1) per
invalid move. After ``max_turns`` (30) moves without a winner the game is a draw.

Metrics: ``first_won``, ``total``.

Arguments: ``max_turns`` (30), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("<<ID>>", max_turns=30)

Version history: v0 — first version.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import numpy as np

from parley.scenarios import ConfigError, Scenario, registered

SEATS = ("first", "second")
TARGET = 21
_MOVE = re.compile(r"^\\s*([123])\\s*$")


def parse_move(action: str) -> int | None:
    """The number ``action`` adds, or None when it is not ``1``, ``2`` or ``3``."""
    found = _MOVE.match(action)
    return int(found.group(1)) if found else None


@dataclasses.dataclass
class State:
    total: int = 0
    turns: int = 0
    winner: str | None = None


'''
    + scenario_class(
        "Race to 21",
        state="race",
        argument=("max_turns", 30),
        seats="list(SEATS)",
        extra="    new_episode_draws = False  # nothing is random: reset needs no generator\n",
    )
    + '''\

    def new_episode(self, rng: np.random.Generator) -> None:
        self.race = State()

    def brief(self) -> None:
        for seat in SEATS:
            self.tell(seat, f"Race to {TARGET}: you are {seat}. Add 1, 2 or 3 to the total.")

    def acting(self) -> list[str]:
        return [SEATS[self.race.turns % 2]]

    def play(self, seat: str, action: str) -> str | None:
        self.race.turns += 1
        step = parse_move(action)
        if step is not None:
            self.race.total += step
            self.announce(f"{seat} adds {step}: the total is {self.race.total}.")
            if self.race.total >= TARGET:
                self.race.winner = seat
                self.reward(seat, "task", 1.0)
                self.finish()
                return None
        if self.race.turns >= self.max_turns:
            self.announce("No winner within the turn limit: a draw.")
            self.finish()
        return None if step is not None else "reply with 1, 2 or 3"

    def prompt(self, seat: str) -> str:
        return f"The total is {self.race.total}. Your move: 1, 2 or 3."

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return {"type": "choice", "choices": ["1", "2", "3"]}

    def view(self, seat: str) -> dict[str, Any]:
        return {"total": self.race.total, "turns_left": self.max_turns - self.race.turns}

    def system_prompt(self, seat: str) -> str:
        return (
            f"Two players take turns adding 1, 2 or 3 to a total; whoever reaches {TARGET} "
            "wins. Reply with the number only."
        )

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Nothing is hidden: both players see every move."""
        return False

    def metrics(self) -> dict[str, float]:
        return {"first_won": float(self.race.winner == "first"), "total": float(self.race.total)}


'''
)

TURN_BASED_AGENT = '''\
"""The scripted baseline of <<ID>>: leaves the total 1 short of a multiple of 4 from the target."""

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation

from <<PACKAGE>>.scenario import TARGET


class <<CLASS>>Baseline(ScriptedAgent):
    """Plays the winning strategy when it can, else adds 1."""

    name = "<<NAME>>-baseline"

    def decide(self, observation: Observation) -> str:
        total = int(observation.info.get("view", {}).get("total", 0))
        step = (TARGET - total) % 4
        return str(step if step in (1, 2, 3) else 1)
'''

SIMULTANEOUS = (
    '''\
"""<<ID>> — rock-paper-scissors, played simultaneously for a number of rounds.

Seats: ``player_0`` and ``player_1``; both move in every step, neither sees the other's move
before the round is scored.

Action: ``rock``, ``paper`` or ``scissors``. Anything else is an invalid move: it costs
``invalid_penalty`` and loses the round (unless the other move is invalid too).

Observations: the rules, then each round's moves and its winner.
``infos[seat]["view"]``: ``round``, ``score`` (this seat's wins minus losses).
``infos[seat]["constraint"]``: a ``choice`` constraint.

Rewards: ``task`` +1 to the winner of a round, -1 to the loser, in the step that scores it;
``invalid`` -``invalid_penalty`` (0.1) per invalid move.

Metrics: ``score_0`` (player_0's wins minus losses), ``draws``.

Arguments: ``rounds`` (5), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("<<ID>>", rounds=5)

Version history: v0 — first version.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from parley.scenarios import ConfigError, Scenario, registered

SEATS = ("player_0", "player_1")
MOVES = ("rock", "paper", "scissors")
BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}


def outcome(a: str | None, b: str | None) -> int:
    """+1 when move ``a`` beats ``b``, -1 when it loses, 0 for a draw (None: invalid)."""
    if a == b:
        return 0
    if a is None or b is None:
        return 1 if b is None else -1
    return 1 if BEATS[a] == b else -1


@dataclasses.dataclass
class State:
    round: int = 0
    moves: dict[str, str | None] = dataclasses.field(default_factory=dict)
    score: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(SEATS, 0))
    draws: int = 0


'''
    + scenario_class(
        "Rock-paper-scissors",
        state="match",
        argument=("rounds", 5),
        seats="list(SEATS)",
        extra="    new_episode_draws = False\n",
    )
    + '''\

    def new_episode(self, rng: np.random.Generator) -> None:
        self.match = State()

    def brief(self) -> None:
        for seat in SEATS:
            self.tell(seat, f"Rock-paper-scissors, {self.rounds} rounds. You are {seat}.")

    def acting(self) -> list[str]:
        return list(SEATS)

    def play(self, seat: str, action: str) -> str | None:
        move = action.strip().lower()
        self.match.moves[seat] = move if move in MOVES else None
        return None if move in MOVES else "reply with rock, paper or scissors"

    def resolve(self) -> None:
        a, b = (self.match.moves.get(seat) for seat in SEATS)
        result = outcome(a, b)
        self.match.round += 1
        self.match.draws += result == 0
        for seat, sign in zip(SEATS, (1, -1)):
            self.match.score[seat] += sign * result
            if result:
                self.reward(seat, "task", float(sign * result))
        self.announce(f"Round {self.match.round}: {a} vs {b} -> "
                      f"{('draw', SEATS[0], SEATS[1])[result]} .")
        self.match.moves = {}
        if self.match.round >= self.rounds:
            self.finish()

    def prompt(self, seat: str) -> str:
        return f"Round {self.match.round + 1} of {self.rounds}: rock, paper or scissors?"

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return {"type": "choice", "choices": list(MOVES)}

    def view(self, seat: str) -> dict[str, Any]:
        return {"round": self.match.round, "score": self.match.score[seat]}

    def system_prompt(self, seat: str) -> str:
        return "You play rock-paper-scissors. Reply with rock, paper or scissors only."

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Nothing is hidden between rounds (moves are revealed when a round is scored)."""
        return False

    def metrics(self) -> dict[str, float]:
        return {"score_0": float(self.match.score[SEATS[0]]), "draws": float(self.match.draws)}


'''
)

SIMULTANEOUS_AGENT = '''\
"""The scripted baseline of <<ID>>: the uniform random strategy (the game's equilibrium)."""

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation

from <<PACKAGE>>.scenario import MOVES


class <<CLASS>>Baseline(ScriptedAgent):
    """Draws each move uniformly from its own seeded generator."""

    name = "<<NAME>>-baseline"

    def decide(self, observation: Observation) -> str:
        return MOVES[int(self.rng.integers(len(MOVES)))]
'''

SCENARIOS: dict[str, tuple[str, str]] = {
    "turn-based": (TURN_BASED, TURN_BASED_AGENT),
    "simultaneous": (SIMULTANEOUS, SIMULTANEOUS_AGENT),
    "tool-use": (TOOL_USE, TOOL_USE_AGENT),
}
"""``--kind`` -> (scenario module, baseline module)."""

AGENT_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "<<NAME>>"
version = "0.1.0"
description = "<<NAME>>: a parley agent"
requires-python = ">=3.10"
dependencies = ["parley"]

[tool.setuptools]
packages = ["<<PACKAGE>>"]

[tool.pytest.ini_options]
pythonpath = ["."]  # the tests run before the package is installed
testpaths = ["tests"]
"""

AGENT_INIT = '''\
"""<<NAME>> (made by `parley new agent`): seat it with ``--agents <<PACKAGE>>.agent:<<CLASS>>``
once installed, or ``--agents path/to/<<PACKAGE>>/agent.py:<<CLASS>>`` without installing."""
'''

AGENT = '''\
"""<<CLASS>>: a parley agent. It plays any seat of any scenario: a ``choice`` constraint gets
one of its choices (drawn from the seeded generator), anything else a fixed reply.

Replace :meth:`<<CLASS>>.act` with your policy. ``observation.text`` is what the seat sees,
``observation.info["view"]`` the scenario's structured view, ``observation.info["constraint"]``
the structured-output constraint when there is one. ``act`` must not raise on odd input: an
action the scenario cannot use is recorded as an invalid move, an exception fails the episode.
"""

import numpy as np

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation


class <<CLASS>>(Agent):
    """Picks a legal choice when the scenario offers them, else replies "pass"."""

    name = "<<NAME>>"

    def __init__(self) -> None:
        self.rng = np.random.default_rng()

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    async def act(self, observation: Observation) -> Action:
        constraint = observation.info.get("constraint") or {}
        choices = constraint.get("choices") if constraint.get("type") == "choice" else None
        text = str(choices[int(self.rng.integers(len(choices)))]) if choices else "pass"
        return Action(agent=observation.agent, text=text)
'''

AGENT_TEST = '''\
"""<<CLASS>> plays whole episodes of a built-in scenario in every seat (run: pytest)."""

import json

from parley.scenarios.conformance import play_episode

from <<PACKAGE>>.agent import <<CLASS>>

SCENARIO = "collaboration/referential-v1"


def test_the_agent_plays_episodes_to_their_end() -> None:
    for seed in range(3):
        agents = {seat: <<CLASS>>() for seat in ("speaker", "listener")}
        record = play_episode(SCENARIO, seed=seed, agents=agents)
        assert record[-1][0] == "metrics"
        assert json.loads(record[-1][1])["invalid_moves"] == 0
'''
