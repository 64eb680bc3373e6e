"""``say`` skips re-escaping only the very action ``step`` just checked: anything else a
scenario derives from an action (or keeps from an earlier step) is escaped as before."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from parley.scenarios.base import Scenario


class Smuggler(Scenario):  # type: ignore[misc]
    """Says the action, a control-character variant of it, and the first action again."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "test/smuggler-v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }

    def __init__(self) -> None:
        super().__init__(["a", "b"])
        self.first: str | None = None

    def new_episode(self, rng: np.random.Generator) -> None:
        self.first = None

    def acting(self) -> list[str]:
        return ["a"]

    def play(self, agent: str, action: str) -> str | None:
        self.say(agent, action)
        self.say(agent, action + "\x1b[2J\x00")  # derived from a clean action: not clean
        if self.first is None:
            self.first = action
        self.say(agent, self.first)  # an earlier clean action: still clean
        return None

    def system_prompt(self, agent: str) -> str:
        return "test"


def test_text_derived_from_a_clean_action_is_still_escaped() -> None:
    env = Smuggler()
    env.reset(seed=0)
    observations, *_ = env.step({"a": "hello", "b": ""})
    assert observations["b"].splitlines() == [
        "a: hello",
        "a: hello\\x1b[2J\\x00",
        "a: hello",
    ]
    observations, *_ = env.step({"a": "\u00e9t\u00e9", "b": ""})  # refused: not in charset
    observations, *_ = env.step({"a": "again", "b": ""})
    # (b is never asked: its lines pile up, the last three are this step's)
    assert observations["b"].splitlines()[-3:] == [
        "a: again",
        "a: again\\x1b[2J\\x00",
        "a: hello",
    ]
    assert all(ch == "\n" or " " <= ch <= "~" for ch in observations["b"])
    assert all(event.text.isascii() for event in env.events)


def test_printable_passes_exactly_the_texts_inside_the_charset() -> None:
    """Its fast paths (short texts: isprintable with newlines as spaces; longer: the bytes
    left once the charset's are deleted) against the regex that defines the charset, on
    random texts with lines, tabs, DEL, NUL, non-ASCII and astral characters, on both sides
    of the length where the paths part."""
    import random

    from parley.scenarios.charset import _SHORT, OUTSIDE_CHARSET, _escape, printable

    rng = random.Random(5)
    rare = [chr(c) for c in range(0x20)] + ["\x7f", "é", "\u2028", "\U0001f600"]
    lengths = [(0, 40), (_SHORT - 3, _SHORT + 3), (_SHORT + 4, 3 * _SHORT)]
    for trial in range(24_000):
        low, high = lengths[trial % 3]
        odds = rng.choice([0.0, 0.003, 0.03])
        text = "".join(
            rng.choice(rare) if rng.random() < odds else rng.choice("ab \n~")
            for _ in range(rng.randint(low, high))
        )
        out = printable(text)
        assert (out is text) == (OUTSIDE_CHARSET.search(text) is None), repr(text)
        assert out == OUTSIDE_CHARSET.sub(_escape, text), repr(text)
