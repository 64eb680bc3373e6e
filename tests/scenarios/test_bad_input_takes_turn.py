"""A move the action space refuses (characters outside the charset, too long, not a string)
uses up the seat's turn from every scenario's v1 on, so a seat that
writes only such moves (an untrained model) still ends the episode within the rules' bound;
the v0 scenarios keep their first behaviour (issue 14)."""

from __future__ import annotations

import pytest

from parley.scenarios import make

BAD_MOVES = ("héllo wörld", "\x00\x1b[2J", "x" * 5000, 42)


@pytest.mark.parametrize("bad", BAD_MOVES, ids=["non-ascii", "control", "too-long", "not-str"])
@pytest.mark.parametrize("max_turns", [2, 6])
def test_deal_or_no_deal_v1_ends_on_bad_input(bad: object, max_turns: int) -> None:
    env = make("negotiation/deal-or-no-deal-v1", max_turns=max_turns)
    env.reset(seed=3)
    steps, invalid = 0, 0
    while env.agents:
        _, _, _, _, infos = env.step({seat: bad for seat in env.agents})
        steps += 1
        invalid += sum("invalid" in info for info in infos.values())
        assert steps <= max_turns + 1, "a refused move did not use up the turn"
    # max_turns talk turns, then the choice (both seats at once): all of them invalid.
    assert steps == max_turns + 1
    assert invalid == max_turns + 2
    assert env.episode_metrics()["agreed"] == 0.0


def test_v0_keeps_its_first_behaviour() -> None:
    env = make("negotiation/deal-or-no-deal-v0", max_turns=2)
    env.reset(seed=3)
    for _ in range(10):
        env.step({seat: "héllo" for seat in env.agents})
    assert env.agents, "v0 changed: a refused move now uses up the turn"


def _latest_versions() -> list[str]:
    from parley.scenarios import registry

    latest: dict[str, str] = {}
    built_in = [i for i, s in registry().items() if s.entry_point.startswith("parley.")]
    for scenario_id in sorted(built_in, key=lambda i: int(i.rsplit("-v", 1)[1])):
        latest[scenario_id.rsplit("-v", 1)[0]] = scenario_id
    return sorted(latest.values())


@pytest.mark.parametrize("scenario_id", _latest_versions())
def test_every_scenario_ends_when_every_move_is_refused(scenario_id: str) -> None:
    """The newest version of every scenario ends within the steps its own limits allow
    (measured with empty moves), even when every move is refused: non-ASCII, as an
    untrained model writes."""
    bounds = []
    for bad in ("", "héllo wörld"):
        env = make(scenario_id)
        env.reset(seed=5)
        steps = 0
        while env.agents and steps < 1000:
            env.step({seat: bad for seat in env.agents})
            steps += 1
        assert not env.agents, f"{scenario_id}: {bad!r} moves never end the episode"
        bounds.append(steps)
        env.close()
    assert bounds[1] <= bounds[0], (scenario_id, bounds)
