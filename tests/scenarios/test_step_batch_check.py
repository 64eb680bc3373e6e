"""Scenario.step checks many seats' actions in one joined C-speed pass (issue 11 §5); the
outcome must be exactly the per-action rules: an action is invalid iff it is not a string
or the action space refuses it, whatever the other seats sent (non-strings, newlines,
characters outside the charset, actions that each fit but not together, str subclasses that
lie about themselves)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.scenarios.test_base_hot_path import Room

_MOVES = st.one_of(
    st.text(max_size=25).map(lambda text: "y" + text),  # "y": Room's play takes it as is
    st.integers(),
    st.none(),
    st.sampled_from(["yes", "y" * 20, "y" * 21, "y\nz", "y\x00", "y\u00e9", ""]),
)


def _expected_invalid(env: Room, move: Any) -> bool:
    if not isinstance(move, str):
        return True
    return not env.action_space("a").contains(str(move))


@settings(max_examples=400, deadline=None)
@given(_MOVES, _MOVES, _MOVES)
def test_every_seat_is_judged_as_if_alone(a: Any, b: Any, c: Any) -> None:
    env = Room()
    env.reset(seed=0)
    moves = {"a": a, "b": b, "c": c}
    _, _, _, _, infos = env.step(moves)
    for seat, move in moves.items():
        assert ("invalid" in infos[seat]) == _expected_invalid(env, move), (seat, move)
    # What was said reached the others escaped into the charset, exactly as sent otherwise.
    said = [e.text for e in env.events if e.kind == "message"]
    assert all(env.observation_space("a").contains(text) for text in said)


class _Liar(str):
    """Claims to be short printable ASCII whatever it holds."""

    def isprintable(self) -> bool:
        return True

    def isascii(self) -> bool:
        return True


def test_a_lying_str_subclass_is_judged_by_what_it_holds() -> None:
    env = Room()
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"a": _Liar("y\x00z"), "b": "ok", "c": _Liar("fine")})
    assert "outside printable ASCII" in infos["a"]["invalid"]
    assert "invalid" not in infos["b"]
    assert "invalid" not in infos["c"]


def test_actions_that_fit_alone_but_not_together_are_each_valid() -> None:
    env = Room()  # max_action_length 20
    env.reset(seed=0)
    moves = {"a": "y" * 20, "b": "y" * 20, "c": "y" * 19}
    observations, _, _, _, infos = env.step(moves)
    assert not any("invalid" in info for info in infos.values())
    assert observations["a"] == f"b: {'y' * 20}\nc: {'y' * 19}\nYour move."
