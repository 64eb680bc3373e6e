"""The non-interference check catches leaks of private data, and every built-in scenario
with private data defines the hook it needs (issue 10, section 2)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from parley.scenarios import register, registry
from parley.scenarios.conformance import (
    ConformanceFailure,
    NotApplicable,
    check_noninterference,
    play_episode,
)
from parley.scenarios.negotiation.deal_or_no_deal import DealOrNoDealV0
from parley.scenarios.tool_use.retail_desk import RetailDeskV0

NOTHING_HIDDEN = {
    *("tool_use/calc-chain-v0", "negotiation/split-the-pie-v0"),
    *("tool_use/calc-chain-v1", "negotiation/split-the-pie-v1"),  # the same games (issue 14)
}
BUILT_IN = sorted(i for i, s in registry().items() if s.entry_point.startswith("parley."))


class IndexInView(RetailDeskV0):
    """v0's leak: the task index in the assistant's view (public tables map it to the goal)."""

    def view(self, agent: str) -> dict[str, Any]:
        return {**super().view(agent), "task": self.desk.task.index}


class TellsPartnerValues(DealOrNoDealV0):
    """Announces both players' values once the talk has started."""

    def play(self, agent: str, action: str) -> str | None:
        if self.deal.talk_turns == 0:
            self.announce(f"values: {self.deal.values}")
        return super().play(agent, action)


class BriefsPartnerValues(DealOrNoDealV0):
    """Tells each player both value vectors in its first observation."""

    def brief(self) -> None:
        super().brief()
        for agent in self.possible_agents:
            self.tell(agent, f"Partner values: {self.deal.values[self.partner(agent)]}")


class PartnerValuesInInfos(DealOrNoDealV0):
    def view(self, agent: str) -> dict[str, Any]:
        return {**super().view(agent), "partner": list(self.deal.values[self.partner(agent)])}


LEAKY = {
    "test/leak-index-v0": (IndexInView, "tool_use/retail-desk-v0"),
    "test/leak-announce-v0": (TellsPartnerValues, "negotiation/deal-or-no-deal-v0"),
    "test/leak-infos-v0": (PartnerValuesInInfos, "negotiation/deal-or-no-deal-v0"),
    "test/leak-brief-v0": (BriefsPartnerValues, "negotiation/deal-or-no-deal-v0"),
}
for _id, (_cls, _like) in LEAKY.items():
    register(
        _id,
        f"{__name__}:{_cls.__name__}",
        baselines=dict(registry()[_like].baselines),
        override=True,
    )


@pytest.mark.parametrize("scenario_id", sorted(LEAKY))
def test_the_check_fails_on_a_leak(scenario_id: str) -> None:
    with pytest.raises(ConformanceFailure, match="depends on data it may not know"):
        check_noninterference(scenario_id)


def test_a_leak_in_the_first_observation_is_caught_there() -> None:
    with pytest.raises(ConformanceFailure, match="the first observation: player_0's observ"):
        check_noninterference("test/leak-brief-v0")


@pytest.mark.parametrize("scenario_id", BUILT_IN)
def test_every_built_in_scenario_passes_or_has_nothing_hidden(scenario_id: str) -> None:
    if scenario_id in NOTHING_HIDDEN:
        with pytest.raises(NotApplicable, match="nothing"):
            check_noninterference(scenario_id)
    else:
        check_noninterference(scenario_id)


@pytest.mark.parametrize("scenario_id", sorted(set(BUILT_IN) - NOTHING_HIDDEN))
def test_redraw_private_really_changes_the_episode(scenario_id: str) -> None:
    """A hook that redraws nothing would pass the check vacuously: the state must change,
    and with it the outcome of some episode."""
    from parley.scenarios import make

    def fingerprint(env: Any) -> str:
        # The scenario's state too: what is redrawn may show in no view or oracle until it
        # is used (code/debug-v3's hidden calls, drawn per episode, are read at submission).
        seats = env.possible_agents
        views = json.dumps([[env.view(a), env.oracle(a)] for a in seats])
        games = [v for v in vars(env.unwrapped).values() if dataclasses.is_dataclass(v)]
        return env.state() + views + repr(games)

    for seed in range(4):
        for index, seat in enumerate(make(scenario_id).possible_agents):
            env = make(scenario_id)
            env.reset(seed=seed)
            before = fingerprint(env)
            assert env.redraw_private(seat, np.random.default_rng([seed, index]))
            assert fingerprint(env) != before, (seed, seat)


def test_oracles_play_with_the_privileged_hook_only() -> None:
    """The retail oracle solves every task through play_episode (which follows the runner's
    rule), and nothing in the transcript names the task."""
    for seed in range(3):
        record = play_episode("tool_use/retail-desk-v0", seed=seed)
        assert '"success": 1.0' in record[-1][1]
        for row in record[:-1]:
            if isinstance(row[1], str) and row[1].startswith("{"):
                infos = json.loads(row[2])
                assert "task" not in infos["assistant"]["view"]
                assert "oracle" not in json.dumps(infos)
