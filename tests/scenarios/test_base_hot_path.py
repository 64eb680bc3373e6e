"""The Scenario machinery's fast paths agree with its plain rules: checks, event log, inboxes."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.scenarios.base import Event, Scenario, printable


class Room(Scenario):  # type: ignore[misc]
    """All seats act while ``all_act``; "@seat text" is private, "x..." is rejected."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "test/room-v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    max_action_length = 20

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(["a", "b", "c"], **kwargs)
        self.all_act = True

    def new_episode(self, rng: np.random.Generator) -> None:
        self.announce("welcome")

    def acting(self) -> list[str]:
        return list(self.agents) if self.all_act else ["a"]

    def play(self, agent: str, action: str) -> str | None:
        if action.startswith("x"):
            return "no x"
        if action.startswith("@"):
            self.say(agent, action[3:], to=[action[1]])
        else:
            self.say(agent, action)
        return None

    def system_prompt(self, agent: str) -> str:
        return "Talk."


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=25))
def test_an_action_is_invalid_exactly_when_the_action_space_refuses_it(action: str) -> None:
    env = Room()
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"a": "y" + action, "b": "ok", "c": "ok"})
    move = "y" + action
    assert ("invalid" in infos["a"]) == (not env.action_space("a").contains(move))
    assert "invalid" not in infos["b"]


def test_non_string_and_subclassed_string_actions() -> None:
    class Text(str):
        pass

    env = Room()
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"a": 5, "b": Text("fine"), "c": "two\nlines"})
    assert infos["a"]["invalid"] == "action must be a string, got int"
    assert "invalid" not in infos["b"]
    assert "invalid" not in infos["c"]


def test_event_log_is_complete_and_in_order_whenever_read() -> None:
    env = Room()
    env.reset(seed=0)
    first = env.events
    env.step({"a": "hi", "b": "@c psst", "c": "xbad"})
    assert env.events is first  # one list all episode, filled as it is read
    assert env.events == [
        Event(0, "notice", "", "welcome"),
        Event(0, "message", "a", "hi"),
        Event(0, "message", "b", "psst", ("c",)),
        Event(0, "invalid", "c", "no x", ("c",)),
    ]
    env.step({"a": "again", "b": "x", "c": "ok"})
    assert [(e.turn, e.kind, e.sender) for e in env.events[4:]] == [
        (1, "message", "a"),
        (1, "invalid", "b"),
        (1, "message", "c"),
    ]
    env.reset(seed=1)
    assert env.events == [Event(0, "notice", "", "welcome")]
    assert env.events is not first
    assert len(first) == 7  # the last episode's log is left as it was


def test_a_seat_not_asked_keeps_its_lines_until_it_is() -> None:
    env = Room()
    observations, _ = env.reset(seed=0)
    assert observations["b"] == "welcome\nYour move."
    env.all_act = False
    observations, _, _, _, infos = env.step({"a": "one", "b": "ignored"})
    assert infos["b"]["to_act"] is False
    assert observations["b"] == "a: one"
    observations, _, _, _, _ = env.step({"a": "four"})
    assert observations["b"] == "a: one\na: four"
    env.all_act = True
    observations, _, _, _, _ = env.step({"a": "five", "b": "six", "c": "seven"})
    assert observations["b"] == "a: one\na: four\na: five\nc: seven\nYour move."
    assert observations["a"] == "b: six\nc: seven\nYour move."


def test_step_dicts_are_fresh_every_step() -> None:
    env = Room()
    env.reset(seed=0)
    _, rewards, terminations, truncations, infos = env.step({"a": "one", "b": "xb", "c": "two"})
    for returned in (rewards, terminations, truncations):
        for seat in list(returned):
            returned[seat] = 7
    infos["b"]["components"]["invalid"] = 99.0
    infos["a"]["components"]["task"] = 5.0
    _, rewards, terminations, truncations, infos = env.step({"a": "xa", "b": "ok", "c": "ok"})
    assert rewards == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert terminations == truncations == {"a": False, "b": False, "c": False}
    assert infos["a"]["components"] == {"invalid": -0.0}
    assert infos["b"]["components"] == {}
    assert "invalid" not in infos["b"]
    assert env.totals("b") == {"invalid": -0.0}


class Prompted(Room):
    """Room whose prompt (outside the charset) and acting seats (any collection) vary."""

    prompt_text = "Move \x1b now"
    asked: Any = ("a", "b")
    lazy = False  # acting() as an iterator

    def acting(self) -> Any:
        return iter(self.asked) if self.lazy else self.asked

    def prompt(self, agent: str) -> str:
        return self.prompt_text


def test_prompts_are_escaped_every_time_and_any_acting_collection_is_asked() -> None:
    env = Prompted()
    observations, _ = env.reset(seed=0)
    assert observations["a"] == "welcome\nMove \\x1b now"
    asked: list[tuple[Any, bool]] = [
        (["b", "c"], False),
        (["c"], True),
        ({"a", "b", "c"}, False),
        (("a",), False),
        (["a", "b", "c"], True),
        ("a", False),
    ]
    for acting, lazy in asked:
        env.asked, env.lazy = acting, lazy
        observations, _, _, _, infos = env.step({"a": "hi", "b": "ok", "c": "yo"})
        assert {seat for seat in infos if infos[seat]["to_act"]} == set(acting)
        for seat in acting:
            assert observations[seat].endswith("Move \\x1b now")
    env.prompt_text = "Other\x00"
    observations, _, _, _, _ = env.step({"a": "hi"})
    assert observations["a"] == "Other\\x00"


def test_a_long_observation_is_cut_from_the_front() -> None:
    env = Room()
    env.max_observation_length = 30
    env.reset(seed=0)
    observations, _, _, _, _ = env.step({"a": "a" * 20, "b": "b" * 20, "c": "ok"})
    whole = "b: " + "b" * 20 + "\nYour move."
    assert observations["c"] == "[...]" + whole[-25:]
    assert len(observations["c"]) == 30


def test_step_dicts_follow_the_live_seats_across_episodes() -> None:
    env = Room()
    for seed in range(2):
        env.reset(seed=seed)
        _, rewards, terminations, _, _ = env.step({"a": "hi", "b": "ok", "c": "yo"})
        assert list(rewards) == list(terminations) == ["a", "b", "c"]
    env.agents = ["a", "c"]  # a subclass dropping a seat mid-episode
    _, rewards, terminations, truncations, infos = env.step({"a": "hi", "c": "yo"})
    assert list(rewards) == list(terminations) == list(truncations) == list(infos) == ["a", "c"]
    env.agents.remove("c")  # or changing the list in place
    _, rewards, _, truncations, _ = env.step({"a": "hi"})
    assert list(rewards) == list(truncations) == ["a"]


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.sampled_from(["a", " ", "\n", "\t", "\r", "\x7f", "\x00", "\u00e9", "\ud800", "~"]),
        max_size=120,
    )
)
def test_tell_escapes_as_printable_does_short_and_long(text: str) -> None:
    env = Room()
    env.reset(seed=0)
    env._inbox["a"].clear()
    env.tell("a", text)
    assert env._inbox["a"] == [printable(text)]
